# syntax=docker/dockerfile:1
# GLM-5.3-Flash serving image: CUDA 13 devel on Ubuntu 24.04 (pinned by digest), Python 3.12 in a
# virtual environment with every package from the hash-locked docker/requirements.lock (vLLM
# 0.33.0 with the b12x extra, torch 2.14.0 CUDA 13), the kit's vLLM patch series applied and
# checked, and the kit's launcher as the entrypoint. Build with `make build` (it passes the base
# digest from compose/images.lock, the kit commit and the source-lock hash).

# The base is a digest reference from compose/images.lock (BASE_IMAGE); B12X compiles small
# C/C++ pieces at run time, so it is a CUDA devel image (headers and nvcc).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}

ARG BASE_IMAGE
ARG KIT_COMMIT
ARG SOURCE_LOCK_SHA256

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Ubuntu's archive moves under these names; what serving depends on is pinned elsewhere: the base
# image by digest and every Python package by hash.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      ca-certificates patch python3.12 python3.12-dev python3.12-venv \
 && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/opt/kit \
    XDG_CACHE_HOME=/cache \
    VLLM_CACHE_ROOT=/cache/vllm \
    TRITON_CACHE_DIR=/cache/triton \
    TORCHINDUCTOR_CACHE_DIR=/cache/torchinductor \
    CUTE_DSL_CACHE_DIR=/cache/cute-dsl \
    B12X_CACHE_DIR=/cache/b12x \
    HF_HOME=/hf

COPY docker/requirements.lock /opt/kit/docker/requirements.lock
RUN python3.12 -m venv /opt/venv \
 && pip install --no-cache-dir --no-deps --require-hashes -r /opt/kit/docker/requirements.lock

# The patch series: each patch is dry-run first; any that does not apply fails the build.
COPY patches /opt/kit/patches
RUN python /opt/kit/patches/apply_series.py --installed \
 && python /opt/kit/patches/apply_series.py --installed --check

COPY launch /opt/kit/launch
COPY smoke /opt/kit/smoke
COPY docker/source_lock.py docker/selfcheck.py /opt/kit/docker/
RUN python /opt/kit/docker/source_lock.py --base "${BASE_IMAGE}" --commit "${KIT_COMMIT}" \
      --write /opt/kit/source.lock --expect-sha256 "${SOURCE_LOCK_SHA256}" \
 && python /opt/kit/docker/selfcheck.py \
 && python -m launch list

LABEL org.opencontainers.image.title="glm53-serving-kit" \
      org.opencontainers.image.description="vLLM 0.33.0 (patched) with B12X for GLM-5.3-Flash on four RTX PRO 6000 Blackwell GPUs" \
      org.opencontainers.image.revision="${KIT_COMMIT}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.glm53-kit.source-lock.sha256="${SOURCE_LOCK_SHA256}"

VOLUME ["/cache", "/hf"]
EXPOSE 8000
WORKDIR /opt/kit
# A profile name (or PROFILE) is all a user passes; the launcher validates and execs vllm serve.
ENTRYPOINT ["python", "-m", "launch", "run"]
