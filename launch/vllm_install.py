"""The installed vLLM as a source tree: what it registers (read by `launch.vllm_registrations`,
never imported: vllm.envs imports torch), what it does with a draft under DCP, and whether
LMCache loads beside it."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from launch import vllm_registrations as registrations
from launch.errors import UsageError

_REGISTRY = Path("v1/attention/backends/registry.py")
LMCACHE_CONNECTOR = "vllm.distributed.kv_transfer.kv_connector.v1.lmcache_mp_connector"
"""The module vLLM loads for --kv-offloading-backend lmcache (LMCacheMPConnector)."""
_TORCH_REQ = re.compile(r"^torch\s*(?P<spec>[=<>!~][^;]*)?(?:;.*)?$")
# A draft's cache under DCP. vLLM 0.33.0: the model runner keeps a draft's cache replicated only
# when the speculator's DCP size is 1, and the speculator takes the target's DCP size, so a DFlash
# draft is sharded. vLLM 0.34.0 keeps that runner rule but gives the speculator the draft's own
# DCP size (`speculative_config.draft_decode_context_parallel_size`), which DFlash's speculator
# config defaults to 1 for a windowed draft ("Only full-attention MLA drafts shard their cache").
_RUNNER = Path("v1/worker/gpu/model_runner.py")
_SPECULATOR = Path("v1/worker/gpu/spec_decode/speculator.py")
_DFLASH_CONFIG = Path("v1/worker/gpu/spec_decode/dflash/config.py")
_REPLICATES_ONLY_AT_DCP1 = "self.speculator.dcp_size == 1"
_SPECULATOR_TAKES_TARGET_DCP = (
    "self.dcp_size = vllm_config.parallel_config.decode_context_parallel_size"
)
_SPECULATOR_TAKES_DRAFT_DCP = "speculative_config.draft_decode_context_parallel_size"
_SM120_SPARSE_MLA = Path("v1/attention/backends/mla/flashinfer_mla_sparse_sm120.py")
_ROW_BYTES = re.compile(
    r"def get_fp8_ds_mla_row_bytes\(self\) -> int:\s*if self\.kv_lora_rank == (?P<rank>\d+) and "
    r"self\.qk_rope_head_dim == (?P<rope>\d+):\s*return (?P<bytes>\d+)"
)
"""vLLM 0.34.0's SM120 sparse-MLA backend (the one vLLM picks on an RTX PRO 6000 when no backend
is named) stores a latent row of its own size for one MLA shape: GLM-5.3's (rank 512, no RoPE)."""
_DFLASH_DRAFT_DCP_DEFAULT = re.compile(
    r"def default_draft_decode_context_parallel_size\(.*?(?=\n    (?:@|def )|\Z)", re.S
)


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
        """Why setting `wanted` would not take effect here, or None when some code of this vLLM
        reads each name: envs.py registers it (and lists the value among its choices, where it
        declares choices), or a module reads it straight from the environment
        (`environ_readers`; the qualified fork reads its split-page sizes that way)."""
        missing = [n for n in wanted if n not in self.env_vars and n not in self.environ_readers]
        if missing:
            return (f"envs.py does not register {', '.join(missing)} and no module reads "
                    f"{'it' if len(missing) == 1 else 'them'} from the environment")  # fmt: skip
        for name, value in wanted.items():
            choices = self.env_vars.get(name)
            if choices is not None and value not in choices:
                return f"envs.py gives {name} the choices {', '.join(choices)}, not {value}"
        return None

    @cached_property
    def environ_readers(self) -> dict[str, tuple[str, ...]]:
        """Names some module reads straight from the process environment (`os.getenv`,
        `os.environ`) -> those modules. A name envs.py does not register but a module reads is
        honoured too; vLLM's start then warns "Unknown vLLM environment variable detected" for it
        if it is a `VLLM_*` name (`Platform.validate_environ`): expected, not a typo."""
        found: dict[str, list[str]] = {}
        for path in sorted(self.root.rglob("*.py")):
            text = path.read_text(encoding="utf-8", errors="replace")
            if "getenv" not in text and "environ" not in text:  # only these can: parse just them
                continue
            for name in registrations.environ_reads(text):
                found.setdefault(name, []).append(path.relative_to(self.root).as_posix())
        return {name: tuple(paths) for name, paths in found.items()}

    def unregistered(self, wanted: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """Of the `wanted` names, those envs.py does not register but a module reads, with the
        modules: the names vLLM will warn about at start."""
        return {n: self.environ_readers[n] for n in wanted
                if n not in self.env_vars and n in self.environ_readers}  # fmt: skip

    @cached_property
    def metric_names(self) -> frozenset[str]:
        """The Prometheus metrics this vLLM defines (`vllm:...`), wherever they are defined."""
        names: set[str] = set()
        for path in sorted(self.root.rglob("*.py")):
            text = path.read_text(encoding="utf-8", errors="replace")
            if '"vllm:' in text:  # only these can define one: parse just them
                names |= registrations.metric_names(text)
        return frozenset(names)

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
        """Why a DFlash draft's KV cache cannot stay DCP-replicated under DCP > 1 on this vLLM,
        when its source shows it (vLLM 0.33.0: the runner replicates a draft only when the
        speculator's DCP size is 1, and the speculator takes the target's); None when the source
        shows the draft keeping a DCP of its own that DFlash defaults to 1 for a windowed draft
        (vLLM 0.34.0), or does not show the 0.33.0 rule (the qualified runtime)."""
        runner, speculator = self._read(_RUNNER), self._read(_SPECULATOR)
        if not (runner and speculator) or _REPLICATES_ONLY_AT_DCP1 not in runner:
            return None
        default = _DFLASH_DRAFT_DCP_DEFAULT.search(self._read(_DFLASH_CONFIG))
        if _SPECULATOR_TAKES_DRAFT_DCP in speculator and default and "return 1" in default[0]:
            return None
        if _SPECULATOR_TAKES_TARGET_DCP in speculator:
            return (
                f"{_RUNNER} replicates a draft's cache only when the speculator's DCP size is 1 "
                f"and {_SPECULATOR} takes the target's DCP size, so the draft is DCP-sharded"
            )
        return None

    def sm120_sparse_mla_row_bytes(self, kv_lora_rank: int, qk_rope_head_dim: int) -> int | None:
        """The FP8 latent row in bytes per token that vLLM's own SM120 sparse-MLA backend stores
        for this MLA shape, when its source states one (vLLM 0.34.0: 528 for GLM-5.3); None
        when it keeps vLLM's general DS-MLA format (0.33.0: 656)."""
        for match in _ROW_BYTES.finditer(self._read(_SM120_SPARSE_MLA)):
            if (int(match["rank"]), int(match["rope"])) == (kv_lora_rank, qk_rope_head_dim):
                return int(match["bytes"])
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
            raise UsageError(
                "--vllm-root",
                str(root),
                "is not a vLLM package directory",
                "point it at the directory that holds vllm/__init__.py",
            )
    return VllmInstall(path, version_of(path))


def version_of(path: Path) -> str:
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
