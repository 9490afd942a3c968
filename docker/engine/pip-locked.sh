#!/usr/bin/env bash
# pip-locked.sh LOCK [PIP ARGS...]: install every package of a hash-locked requirements file into
# the active venv (--no-deps --require-hashes: the lock is the whole environment). A test build
# behind the host's TLS-inspecting proxy trusts the host's extra CA certificates, which
# docker/build.py serves at BUILD_INPUTS (--trust-host-ca; never a release image), for this step
# only: they are removed again before the RUN ends, so no layer holds them.
set -euo pipefail
lock="$1"
shift
extra_ca=/usr/local/share/ca-certificates/kit-build
if [[ -n "${BUILD_INPUTS:-}" ]]; then
  python /opt/kit/docker/engine/build_inputs.py "$BUILD_INPUTS" "$extra_ca"
fi
if [[ -d "$extra_ca" ]]; then
  update-ca-certificates
fi
PIP_CERT=/etc/ssl/certs/ca-certificates.crt pip install --no-cache-dir --no-deps --require-hashes \
  "$@" -r "$lock"
if [[ -d "$extra_ca" ]]; then
  rm -rf "$extra_ca"
  update-ca-certificates --fresh
fi
