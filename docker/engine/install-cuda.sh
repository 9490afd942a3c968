#!/usr/bin/env bash
# The CUDA engine: Python 3.12 on the CUDA 13 devel base, every package from the hash-locked
# docker/requirements.lock, then the kit's vLLM patch series (each patch dry-run first; one that
# does not apply fails the build) and its markers checked.
set -euo pipefail
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
  ca-certificates patch python3.12 python3.12-dev python3.12-venv
rm -rf /var/lib/apt/lists/*
python3.12 -m venv /opt/venv
pip install --no-cache-dir --no-deps --require-hashes -r /opt/kit/docker/requirements.lock
python /opt/kit/patches/apply_series.py --installed
python /opt/kit/patches/apply_series.py --installed --check
rm -rf /tmp/build-inputs
