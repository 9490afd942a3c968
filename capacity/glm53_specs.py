"""GLM-5.3's KV cache specs as vLLM builds them, on the CPU: `make capacity`'s and the
planner tests' specs (no checkpoint or GPU is needed, only vLLM's layer classes).

One process per tensor-parallel rank joins a gloo world (as vLLM's workers do); each constructs
vLLM's own layers for one sparse-MLA position (its `Indexer`, which owns the C4 indexer cache and
the tail ring) and one gated-delta position (`Glm5NextLinearAttention`), and the model runner's
spec path (`vllm.v1.worker.gpu.attn_utils.get_kv_cache_spec`, which applies each backend's
`customize_spec`) collects them. Rank 0 writes them out, named after `Glm5NextConfig`'s
`layer_types` (45 layers: 11 sparse-MLA, 34 gated-delta). With a DFlash2 draft
(`--draft-backend`), one of its sliding-window layers is vLLM's `Attention` built beside them
(`DFLASH2`: its shape from public facts, the checkpoint's config not being at hand) and named
for each of the draft's layers, replicated over the DCP ranks when vLLM keeps it so.

Stand-ins, each for something that cannot run here, and nothing else:
- the KDA prefill backend: FlashKDA's kernels are CUDA-only, so the gated-delta layer is built
  on the CPU and then given the backend an SM120 GPU resolves the server's choice to
  (`gpu_kda_backend`: vLLM's own resolution asked with a CUDA stand-in); its spec (the
  prefill-checkpoint block FlashKDA keeps) is then the layer's own `get_kv_cache_spec`;
- the `vllm.models.glm5next` package's `__init__` is skipped (it imports the model class, whose
  multimodal processor imports torchvision, which has no build for this CPU torch); the layer
  modules themselves are vLLM's;
- `model_config` is a namespace holding the checkpoint's text config (vLLM's ModelConfig inspects
  the model class, the same torchvision import);
- the MLA latent: `MLAAttention` cannot be built here (the CPU platform refuses sparse attention,
  and the SM120 sparse-MLA backend needs FlashInfer's CUDA kernels), so its spec is
  `MLAAttention.get_kv_cache_spec` on an instance holding what `__init__` sets: the KV dtype as
  that backend stores it (vLLM's own `_canonicalize_sparse_mla_kv_cache_dtype`) and the
  backend's implementation class, which states the latent row (vLLM 0.34.0's SM120 backend:
  528 bytes for GLM-5.3, the qualified runtime's format).
Checkpoint values transformers' defaults lack: `num_nextn_predict_layers` 1 (one MTP layer, built
with `--mtp-layers` as the drafter adds it), `index_kpool` 4 (GLM-5.3-Flash's; the default is
16), `mla_use_nope` true (`qk_rope_head_dim` is 0) and `indexer_rope_interleave` false (no RoPE
dims to interleave); see ../shared/notes/glm53-geometry.md.

    python -m capacity.glm53_specs --tp 4 --dcp 1 --spec-tokens 3 --block 512 --out F.pkl

pickles rank 0's specs (layer name -> KVCacheSpec) into F.pkl.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pickle
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from capacity.localhost import free_port
from launch.glm53 import GLM53

INDEX_KPOOL = 4
SM120_SPARSE_MLA = "FLASHINFER_MLA_SPARSE_SM120"
"""vLLM's sparse-MLA backend on SM120 (`platforms/cuda.py`, 0.33.0 and 0.34.0: TRITON_MLA, which
has no sparse support, then this one)."""
KV_LAYOUT = "BLHNC"
"""The KV cache layout a GLM-5.3 start resolves: the engine core takes the first layout every
attention backend supports (`get_supported_kv_cache_layouts`), and the tail ring's KPOOL_TAIL
backend supports BLHNC alone (the qualified runtime logs BLHNC too). Each spec build asks vLLM's
own resolution on the built layers' backends and refuses another answer (`resolved_layout`)."""
RANK_TIMEOUT_S = 600
"""How long a rank process may take to build its layers (seconds; about 15 on two cores)."""
MTP_LAYERS = 1
"""GLM-5.3-Flash's `num_nextn_predict_layers` (45 layers + 1 MTP in zai-org/GLM-5.3-Flash's
config; transformers' Glm5NextTextConfig has no such field)."""
DFLASH2_CHECKPOINT = "GLM-5.3-Flash-DFlash2"
"""The DFlash2 draft for GLM-5.3-Flash (`incoai/GLM-5.3-Flash-DFlash2`, BF16, and the MXFP8
quantization of it seed 000 serves, `local-inference-lab/GLM-5.3-Flash-DFlash2-MXFP8`): a
draft model whose name holds this is built with `DFLASH2`."""


