#!/usr/bin/env bash
# Set up specexport's runtime on a Jetson, in a virtual environment that sees JetPack's TensorRT bindings.
# NOT YET RUN ON A DEVICE (nothing of the TensorRT path has run on a GPU: see README.md).
#
#   samples/jetson/install.sh [--ort-gpu] [SPECEXPORT]   # SPECEXPORT: a checkout or a wheel (default: this checkout)
#
# JetPack 6.1/6.2 (L4T R36.4+: CUDA 12.6, TensorRT 10.3) gets the extra jetson-jp6: cuda-python >=12.9.2,<13
# and numpy <2; JetPack 7 (L4T R38: CUDA 13, driver 580) gets jetson-jp7: cuda-python >=13.0.1,<14.
# JetPack 6.0 (TensorRT 8.6) and older are refused: specexport needs TensorRT 10.
#
# --ort-gpu: ONNX Runtime's CUDA provider (`--provider CUDAExecutionProvider`), Jetson AI Lab's onnxruntime-gpu
# *in place of* onnxruntime: both install the `onnxruntime` module, and with both the CUDA provider is hidden.
#
# Environment: VENV (default ~/specexport-venv); ORT_INDEX, the pip index of onnxruntime-gpu (default for
# JetPack 6: Jetson AI Lab's jp6/cu126; for JetPack 7 set it to the index of your CUDA from
# https://pypi.jetson-ai-lab.io); L4T_RELEASE (default /etc/nv_tegra_release); DRY_RUN=1 prints the commands.
set -euo pipefail

ORT_GPU=0
if [ "${1:-}" = --ort-gpu ]; then ORT_GPU=1; shift; fi
SRC="${1:-$(cd "$(dirname "$0")/../.." && pwd)}"
VENV="${VENV:-$HOME/specexport-venv}"
L4T_RELEASE="${L4T_RELEASE:-/etc/nv_tegra_release}"

run() { if [ "${DRY_RUN:-0}" = 1 ]; then echo "+ $*"; else "$@"; fi; }
die() { echo "error: $*" >&2; exit 1; }

[ -r "$L4T_RELEASE" ] || die "$L4T_RELEASE is missing, so this is not a Jetson with JetPack; on a desktop GPU install specexport with pip install '.[tensorrt]' (README.md)"
# its first line: "# R36 (release), REVISION: 4.3, GCID: ..."
L4T=$(sed -n 's/^# R\([0-9][0-9]*\) (release), REVISION: \([0-9][0-9]*\).*/\1 \2/p' "$L4T_RELEASE" | head -n 1)
[ -n "$L4T" ] || die "cannot read the L4T release from $L4T_RELEASE; pick the extra yourself: pip install '.[jetson-jp6]' (JetPack 6.1/6.2) or '.[jetson-jp7]' (JetPack 7)"
read -r L4T_MAJOR L4T_MINOR <<< "$L4T"

NUMPY_PIN=()
if [ "$L4T_MAJOR" -eq 36 ] && [ "$L4T_MINOR" -ge 4 ]; then
    EXTRA=jetson-jp6
    NUMPY_PIN=("numpy<2")  # Jetson AI Lab's jp6 onnxruntime-gpu wheel is built against numpy 1
    ORT_INDEX="${ORT_INDEX:-https://pypi.jetson-ai-lab.io/jp6/cu126}"
elif [ "$L4T_MAJOR" -ge 38 ]; then
    EXTRA=jetson-jp7
    ORT_INDEX="${ORT_INDEX:-}"
else
    die "L4T R$L4T_MAJOR.$L4T_MINOR is JetPack 6.0 or older, whose TensorRT (8.6 or older) specexport cannot use; upgrade to JetPack 6.1 or later (TensorRT 10.3)"
fi

if [ "$ORT_GPU" = 1 ] && [ -z "$ORT_INDEX" ]; then
    die "set ORT_INDEX to the Jetson AI Lab pip index of this JetPack's CUDA (https://pypi.jetson-ai-lab.io) to install onnxruntime-gpu"
fi

echo "L4T R$L4T_MAJOR.$L4T_MINOR: installing specexport[$EXTRA] into $VENV" >&2
run python3 -m venv --system-site-packages "$VENV"
run "$VENV/bin/python" -c "import tensorrt" || die "TensorRT's Python bindings are missing from the system Python; install them with sudo apt install python3-libnvinfer"
run "$VENV/bin/pip" install "$SRC[$EXTRA]"

if [ "$ORT_GPU" = 1 ]; then
    run "$VENV/bin/pip" uninstall -y onnxruntime
    run "$VENV/bin/pip" install --index-url "$ORT_INDEX" onnxruntime-gpu "${NUMPY_PIN[@]}"
    run "$VENV/bin/python" -c "import onnxruntime as o, sys; sys.exit(0 if 'CUDAExecutionProvider' in o.get_available_providers() else 'onnxruntime-gpu installed, but without the CUDA execution provider')"
    echo "onnxruntime-gpu replaces onnxruntime here: reinstall or upgrade specexport with pip install --no-deps, or pip brings onnxruntime back" >&2
fi

cat >&2 <<'EOF'
Before timing anything, set the highest power mode and pin the clocks:
    sudo nvpmodel -q                   # the current mode; the modes are listed in /etc/nvpmodel.conf
    sudo nvpmodel -m <MAXN mode>       # MAXN (MAXN SUPER on an Orin Nano with JetPack 6.2)
    sudo jetson_clocks
`specexport bench` records `nvpmodel -q` and `jetson_clocks --show` with its results.
Then check the device before anything else: specexport doctor --backend tensorrt (versions, engines, every mode).
EOF
