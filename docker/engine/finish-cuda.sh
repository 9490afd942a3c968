#!/usr/bin/env bash
# The CUDA profiles serve GLM-5.3-Flash weights from the Hugging Face cache volume (/hf), pinned
# by revision in the profile; nothing is added to the image after the kit layer.
set -euo pipefail
test -d /opt/kit/patches/vllm
