"""What the installed vLLM provides, detected from its source tree, never assumed.

Some knobs of the qualified configurations exist only in the fork that qualified them (B12X PCIe
all-reduce, complete-KV gather under DCP, the KDA decode selector, the B12X sparse-MLA attention
backend). A knob that no code reads is silently ignored by vLLM, which is exactly how a wrong
geometry goes unnoticed. So each knob a profile uses becomes a requirement; the requirement is met
when the installed vLLM registers that name where vLLM looks it up (its env-variable table, the
attention-backend enum, the parser tables, the offloading-backend choices, an `additional_config`
read: `launch.vllm_registrations`).
A missing requirement refuses the start unless the user names its fallback; the run is then
marked unqualified. A few things a profile needs have no fallback (the start would fail later,
after the weights load): those refuse whatever FALLBACKS says.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from launch.deviations import expect_key
from launch.errors import UsageError
from launch.feature_env import FEATURE_ENV, SPLIT_ENV, feature_env, split_env
from launch.glm53 import GLM53, MLA_SHAPE, RUNTIME_LATENT_BYTES
from launch.kv_offload import OFF
from launch.profile import Profile
from launch.vllm_install import VllmInstall


@dataclass(frozen=True)
class Requirement:
    """A knob the profile uses and the evidence that the installed vLLM honours it."""

    name: str  # the fallback name a user passes: the knob's own field name
    field: str  # profile path of the knob
    value: str
    needs: str  # what must be true of vLLM, for the message
    fallback: str  # what running without it means
    met: Callable[[VllmInstall], bool]
    drop: Callable[[Profile], Profile]
    expect_dropped: tuple[str, ...] = ()
    """Expectations (Expect's field names) that do not hold without the knob."""
    explain: Callable[[VllmInstall], str | None] | None = None
    """What exactly is missing on this install, when more than `needs` can say."""
    keeps: Callable[[VllmInstall], tuple[str, ...]] | None = None
    """Of `expect_dropped`, those that still hold on this install without the knob (what vLLM
    does in its place gives the same figures)."""

    def __post_init__(self) -> None:
        for key in self.expect_dropped:
            expect_key(key)  # a misspelt name would otherwise drop nothing, silently

    def why(self, install: VllmInstall) -> str:
        detail = self.explain(install) if self.explain else None
        return f"{self.needs} ({detail})" if detail else self.needs


def _replace(p: Profile, **engine_or_features: object) -> Profile:
    engine_keys = {f.name for f in dataclasses.fields(p.engine)}
    engine = {k: v for k, v in engine_or_features.items() if k in engine_keys}
    features = {k: v for k, v in engine_or_features.items() if k not in engine_keys}
    return dataclasses.replace(
        p,
        engine=dataclasses.replace(p.engine, **engine),
        features=dataclasses.replace(p.features, **features),
    )


def _feature_switch(feature: str, fallback: str, expect_dropped: tuple[str, ...]) -> Requirement:
    """A fork feature that is a set of environment variables vLLM must register."""
    env = FEATURE_ENV[feature]
    return Requirement(
        feature, f"features.{feature}", "true",
        "vLLM must register " + " and ".join(f"{k}={v}" for k, v in env.items()), fallback,
        met=lambda v: v.env_problem(env) is None,
        drop=lambda q: _replace(q, **{feature: False}),
        expect_dropped=expect_dropped, explain=lambda v: v.env_problem(env),
    )  # fmt: skip


def _features(p: Profile) -> list[Requirement]:
    reqs = []
    if p.features.b12x_pcie_allreduce:
        reqs.append(_feature_switch(
            "b12x_pcie_allreduce",
            "vLLM's own all-reduce selection (custom all-reduce or NCCL) instead of B12X PCIe",
            ("backends",)))  # fmt: skip
    if p.features.dcp_ckv_gather:
        reqs.append(_feature_switch("dcp_ckv_gather",
                                    "DCP decode without the complete-KV gather path", ()))
    return reqs


def _split_pages(p: Profile) -> list[Requirement]:
    if p.features.split_pages is None:
        return []
    env = split_env(p.features.split_pages)
    return [Requirement(
        "split_pages", "features.split_pages", "target/mamba block sizes",
        f"vLLM must read {' and '.join(SPLIT_ENV)} (registered by the patches/vllm series, "
        "patch 2; read straight from the environment by the qualified fork, #535)",
        "vLLM's automatic hybrid alignment, which promotes the target block",
        met=lambda v: v.env_problem(env) is None,
        drop=lambda q: _replace(q, split_pages=None),
        expect_dropped=("block_sizes", "page_bytes", "kv_cache_tokens_min",
                        "max_concurrency_min"),
        explain=lambda v: v.env_problem(env),
    )]  # fmt: skip


def _same_latent(p: Profile) -> Callable[[VllmInstall], tuple[str, ...]]:
    """The page sizes, kept where the backend vLLM picks in place of the profile's stores
    GLM-5.3's latent in the qualified runtime's row (vLLM 0.34.0's SM120 sparse-MLA backend).
    The capacity figures are not: that backend aligns the pool stride to 64 latent rows, the
    runtime's does not (905 blocks where seed 000 has 906, tests/planner/test_capacity_seeds.py);
    on the kit's image `make smoke` checks the capacity `make capacity` predicts instead."""

    def keeps(v: VllmInstall) -> tuple[str, ...]:
        if p.architecture != GLM53 or p.engine.kv_cache_dtype not in FP8_LATENT:
            return ()
        if v.sm120_sparse_mla_row_bytes(*MLA_SHAPE) != RUNTIME_LATENT_BYTES:
            return ()
        return ("page_bytes",)

    return keeps


LATENT_FIGURES = ("page_bytes", "kv_cache_tokens", "kv_cache_tokens_min", "kv_blocks",
                  "max_concurrency_min")  # fmt: skip
"""The expectations the MLA latent's row size moves: pages, and the capacity they give."""
FP8_LATENT = frozenset({None, "auto", "fp8", "fp8_e4m3", "fp8_ds_mla"})
"""KV cache dtypes a GLM-5.3 start stores as the FP8 DS-MLA latent (profile default: unset)."""


def _attention_backends(p: Profile) -> list[Requirement]:
    reqs = []
    target, spec = p.engine.attention_backend, p.engine.speculative_config
    if target is not None:
        reqs.append(Requirement(
            "attention_backend", "engine.attention_backend", target,
            f"vLLM must register the attention backend {target}",
            "vLLM selects the target attention backend itself",
            met=lambda v: target in v.attention_backends,
            drop=lambda q: _replace(q, attention_backend=None),
            # the backend owns the MLA latent's format, so pages and capacity move with it
            expect_dropped=("backends", *LATENT_FIGURES), keeps=_same_latent(p),
        ))  # fmt: skip
    if spec is not None and spec.attention_backend is not None:
        draft = spec.attention_backend
        reqs.append(Requirement(
            "draft_attention_backend", "engine.speculative_config.attention_backend", draft,
            f"vLLM must register the attention backend {draft}",
            "vLLM selects the draft attention backend itself",
            met=lambda v: draft in v.attention_backends,
            drop=lambda q: _replace(q, speculative_config=dataclasses.replace(
                q.engine.speculative_config, attention_backend=None)),
            expect_dropped=("backends",),
        ))  # fmt: skip
    return reqs


def _parser(field: str, kind: str, registry: str, name: str) -> Requirement:
    """A reasoning or tool-call parser the installed vLLM must register."""
    tool = field == "tool_call_parser"
    return Requirement(
        field, f"engine.{field}", name, f"vLLM must register the {kind} {name!r}",
        f"no {kind}: the output is returned as the model writes it"
        + (" (and no auto tool choice)" if tool else ""),
        met=lambda v: name in getattr(v, registry),
        drop=lambda q: _replace(q, **{field: None},
                                **({"enable_auto_tool_choice": None} if tool else {})),
        expect_dropped=(),
        explain=lambda v: "it registers " + ", ".join(sorted(getattr(v, registry))[:60]),
    )  # fmt: skip


def _parsers(p: Profile) -> list[Requirement]:
    e = p.engine
    return [_parser(field, kind, registry, name)
            for field, kind, registry in (("reasoning_parser", "reasoning parser",
                                           "reasoning_parsers"),
                                          ("tool_call_parser", "tool-call parser", "tool_parsers"))
            if (name := getattr(e, field)) is not None]  # fmt: skip


def _host_tier(p: Profile) -> list[Requirement]:
    offload = p.engine.kv_offload
    if offload is None or offload.backend == OFF:
        return []
    backend = offload.backend
    lmcache = backend == "lmcache"

    def explain(v: VllmInstall) -> str | None:
        if backend not in v.kv_offloading_backends:
            return f"its KVOffloadingBackend is {', '.join(sorted(v.kv_offloading_backends))}"
        return v.lmcache_problem if lmcache else None

    return [Requirement(
        "kv_offload", "engine.kv_offload.backend", backend,
        f"vLLM must accept --kv-offloading-backend {backend}"
        + (" and the image must provide LMCache built for its torch" if lmcache else ""),
        "GPU KV cache only, no host tier",
        met=lambda v: backend in v.kv_offloading_backends
        and (not lmcache or v.lmcache_problem is None),
        drop=lambda q: _replace(q, kv_offload=None), expect_dropped=(), explain=explain,
    )]  # fmt: skip


def _config_key(key: str, value: object) -> Requirement:
    """One `additional_config` key some code of the installed vLLM must read."""
    return Requirement(
        key, f"engine.additional_config.{key}", json.dumps(value),
        f"vLLM must read the additional-config key {key!r}",
        f"the key {key!r} is left out and vLLM's default applies",
        met=lambda v: key in v.additional_config_keys,
        drop=lambda q: _replace(q, additional_config={
            k: v for k, v in (q.engine.additional_config or {}).items() if k != key} or None),
        expect_dropped=(),
    )  # fmt: skip


def _additional_config(p: Profile) -> list[Requirement]:
    config = p.engine.additional_config or {}
    return [_config_key(key, config[key]) for key in sorted(config)]


REQUIREMENT_RULES: tuple[Callable[[Profile], list[Requirement]], ...] = (
    _features, _split_pages, _attention_backends, _parsers, _host_tier, _additional_config,
)
"""Each kind of fork-sensitive knob, in the order the requirements are reported."""


def requirements(p: Profile) -> list[Requirement]:
    """The fork-sensitive knobs this profile uses, in a stable order."""
    return [req for rule in REQUIREMENT_RULES for req in rule(p)]


@dataclass(frozen=True)
class HardRequirement:
    """Something the profile needs that no fallback can replace: without it the start fails
    after the weights load, so it is refused at once whatever FALLBACKS says."""

    field: str
    value: str
    problem: Callable[[VllmInstall], str | None]
    consequence: str
    fix: str


def hard_requirements(p: Profile) -> list[HardRequirement]:
    e = p.engine
    spec = e.speculative_config
    reqs = []
    if spec is not None and spec.method == "dflash" and e.decode_context_parallel_size > 1:
        reqs.append(
            HardRequirement(
                "engine.speculative_config.method",
                spec.method,
                lambda v: v.draft_replication_problem,
                "a DFlash draft's sliding-window layers cannot be DCP-sharded: vLLM stops the "
                "start at 'DCP not support sliding window.' after loading the weights (seed "
                "000's runtime keeps the draft replicated across the DCP ranks)",
                "run this profile on an image whose vLLM keeps the draft replicated under DCP "
                "(IMAGE_SOURCE=qualified, the runtime seed 000 qualified), or set DCP=1 "
                "(unqualified); FALLBACKS cannot waive it",
            )
        )
    return reqs


@dataclass(frozen=True)
class Resolution:
    """The profile as it will run on this vLLM, with what was given up and why."""

    profile: Profile
    checked_against: str | None  # "vLLM <version> at <path>", or None when no vLLM was found
    fallbacks: tuple[Requirement, ...]
    unregistered: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Variables the run sets that this vLLM reads without registering them in envs.py -> the
    modules reading each: its start warns "Unknown vLLM environment variable detected" for
    them, which is expected (`VllmInstall.environ_readers`)."""

    @property
    def qualified(self) -> bool:
        return not self.fallbacks


def resolve(p: Profile, install: VllmInstall | None) -> Resolution:
    """Check every requirement against `install`; apply the fallbacks the user allowed.

    Allowed fallbacks are `deployment.fallbacks` (environment FALLBACKS or `--set FALLBACKS=...`).

    With no vLLM to check against (a laptop running `make plan`), nothing is dropped and the
    result says the check was not made; `launch run` always checks.
    """
    reqs = requirements(p)
    known = {r.name for r in reqs}
    allowed = p.deployment.fallbacks
    for name in allowed:
        if name not in known:
            raise UsageError(
                "deployment.fallbacks",
                name,
                "is not a fallback of this profile",
                f"use one of: {', '.join(sorted(known)) or '(none: no fork knob is used)'}",
            )
    if install is None:
        return Resolution(p, None, ())
    where = f"vLLM {install.version} at {install.root}"
    for hard in hard_requirements(p):
        if (problem := hard.problem(install)) is not None:
            raise UsageError(
                hard.field,
                hard.value,
                f"the installed vLLM cannot keep the draft replicated under DCP "
                f"{p.engine.decode_context_parallel_size} ({where}: {problem}); "
                f"{hard.consequence}",
                hard.fix,
            )
    missing = [req for req in reqs if not req.met(install)]
    refused = [req for req in missing if req.name not in allowed]
    if refused:
        first = refused[0]
        needs = "; ".join(f"{r.field}={r.value}: {r.why(install)}" for r in refused)
        names = ",".join(r.name for r in missing)
        raise UsageError(
            first.field if len(refused) == 1 else "capabilities",
            first.value if len(refused) == 1 else f"{len(refused)} missing",
            f"the installed vLLM lacks what the profile uses ({where}): {needs}",
            f"use an image whose vLLM provides it, or accept running unqualified with "
            f"FALLBACKS={names} (" + "; ".join(f"{r.name}: {r.fallback}" for r in refused) + ")",
        )
    for req in missing:
        p = req.drop(p)
    fallbacks = tuple(_narrowed(req, install) for req in missing)
    return Resolution(p, where, fallbacks, install.unregistered(feature_env(p.features)))


def _narrowed(req: Requirement, install: VllmInstall) -> Requirement:
    """`req` dropping only the expectations that do not hold on `install` without it."""
    kept = req.keeps(install) if req.keeps else ()
    return dataclasses.replace(req, expect_dropped=tuple(
        k for k in req.expect_dropped if k not in kept)) if kept else req  # fmt: skip
