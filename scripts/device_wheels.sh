#!/usr/bin/env bash
# The wheels bench/gpu.py needs on the device machine beyond its image (torch is there; pydantic, which
# trainyard's JobSpec is made of, is not), at the versions constraints.txt pins, for its Python 3.12 on
# x86-64 Linux, into .whl/ (git-ignored). The command to run there is in bench/gpu.py's docstring.
set -euo pipefail
cd "$(dirname "$0")/.."
pins=()
for name in pydantic pydantic_core annotated-types typing-inspection; do
    pin=$(grep -i "^${name}==" constraints.txt) || { echo "constraints.txt pins no ${name}" >&2; exit 1; }
    pins+=("$pin")
done
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${pins[@]}"
ls .whl
