#!/usr/bin/env bash
# The CPU profile's model, made and checked at build time (no weights can be downloaded where
# this image is tested): docker/tiny_model.py trains it on the smoke check's own prompts. Its
# files are made readable for the unprivileged user the server runs as (safetensors writes 0600).
set -euo pipefail
python /opt/kit/docker/tiny_model.py --out /opt/models/kit-tiny-chat
chmod -R a+rX /opt/models
