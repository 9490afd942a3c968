#!/usr/bin/env bash
# The CUDA engine on the Debian 13 base (docker/debian_base.py --engine cuda: CPython 3.13, g++,
# patch; CUDA_HOME, LIBRARY_PATH and the NVIDIA_* variables in its config): every package from the
# hash-locked docker/requirements.lock, the CUDA 13.0 compiler, headers and runtime among them;
# the wheels' tree laid out as a toolkit at CUDA_HOME (docker/engine/cuda_toolkit.py); what
# serving never loads removed (docker/engine/prune.py, each path with why); then the
# kit's vLLM patch series (each patch dry-run first; one that does not apply fails the build) and
# its markers checked.
set -euo pipefail
python3.13 -m venv /opt/venv
/opt/kit/docker/engine/pip-locked.sh /opt/kit/docker/requirements.lock
python /opt/kit/docker/engine/cuda_toolkit.py --link "${CUDA_HOME:?the CUDA base sets CUDA_HOME}"
python /opt/kit/docker/engine/prune.py
python /opt/kit/patches/apply_series.py --installed
python /opt/kit/patches/apply_series.py --installed --check
