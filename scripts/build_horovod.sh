#!/usr/bin/env bash
# Build Horovod 0.28.1 (its last release) into the project's venv, CPU only (Gloo, PyTorch).
#
# The published sdist does not compile against torch >= 2.x headers: CMakeLists.txt and
# horovod/torch/CMakeLists.txt ask for C++14, torch's headers need C++17. We patch those two lines and
# build a wheel from the PyPI sdist with the venv's own torch (--no-build-isolation): 67 C++ files, 65 s
# on an idle 2-core machine, about 100 s beside the rest of a fresh clone's set-up (2026-12-01; the 18 min
# measured before were with other jobs on the same 2 cores).
#
#   build_horovod.sh              build the wheel and install it; exits at once if `import horovod.torch` works
#   build_horovod.sh wheel DIR    only build the wheel into DIR. It needs torch (with numpy), setuptools and
#                                 packaging in the venv and nothing else, so scripts/setup.sh runs it while
#                                 the other packages install.
#   build_horovod.sh install DIR  install the wheel that `wheel DIR` built, with its runtime dependencies,
#                                 and check that it loads
#   build_horovod.sh check        exit 1, naming it, if a tool the build needs (cmake, c++, make) is missing
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
VENV=${VENV:-$REPO/.venv}
PY=$VENV/bin/python
PIP=("$PY" -m pip --disable-pip-version-check)
VERSION=0.28.1
USAGE="usage: $0 [wheel DIR | install DIR | check]"

log() { printf '[build_horovod %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
quiet_pip() { grep -v "is ignored: it is neither a file nor a directory" || true; }

check_tools() {
  local tool
  for tool in cmake c++ make; do
    command -v "$tool" >/dev/null || {
      echo "build_horovod: '$tool' not found; install it (Debian: apt-get install cmake g++ make)" >&2
      exit 1
    }
  done
}

build_wheel() {
  local out=$1 started work src
  started=$(date +%s)
  check_tools
  work=$(mktemp -d "${TMPDIR:-/tmp}/horovod-build.XXXXXX")
  # shellcheck disable=SC2064  # expand now: $work is local
  trap "rm -rf '$work'" EXIT

  log "downloading the horovod==$VERSION sdist"
  "${PIP[@]}" download -q --no-deps --no-binary :all: "horovod==$VERSION" -d "$work" 2>&1 | quiet_pip
  tar -xzf "$work/horovod-$VERSION.tar.gz" -C "$work"
  src=$work/horovod-$VERSION

  # patch FILE OLD NEW: replace an exact line, and fail loudly if it is not there (a different sdist).
  patch_line() {
    local file=$src/$1 old=$2 new=$3
    if ! grep -qxF "$old" "$file"; then
      echo "build_horovod: expected line not found in $1: '$old' (is this really horovod $VERSION?)" >&2
      exit 1
    fi
    sed -i "s/^${old}\$/${new}/" "$file"
    grep -qxF "$new" "$file" || { echo "build_horovod: patching $1 failed" >&2; exit 1; }
  }
  log "patching CMake files: C++14 -> C++17 (torch headers need C++17)"
  patch_line CMakeLists.txt 'set(CMAKE_CXX_STANDARD 14)' 'set(CMAKE_CXX_STANDARD 17)'
  patch_line horovod/torch/CMakeLists.txt '    set(CMAKE_CXX_STANDARD 14)' '    set(CMAKE_CXX_STANDARD 17)'
  # setup.py builds RelWithDebInfo (-O3 -g): debug info over torch's headers is much of the compile time and
  # of no use here, so the C++ build type flags become -O3 without -g.
  log "patching CMake files: no debug info (-g) in the C++ build"
  patch_line CMakeLists.txt \
    'string(REPLACE "-O2" "-O3" CMAKE_CXX_FLAGS_RELWITHDEBINFO "${CMAKE_CXX_FLAGS_RELWITHDEBINFO}")' \
    'string(REPLACE "-O2 -g" "-O3" CMAKE_CXX_FLAGS_RELWITHDEBINFO "${CMAKE_CXX_FLAGS_RELWITHDEBINFO}")'

  log "building the wheel (PyTorch + Gloo, no MPI/TensorFlow/MXNet; 1 to 2 minutes on 2 cores)"
  HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
    HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=GLOO \
    MAKEFLAGS=${MAKEFLAGS:--j$(nproc 2>/dev/null || echo 2)} \
    "${PIP[@]}" wheel -q --no-build-isolation --no-deps --no-cache-dir -w "$out" "$src" 2>&1 | quiet_pip
  log "horovod $VERSION wheel built in $(($(date +%s) - started))s"
}

install_wheel() {
  local built missing
  built=("$1"/horovod-"$VERSION"-*.whl)
  [ -f "${built[0]}" ] || { echo "build_horovod: no horovod-$VERSION wheel in $1 (did 'wheel $1' fail?)" >&2; exit 1; }
  # --force-reinstall: pip skips a wheel of the version already installed, and a rebuild (say for a new
  # torch) is exactly that case
  "${PIP[@]}" install -q --no-deps --force-reinstall "${built[0]}" 2>&1 | quiet_pip
  # Runtime dependencies (setup.py's require_list); all are normally already in the venv via requirements.txt.
  missing=$("$PY" - <<'EOF'
import importlib.util
mods = {"cloudpickle": "cloudpickle", "psutil": "psutil", "yaml": "pyyaml", "packaging": "packaging", "cffi": "cffi"}
print(" ".join(pkg for mod, pkg in mods.items() if importlib.util.find_spec(mod) is None))
EOF
  )
  if [ -n "$missing" ]; then
    log "installing missing runtime dependencies: $missing"
    local constraints=()
    [ -f constraints.txt ] && constraints=(-c constraints.txt)
    # shellcheck disable=SC2086
    "${PIP[@]}" install -q "${constraints[@]}" $missing
  fi
  "$PY" -c "import horovod.torch" || { echo "build_horovod: horovod installed but 'import horovod.torch' fails" >&2; exit 1; }
  "$VENV/bin/horovodrun" --check-build
  log "horovod $VERSION installed in $VENV"
}

case ${1:-} in
  "")
    if "$PY" -c "import horovod.torch" >/dev/null 2>&1; then
      log "horovod $("$PY" -c 'import horovod; print(horovod.__version__)') already importable in $VENV; nothing to do"
      exit 0
    fi
    wheels=$(mktemp -d "${TMPDIR:-/tmp}/horovod-wheel.XXXXXX")
    trap 'rm -rf "$wheels"' EXIT
    (build_wheel "$wheels")
    install_wheel "$wheels"
    ;;
  check) check_tools ;;
  wheel | install)
    [ $# -eq 2 ] || { echo "$USAGE" >&2; exit 2; }
    mkdir -p "$2"
    if [ "$1" = wheel ]; then build_wheel "$2"; else install_wheel "$2"; fi
    ;;
  *)
    echo "$USAGE" >&2
    exit 2
    ;;
esac
