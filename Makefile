# `make demo` and `make test` set everything up on a fresh machine, then run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

# The MLflow UI test drives Debian's Chromium, headless.
BROWSER := /usr/bin/chromedriver
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test bench bench-smoke tcmalloc clean lock upgrade-check

# The quickstart sweep: 4 trials on synthetic shapes, synchronous halving (its time: README, Speed).
demo: $(INSTALLED)
	$(BIN)/detsweep launch sweeps/quickstart.yaml --set storage=$(CURDIR)/demo-out/ray/$(shell date +%Y%m%d-%H%M%S)

# The layers and the lint first (seconds), then every test, in one process: two at once
# were slower on CI's machine (README, Tests).
test: $(INSTALLED) $(BROWSER)
	$(BIN)/lint-imports
	$(BIN)/ruff check detsweep tests bench
	$(BIN)/python -m pytest

# Every benchmark under bench/ (about two hours on 2 cores): bench/results.json and RESULTS.md.
bench: $(INSTALLED) tcmalloc
	$(BIN)/python -m bench.run_all

# Each benchmark at a tiny size, only to check that the scripts run (tests/test_bench.py runs those
# whose path no other test takes, and names the others).
bench-smoke: $(INSTALLED) tcmalloc
	$(BIN)/python -m bench.run_all --smoke --out $(CURDIR)/demo-out/bench-smoke.json

# The newest versions PyPI serves, bounds lifted, in .venv/upgrade-check: what of the marked tests broke.
# PIN='ray==2.59.*' tries that version instead, the other packages at uv.lock's (tools/upgrade_check.py --pin).
upgrade-check: $(INSTALLED)
	$(BIN)/python tools/upgrade_check.py $(if $(PIN),--pin '$(PIN)')

# The benchmarks compare glibc's malloc with tcmalloc (bench/allocator.py), which Ray's training
# workers get where a machine has it. It gave no gain beyond noise (README, Speed), so the demo
# and the tests do without it.
tcmalloc:
	@ldconfig -p | grep -q libtcmalloc_minimal.so.4 || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq libtcmalloc-minimal4; }

$(BROWSER):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium chromium-driver

# Installs exactly uv.lock's packages (README, Install), again whenever the lock changes; the venv
# itself is made only when missing. --locked refuses a lock that no longer matches pyproject.toml
# (`make lock` refreshes it). uv downloads in parallel (48-57 s against pip's 88 s here) and
# compiles to bytecode as pip does: Python may not write any of its own here
# (PYTHONDONTWRITEBYTECODE), and every process would then compile TensorFlow again. Nothing is
# cached outside the venv (no pip or uv cache). uv reads UV_DEFAULT_INDEX, not pip's
# configuration, for a package mirror. --inexact: the venv's own pip and uv stay.
UV := UV_CACHE_DIR=$(VENV)/.uv-cache $(BIN)/uv
UV_VERSION := 0.13.9

$(BIN)/uv:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --no-cache-dir 'uv==$(UV_VERSION)'

# uv.lock anew from pyproject.toml's ranges (the locked versions kept where they still fit; `uv lock
# --upgrade` for the newest), and the cluster's nodes' two views of it: every package with its
# hashes, for pip in Ray's image (ray_cluster.yaml; README, Install). tests/test_install.py holds
# them to the lock.
lock: | $(BIN)/uv
	$(UV) lock
	{ echo "# The packages of uv.lock for a cluster's nodes (make lock writes this file; README, Install)"; \
	  $(UV) export --frozen --no-emit-project --no-header --extra bohb; } > cluster/requirements.txt
	{ echo "# The packages of uv.lock for a cluster's GPU nodes (make lock writes this file; README, Install)"; \
	  $(UV) export --frozen --no-emit-project --no-header --extra bohb --extra gpu; } > cluster/requirements-gpu.txt

$(INSTALLED): pyproject.toml uv.lock | $(BIN)/uv
	$(UV) sync --locked --inexact --no-cache --compile-bytecode --extra dev --python $(BIN)/python --quiet
	touch $@

clean:
	rm -rf demo-out .pytest_cache mlflow.db mlartifacts
