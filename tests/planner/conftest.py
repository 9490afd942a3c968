"""The planner tests need the patched vLLM copy first on PYTHONPATH; refuse anything else."""

from __future__ import annotations

import pytest
import vllm.platforms.interface as interface

if not hasattr(interface, "glm53_split_block_sizes"):
    pytest.exit(
        f"tests/planner needs the patched vLLM; imported {interface.__file__}. "
        "Run `make test` (it builds .venv/vllm-patched and sets PYTHONPATH).",
        returncode=3,
    )
