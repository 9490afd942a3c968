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
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from launch import vllm_registrations as registrations
from launch.deviations import expect_key
from launch.errors import ProfileError
from launch.kv_offload import OFF
from launch.profile import Features, Profile, SplitPages

_REGISTRY = Path("v1/attention/backends/registry.py")
LMCACHE_CONNECTOR = "vllm.distributed.kv_transfer.kv_connector.v1.lmcache_mp_connector"
"""The module vLLM loads for --kv-offloading-backend lmcache (LMCacheMPConnector)."""
_TORCH_REQ = re.compile(r"^torch\s*(?P<spec>[=<>!~][^;]*)?(?:;.*)?$")
# vLLM 0.33.0's draft cache under DCP: the model runner keeps a draft's cache replicated only when
# the speculator's DCP size is 1, and the speculator takes the target's DCP size.
_RUNNER = Path("v1/worker/gpu/model_runner.py")
_SPECULATOR = Path("v1/worker/gpu/spec_decode/speculator.py")
_REPLICATES_ONLY_AT_DCP1 = "self.speculator.dcp_size == 1"
_SPECULATOR_TAKES_TARGET_DCP = (
    "self.dcp_size = vllm_config.parallel_config.decode_context_parallel_size"
)

FEATURE_ENV: dict[str, dict[str, str]] = {
    # Seed 000 names its runtime's launcher variables (B12X_PCIE_ALLREDUCE=1, DCP_CKV_GATHER=1); the
    # qualified image's serve script turns them into what its vLLM registers in envs.py
    # (`export VLLM_ENABLE_PCIE_ALLREDUCE="${b12x_pcie_allreduce}"`, `export
    # VLLM_PCIE_ALLREDUCE_BACKEND=b12x`, `export VLLM_B12X_MLA_CKV_GATHER="${dcp_ckv_gather}"`).
    # `launch run` starts `vllm serve` itself, so it sets vLLM's own names: the launcher's would be
    # read by nothing.
    "b12x_pcie_allreduce": {
        "VLLM_ENABLE_PCIE_ALLREDUCE": "1",
        "VLLM_PCIE_ALLREDUCE_BACKEND": "b12x",
    },
    "dcp_ckv_gather": {"VLLM_B12X_MLA_CKV_GATHER": "1"},
}
"""Environment by feature: what vLLM must register for the feature to take effect."""
SPLIT_ENV = ("VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE", "VLLM_GLM53_SPLIT_MAMBA_BLOCK_SIZE")
"""The split-page sizes (patches/vllm series, patch 2, registers both in envs.py)."""


def split_env(split: SplitPages) -> dict[str, str]:
    return dict(zip(SPLIT_ENV, (str(split.target_block_size), str(split.mamba_block_size)),
                    strict=True))  # fmt: skip


def feature_env(features: Features) -> dict[str, str]:
    """The environment that turns the profile's features on in a vLLM that registers them."""
    env = {k: v for name, values in FEATURE_ENV.items() if getattr(features, name)
           for k, v in values.items()}  # fmt: skip
    if features.split_pages is not None:
        env.update(split_env(features.split_pages))
    return env


