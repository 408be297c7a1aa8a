# `make demo` and `make test` set everything up on a fresh machine, then run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

# The MLflow UI test drives Debian's Chromium, headless.
BROWSER := /usr/bin/chromedriver
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test clean

# The quickstart sweep: 4 trials on synthetic shapes, ASHA, about 10 minutes on 2 cores.
demo: $(INSTALLED)
	$(BIN)/detsweep launch sweeps/quickstart.yaml --set storage=$(CURDIR)/demo-out/ray

test: $(INSTALLED) $(BROWSER)
	$(BIN)/python -m pytest

$(BROWSER):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium chromium-driver

# Reinstalls when pyproject.toml changes; the venv itself is made only when missing.
$(INSTALLED): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

clean:
	rm -rf demo-out .pytest_cache mlflow.db mlartifacts
