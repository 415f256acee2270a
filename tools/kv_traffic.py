"""KV-cache megabytes per decode step against position, for a bundle's pieces on TensorRT targets.

    .venv/bin/python tools/kv_traffic.py bundles/smollm2 orin-nano agx-orin
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specexport.exporter.tensorrt.targets import load_target
from specexport.exporter.tensorrt.traffic import table

if __name__ == "__main__":
    manifest = json.loads((Path(sys.argv[1]) / "manifest.json").read_text())
    print(table(manifest["pieces"], [load_target(t) for t in sys.argv[2:] or ["orin-nano", "agx-orin"]]))
