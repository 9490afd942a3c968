"""Seed 000's DFlash server as the qualified runtime laid out its KV cache, for vLLM's planner.

Seed 000's figures (906 blocks at 12 GiB; 5,688,681 tokens with the 1,152-token draft block,
5,974,904 with 2,304; 7,900,591 at '15.87 GiB') come out of vLLM 0.34.0's engine core sizing
(`make capacity`'s) when the caches are laid out as that runtime laid them out. What is vLLM's,
what is the runtime's, and where each value comes from:

- TARGET: vLLM's GLM-5.3 layers at TP4/DCP4 and the 2,304-token block (capacity/glm53_specs.py),
  with the runtime's latent rows (`runtime_latent`), without vLLM's tail-ring cache (the runtime
  logs two physical page sizes, target and recurrent) and built with the Triton KDA prefill, so
  a recurrent layer keeps 2 + 7 speculative blocks per request and no FlashKDA checkpoint block
  (seed 000's command line sets no KDA prefill backend; with the checkpoint block neither
  vLLM's recurrent partition nor the runtime's gives the 167 and 159 blocks per request the
  seed's figures need).
- RECURRENT PARTITION: the runtime's, `runtime_partition`, declared through vLLM's hook for a
  model's own grouping (`RuntimeGrouping`): recurrent layers grouped by the
  target's attention-layer count (the fork's #602: 'grouped primarily by layer count', baseline
  [9, 9, 8, 8, 11]). With the draft's group that is six groups, the seed's logged 'effective
  cache-group CP sizes (4,4,4,4,4,1)'. vLLM 0.34.0 groups the same 34 layers [12, 11, 11].
- DRAFT: the DFlash2 draft's layers from its public facts (`capacity.glm53_specs.DFLASH2` says
  where each comes from): 5 sliding-window layers, window 2,048, 8 KV heads of 128 (2 per rank
  at TP4), BF16 (seed 000: DFLASH_KV_CACHE_DTYPE=auto): 1,024 bytes per token per layer. Its
  block, 1,152, is the fork's FLASH_ATTN selection (seed 000's '1152 control'); vLLM 0.34.0's
  own `Attention` layer already picks the target's 2,304 when it builds the spec
  (`_largest_kernel_block_within(..., divisor_of=block_size)`; `make capacity` builds it so).
- SCHEDULER: MAX_NUM_BATCHED_TOKENS=8192 (seed 000) with asynchronous scheduling (vLLM's default
  for this server), so a window holds 2,047 + 2 x 8,192 tokens: 17 blocks of 1,152, 9 of 2,304.

Per 1,048,576-token request: 114 target + 4 x 9 recurrent + 17 or 9 draft = 167 or 159 blocks.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
from vllm.config import VllmConfig
from vllm.v1.kv_cache_interface import (
    CircularBufferSpec,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

from capacity.glm53_specs import (
    DFLASH2,
    Shape,
    build,
    draft_name,
    runtime_latent,
    text_config,
    vllm_config,
)
from launch.glm53 import GLM53, RUNTIME_TARGET_BLOCK

MILLION = 1_048_576
TARGET_BLOCK = RUNTIME_TARGET_BLOCK
DRAFT_BLOCK = 1152
"""Seed 000: 'Replicated draft block 1152 control', '2304 planner alignment'."""
MAX_NUM_BATCHED_TOKENS = 8192
"""Seed 000's runtime configuration."""
SHAPE = Shape(tp=4, dcp=4, spec_tokens=7, block_size=TARGET_BLOCK, max_model_len=MILLION,
              kda_prefill_backend="triton")  # fmt: skip


def draft(layers: int = DFLASH2.layers, block: int = DRAFT_BLOCK, window: int = DFLASH2.window,
          spec: type = SlidingWindowSpec) -> dict[str, KVCacheSpec]:  # fmt: skip
    """The draft's replicated caches at TP4 as vLLM 0.34.0's runner makes a DCP-1 draft's specs
    (`dcp_sharded=False`), with the fork's block unless told otherwise."""
    extra = {"sliding_window": window} if spec is SlidingWindowSpec else {}
    return {draft_name(i): spec(
        block_size=block, num_kv_heads=DFLASH2.kv_heads // SHAPE.tp,
        head_size=DFLASH2.head_size, dtype=torch.bfloat16, is_draft=True, dcp_sharded=False,
        **extra) for i in range(layers)}  # fmt: skip


