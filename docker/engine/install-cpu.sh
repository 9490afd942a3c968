#!/usr/bin/env bash
# The CPU engine: Debian 12's Python 3.11, vLLM's CPU build and its dependencies from the
# hash-locked docker/requirements-cpu.lock (torch 2.13.0+cpu, which PyPI does not serve, from the
# wheel docker/build.py serves at BUILD_INPUTS for this build), the metadata alias vLLM's CLI
# needs, and the runtime libraries the CPU worker loads (libnuma) and TorchInductor compiles
# with (g++).
set -euo pipefail
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
  ca-certificates g++ libnuma1 python3 python3-venv
rm -rf /var/lib/apt/lists/*
python3 -m venv /opt/venv
served=()
if [[ -n "${BUILD_INPUTS:-}" ]]; then
  # plain HTTP on the bridge for this build only; --require-hashes vouches for what it serves
  address="${BUILD_INPUTS#http://}"
  served=(--find-links "${BUILD_INPUTS}wheels/" --trusted-host "${address%%/*}")
fi
/opt/kit/docker/engine/pip-locked.sh /opt/kit/docker/requirements-cpu.lock "${served[@]}"
python /opt/kit/docker/engine/vllm_dist_alias.py
