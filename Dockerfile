# The trainer image: what the Kubernetes launcher runs in every pod (trainyard.TRAINER_IMAGE, the default of
# kubernetes.image). Build it with `make image`, which tags it from trainyard.TRAINER_IMAGE.
#
# Contents: this repository's package (include/ installed as `trainyard`, editable as on the Airflow worker,
# so include/config resolves the same way), exactly requirements.txt under constraints.txt, and Horovod
# 0.28.1 built by scripts/build_horovod.sh (the same script `make setup` runs). The pods override the
# command with their own argv (`torchrun ... -m trainyard.training.entry ...`), so there is no ENTRYPOINT.
# tests/unit/test_dockerfile.py checks this file without a Docker engine.
#
# torch: requirements.txt pins torch==2.13.0 and this project runs and tests the CPU wheel (2.13.0+cpu).
# TORCH_VARIANT picks the wheel index of that same version: `cpu` (the default) or a CUDA build for GPU
# nodes, e.g. `docker build --build-arg TORCH_VARIANT=cu128 ...`. The pin does not change; `==2.13.0`
# matches 2.13.0+<variant>, and a local version sorts after the public one, so pip takes the variant
# wheel from that index over PyPI's; the build fails below if it did not. Horovod stays the Gloo/CPU build
# in either case (build_horovod.sh builds no CUDA operations; that would need a CUDA devel base image).

# The minor version must satisfy pyproject's requires-python and match the cp311 wheels constraints.txt
# was resolved with; patch releases of the base image are security fixes.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_VARIANT=cpu
# Compilers and CMake for the Horovod build; they stay in this stage.
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake \
    && rm -rf /var/lib/apt/lists/*
ENV VENV=/opt/venv \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN python -m venv "$VENV"
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /opt/trainyard

# Requirements first: this layer is rebuilt only when the pins change, not on every code change.
COPY requirements.txt constraints.txt ./
RUN pip install --extra-index-url "https://download.pytorch.org/whl/${TORCH_VARIANT}" \
        -r requirements.txt -c constraints.txt \
    && python -c "import torch; assert torch.__version__.endswith('+${TORCH_VARIANT}'), torch.__version__"

# Horovod needs torch installed (it builds against the venv's torch headers); VENV tells the script where.
COPY scripts/build_horovod.sh scripts/
RUN scripts/build_horovod.sh

COPY pyproject.toml ./
COPY include/ include/
RUN pip install --no-deps -e . && pip check


FROM ${PYTHON_IMAGE}
# uid 50000, gid 0: the user of the official Airflow image, so files that the Airflow worker and the pods
# write on the shared data PVC (TRAINYARD_HOME) are readable and writable by both.
ARG TRAINER_UID=50000
RUN useradd --uid "${TRAINER_UID}" --gid 0 --create-home --shell /bin/bash trainyard \
    && mkdir -p /var/trainyard \
    && chown "${TRAINER_UID}:0" /var/trainyard \
    && chmod 0775 /var/trainyard
# Same paths as in the build stage: the venv's scripts and the editable install point at them.
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/trainyard /opt/trainyard
ENV PATH=/opt/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/venv \
    PYTHONUNBUFFERED=1 \
    TRAINYARD_HOME=/var/trainyard
# The runtime stage has no compilers: prove the compiled parts load here, not in the first pod.
RUN python -c "import horovod.torch, deepspeed, trainyard.training.entry" && torchrun --help >/dev/null
WORKDIR /opt/trainyard
USER ${TRAINER_UID}:0
CMD ["trainyard", "--help"]
