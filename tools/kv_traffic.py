"""KV-cache megabytes per decode step against position, for a bundle's pieces on TensorRT targets.

    .venv/bin/python tools/kv_traffic.py bundles/smollm2 orin-nano agx-orin
"""

from __future__ import annotations

import sys
from pathlib import Path

from specexport.exporter.tensorrt.targets import load_target
from specexport.exporter.tensorrt.traffic import table
from specexport.runtime.bundle import read_manifest

if __name__ == "__main__":
    targets = [load_target(t) for t in sys.argv[2:] or ["orin-nano", "agx-orin"]]
    print(table(read_manifest(Path(sys.argv[1])).pieces, targets))
