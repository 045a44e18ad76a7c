# syntax=docker/dockerfile:1
# ShardMeter images. Two targets, one wheel:
#   docker build --target operator -t ghcr.io/shardmeter/operator:0.1.0 .
#   docker build --target bench    -t ghcr.io/shardmeter/bench:0.1.0 .
# tests/test_dockerfile.py checks this file (targets, non-root numeric USER, pinned bases,
# entrypoints) and lints it with hadolint.

# Pinned bases (never `latest`). The bench base is a CUDA build of PyTorch: its torch is kept.
# torchtitan 0.3.0 needs torch >= 2.11 (its torch_checkpointing dependency says so).
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm
ARG TORCH_IMAGE=pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime
# The islands' trainer; the Makefile pins the same version (tests parse flags with it).
ARG TORCHTITAN_VERSION=0.3.0

# ---- builder: the project's wheel (pure Python: shardmeter, shardmeter_operator, shardmeter_bench)
FROM ${PYTHON_IMAGE} AS builder
WORKDIR /src
COPY pyproject.toml README.md ./
COPY shardmeter ./shardmeter
COPY operator ./operator
COPY bench-job ./bench-job
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && ls /wheels/shardmeter-*.whl

# ---- operator: slim Python, the `operator` extra (kopf, kubernetes, prometheus-client,
# cryptography for the admission webhook's self-signed certificate), no torch
FROM ${PYTHON_IMAGE} AS operator
# PYTHONSAFEPATH: `python -m` does not put the working directory on sys.path.
# PYTHONDONTWRITEBYTECODE: nothing is written at run time (read-only root filesystem); the
# wheel's modules are byte-compiled at install time instead. /tmp is the only writable path
# (an emptyDir in the Helm chart); MPLCONFIGDIR points there should matplotlib ever load.
ENV PYTHONSAFEPATH=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib
COPY --from=builder /wheels /wheels
# The project's own wheel file (pinned by construction); its dependencies follow the ranges of
# pyproject.toml, as for a `pip install shardmeter[operator]`.
# hadolint ignore=DL3013
RUN set -eux; \
    wheel="$(ls /wheels/shardmeter-*.whl)"; \
    pip install --no-cache-dir "${wheel}[operator]"; \
    rm -rf /wheels; \
    if python -c "import torch" 2>/dev/null; then echo "torch must not be in the operator image" >&2; exit 1; fi; \
    python -c "import shardmeter_operator.__main__"; \
    python -c "from shardmeter_operator.admission.webhook import self_signed_certificate as c; c(['localhost'])"; \
    groupadd --system --gid 10001 shardmeter; \
    useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin shardmeter
WORKDIR /tmp
USER 10001:10001
# Metrics (Prometheus) and kopf's liveness endpoint (/healthz).
EXPOSE 9090 8080
ENTRYPOINT ["python", "-m", "shardmeter_operator"]

# ---- bench: CUDA PyTorch base; the `bench` extra (torchft) and torchtitan are installed
# around the image's own torch. The image runs the benchmark Job, the islands of a launched
# plan (torchrun -m torchtitan.train --module shardmeter_torchtitan …) and their torchft
# lighthouse (torchft_lighthouse).
FROM ${TORCH_IMAGE} AS bench
ARG TORCHTITAN_VERSION
ENV PYTHONSAFEPATH=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib \
    HF_HOME=/tmp/huggingface \
    TRITON_CACHE_DIR=/tmp/triton
COPY --from=builder /wheels /wheels
# A constraint pinning torch to the version already installed: pip keeps the image's CUDA build
# (or fails) instead of replacing it with a PyPI wheel; the check after it proves it.
RUN set -eux; \
    torch_before="$(python -c 'import torch; print(torch.__version__)')"; \
    echo "torch==${torch_before}" > /tmp/torch-constraint.txt; \
    wheel="$(ls /wheels/shardmeter-*.whl)"; \
    pip install --no-cache-dir --constraint /tmp/torch-constraint.txt "${wheel}[bench]" \
        "torchtitan==${TORCHTITAN_VERSION}"; \
    rm -rf /wheels /tmp/torch-constraint.txt; \
    test "$(python -c 'import torch; print(torch.__version__)')" = "${torch_before}"; \
    python -c "import torch; assert torch.version.cuda, 'the bench image needs a CUDA build of torch'"; \
    python -c "import shardmeter_bench, torchft, shardmeter_torchtitan.config_registry"; \
    torchft_lighthouse --help > /dev/null; \
    groupadd --system --gid 10001 shardmeter; \
    useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin shardmeter
WORKDIR /tmp
USER 10001:10001
ENTRYPOINT ["python", "-m", "shardmeter_bench"]