@dataclass(frozen=True)
class VllmInstall:
    """A vLLM package directory and what it registers (read by `launch.vllm_registrations`)."""

    root: Path
    version: str

    def _read(self, path: str | Path) -> str:
        file = self.root / path
        return file.read_text(encoding="utf-8") if file.is_file() else ""

    @cached_property
    def env_vars(self) -> dict[str, tuple[str, ...] | None]:
        """envs.py's `environment_variables`: name -> declared choices (None: any value)."""
        return registrations.env_table(self._read("envs.py"))

    def env_problem(self, wanted: dict[str, str]) -> str | None:
        """Why setting `wanted` would not take effect here, or None when vLLM registers each name
        (and lists the value among the name's choices, where it declares choices)."""
        missing = [name for name in wanted if name not in self.env_vars]
        if missing:
            return f"envs.py does not register {', '.join(missing)}"
        for name, value in wanted.items():
            choices = self.env_vars[name]
            if choices is not None and value not in choices:
                return f"envs.py gives {name} the choices {', '.join(choices)}, not {value}"
        return None

    @cached_property
    def attention_backends(self) -> frozenset[str]:
        """Names of `AttentionBackendEnum` members in this vLLM."""
        return registrations.enum_members(self._read(_REGISTRY), "AttentionBackendEnum")

    @cached_property
    def reasoning_parsers(self) -> frozenset[str]:
        return registrations.table_keys(
            self._read("reasoning/__init__.py"), "_REASONING_PARSERS_TO_REGISTER"
        )

    @cached_property
    def tool_parsers(self) -> frozenset[str]:
        return registrations.table_keys(
            self._read("tool_parsers/__init__.py"), "_TOOL_PARSERS_TO_REGISTER"
        )

    @cached_property
    def kv_offloading_backends(self) -> frozenset[str]:
        """The choices of --kv-offloading-backend (config/cache.py's `KVOffloadingBackend`)."""
        return registrations.literal_alias(self._read("config/cache.py"), "KVOffloadingBackend")

    @cached_property
    def additional_config_keys(self) -> frozenset[str]:
        """Keys some vLLM code reads from `additional_config`."""
        keys: set[str] = set()
        for path in sorted(self.root.rglob("*.py")):
            text = path.read_text(encoding="utf-8", errors="replace")
            if "additional_config" in text:  # only these files can read one; parse just them
                keys |= registrations.mapping_keys_read(text, "additional_config")
        return frozenset(keys)

    @cached_property
    def draft_replication_problem(self) -> str | None:
        """Why a draft's KV cache cannot stay DCP-replicated under DCP > 1 on this vLLM, when
        its source shows it (vLLM 0.33.0: the runner replicates a draft only when the
        speculator's DCP size is 1, and the speculator takes the target's); None when the source
        does not show that (a build that replicates drafts, such as the qualified runtime)."""
        runner, speculator = self.root / _RUNNER, self.root / _SPECULATOR
        if not (runner.is_file() and speculator.is_file()):
            return None
        if _REPLICATES_ONLY_AT_DCP1 in runner.read_text(encoding="utf-8") and (
            _SPECULATOR_TAKES_TARGET_DCP in speculator.read_text(encoding="utf-8")
        ):
            return (
                f"{_RUNNER} replicates a draft's cache only when the speculator's DCP size is 1 "
                f"and {_SPECULATOR} takes the target's DCP size, so the draft is DCP-sharded"
            )
        return None

    def distribution(self, name: str) -> importlib.metadata.Distribution | None:
        """An installed distribution beside this vLLM (same site-packages), or None."""
        found = importlib.metadata.distributions(name=name, path=[str(self.root.parent)])
        return next(iter(found), None)

    @cached_property
    def lmcache_problem(self) -> str | None:
        """Why LMCache cannot serve here, or None: not installed; a torch pin the image's torch
        does not meet; or vLLM's LMCache connector failing to import (a wheel whose compiled ops
        were built for another torch or CUDA stops there with an undefined symbol). Installing
        another wheel at start would crash later instead, so the kit refuses."""
        lmcache, torch = self.distribution("lmcache"), self.distribution("torch")
        if lmcache is None:
            return "LMCache is not installed in this image"
        if torch is None:
            return "torch is not installed in this image"
        from packaging.specifiers import SpecifierSet  # vLLM's own dependency

        pins = [m.group("spec") or "" for r in lmcache.requires or [] if (m := _TORCH_REQ.match(r))]
        wanted = SpecifierSet(pins[0].strip()) if pins else SpecifierSet()
        if torch.version.split("+")[0] not in wanted:
            return (
                f"LMCache {lmcache.version} requires torch{wanted}, the image has torch "
                f"{torch.version}"
            )
        probe = subprocess.run(
            [sys.executable, "-c", f"import {LMCACHE_CONNECTOR}"],
            env={**os.environ, "PYTHONPATH": str(self.root.parent)},
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        if probe.returncode != 0:
            last = (probe.stderr.strip().splitlines() or [f"exit {probe.returncode}"])[-1]
            return (
                f"LMCache {lmcache.version} does not load with torch {torch.version}: {last[:200]}"
            )
        return None


def find_vllm(root: str | Path | None = None) -> VllmInstall | None:
    """The vLLM at `root` (a package directory) or the importable one; None if there is none."""
    if root is None:
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            return None
        path = Path(next(iter(spec.submodule_search_locations)))
    else:
        path = Path(root)
        if not (path / "__init__.py").is_file():
            raise ProfileError(
                "--vllm-root",
                str(root),
                "is not a vLLM package directory",
                "point it at the directory that holds vllm/__init__.py",
            )
    return VllmInstall(path, _version_of(path))


def _version_of(path: Path) -> str:
    version_file = path / "_version.py"
    if version_file.is_file():
        match = re.search(
            r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""",
            version_file.read_text(encoding="utf-8"),
        )
        if match:
            return match.group(1)
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


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
    expect_dropped: tuple[str, ...]
    """Expectations (Expect's field names) that do not hold without the knob."""
    explain: Callable[[VllmInstall], str | None] | None = None
    """What exactly is missing on this install, when more than `needs` can say."""

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


def requirements(p: Profile) -> list[Requirement]:
    """The fork-sensitive knobs this profile uses, in a stable order."""
    reqs: list[Requirement] = []
    f, e = p.features, p.engine
    for feature, fallback, expect_dropped in (
        ("b12x_pcie_allreduce",
         "vLLM's own all-reduce selection (custom all-reduce or NCCL) instead of B12X PCIe",
         ("backends",)),
        ("dcp_ckv_gather", "DCP decode without the complete-KV gather path", ()),
    ):
        if not getattr(f, feature):
            continue
        env = FEATURE_ENV[feature]
        reqs.append(
            Requirement(
                feature,
                f"features.{feature}",
                "true",
                "vLLM must register " + " and ".join(f"{k}={v}" for k, v in env.items()),
                fallback,
                lambda v, env=env: v.env_problem(env) is None,
                lambda q, feature=feature: _replace(q, **{feature: False}),
                expect_dropped,
                explain=lambda v, env=env: v.env_problem(env),
            )
        )  # fmt: skip
    if f.split_pages is not None:
        split = split_env(f.split_pages)
        reqs.append(
            Requirement(
                "split_pages",
                "features.split_pages",
                "target/mamba block sizes",
                f"vLLM must register {' and '.join(SPLIT_ENV)} (patches/vllm series, patch 2)",
                "vLLM's automatic hybrid alignment, which promotes the target block",
                lambda v: v.env_problem(split) is None,
                lambda q: _replace(q, split_pages=None),
                ("block_sizes", "page_bytes", "kv_cache_tokens_min", "max_concurrency_min"),
                explain=lambda v: v.env_problem(split),
            )
        )
    if e.attention_backend is not None:
        name = e.attention_backend
        reqs.append(
            Requirement(
                "attention_backend",
                "engine.attention_backend",
                name,
                f"vLLM must register the attention backend {name}",
                "vLLM selects the target attention backend itself",
                lambda v, n=name: n in v.attention_backends,
                lambda q: _replace(q, attention_backend=None),
                # the backend owns the MLA latent's format, so pages and capacity move with it
                ("backends", "page_bytes", "kv_cache_tokens", "kv_cache_tokens_min", "kv_blocks",
                 "max_concurrency_min"),
            )
        )
    spec = e.speculative_config
    if spec is not None and spec.attention_backend is not None:
        name = spec.attention_backend
        reqs.append(
            Requirement(
                "draft_attention_backend",
                "engine.speculative_config.attention_backend",
                name,
                f"vLLM must register the attention backend {name}",
                "vLLM selects the draft attention backend itself",
                lambda v, n=name: n in v.attention_backends,
                lambda q: _replace(
                    q,
                    speculative_config=dataclasses.replace(
                        q.engine.speculative_config, attention_backend=None
                    ),
                ),
                ("backends",),
            )
        )
    for field, kind, registry in (
        ("reasoning_parser", "reasoning parser", "reasoning_parsers"),
        ("tool_call_parser", "tool-call parser", "tool_parsers"),
    ):
        name = getattr(e, field)
        if name is None:
            continue
        reqs.append(
            Requirement(
                field,
                f"engine.{field}",
                name,
                f"vLLM must register the {kind} {name!r}",
                f"no {kind}: the output is returned as the model writes it"
                + (" (and no auto tool choice)" if field == "tool_call_parser" else ""),
                lambda v, n=name, r=registry: n in getattr(v, r),
                lambda q, f=field: _replace(
                    q, **{f: None},
                    **({"enable_auto_tool_choice": None} if f == "tool_call_parser" else {}),
                ),
                (),
                explain=lambda v, r=registry: "it registers "
                + ", ".join(sorted(getattr(v, r))[:60]),
            )
        )  # fmt: skip
    offload = e.kv_offload
    if offload is not None and offload.backend != OFF:
        backend = offload.backend
        reqs.append(
            Requirement(
                "kv_offload",
                "engine.kv_offload.backend",
                backend,
                f"vLLM must accept --kv-offloading-backend {backend}"
                + (" and the image must provide LMCache built for its torch"
                   if backend == "lmcache" else ""),
                "GPU KV cache only, no host tier",
                lambda v, b=backend: b in v.kv_offloading_backends
                and (b != "lmcache" or v.lmcache_problem is None),
                lambda q: _replace(q, kv_offload=None),
                (),
                explain=lambda v, b=backend: (
                    f"its KVOffloadingBackend is {', '.join(sorted(v.kv_offloading_backends))}"
                    if b not in v.kv_offloading_backends
                    else v.lmcache_problem if b == "lmcache" else None
                ),
            )
        )  # fmt: skip
    for key in sorted(e.additional_config or {}):
        reqs.append(
            Requirement(
                key,
                f"engine.additional_config.{key}",
                json.dumps(e.additional_config[key]),
                f"vLLM must read the additional-config key {key!r}",
                f"the key {key!r} is left out and vLLM's default applies",
                lambda v, k=key: k in v.additional_config_keys,
                lambda q, k=key: _replace(
                    q,
                    additional_config={
                        kk: vv for kk, vv in (q.engine.additional_config or {}).items() if kk != k
                    }
                    or None,
                ),
                (),
            )
        )
    return reqs


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
            raise ProfileError(
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
            raise ProfileError(
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
        raise ProfileError(
            first.field if len(refused) == 1 else "capabilities",
            first.value if len(refused) == 1 else f"{len(refused)} missing",
            f"the installed vLLM lacks what the profile uses ({where}): {needs}",
            f"use an image whose vLLM provides it, or accept running unqualified with "
            f"FALLBACKS={names} (" + "; ".join(f"{r.name}: {r.fallback}" for r in refused) + ")",
        )
    for req in missing:
        p = req.drop(p)
    return Resolution(p, where, tuple(missing))


def parse_with_vllm(argv: tuple[str, ...], extra: tuple[str, ...]) -> None:
    """Parse `vllm serve ...` with the installed vLLM's own argument parser (imported only when
    the profile passes extra arguments through); refuse what vLLM would refuse at start."""
    import contextlib
    import io

    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:  # vLLM 0.32 (the CPU build) keeps it under launchers/
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(list(argv[2:]))
    except SystemExit as exc:
        why = (err.getvalue().strip().splitlines() or [f"exit {exc.code}"])[-1]
        raise ProfileError(
            "engine.extra_args", " ".join(extra), f"vLLM's own parser refuses it ({why})",
            "fix or drop the argument in VLLM_EXTRA_ARGS",
        ) from exc  # fmt: skip
