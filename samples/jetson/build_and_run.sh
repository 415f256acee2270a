#!/usr/bin/env bash
# Export the default bundle with a TensorRT plan on this host, copy it to a Jetson, build the engines
# there with `specexport doctor` (which also checks every mode against the CPU runtime's tokens), bring its
# report back to ./doctor-TARGET/, and generate. NOT YET RUN ON A DEVICE (see README.md: nothing of the TensorRT
# path has run on a GPU).
#
#   samples/jetson/build_and_run.sh user@jetson [target]     # target: orin-nano (default), agx-orin, thor
#   samples/jetson/build_and_run.sh local [target]           # everything on this machine (run it on the Jetson;
#                                                            # the export step then needs torch there too)
#
# Environment: REMOTE_DIR (default: specexport, relative to the remote home), VENV (the device's virtual
# environment, default: ~/specexport-venv), PROMPT.
set -euo pipefail

DEVICE="${1:?usage: $0 user@jetson|local [target]}"
TARGET="${2:-orin-nano}"
BUNDLE="bundles/smollm2-${TARGET}"
REMOTE_DIR="${REMOTE_DIR:-specexport}"
VENV="${VENV:-\$HOME/specexport-venv}"
PROMPT="${PROMPT:-Explain how a hash table works.}"

# 1. export fp16 standard-flavour pieces, check them against the target's TensorRT, write the plan and
#    the trtexec scripts: no GPU needed
specexport build --backend tensorrt --target "$TARGET" --plan-only --out "$BUNDLE" --force
specexport check "$BUNDLE" --target "$TARGET" > /dev/null

# quoted for the shell that runs the device steps (the prompt may hold quotes)
Q_BUNDLE=$(printf '%q' "$BUNDLE")
Q_PROMPT=$(printf '%q' "$PROMPT")
DOCTOR="doctor-${TARGET}"
Q_DOCTOR=$(printf '%q' "$DOCTOR")
device_steps="
set -euo pipefail
if [ -f $VENV/bin/activate ]; then . $VENV/bin/activate; fi
python3 -c 'import tensorrt' || { echo 'TensorRT Python bindings missing: sudo apt install python3-libnvinfer' >&2; exit 1; }
# versions and verdicts, the bundle's engines (built here), every mode on TensorRT against the CPU runtime's
# tokens; exit 3 only says that checks were skipped (the tiny model without torch on the device, for one)
rc=0; specexport doctor --bundle $Q_BUNDLE --backend tensorrt --out $Q_DOCTOR || rc=\$?
if [ \$rc -ne 0 ] && [ \$rc -ne 3 ]; then cat $Q_DOCTOR/doctor.md >&2; exit \$rc; fi
specexport generate --bundle $Q_BUNDLE --backend tensorrt --stats $Q_PROMPT
"

if [ "$DEVICE" = local ]; then
    bash -c "$device_steps"
else
    # 2. copy the bundle (ONNX pieces, manifest, scripts); engines are built on the device only
    ssh "$DEVICE" "mkdir -p '$REMOTE_DIR/bundles'"
    rsync -a --delete --exclude '*.engine' "$BUNDLE/" "$DEVICE:$REMOTE_DIR/$BUNDLE/"
    # 3. on the device: the doctor (it builds the engines), then generate
    ssh "$DEVICE" "cd '$REMOTE_DIR' && bash -s" <<< "$device_steps" || rc=$?
    # the doctor's report comes back either way: it is the record of what ran on the device
    mkdir -p "$DOCTOR"
    rsync -a "$DEVICE:$REMOTE_DIR/$DOCTOR/doctor.json" "$DEVICE:$REMOTE_DIR/$DOCTOR/doctor.md" "$DOCTOR/" || true
    exit "${rc:-0}"
fi