@dataclass(frozen=True)
class DraftLayers:
    """A DFlash draft's attention layers, all sliding-window (qwen3 architecture)."""

    layers: int
    window: int
    heads: int
    kv_heads: int
    head_size: int


DFLASH2 = DraftLayers(layers=5, window=2048, heads=32, kv_heads=8, head_size=4096 // 32)
"""GLM-5.3-Flash-DFlash2's layers, from public facts (its config.json is not where the kit can
read it offline): '5 x qwen3 sliding-attention (window 2048)' and a 20,480 -> 4,096 feature
projection over five 4,096-wide target taps (a public retraining note, read from the checkpoint's
safetensors header: hidden size 4,096), and public launchers that refuse a draft config whose
`(num_attention_heads, num_key_value_heads)` is not (32, 8); the head size is the hidden size
over the heads (qwen3's). The note's parameter counts agree: its 1.171 B less the projection,
the selector's codebooks, the convolutions and the MLPs leaves about 5 x 41.9 M, the q, k, v and
o projections of 4,096 x (2 x 4,096 + 2 x 8 x 128) each layer."""


@dataclass(frozen=True)
class Shape:
    tp: int
    dcp: int
    spec_tokens: int
    block_size: int = 512
    kv_cache_dtype: str = "fp8"
    max_model_len: int = 262_144
    attention_backend: str = SM120_SPARSE_MLA
    mtp_layers: int = 0
    """The MTP draft's sparse-MLA layers (GLM-5.3-Flash has one, index 45), whose caches the
    drafter adds beside the target's when the speculative method is mtp."""
    kda_prefill_backend: str = "auto"
    """The server's `--kda-prefill-backend`: with FlashKDA each recurrent layer keeps a
    prefill-checkpoint block per request (vLLM's `Glm5NextLinearAttention.get_kv_cache_spec`)."""
    draft_backend: str = ""
    """A DFlash2 draft's attention backend (its speculative config's `attention_backend`); empty:
    no draft layers. Its layers are `DFLASH2`'s, built with vLLM's `Attention`."""
    draft_kv_cache_dtype: str = "auto"
    """The draft's speculative config `kv_cache_dtype` (auto: the model's dtype). The draft keeps
    one cache on every DCP rank: a vLLM that would shard it is refused before the build
    (`capacity.engine.draft_replicated`)."""


def text_config():
    from transformers import Glm5NextTextConfig

    return Glm5NextTextConfig(
        index_kpool=INDEX_KPOOL, mla_use_nope=True, indexer_rope_interleave=False
    )


def vllm_config(shape: Shape, text):
    """vLLM's config objects as a start with this shape has them when layers are built."""
    import torch
    from vllm.config import VllmConfig

    config = VllmConfig()
    config.parallel_config.tensor_parallel_size = shape.tp
    config.parallel_config.decode_context_parallel_size = shape.dcp
    config.cache_config.block_size = shape.block_size
    config.cache_config.mamba_block_size = shape.block_size
    config.cache_config.cache_dtype = shape.kv_cache_dtype
    config.cache_config.mamba_cache_mode = "align"
    config.cache_config.kv_cache_layout = KV_LAYOUT
    config.attention_config.sparse_mla_prefill_workspace_factor = 2
    config.speculative_config = SimpleNamespace(num_speculative_tokens=shape.spec_tokens)
    config.model_config = SimpleNamespace(
        hf_text_config=text, hf_config=text, architecture=GLM53, use_mla=True, is_moe=True,
        rswa_window=None, dtype=torch.bfloat16, max_model_len=shape.max_model_len,
        supports_kv_cache_grouping=False,  # GLM-5.3 declares no grouping of its own
        original_max_model_len=shape.max_model_len,
        is_mm_prefix_lm=False,  # read by vLLM's `Attention` (the draft's layers)
    )  # fmt: skip
    return config


def _glm5next_modules():
    """vLLM's GLM-5.3 layer modules without the package `__init__` (see the module docstring)."""
    import vllm.models

    if "vllm.models.glm5next" not in sys.modules:
        package = types.ModuleType("vllm.models.glm5next")
        package.__path__ = [str(Path(vllm.models.__path__[0]) / "glm5next")]
        sys.modules["vllm.models.glm5next"] = package
    from vllm.models.glm5next.common import attention, kda

    return attention, kda


def latent_spec(config, text, backend_name: str = SM120_SPARSE_MLA):
    """The MLA latent's spec (see the module docstring for why it is not a built layer): the
    layer's own `get_kv_cache_spec`, which asks its backend implementation for the latent row
    (vLLM 0.34.0's SM120 backend: the runtime's 528 bytes for GLM-5.3's shape)."""
    from vllm.model_executor.layers.attention.mla_attention import (
        MLAAttention,
        _canonicalize_sparse_mla_kv_cache_dtype,
    )
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.worker.utils import customize_attention_spec

    backend = AttentionBackendEnum[backend_name].get_class()
    impl = backend.get_impl_cls().__new__(backend.get_impl_cls())
    impl.kv_lora_rank, impl.qk_rope_head_dim = text.kv_lora_rank, text.qk_rope_head_dim
    layer = MLAAttention.__new__(MLAAttention)
    layer.impl = impl
    layer.kv_cache_dtype = _canonicalize_sparse_mla_kv_cache_dtype(
        backend, config.cache_config.cache_dtype
    )
    layer.head_size = text.kv_lora_rank + text.qk_rope_head_dim
    layer.sliding_window = None
    layer.topk_buffer_width = text.index_topk
    layer.indexer = True
    layer.non_causal_multi_token_decode = False
    return customize_attention_spec(backend, MLAAttention.get_kv_cache_spec(layer, config))


def runtime_latent(specs: dict[str, Any]) -> dict[str, Any]:
    """STAND-IN for the qualified runtime's target, whose B12X sparse-MLA backend is not in
    upstream vLLM: the same specs, the latent's 528-byte rows kept, without the 64-row block
    stride alignment vLLM's SM120 backend asks for (FlashInfer reads the cache as 64-row pages,
    `align_blocks_to_rows`). Seed 000's 906 blocks at 12 GiB bound the runtime's pool stride to
    at most 12,884,901,888 / 906 bytes, which the 64-row alignment (33,792 bytes) overshoots."""
    import dataclasses

    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    return {name: dataclasses.replace(spec, block_stride_alignment=None)
            if name.endswith(".mla_attn") and isinstance(spec, MLAAttentionSpec) else spec
            for name, spec in specs.items()}  # fmt: skip


def resolved_layout(config, latent_backend: str) -> str | None:
    """The layout the engine core would pick for the layers built in `config` and the latent's
    backend: the first of vLLM's `get_supported_kv_cache_layouts` over their backends."""
    from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts

    backends = [*get_current_attn_backends(config),
                AttentionBackendEnum[latent_backend].get_class()]  # fmt: skip
    layouts = get_supported_kv_cache_layouts(backends)
    return layouts[0].name if layouts else None


def gpu_kda_backend(kda, layer, requested: str, dtype) -> str:
    """The KDA prefill backend an SM120 GPU resolves `requested` to: vLLM's own
    `_resolve_kda_prefill_backend`, asked with a stand-in for the CUDA platform (capability
    12.0), since the CPU platform answers for itself; the layer's head size and gate bound and
    the model's dtype are the real ones."""
    from unittest import mock

    from vllm.platforms.interface import DeviceCapability

    sm120 = SimpleNamespace(is_cuda=lambda: True,
                            get_device_capability=lambda: DeviceCapability(12, 0))  # fmt: skip
    with mock.patch.object(kda, "current_platform", sm120):
        return str(kda._resolve_kda_prefill_backend(requested, layer.head_dim, dtype,
                                                    layer.kda_lower_bound))  # fmt: skip


def mtp_prefix(text, index: int) -> str:
    """The MTP layer's name: vLLM's `Glm5NextMultiTokenPredictor` numbers its layers on from the
    target's (`model.layers.45` for GLM-5.3-Flash's one)."""
    return f"model.layers.{text.num_hidden_layers + index}.mtp_block"


def build_rank(shape: Shape, rank: int, port: int) -> dict[str, Any]:
    """This rank's specs for the whole model (one layer of each kind built, then named)."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.v1.worker.gpu.attn_utils import get_kv_cache_spec

    text = text_config()
    config = vllm_config(shape, text)
    with set_current_vllm_config(config):
        init_distributed_environment(world_size=shape.tp, rank=rank, local_rank=rank,
                                     distributed_init_method=f"tcp://127.0.0.1:{port}",
                                     backend="gloo")  # fmt: skip
        initialize_model_parallel(shape.tp)
    attention, kda = _glm5next_modules()
    mla_at = text.layer_types.index("indexed_attention")
    gdn_at = text.layer_types.index("linear_attention")
    with set_current_vllm_config(config), torch.device("meta"):
        indexer = f"model.layers.{mla_at}.self_attn.indexer"
        attention.Indexer(config, text, text.hidden_size, text.q_lora_rank, None,
                          config.cache_config, None, indexer)  # fmt: skip
        for mtp in range(shape.mtp_layers):  # the drafter's layers, past the target's
            attention.Indexer(config, text, text.hidden_size, text.q_lora_rank, None,
                              config.cache_config, None,
                              f"{mtp_prefix(text, mtp)}.self_attn.indexer")  # fmt: skip
        gdn = kda.Glm5NextLinearAttention(config=text, vllm_config=config,
                                          prefix=f"model.layers.{gdn_at}.self_attn")  # fmt: skip
        # built on the CPU (FlashKDA's kernels are CUDA-only); its spec as the GPU server's
        gdn.kda_prefill_backend = gpu_kda_backend(kda, gdn, shape.kda_prefill_backend,
                                                  config.model_config.dtype)
        if shape.draft_backend:
            draft_layer(config, shape)
        built = get_kv_cache_spec(config)
        latent = latent_spec(config, text, shape.attention_backend)
        layout = resolved_layout(config, shape.attention_backend)
    if layout != KV_LAYOUT:
        raise RuntimeError(f"vLLM resolves the KV cache layout {layout} for GLM-5.3's backends, "
                           f"not {KV_LAYOUT}: capacity.glm53_specs.KV_LAYOUT needs updating")
    specs: dict[str, Any] = {}
    for i, kind in enumerate(text.layer_types):
        if kind == "linear_attention":
            specs[f"model.layers.{i}.self_attn"] = built[f"model.layers.{gdn_at}.self_attn"]
            continue
        specs[f"model.layers.{i}.self_attn.mla_attn"] = latent
        for part in ("indexer.k_cache", "indexer.tail_cache"):
            specs[f"model.layers.{i}.self_attn.{part}"] = built[
                f"model.layers.{mla_at}.self_attn.{part}"
            ]
    for mtp in range(shape.mtp_layers):
        prefix = f"{mtp_prefix(text, mtp)}.self_attn"
        specs[f"{prefix}.mla_attn"] = latent
        for part in ("indexer.k_cache", "indexer.tail_cache"):
            specs[f"{prefix}.{part}"] = built[f"{prefix}.{part}"]
    if shape.draft_backend:
        draft = built[draft_name(0)]
        if shape.dcp > 1:  # as vLLM's model runner does for a DCP-1 draft
            draft = dataclasses.replace(draft, dcp_sharded=False)
        specs.update({draft_name(i): draft for i in range(DFLASH2.layers)})
    return specs


def draft_name(index: int) -> str:
    return f"draft.model.layers.{index}.self_attn.attn"


def draft_layer(config, shape: Shape) -> Any:
    """One DFlash2 draft layer, vLLM's `Attention` as its qwen3 draft model builds it on this
    rank (heads split over the TP ranks), with the speculative config's backend and KV dtype,
    marked a draft layer as the speculator marks it. Its spec (the block vLLM's layer picks for
    a sliding window beside the target's block) is collected with the target's; built under
    the caller's meta device."""
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    layer = Attention(
        num_heads=DFLASH2.heads // shape.tp, head_size=DFLASH2.head_size,
        scale=DFLASH2.head_size ** -0.5, num_kv_heads=max(1, DFLASH2.kv_heads // shape.tp),
        cache_config=dataclasses.replace(config.cache_config,
                                         cache_dtype=shape.draft_kv_cache_dtype),
        per_layer_sliding_window=DFLASH2.window, prefix=draft_name(0),
        attn_backend=AttentionBackendEnum[shape.draft_backend].get_class(),
    )  # fmt: skip
    layer.is_draft_layer = True
    return layer


def build(shape: Shape, work: Path) -> dict[str, Any]:
    """Run one process per TP rank and return rank 0's specs (layer name -> KVCacheSpec)."""
    port = free_port()
    out = work / ("specs-" + "-".join(str(v) for v in dataclasses.astuple(shape)) + ".pkl")
    argv = [sys.executable, "-m", "capacity.glm53_specs", "--tp", str(shape.tp), "--dcp",
            str(shape.dcp), "--spec-tokens", str(shape.spec_tokens), "--block",
            str(shape.block_size), "--kv-cache-dtype", shape.kv_cache_dtype, "--max-model-len",
            str(shape.max_model_len), "--attention-backend", shape.attention_backend,
            "--mtp-layers", str(shape.mtp_layers), "--kda-prefill-backend",
            shape.kda_prefill_backend, "--draft-backend", shape.draft_backend,
            "--draft-kv-cache-dtype", shape.draft_kv_cache_dtype,
            "--port", str(port), "--out", str(out)]  # fmt: skip
    # CUDA_VISIBLE_DEVICES empty: vLLM's start on an x86 CPU then takes PyPI's triton as it
    # takes it in a worker whose devices are not yet visible (vllm/triton_utils/importing.py)
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    ranks = [
        subprocess.Popen([*argv, "--rank", str(r)], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
        for r in range(shape.tp)
    ]  # fmt: skip
    try:
        logs = [p.communicate(timeout=RANK_TIMEOUT_S)[0] for p in ranks]
    finally:  # a rank that hangs (a peer died before the gloo world formed) is ended too
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
    failed = [(r, p.returncode, logs[r][-2000:]) for r, p in enumerate(ranks) if p.returncode]
    if failed:
        raise RuntimeError(f"spec build failed on ranks {failed}")
    return pickle.loads(out.read_bytes())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, required=True)
    parser.add_argument("--dcp", type=int, default=1)
    parser.add_argument("--spec-tokens", type=int, default=0)
    parser.add_argument("--block", type=int, default=512)
    parser.add_argument("--kv-cache-dtype", default="fp8")
    parser.add_argument("--max-model-len", type=int, default=262_144)
    parser.add_argument("--attention-backend", default=SM120_SPARSE_MLA)
    parser.add_argument("--mtp-layers", type=int, default=0)
    parser.add_argument("--kda-prefill-backend", default="auto")
    parser.add_argument("--draft-backend", default="")
    parser.add_argument("--draft-kv-cache-dtype", default="auto")
    parser.add_argument("--rank", type=int)
    parser.add_argument("--port", type=int)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    shape = Shape(args.tp, args.dcp, args.spec_tokens, args.block, args.kv_cache_dtype,
                  args.max_model_len, args.attention_backend, args.mtp_layers,
                  args.kda_prefill_backend, args.draft_backend, args.draft_kv_cache_dtype)
    if args.rank is None:
        args.out.write_bytes(pickle.dumps(build(shape, args.out.parent)))
        return
    specs = build_rank(shape, args.rank, args.port)
    if args.rank == 0:
        args.out.write_bytes(pickle.dumps(specs))


if __name__ == "__main__":
    main()
