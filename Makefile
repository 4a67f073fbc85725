# trainyard: `make demo` runs the pipeline end to end, `make test` runs the suite, `make up` starts the UIs.
SHELL := /bin/bash
export AIRFLOW_HOME ?= $(CURDIR)/.airflow
export TRAINYARD_HOME ?= $(CURDIR)/var
VENV := $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)

# The image tag lives in one place, trainyard.TRAINER_IMAGE (also the JobSpec's default kubernetes.image);
# trainyard/__init__.py imports nothing, so reading it needs no set-up.
TRAINER_IMAGE = $(shell PYTHONPATH=include python3 -c 'import trainyard; print(trainyard.TRAINER_IMAGE)')
DOCKER ?= docker
# e.g. DOCKER_BUILD_ARGS="--build-arg TORCH_VARIANT=cu128" for CUDA torch (then tag it as your own, see Dockerfile)
DOCKER_BUILD_ARGS ?=
# mypy checks the code that ships; ruff also the tests, benchmarks and scripts.
LINT_PATHS := include plugins dags
RUFF_PATHS := $(LINT_PATHS) tests bench scripts

.PHONY: setup demo test test-gpu lint bench bench-scheduler image up up-cluster down-cluster cluster-status cluster-env clean

setup:
	@scripts/setup.sh

demo: setup
	@scripts/demo.sh

# Lint first: a finding fails the run before pytest starts (mypy about 5 s: `make setup` has filled its cache
# with the installed packages, scripts/warm_mypy_cache.py; a minute without that).
# The suite runs in TEST_WORKERS pytest-xdist processes, a test file per worker at a time (module fixtures
# stay shared); each worker has its own copy of the Airflow database (tests/conftest.py). Three on 2 cores:
# much of an integration test is waiting (for a scheduler loop, a trigger's look, a process to start), which
# a third worker fills; both cores were 85 % busy with two workers, 95 % with three (/proc/stat every 5 s).
TEST_WORKERS ?= 3
test: setup lint
	@set -o pipefail; python -m pytest -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 $(PYTEST_ARGS)

# On a machine with CUDA GPUs (and a CUDA build of torch): DDP over nccl on 1 and all GPUs, bf16, DeepSpeed
# on CUDA, ONNX parity of a GPU-trained model; a few minutes. Without CUDA each test is skipped with the reason.
test-gpu: setup
	@set -o pipefail; python -m pytest -p no:cacheprovider -m gpu tests/gpu -v $(PYTEST_ARGS)

# Every check runs even when an earlier one fails, so one run shows all there is to fix.
lint: setup
	@status=0; \
	ruff check $(RUFF_PATHS) || status=1; \
	ruff format --check $(RUFF_PATHS) || status=1; \
	mypy $(LINT_PATHS) || status=1; \
	exit $$status

# Every benchmark in bench/ at its default size (about 10 minutes on 2 cores), written to BENCHMARKS.md
# with the machine and the commit; BENCH_ARGS="--only loop data" picks some.
bench: setup
	@python bench/all.py $(BENCH_ARGS)

# The scheduler replay (about 50 minutes on 2 cores): static per-team partitions against trainyard's
# queueing on one job stream, then trainyard's again on the cluster profile (CeleryExecutor), each beside
# the capacity-only reference; rewrites their sections of BENCHMARKS.md and the charts in docs/.
bench-scheduler: setup
	@python bench/all.py --only scheduler scheduler-celery

image:
	@test -n "$(TRAINER_IMAGE)" || { echo "make image: could not read trainyard.TRAINER_IMAGE from include/" >&2; exit 1; }
	@command -v $(DOCKER) >/dev/null || { echo "make image: '$(DOCKER)' not found; install Docker (or run with DOCKER=podman) to build $(TRAINER_IMAGE)" >&2; exit 1; }
	@$(DOCKER) info >/dev/null 2>&1 || { echo "make image: '$(DOCKER)' reaches no engine (is the daemon running?); cannot build $(TRAINER_IMAGE)" >&2; exit 1; }
	$(DOCKER) build -t $(TRAINER_IMAGE) $(DOCKER_BUILD_ARGS) .

up: setup
	@scripts/up.sh

# The cluster profile on this machine (scripts/cluster.py): PostgreSQL, Redis, an MLflow server, Airflow with
# the CeleryExecutor and a worker per queue (cpu, gpu), all on 127.0.0.1, data under $(TRAINYARD_CLUSTER_DIR).
# HOSTS=2: two GPU hosts, each in a network namespace of its own (root), for a job of several nodes.
export TRAINYARD_CLUSTER_DIR ?= $(CURDIR)/var/cluster
up-cluster: setup
	@python scripts/cluster.py up $(if $(HOSTS),--hosts $(HOSTS))

down-cluster:
	@python scripts/cluster.py down

cluster-status:
	@python scripts/cluster.py status

# eval "$$(make -s cluster-env)": the trainyard and airflow commands of this shell then use the cluster
cluster-env:
	@python scripts/cluster.py env

clean:
	rm -rf .airflow var
