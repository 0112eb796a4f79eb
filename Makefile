# One command runs the main job (make demo), one runs the tests (make test).
# Each sets up what it needs on a fresh machine.
#
# Two environments, both Python 3.11 (this machine's torch CPU wheel is for 3.11; Python 3.12
# is checked by tests/test_packaging.py, from the built wheel):
#   .venv            the core on today's stack (numpy 2, pyarrow 26): constraints/dev.txt
#   .venv-petastorm  trainfeed[petastorm,spark]: Petastorm 0.13.1 holds pyarrow 14 / numpy 1.26 /
#                    pandas 2.2 (Python 3.11 only), with Spark 3.5 (DBR 15.4 LTS's):
#                    constraints/petastorm.txt. The spark tests run in both environments.
PYTHON   ?= python3.11
VENV     := .venv
PY       := $(VENV)/bin/python
PS_VENV  := .venv-petastorm
PS_PY    := $(PS_VENV)/bin/python
DEMO     ?= demo-out

.PHONY: install lint test test-busy test-fast demo bench-convert bench-loader bench-remote bench-decode bench-io bench-mlperf bench-gpu-feed clean

install: $(VENV)/.installed $(PS_VENV)/.installed

# torch first, at the version the constraints file pins (2.13.0: the CPU wheel on this disk);
# letting another package pull torch in would fetch a multi-GB CUDA build instead.
# Each environment is rebuilt whole (an old .venv may still hold Petastorm or pyarrow 14).
# $(1): interpreter, $(2): venv folder, $(3): constraints file, $(4): extras.
define make_venv
	rm -rf $(2)
	$(1) -m venv $(2)
	$(2)/bin/python -m pip install -q --upgrade pip
	$(2)/bin/python -m pip install -q -c $(3) torch
	$(2)/bin/python -m pip install -q -c $(3) -e '.[$(4)]'
endef
MAIN_EXTRAS := tf,spark,gpu,dev
PS_EXTRAS   := petastorm,spark,dev

# Azurite (the Azure Blob emulator) and s3rver (a file-backed S3 server, for bench-io) come from
# npm: package.json / package-lock.json.
$(VENV)/.installed: pyproject.toml constraints/dev.txt package.json
	$(call make_venv,$(PYTHON),$(VENV),constraints/dev.txt,$(MAIN_EXTRAS))
	npm install --no-audit --no-fund --loglevel=error
	touch $@

# Petastorm and Spark 3.5 are the reasons for this environment: no tensorflow.
$(PS_VENV)/.installed: pyproject.toml constraints/petastorm.txt
	$(call make_venv,python3.11,$(PS_VENV),constraints/petastorm.txt,$(PS_EXTRAS))
	touch $@

# One pytest process per core and one more, at most 4 (each may start a Spark JVM and
# TensorFlow): a quarter of the suite's time is spent waiting (servers, subprocesses, timeouts
# under test), which the extra process fills (2 cores: 9:01 with 3 processes, 11:21 with 2, the
# same tests). A test file stays in one process, so its module fixtures (servers, Spark
# sessions) start once. PYTEST_WORKERS=0 runs in this process.
PYTEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); n=$$((n + 1)); [ $$n -gt 4 ] && n=4; echo $$n)

# Files are handed out longest first (tests/conftest.py LONGEST_FIRST, from the per-file profile;
# --no-loadscope-reorder keeps that order instead of xdist's most-tests-first), so that no long
# file starts last while the other process has nothing left to do.
PYTEST_SPREAD := -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

# pytest exits 5 when it selects no test; that is fine only when PYTEST_ARGS narrowed the run
# to tests of the other environment.
define pytest_in
	$(1) -m pytest -m "$(2)" $(PYTEST_SPREAD) $(PYTEST_ARGS) || { rc=$$?; [ $$rc -eq 5 ] && [ -n "$(PYTEST_ARGS)" ] || exit $$rc; }
endef

