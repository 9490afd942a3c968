"""`make patches-report`: tokens and blocks with vLLM's automatic alignment and with 0002.

Planner-level evidence only: hand-written seed-shaped specs (tests/planner/seed_shapes.py says
how they differ from the ones vLLM builds) at a 12 GiB budget. The seeds' server-level
capacities were measured on GPUs with the full model's cache groups and their own memory
budgets; these figures are not those and are not compared.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from capacity.glm53_specs import KV_LAYOUT, Shape, build
from launch.vllm_vocab import VLLM_VERSION
from tests.planner.planning import Plan, plan
from tests.planner.seed_shapes import TWELVE_GIB, mtp_auto_alignment, mtp_split_seed, vllm_config


def row(label: str, result: Plan, layer: str) -> str:
    return (
        f"  {label:<34} block {result.block_size_of(layer):>5}  stride {result.stride:>11,} B  "
        f"blocks {result.config.num_blocks:>6,}  tokens {result.tokens:>11,}"
    )


def main() -> None:
    print(f"KV cache planner, vLLM {VLLM_VERSION} CPU, {TWELVE_GIB:,} bytes (12 GiB), "
          f"{KV_LAYOUT} layout")
    print("0002 GLM-5.3 split pages: seed 004 shape, TP4/DCP1 MTP3, 262,144 tokens")
    target = "model.layers.3.self_attn"
    config = vllm_config(max_model_len=262_144)
    auto = plan(config, mtp_auto_alignment())
    os.environ["VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE"] = "512"
    os.environ["VLLM_GLM53_SPLIT_MAMBA_BLOCK_SIZE"] = "512"
    split = plan(config, mtp_split_seed())
    print(row("automatic 2,304-token alignment", auto, target))
    print(row("with 0002, 512/512 split pages", split, target))
    print("  seed 004's servers reported 1,265,215 tokens (split) and 4,412,757 (automatic) with")
    print("  the full model's cache groups and their own budget; those are not reproduced here")
    print(f"0002 on the specs vLLM {VLLM_VERSION}'s layers build (capacity/glm53_specs.py), "
          "512/512:")
    with tempfile.TemporaryDirectory() as work:
        real = build(Shape(tp=4, dcp=1, spec_tokens=3, block_size=512), Path(work))
    print(row("the SM120 backend's latent (the runtime's 528-byte row)", plan(config, real),
              "model.layers.3.self_attn.mla_attn"))  # fmt: skip


if __name__ == "__main__":
    main()
