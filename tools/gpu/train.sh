#!/usr/bin/env bash
# The draft heads' training run for a lent GPU machine, in one command of at most 10 minutes, from the
# repository root of a copy of this tree. Nothing is installed there and nothing can be fetched: the package
# runs from this tree (a `specexport` link to it on PYTHONPATH), the target comes staged by `make gpu-stage`
# (the default model's GGUF in chunks that fit a call, and the pure-Python `gguf` reader), and the machine's
# own PyTorch, transformers and onnxruntime do the rest.
#
#   1. distil TOKENS response tokens (the shipped prompts, then requests the target writes itself), batched;
#   2. train the draft head on them (training-time test, FR-Spec head), on the GPU;
#   3. with time left, the adapter and the drafter on the same responses, so the three compare fairly.
#
# Each stage has a time cap (seconds, from the start of the script); the corpus is cached and resumable, so
# a stage cut short keeps what it made. Results go to $OUT (the device tool brings that folder back):
# head/, adapter/, drafter/ (weights and metadata) and train.log.
#
# On this CPU, end to end with a tiny model (tests/conftest.py: make_tiny_checkpoint):
#   PY=.venv/bin/python MODEL=/path/to/tiny-ckpt EXIT_LAYER=1 DEVICE=cpu TOKENS=3000 HEAD_STEPS=20 \
#       HEAD_BATCH=1024 SIDE_STEPS=10 bash tools/gpu/train.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
stage=${STAGE:-$root/gpu-stage}
OUT=${OUT:-$root/gpu-out}
DEVICE=${DEVICE:-cuda}
TOKENS=${TOKENS:-5000000}
HEAD_STEPS=${HEAD_STEPS:-3000}
HEAD_BATCH=${HEAD_BATCH:-16384}
SIDE_STEPS=${SIDE_STEPS:-1500}
DISTILL_UNTIL=${DISTILL_UNTIL:-330}
HEAD_UNTIL=${HEAD_UNTIL:-520}
SIDE_UNTIL=${SIDE_UNTIL:-580}
PY=${PY:-python3}
start=$(date +%s)
mkdir -p "$OUT" "$stage/pkgs"
exec > >(tee -a "$OUT/train.log") 2>&1

ln -sfn "$root" "$stage/pkgs/specexport"
export PYTHONPATH="$stage/pkgs:$stage/site${PYTHONPATH:+:$PYTHONPATH}"
export SPECEXPORT_CACHE=${SPECEXPORT_CACHE:-$stage/cache}
if [ -z "${MODEL:-}" ]; then
  MODEL=$stage/model.gguf
  if [ ! -f "$MODEL" ]; then
    ls "$stage"/model.gguf.part-* > /dev/null 2>&1 || { echo "no model: run \`make gpu-stage\` and carry gpu-stage/ (or set MODEL)"; exit 2; }
    cat "$stage"/model.gguf.part-* > "$MODEL.tmp" && mv "$MODEL.tmp" "$MODEL"
  fi
fi

left() { echo $(( $1 - ($(date +%s) - start) )); }
spx=("$PY" -c 'import sys; from specexport.cli.main import entry; sys.argv[0] = "specexport"; entry()')
"$PY" - <<'PY'
import torch
print(f"torch {torch.__version__}, cuda {torch.cuda.is_available()}"
      + (f" ({torch.cuda.get_device_name()})" if torch.cuda.is_available() else ""), flush=True)
PY

echo "== distil $TOKENS response tokens ($(left "$DISTILL_UNTIL") s)"
t0=$(date +%s)
timeout "$(left "$DISTILL_UNTIL")" "${spx[@]}" distill --model "$MODEL" --tokens "$TOKENS" --device "$DEVICE" \
  || echo "distil stopped at its time cap; training on what it made"
read -r have magpie < <("$PY" - "$MODEL" <<'PY'
import sys
from specexport.exporter.model_source import resolve
from specexport.exporter.training.corpus import corpus_dirs, read_shards
dirs = corpus_dirs(resolve(sys.argv[1]).origin_sha256)
shards = sorted(p for d in dirs for p in d.glob("shard_*.npz"))
print(sum(len(s) - p for s, p in read_shards(shards)), dirs[1] if any(dirs[1].glob("shard_*.npz")) else "-")
PY
)
echo "distilled: $have response tokens in $(( $(date +%s) - t0 )) s"
tokens=$(( have < TOKENS ? have : TOKENS ))

echo "== train the head on $tokens tokens ($(left "$HEAD_UNTIL") s)"
timeout "$(left "$HEAD_UNTIL")" "${spx[@]}" train-head --model "$MODEL" ${EXIT_LAYER:+--exit-layer "$EXIT_LAYER"} --tokens "$tokens" --device "$DEVICE" --steps "$HEAD_STEPS" \
  --tokens-per-batch "$HEAD_BATCH" --out "$OUT/head"

for piece in adapter drafter; do
  budget=$(left "$SIDE_UNTIL")
  [ "$budget" -gt 30 ] || { echo "no time left for the $piece"; continue; }
  echo "== train the $piece ($budget s)"
  extra=()
  [ "$magpie" = "-" ] || extra=(--extra-data "$magpie")
  [ "$piece" = drafter ] || [ -z "${EXIT_LAYER:-}" ] || extra+=(--exit-layer "$EXIT_LAYER")
  timeout "$budget" "${spx[@]}" "train-$piece" --model "$MODEL" --device "$DEVICE" --steps "$SIDE_STEPS" \
    --out "$OUT/$piece" "${extra[@]}" || echo "the $piece did not finish in its $budget s"
done
rm -f "$OUT"/*/train_state.pt  # resumption state: not worth the trip back
echo "== done in $(( $(date +%s) - start )) s"
