"""KV cache tiers below the GPU cache: what vLLM's offload flags need from the host.

vLLM (0.33.0 and 0.34.0) enables a host tier with `--kv-offloading-backend native|lmcache` and
`--kv-offloading-size <GiB>` (`vllm/config/vllm.py`, `_post_init_kv_transfer_config`: without a
size nothing is offloaded, whatever the backend). The native backend stages the tier through one
memory-mapped file in /dev/shm (`v1/kv_offload/cpu/shared_offload_region.py`: `Created mmap file
... (N GB)`), so the container's shared memory must hold it beside vLLM's own message queues, and
the host must have the memory behind it. These are pure functions: the validator and `launch run`
feed them the profile and what they read from the host.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launch.sizes import GIB, MIB

OFFLOAD_FLAGS = {"--kv-offloading-backend": "backend", "--kv-offloading-size": "size_gib"}
"""vLLM's flags for the host tier -> the `engine.kv_offload` field each renders from."""
OFF = "vram"
"""The mode without a host tier (GPU KV cache only), as the seeds' runtime names it."""
CONNECTORS = {
    "native": ("OffloadingConnector", "SimpleCPUOffloadConnector"),
    "lmcache": ("LMCacheMPConnector",),
}
"""The KV connector vLLM creates for each backend (`_post_init_kv_transfer_config`; native picks
SimpleCPUOffloadConnector when VLLM_USE_SIMPLE_KV_OFFLOAD is set)."""
MQ_CHUNKS = 10
MQ_CHUNK_BYTES = 24 * MIB
"""vLLM's shared-memory message queue ring: 10 chunks of at most 24 MiB
(`distributed/device_communicators/shm_broadcast.py`, MessageQueue defaults)."""
OTHER_SHM_BYTES = 1 * GIB
"""NCCL's shared-memory transport and PyTorch's shared tensors, which vLLM does not size: the
kit keeps 1 GiB for them."""


def vllm_shm_bytes(world_size: int) -> int:
    """/dev/shm vLLM itself uses besides an offload region: the executor's broadcast queue, the
    tensor-parallel group's broadcaster, one response queue per worker, and `OTHER_SHM_BYTES`."""
    return (2 + world_size) * MQ_CHUNKS * MQ_CHUNK_BYTES + OTHER_SHM_BYTES


def region_bytes(size_gib: float) -> int:
    """The offload region vLLM maps: `kv_offloading_size` GiB summed over the TP ranks."""
    return int(size_gib * GIB)


def shm_needed_bytes(size_gib: float, world_size: int) -> int:
    return region_bytes(size_gib) + vllm_shm_bytes(world_size)


@dataclass(frozen=True)
class HostMemory:
    """The one host-memory rule (`make doctor`, `make up`, `launch run`): the server's shared
    memory is host memory, so the native KV tier's region and vLLM's own shared memory must fit
    in what the host (or the container's cgroup) can still give."""

    tier: int
    """The native KV tier's region, 0 without one."""
    queues: int
    """vLLM's own shared memory (`vllm_shm_bytes`)."""

    @property
    def need(self) -> int:
        return self.tier + self.queues

    def seen(self, available: int) -> str:
        return (f"{gib(available)} available (MemAvailable, capped by the container's memory "
                f"limit); the server's shared memory needs {gib(self.need)}"
                + (f" (the native KV tier {gib(self.tier)})" if self.tier else ""))  # fmt: skip

    def problem(self, available: int) -> str:
        return (f"needs {gib(self.need)} of host memory for the server's shared memory"
                + (f" (the native KV tier {gib(self.tier)} and vLLM's own {gib(self.queues)})"
                   if self.tier else "")
                + f", and this host can give {gib(available)} (MemAvailable, capped by the "
                "container's memory limit)")  # fmt: skip

    def fix(self, available: int) -> str:
        if not self.tier:
            return "free host memory"
        room = max(available - self.queues, 0)
        return f"KV_OFFLOADING_SIZE_GB={room // GIB} or less, or free host memory"


def host_memory(offload: Any, world_size: int) -> HostMemory:
    """What the server takes of the host's memory, for the profile's `engine.kv_offload` (None,
    or a backend and a size in GiB: only the native backend maps its tier in /dev/shm)."""
    native = offload is not None and offload.backend == "native"
    return HostMemory(region_bytes(offload.size_gib) if native else 0, vllm_shm_bytes(world_size))


_MEMINFO = re.compile(r"^(?P<key>\w+):\s+(?P<kib>\d+) kB$", re.MULTILINE)


def meminfo_bytes(meminfo: str) -> dict[str, int]:
    """/proc/meminfo's `Key: N kB` lines, in bytes."""
    return {m.group("key"): int(m.group("kib")) * 1024 for m in _MEMINFO.finditer(meminfo)}


def mem_available_bytes(
    meminfo: str, cgroup_max: str | None = None, cgroup_current: str | None = None
) -> int | None:
    """Memory a new allocation can get: /proc/meminfo's MemAvailable, capped by what the
    container's cgroup still allows (memory.max - memory.current; "max" means no limit).
    None if neither says."""
    available = meminfo_bytes(meminfo).get("MemAvailable")
    limit, used = (cgroup_max or "").strip(), (cgroup_current or "0").strip()
    if limit.isdigit() and used.isdigit():
        room = max(int(limit) - int(used), 0)
        available = room if available is None else min(available, room)
    return available


def mem_total_bytes(meminfo: str, cgroup_max: str | None = None) -> int | None:
    """All the memory this host (or container) has: MemTotal, capped by the cgroup's memory.max.
    A private /dev/shm is a tmpfs whose pages come out of it."""
    total = meminfo_bytes(meminfo).get("MemTotal")
    limit = (cgroup_max or "").strip()
    if limit.isdigit():
        total = int(limit) if total is None else min(total, int(limit))
    return total


def tier_in_argv(argv: list[str]) -> dict[str, str] | None:
    """The host tier a rendered command asks for ({flag: value}), or None without one."""
    given = {f: argv[argv.index(f) + 1] for f in OFFLOAD_FLAGS if f in argv[:-1]}
    return given or None


def gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def _read(root: Path, path: str) -> str | None:
    file = root / path
    return file.read_text(encoding="utf-8") if file.is_file() else None


def read_host_memory(root: Path = Path("/")) -> int | None:
    """What `mem_available_bytes` says about this host or container (thin I/O)."""
    meminfo = _read(root, "proc/meminfo")
    if meminfo is None:
        return None
    return mem_available_bytes(meminfo, _read(root, "sys/fs/cgroup/memory.max"),
                               _read(root, "sys/fs/cgroup/memory.current"))  # fmt: skip


def read_host_memory_total(root: Path = Path("/")) -> int | None:
    """What `mem_total_bytes` says about this host or container (thin I/O)."""
    meminfo = _read(root, "proc/meminfo")
    return None if meminfo is None else mem_total_bytes(
        meminfo, _read(root, "sys/fs/cgroup/memory.max"))  # fmt: skip
