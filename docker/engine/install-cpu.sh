#!/usr/bin/env bash
# The CPU engine: Debian 12's Python 3.11, vLLM's CPU build and its dependencies from the
# hash-locked docker/requirements-cpu.lock (torch 2.13.0+cpu from docker/build-inputs/wheels when
# PyPI does not serve it), the metadata alias vLLM's CLI needs, and the runtime libraries the
# CPU worker loads (libnuma) and TorchInductor compiles with (g++).
set -euo pipefail
inputs=/tmp/build-inputs
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
  ca-certificates g++ libnuma1 python3 python3-venv
rm -rf /var/lib/apt/lists/*
extra_ca=("$inputs"/ca/*.crt)
if [[ -e "${extra_ca[0]}" ]]; then
  # a test build behind the host's TLS-inspecting proxy only (docker/build.py --trust-host-ca)
  cp "${extra_ca[@]}" /usr/local/share/ca-certificates/
  update-ca-certificates
fi
python3 -m venv /opt/venv
PIP_CERT=/etc/ssl/certs/ca-certificates.crt pip install --no-cache-dir --no-deps --require-hashes \
  --find-links "$inputs/wheels" -r /opt/kit/docker/requirements-cpu.lock
python /opt/kit/docker/engine/vllm_dist_alias.py
if [[ -e "${extra_ca[0]}" ]]; then
  for crt in "${extra_ca[@]}"; do rm -f "/usr/local/share/ca-certificates/$(basename "$crt")"; done
  update-ca-certificates --fresh
fi
rm -rf "$inputs"
