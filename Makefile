# One command runs the main job (make demo), one runs the tests (make test).
# Each sets up what it needs on a fresh machine.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
DEMO   ?= demo-out

.PHONY: install test test-fast demo bench-convert bench-loader clean

install: $(STAMP)

# torch first: `torch==2.13.0` resolves to the CPU wheel on this disk; letting
# another package pull torch in would fetch a multi-GB CUDA build instead.
# Azurite (the Azure Blob emulator) comes from npm: package.json / package-lock.json.
$(STAMP): pyproject.toml package.json
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[tf,spark,gpu,dev]'
	npm install --no-audit --no-fund --loglevel=error
	touch $(STAMP)

test: install
	$(PY) -m pytest -m "not gpu" $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -m "not gpu and not slow and not spark and not tf" $(PYTEST_ARGS)

demo: install
	bash scripts/demo.sh $(DEMO)

bench-convert: install
	$(PY) -m trainfeed.benchmarks.convert_bench --out bench-out/convert.jsonl

bench-loader: install
	$(PY) -m trainfeed.benchmarks.loader_bench --out bench-out/loader.jsonl

clean:
	rm -rf $(VENV) $(DEMO) bench-out .pytest_cache
