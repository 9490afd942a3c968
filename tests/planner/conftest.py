"""The planner tests need the patched vLLM copy first on PYTHONPATH; refuse anything else."""

from __future__ import annotations

import pytest
import vllm.v1.core.kv_cache_planning as planning

if not hasattr(planning, "_align_replicated_window_groups"):
    pytest.exit(
        f"tests/planner needs the patched vLLM; imported {planning.__file__}. "
        "Run `make test` (it builds .venv/vllm-patched and sets PYTHONPATH).",
        returncode=3,
    )
