# trainyard: `make demo` runs the pipeline end to end, `make test` runs the suite, `make up` starts the UIs.
SHELL := /bin/bash
export AIRFLOW_HOME ?= $(CURDIR)/.airflow
export TRAINYARD_HOME ?= $(CURDIR)/var
VENV := $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)

.PHONY: setup demo test up clean

setup:
	@scripts/setup.sh

demo: setup
	@scripts/demo.sh

test: setup
	@set -o pipefail; python -m pytest -p no:cacheprovider $(PYTEST_ARGS)

up: setup
	@scripts/up.sh

clean:
	rm -rf .airflow var
