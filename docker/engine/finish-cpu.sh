#!/usr/bin/env bash
# The CPU profile's model, made and checked at build time (no weights can be downloaded where
# this image is tested): docker/tiny_model.py trains it on the smoke check's own prompts.
set -euo pipefail
python /opt/kit/docker/tiny_model.py --out /opt/models/kit-tiny-chat
