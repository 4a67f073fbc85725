#!/usr/bin/env bash
# The wheels the GPU checks (scripts/device_check.sh: the GPU test group and bench/gpu.py) need on the
# device machine beyond its image (torch, numpy, scikit-learn, onnx, onnxruntime, tensorboard are there), at
# the versions constraints.txt pins, for its Python 3.12 on x86-64 Linux, into .whl/ (git-ignored):
# pydantic (the JobSpec), lmdb (the prepared data), great_expectations with what it needs and the image
# lacks (the data preparation's leakage check), pandas at our pin, and DeepSpeed, which PyPI has as an
# sdist only: its wheel is built here without its compiled ops (they build on first use, as pip's does).
set -euo pipefail
cd "$(dirname "$0")/.."
names=(pydantic pydantic_core annotated-types typing-inspection lmdb pandas great_expectations altair cffi
    cryptography jsonschema jsonschema-specifications marshmallow mistune pycparser referencing rpds-py
    ruamel.yaml tzdata tzlocal hjson)
pins=()
for name in "${names[@]}"; do
    pattern="^$(sed 's/[-_.]/[-_.]/g' <<<"$name")=="
    pin=$(grep -iE "$pattern" constraints.txt) || { echo "constraints.txt pins no ${name}" >&2; exit 1; }
    pins+=("$pin")
done
rm -rf .whl && mkdir .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${pins[@]}"
deepspeed=$(grep -i "^deepspeed==" constraints.txt)
DS_BUILD_OPS=0 .venv/bin/python -m pip wheel --quiet --no-deps --no-build-isolation -w .whl "$deepspeed"
du -sh .whl
