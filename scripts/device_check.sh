#!/usr/bin/env bash
# The GPU checks, as one run on the device machine (one NVIDIA GPU, its image's torch, no network):
#   here, once:  scripts/device_wheels.sh      (the wheels into .whl/)
#   there:       bash scripts/device_check.sh   (carry [".whl"]; writes the logs and figures into $OUT)
# 1. the GPU test group (tests/gpu: DDP, bf16 and DeepSpeed trainings through the local launcher, their
#    curves with GPU memory and utilisation, the ONNX gate on what the GPU trained), at most TEST_LIMIT s;
# 2. bench/gpu.py: GPT-2 small in bf16 through trainyard's loop against a plain loop, tokens/s and MFU.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD/include PYTHONUNBUFFERED=1 TRAINYARD_HOME=/tmp/trainyard-home
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda)'
    python3 -m pip list 2>/dev/null | grep -iE '^(numpy|pandas|onnx|onnxruntime|onnxscript|tensorboard|scikit-learn|nvidia-ml-py|pydantic|deepspeed) '
} 2>&1 | tee "$OUT/machine.txt"
timeout "${TEST_LIMIT:-330}" python3 -m pytest -p no:cacheprovider -m gpu tests/gpu -v -rA --durations=0 2>&1 |
    tee "$OUT/gpu_tests.log"
tests=${PIPESTATUS[0]}
echo "tests: exit $tests" | tee -a "$OUT/gpu_tests.log"
timeout "${BENCH_LIMIT:-200}" python3 bench/gpu.py --steps "${BENCH_STEPS:-60}" --warmup 15 --out "$OUT/gpu.json" 2>&1 |
    tee "$OUT/bench_gpu.log"
bench=${PIPESTATUS[0]}
echo "bench: exit $bench" | tee -a "$OUT/bench_gpu.log"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]  # the script's status: both passed
