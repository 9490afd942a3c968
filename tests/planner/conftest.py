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


@pytest.fixture(scope="session")
def real_specs(tmp_path_factory):
    """GLM-5.3's specs built by vLLM's own layers (capacity/glm53_specs.py) for the two
    qualified shapes: seed 004's TP4/DCP1 with 3 MTP tokens at 512-token split pages, and seed
    000's TP4/DCP4 with 7 DFlash tokens at the 2,304-token block. Built once per session."""
    from capacity.glm53_specs import Shape, build

    work = tmp_path_factory.mktemp("glm53-specs")
    return {
        "mtp3": build(Shape(tp=4, dcp=1, spec_tokens=3, block_size=512), work),
        "dflash": build(Shape(tp=4, dcp=4, spec_tokens=7, block_size=2304), work),
    }