def target(work: Path) -> dict[str, KVCacheSpec]:
    """The target's caches as the runtime kept them (see the module docstring)."""
    specs = runtime_latent(build(SHAPE, work))
    return {n: s for n, s in specs.items() if not isinstance(s, CircularBufferSpec)}


class RuntimeGrouping:
    """The runtime's grouping, declared the way vLLM lets a model declare its own
    (`SupportsKVCacheGrouping`: the engine core's planner asks the model class for its groups,
    then checks they partition the layers): vLLM's default grouping (with patch 0001 when the
    series is in), the recurrent layers then regrouped as the runtime grouped them."""

    @staticmethod
    def get_kv_cache_groups(vllm_config: VllmConfig,
                            specs: dict[str, KVCacheSpec]) -> list[KVCacheGroupSpec]:  # fmt: skip
        import vllm.v1.core.kv_cache_planning as planning

        return runtime_partition(planning.get_kv_cache_groups(vllm_config, specs))


def config() -> VllmConfig:
    served = vllm_config(SHAPE, text_config())
    served.speculative_config = None
    served.device_config.device_type = "cuda"
    served.scheduler_config.max_num_batched_tokens = MAX_NUM_BATCHED_TOKENS
    served.scheduler_config.async_scheduling = True
    model = served.model_config
    model.supports_kv_cache_grouping = True
    model.architectures = [model.architecture]
    model.registry = SimpleNamespace(resolve_model_cls=lambda *_: (RuntimeGrouping, GLM53))
    return served


def runtime_partition(groups: list[KVCacheGroupSpec]) -> list[KVCacheGroupSpec]:
    """vLLM's groups with the recurrent layers regrouped as the runtime grouped them: as many
    groups as it takes to hold them at the target's attention-layer count each, the layers
    dealt out evenly in vLLM's order (34 beside 11: [9, 9, 8, 8])."""
    def specs_of(group: KVCacheGroupSpec) -> dict[str, KVCacheSpec]:
        inner = getattr(group.kv_cache_spec, "kv_cache_specs", None)
        return inner or {n: group.kv_cache_spec for n in group.layer_names}

    recurrent = [g for g in groups if all(isinstance(s, MambaSpec)
                                          for s in specs_of(g).values())]  # fmt: skip
    specs = {n: s for g in recurrent for n, s in specs_of(g).items()}
    layers = [n for g in recurrent for n in g.layer_names]
    attention_layers = len({n.rsplit(".self_attn", 1)[0] for g in groups if g not in recurrent
                            for n in g.layer_names if not n.startswith("draft.")})  # fmt: skip
    count = -(-len(layers) // attention_layers)
    sizes = [len(layers) // count + (i < len(layers) % count) for i in range(count)]
    parts, start = [], 0
    for size in sizes:
        parts.append(layers[start:start + size])
        start += size
    return [g for g in groups if g not in recurrent] + [
        KVCacheGroupSpec(p, UniformTypeKVCacheSpecs.from_specs({n: specs[n] for n in p}))
        for p in parts]  # fmt: skip


def served_capacity(specs: dict[str, KVCacheSpec], budgets: list[int]) -> dict:
    """The engine core's sizing (`make capacity`'s, `capacity.engine_plan`) by the installed
    vLLM, patched or not, on `specs` at each budget, with the runtime's grouping."""
    from capacity.engine_plan import EnginePlan, engine_plan

    out: dict = {"budgets": []}
    for budget in budgets:
        plan = engine_plan(config(), specs, budget)
        assert isinstance(plan, EnginePlan), plan
        out["groups"] = [[g.layers, g.block_size, g.cp_size] for g in plan.geometry.groups
                         if g.role not in ("indexer",)]  # latent+indexer share one group
        out["draft_block"] = plan.geometry.block_sizes["draft"]
        out["budgets"].append({"budget": budget, "blocks": plan.num_blocks,
                               "tokens": plan.tokens, "concurrency": plan.max_concurrency})
    return out
