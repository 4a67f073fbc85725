#!/usr/bin/env bash
# One-time (and idempotent) set-up of a fresh machine: venv, packages, Airflow config, database, pools.
# Every `make` target that needs the environment runs this first; re-runs take a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
VENV=$REPO/.venv
UV_VERSION=0.13.8  # the installer; the packages themselves are pinned in requirements.txt / constraints.txt
export AIRFLOW_HOME=${AIRFLOW_HOME:-$REPO/.airflow}
export TRAINYARD_HOME=${TRAINYARD_HOME:-$REPO/var}

log() { printf '[setup %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtualenv $VENV ($($PY --version))"
  "$PY" -m venv "$VENV"
fi
# Horovod 0.28.1 needs a patched C++ build against torch 2.13 (scripts/build_horovod.sh, 1 to 2 minutes on
# 2 cores). Its wheel builds in the background from the moment torch is installed, while the other packages
# install and the Airflow database migrates; it is installed at the end of the set-up.
horovod_pid="" horovod_wheels=$VENV/horovod-wheel horovod_log=$VENV/horovod-build.log
start_horovod_build() {
  "$VENV/bin/python" -c "import horovod.torch" >/dev/null 2>&1 && return 0
  "$REPO/scripts/build_horovod.sh" check  # a missing compiler is said now, not after the other packages
  log "building Horovod in the background (log: $horovod_log)"
  rm -rf "$horovod_wheels"
  # its own process group, so that a set-up that fails first stops the whole build (pip, cmake, make)
  setsid "$REPO/scripts/build_horovod.sh" wheel "$horovod_wheels" >"$horovod_log" 2>&1 &
  horovod_pid=$!
  trap '[ -z "$horovod_pid" ] || kill -- -"$horovod_pid" 2>/dev/null || true' EXIT
}
finish_horovod_build() {
  [ -n "$horovod_pid" ] || return 0
  log "waiting for the Horovod build"
  local status=0
  wait "$horovod_pid" || status=$?
  horovod_pid=""
  [ "$status" -eq 0 ] || { cat "$horovod_log"; echo "setup: the Horovod build failed (log above)" >&2; exit 1; }
  tail -n 1 "$horovod_log"
  "$REPO/scripts/build_horovod.sh" install "$horovod_wheels"
  rm -rf "$horovod_wheels"
}

stamp=$VENV/.installed
if [ ! -f "$stamp" ] || [ requirements.txt -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  # torch through pip, which honours this machine's pip configuration (a local wheel, a CPU index); then
  # the rest through uv: the same pinned set, installed and byte-compiled in parallel (pip takes 10 to 20
  # minutes for it on 2 cores, uv a few). uv keeps the torch already installed, as the pin allows it.
  # setuptools, packaging and numpy are installed with torch: the Horovod build imports them (numpy through
  # torch) while uv installs the rest, so uv must find them already there.
  # uv reads no pip.conf: behind a PyPI mirror, export UV_INDEX_URL (or UV_DEFAULT_INDEX) as well.
  log "installing torch, then the pinned requirements with uv"
  torch_pin=$(grep -m1 '^torch==' requirements.txt)
  "$VENV/bin/pip" install --disable-pip-version-check -q "$torch_pin" "uv==$UV_VERSION" setuptools packaging numpy \
    -c constraints.txt 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  start_horovod_build
  "$VENV/bin/uv" pip install --python "$VENV/bin/python" --compile-bytecode -q -r requirements.txt -c constraints.txt
  "$VENV/bin/uv" pip install --python "$VENV/bin/python" --compile-bytecode -q --no-deps -e .
  "$VENV/bin/pip" check
  touch "$stamp"
else
  start_horovod_build  # seconds when Horovod is already installed
fi
export PATH=$VENV/bin:$PATH

# The cluster profile (make up-cluster) and its tests run PostgreSQL and Redis servers from the Debian
# packages' binaries, started by trainyard itself (so are the scheduler replay's and the ledger tests'
# throwaway PostgreSQL servers, bench/airflow_services.py).
missing=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v bwrap >/dev/null || missing+=(bubblewrap)  # the sandbox's namespaces (trainyard.training.launchers.sandbox)
command -v chromium >/dev/null || missing+=(chromium)  # the UI's browser tests: headless Chromium
command -v chromedriver >/dev/null || missing+=(chromium-driver)  # ... driven by Selenium through its chromedriver
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing ${missing[*]} (apt-get install)"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    log "missing: ${missing[*]}; the cluster profile and its tests need them (Debian: sudo apt-get install ${missing[*]})"
  fi
fi

# Custom commands run as unprivileged sandbox users, which need POSIX ACLs (setfacl) and root to set up
# (trainyard.training.launchers.sandbox); without them custom commands are refused, the rest works.
if [ "$(id -u)" = 0 ] && ! command -v setfacl >/dev/null && command -v apt-get >/dev/null; then
  log "installing setfacl (apt-get install acl) for the custom-command sandbox"
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq acl >/dev/null
fi

"$VENV/bin/python" scripts/render_airflow_cfg.py
log "migrating the Airflow database"
airflow db migrate >"$AIRFLOW_HOME/db-migrate.log" 2>&1 || { cat "$AIRFLOW_HOME/db-migrate.log"; exit 1; }
log "the teams of include/config/resources.yaml as Airflow teams (each owns a DAG bundle)"
airflow teams sync >"$AIRFLOW_HOME/teams-sync.log" 2>&1 || { cat "$AIRFLOW_HOME/teams-sync.log"; exit 1; }
log "making the GPU pools match include/config/resources.yaml"
trainyard pools sync >/dev/null
mkdir -p "$TRAINYARD_HOME"
log "demo model-signing key pair in $TRAINYARD_HOME/keys (created once)"
trainyard models keygen --if-missing >/dev/null
if [ "$(id -u)" = 0 ]; then
  log "sandbox users for custom commands; trainyard's and Airflow's state closed to other users"
  trainyard sandbox setup >/dev/null || log "no sandbox: custom commands will be refused locally (trainyard sandbox check says why)"
else
  log "not root: no sandbox users, so custom commands are refused locally (trainyard sandbox check says why)"
fi
if [ ! -d .mypy_cache ]; then  # once per checkout: a cold lint spends most of its time on the packages
  log "filling mypy's cache with the installed packages the code imports"
  "$VENV/bin/python" scripts/warm_mypy_cache.py >/dev/null || log "mypy's cache not filled: the first lint will take a minute more"
fi
finish_horovod_build
log "ready: AIRFLOW_HOME=$AIRFLOW_HOME TRAINYARD_HOME=$TRAINYARD_HOME"
