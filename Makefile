# Set-up and the two entry points the README opens with:
#   make diagnose   - creates .venv, installs bubblescope, runs `bubblescope diagnose model` on the default model
#   make test       - creates .venv, installs bubblescope[test], runs the test suite
# On a machine without torch and without an NVIDIA GPU, set-up installs torch==2.13.0 (and triton==3.6.0, the
# version of our H200) first: the CPU build where pip's configuration offers it (our machines' wheel folder; on
# plain PyPI, set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu), so pip does not pull a CUDA build.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.bubblescope-installed
OUT    ?= bubblescope-out

.PHONY: setup diagnose test clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@if $(BIN)/python -c "import torch" 2>/dev/null; then \
	  echo "torch already installed"; \
	elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  echo "NVIDIA GPU found: installing torch with CUDA"; $(BIN)/python -m pip install -q torch; \
	else \
	  echo "no GPU: installing torch==2.13.0 (the CPU build where pip offers it)"; $(BIN)/python -m pip install -q torch==2.13.0 triton==3.6.0; \
	fi
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

diagnose: $(STAMP)
	$(BIN)/bubblescope diagnose model --out $(OUT)

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) $(OUT)