# Style (ruff) and types (mypy), as configured in pyproject.toml. mypy checks the package as
# installed (trainfeed.*), so the folders are linked under build/typecheck the way package-dir
# maps them; paths in its messages read trainfeed/<folder>/... (= <folder>/...).
TYPECHECK := build/typecheck
lint: $(VENV)/.installed
	$(PY) -m ruff check converters training benchmarks pipelines trainfeed tests
	rm -rf $(TYPECHECK)/trainfeed && mkdir -p $(TYPECHECK)/trainfeed
	ln -s $(CURDIR)/trainfeed/* $(TYPECHECK)/trainfeed/
	for d in converters training benchmarks pipelines; do ln -s $(CURDIR)/$$d $(TYPECHECK)/trainfeed/$$d; done
	cd $(TYPECHECK) && $(CURDIR)/$(PY) -m mypy --config-file $(CURDIR)/pyproject.toml -p trainfeed

test: install
	$(call pytest_in,$(PY),not gpu and not petastorm)
	$(call pytest_in,$(PS_PY),(petastorm or spark) and not gpu)

# `make test` beside four busy processes, as on a shared CI machine: no test may depend on idle
# cores. The busy processes are killed however the tests end; the exit status is the tests'.
test-busy: install
	@pids=""; trap 'kill $$pids 2>/dev/null' EXIT; trap 'exit 130' INT; trap 'exit 143' TERM; \
	for i in 1 2 3 4; do python3 -c "while True: pass" & pids="$$pids $$!"; done; \
	echo "test-busy: 4 busy processes beside the tests (pids$$pids)"; \
	$(MAKE) --no-print-directory test; rc=$$?; exit $$rc

# The edit-run loop, under 2 minutes on 2 cores: `make test` less what starts Spark, TensorFlow or
# an object-storage emulator (azurite, s3) and what is marked slow, spread as `make test` spreads.
test-fast: $(VENV)/.installed
	$(PY) -m pytest -m "not gpu and not slow and not spark and not tf and not petastorm and not azurite and not s3" \
		$(PYTEST_SPREAD) $(PYTEST_ARGS)

demo: $(VENV)/.installed
	bash scripts/demo.sh $(DEMO)

# The developer micro-benchmarks (benchmarks/micro) are not in the wheel: they run from this
# checkout, which $(VENV)'s editable install maps to trainfeed.benchmarks (micro included).
bench-convert: $(VENV)/.installed
	$(PY) -m trainfeed.benchmarks.micro.convert_bench --out bench-out/convert.jsonl

bench-loader: $(VENV)/.installed
	$(PY) -m trainfeed.benchmarks.micro.loader_bench --out bench-out/loader.jsonl

# JSON lines on stdout (kept in bench-out/remote.jsonl), the summary table on stderr
bench-remote: $(VENV)/.installed
	mkdir -p bench-out
	$(PY) -m trainfeed.benchmarks.micro.remote_bench > bench-out/remote.jsonl

# JPEG decode per core and training input from a JPEG folder / encoded / decoded Parquet (JSON lines)
bench-decode: $(VENV)/.installed
	mkdir -p bench-out
	$(PY) -m trainfeed.benchmarks.micro.decode_bench | tee bench-out/decode.jsonl

# Object-storage reads next to the native client's floor, on Azurite and s3rver (JSON lines
# in bench-out/io.jsonl, the summary table on stderr)
bench-io: $(VENV)/.installed
	mkdir -p bench-out
	$(PY) -m trainfeed.benchmarks.micro.io_bench > bench-out/io.jsonl

# MLPerf Storage's 3D U-Net through DataLoader workers from s3rver: emulated H100s / A100s fed at 90% AU
bench-mlperf: $(VENV)/.installed
	mkdir -p bench-out
	$(VENV)/bin/storage-bench mlperf $(MLPERF_ARGS) > bench-out/mlperf.jsonl

# The 3D ResNet through DataLoader workers from local Parquet and from s3rver (with and without
# cache_dir): meant for a GPU machine (cuda when there is one; on a CPU, use --width 8 or less)

bench-gpu-feed: $(VENV)/.installed
	mkdir -p bench-out
	$(PY) -m trainfeed.benchmarks.micro.gpu_feed_bench $(GPU_FEED_ARGS) > bench-out/gpu_feed.jsonl

clean:
	rm -rf $(VENV) $(PS_VENV) $(DEMO) bench-out .pytest_cache build dist
