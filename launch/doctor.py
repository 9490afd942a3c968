"""`launch doctor`: what breaks GLM-5.3 serving on a PCIe Blackwell host, found before a
40-minute start finds it. Each check is ok / warn / fail with what was seen and the fix.

The checks are pure functions over what `launch.host_facts` read (live, or from recorded
outputs); `gather` is the I/O edge. The fixes are the reported ones: NCCL hangs in the first
all-reduce when the IOMMU translates peer traffic or ACS redirects it
(local-inference-lab/rtx6kpro#15, vllm-project/vllm#33041, NVIDIA/nccl#2079, NCCL's
troubleshooting guide, "PCI Access Control Services").
"""

from __future__ import annotations

import codecs
import os
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path

from launch.docker_api import NVIDIA_HOOK, gives_gpus, nvidia_cdi_specs
from launch.errors import UsageError
from launch.host_facts import (
    AcsControl,
    GpuReport,
    HubWeights,
    Iommu,
    Unreadable,
    hub_weights,
    iommu_mode,
    parse_acs,
    parse_nvidia_smi,
    parse_topo,
    read_iommu,
    read_nvml,
    run_tool,
)
from launch.kv_offload import (
    gib,
    host_memory,
    read_host_memory,
    read_host_memory_total,
)
from launch.profile import Profile
from launch.settings import Settings
from launch.sizes import GIB, MIB
from launch.weights import weight_repos

HUB = "https://huggingface.co"

MIN_DRIVER = "580.65.06"
"""CUDA 13.0's minimum Linux driver (CUDA 13.0 release notes, table 3: >= 580.65.06): the
image's torch and vLLM are built for CUDA 13.0."""
QUALIFIED_GPU = "RTX PRO 6000"
"""The card the profiles were qualified on (any of its editions)."""
OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(frozen=True)
class Finding:
    name: str
    status: str
    seen: str
    fix: str = ""


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def check_driver(report: GpuReport | Unreadable) -> Finding:
    name = "NVIDIA driver"
    if isinstance(report, Unreadable):
        return Finding(
            name,
            FAIL,
            f"no driver: {report.why}",
            "install the NVIDIA driver, 580 series or newer (CUDA 13.0)",
        )
    want = MIN_DRIVER
    if _version(report.driver) < _version(MIN_DRIVER):
        return Finding(
            name,
            FAIL,
            f"{report.driver} ({report.source}), older than {want}",
            f"upgrade the driver to {want} or newer: the image runs CUDA 13.0",
        )
    return Finding(name, OK, f"{report.driver} ({report.source}), >= {want}")


def check_gpus(report: GpuReport | Unreadable, profile: Profile) -> Finding:
    e, d = profile.engine, profile.deployment
    need = e.world_size
    name = f"GPUs for TP{e.tensor_parallel_size} x PP{e.pipeline_parallel_size}"
    if isinstance(report, Unreadable):
        return Finding(
            name,
            FAIL,
            f"no GPUs seen: {report.why}",
            f"a host with {need} NVIDIA GPUs and their driver",
        )
    by_index = {g.index: g for g in report.gpus}
    chosen = [by_index[i] for i in d.gpu_devices if i in by_index]
    seen = "; ".join(f"{g.index}: {g.name}, {g.memory_mib:,} MiB" for g in chosen) or "none"
    missing = [i for i in d.gpu_devices if i not in by_index]
    if len(chosen) < need:
        return Finding(
            name,
            FAIL,
            f"{len(report.gpus)} GPU(s) on the host, {len(chosen)} of GPU_DEVICES="
            f"{','.join(map(str, d.gpu_devices))} present ({seen})"
            + (f"; missing {missing}" if missing else ""),
            f"GPU_DEVICES naming {need} GPUs of this host, or a host with {need}",
        )
    budget = e.kv_cache_memory_bytes
    small = [g for g in chosen if budget and g.memory_mib * MIB <= budget]
    if small:
        return Finding(
            name,
            FAIL,
            f"{seen}: the KV budget alone ({gib(budget or 0)}) does not fit",
            "GPUs with more memory, or a smaller KV_CACHE_MEMORY",
        )
    other = [g for g in chosen if QUALIFIED_GPU not in g.name]
    if other:
        return Finding(
            name,
            WARN,
            f"{seen}: not the {QUALIFIED_GPU} the profile was qualified on",
            "expect different capacity and speed; the smoke check will say",
        )
    return Finding(name, OK, seen)


def check_toolkit(runtimes: list[str] | Unreadable, hook: str | None, cdi: list[str]) -> Finding:
    name = "NVIDIA container toolkit"
    if isinstance(runtimes, Unreadable):
        return Finding(name, FAIL, runtimes.why, "start the Docker engine")
    seen = f"engine runtimes {sorted(runtimes)}"
    if gives_gpus(runtimes, hook, cdi):
        parts = [seen] + ([f"hook {hook}"] if hook else []) + ([f"CDI {cdi}"] if cdi else [])
        return Finding(name, OK, "; ".join(parts))
    return Finding(
        name,
        FAIL,
        f"{seen}, no nvidia-container-runtime-hook, no CDI spec",
        "install nvidia-container-toolkit, then `nvidia-ctk runtime configure "
        "--runtime=docker` and restart dockerd",
    )


def needs_peer_traffic(profile: Profile) -> bool:
    e = profile.engine
    return (
        profile.deployment.device == "cuda"
        and e.world_size > 1
    )


def check_iommu(state: Iommu, profile: Profile) -> Finding:
    name = "IOMMU mode"
    if state.mode == "translated" and needs_peer_traffic(profile):
        return Finding(
            name,
            FAIL,
            f"translated ({state.seen}): peer-to-peer writes go through "
            "the IOMMU; NCCL's first all-reduce hangs on such hosts",
            "boot with iommu=pt (or amd_iommu=off / intel_iommu=off), or set "
            "the IOMMU to passthrough in the BIOS",
        )
    if state.mode == "unknown":
        return Finding(
            name,
            WARN,
            f"cannot read ({state.seen})",
            "run on the host itself (needs /proc/cmdline and /sys)",
        )
    return Finding(name, OK, f"{state.mode} ({state.seen})")


def check_acs(controls: list[AcsControl] | Unreadable, profile: Profile) -> Finding:
    name = "PCIe ACS redirect"
    if isinstance(controls, Unreadable):
        return Finding(
            name,
            WARN,
            f"cannot read: {controls.why}",
            "run `sudo make doctor` (lspci shows ACS only to root), with pciutils",
        )
    if not controls:
        return Finding(
            name,
            WARN,
            "no ACSCtl line in lspci's output (needs root)",
            "run `sudo make doctor` so lspci can read the capabilities",
        )
    on = [c for c in controls if c.redirects]
    if on and needs_peer_traffic(profile):
        where = "; ".join(f"{c.device or 'a bridge'}: {c.flags}" for c in on[:3])
        return Finding(
            name,
            FAIL,
            f"redirect on at {len(on)} of {len(controls)} ports ({where})",
            "disable ACS in the BIOS, or boot with pci=noacs; at run time (lost at "
            "reboot): `setpci -s <bridge> ECAP_ACS+6.w=0000` on each port listed",
        )
    return Finding(name, OK, f"no redirect on {len(controls)} ports' ACSCtl")


def check_topology(matrix: dict[str, dict[str, str]] | Unreadable, profile: Profile) -> Finding:
    name = "GPU topology"
    if isinstance(matrix, Unreadable):
        return Finding(name, WARN, f"cannot read: {matrix.why}", "install the NVIDIA driver")
    gpus = [f"GPU{i}" for i in profile.deployment.gpu_devices]
    links = {(a, b): matrix.get(a, {}).get(b) for a in gpus for b in gpus if a < b}
    seen = ", ".join(f"{a}-{b} {v}" for (a, b), v in links.items() if v) or "no links read"
    if any(v == "SYS" for v in links.values()):
        return Finding(
            name,
            WARN,
            f"{seen}: SYS crosses the CPU sockets' interconnect",
            "choose GPU_DEVICES on one NUMA node if the host allows",
        )
    return Finding(name, OK, seen)


def check_host_memory_room(available: int | None, profile: Profile) -> Finding:
    """Shared memory is host memory: the rule `make up` and `launch run` apply
    (`launch.kv_offload.HostMemory`), as a finding."""
    name = "host memory"
    if available is None:
        return Finding(name, WARN, "cannot read /proc/meminfo", "run on the host itself")
    memory = host_memory(profile.engine.kv_offload, profile.engine.world_size)
    if memory.need > available:
        return Finding(name, FAIL, memory.seen(available), memory.fix(available))
    return Finding(name, OK, memory.seen(available))


def check_shared_memory(total: int | None, profile: Profile) -> Finding:
    """The container gets a private /dev/shm of the profile's size (compose shm_size, not the
    host's /dev/shm): a tmpfs whose pages are host memory, so the host must have that much."""
    name = "shared memory"
    size = profile.deployment.shm_size_gib * GIB
    if total is None:
        return Finding(name, WARN, "cannot read /proc/meminfo", "run on the host itself")
    seen = (f"the container's private /dev/shm is {gib(size)} (deployment.shm_size_gib); the "
            f"host has {gib(total)} of memory")  # fmt: skip
    if size > total:
        fix = (f"SHM_SIZE_GIB={max(total // GIB - 1, 1)} or less (with a native KV tier, a "
               "smaller KV_OFFLOADING_SIZE_GB too), or a host with more memory")
        return Finding(name, FAIL, seen, fix)
    return Finding(name, OK, seen)


def check_disk(free: int | Unreadable, image_bytes: int | None, weights: HubWeights,
               where: str) -> Finding:  # fmt: skip
    """The image and the weights (the volume lives under the engine's root too) against the
    free space there; what could not be sized is said, not assumed small."""
    name = "disk for image and weights"
    if isinstance(free, Unreadable):
        return Finding(name, WARN, free.why, "start the Docker engine")
    need = (image_bytes or 0) + (weights.bytes or 0)
    parts = [f"image {gib(image_bytes)}" if image_bytes else "image not on the engine yet",
             f"weights {gib(weights.bytes)}" if weights.bytes is not None
             else f"weights not sized ({weights.why})"]  # fmt: skip
    seen = f"{gib(free)} free at {where}; {', '.join(parts)}"
    if need > free:
        return Finding(name, FAIL, seen, "free space where Docker keeps images and volumes")
    if image_bytes is None or weights.bytes is None:
        return Finding(name, WARN, seen, "pull the image and make the Hub reachable, then run "
                       "doctor again")  # fmt: skip
    return Finding(name, OK, seen)


def check_port(host: str, port: int) -> Finding:
    """The host address and port compose publishes the API on (BIND_ADDRESS, HOST_PORT)."""
    name = f"API port {port}"
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0" if host in ("", "0.0.0.0") else host, port))
        except OSError as err:
            return Finding(
                name,
                FAIL,
                f"in use ({err.strerror})",
                f"stop what listens on {port}, or set HOST_PORT=<another> in compose/.env",
            )
    return Finding(name, OK, "free")


def check_hf_token(profile: Profile, token: str | None, weights: HubWeights) -> Finding:
    """The Hub token (compose/secrets/hf_token) against what the Hub said of the weights."""
    name = "HF_TOKEN"
    if not weight_repos(profile):
        return Finding(name, OK, "the model is in the image")
    if weights.gated:
        return Finding(name, FAIL, f"{', '.join(weights.gated)}: {weights.why}",
                       "write a token with access to it to compose/secrets/hf_token" if not token
                       else "use a token that has been granted access")  # fmt: skip
    if weights.bytes is None and not token:
        return Finding(name, WARN, f"not set, and the Hub could not say whether it is needed "
                       f"({weights.why})",
                       "write a token to compose/secrets/hf_token if the repository is "
                       "gated")  # fmt: skip
    return Finding(name, OK, "set" if token else "not needed: the Hub answered without one")


@dataclass(frozen=True)
class HostFacts:
    """Everything the checks judge, read once."""

    gpus: GpuReport | Unreadable
    topology: dict[str, dict[str, str]] | Unreadable
    acs: list[AcsControl] | Unreadable
    iommu: Iommu
    memory: int | None
    memory_total: int | None = None
    runtimes: list[str] | Unreadable = field(default_factory=list)
    hook: str | None = None
    cdi: list[str] = field(default_factory=list)
    disk_free: int | Unreadable = 0
    disk_root: str = ""
    image_bytes: int | None = None
    weights: HubWeights = field(default_factory=lambda: HubWeights(None, why="not asked"))


def judge(facts: HostFacts, profile: Profile, settings: Settings) -> list[Finding]:
    """Every check, in the order a user fixes them."""
    d = profile.deployment
    findings = [check_driver(facts.gpus)] if d.device == "cuda" else []
    if d.device == "cuda":
        findings += [
            check_gpus(facts.gpus, profile),
            check_toolkit(facts.runtimes, facts.hook, facts.cdi),
            check_iommu(facts.iommu, profile),
            check_acs(facts.acs, profile),
            check_topology(facts.topology, profile),
        ]
    return [
        *findings,
        check_host_memory_room(facts.memory, profile),
        check_shared_memory(facts.memory_total, profile),
        check_disk(facts.disk_free, facts.image_bytes, facts.weights, facts.disk_root),
        check_port(settings.bind_address, settings.host_port),
        check_hf_token(profile, settings.hf_token(), facts.weights),
    ]


@dataclass(frozen=True)
class Recorded:
    """Outputs recorded on a host (files), judged instead of reading this one."""

    nvidia_smi: Path | None = None
    topo: Path | None = None
    lspci: Path | None = None
    kernel_log: Path | None = None

    def text(self, name: str) -> str | None:
        """The recorded output `name` as text, or None when none was given: UTF-8, or UTF-16
        with its byte-order mark (what PowerShell's `>` writes); anything else is refused by the
        flag's name."""
        path: Path | None = getattr(self, name)
        if path is None:
            return None
        flag = "--" + name.replace("_", "-")
        try:
            data = path.read_bytes()
        except OSError as err:
            raise UsageError(flag, str(path), "is not a readable file",
                             "pass the file the output was saved to") from err  # fmt: skip
        for bom, codec in ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"),
                           (codecs.BOM_UTF16_BE, "utf-16")):  # fmt: skip
            if data.startswith(bom):
                return data.decode(codec, errors="replace")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise UsageError(
                flag, str(path), f"is not UTF-8 or UTF-16 text (byte 0x{data[err.start]:02x} at "
                f"offset {err.start})",
                "save the command's output as text, e.g. `nvidia-smi > out.txt` on the host",
            ) from err  # fmt: skip


def gather(recorded: Recorded, image: str | None, profile: Profile,
           settings: Settings) -> HostFacts:  # fmt: skip
    """Read this host (or the recorded outputs given instead), and ask the Hub (HF_ENDPOINT,
    as compose's fetch service does) how large the profile's weights are."""
    import docker

    smi, topo, lspci, kernel_log = (recorded.text(name) for name in
                                     ("nvidia_smi", "topo", "lspci", "kernel_log"))  # fmt: skip
    gpus = parse_nvidia_smi(smi, str(recorded.nvidia_smi)) if smi is not None else read_nvml()
    topo_text = topo if topo is not None else run_tool(["nvidia-smi", "topo", "-m"])
    lspci_text = lspci if lspci is not None else run_tool(["lspci", "-vvv"])
    iommu = iommu_mode("", [], kernel_log) if kernel_log is not None else read_iommu()
    facts = dict(
        gpus=gpus,
        topology=topo_text if isinstance(topo_text, Unreadable) else parse_topo(topo_text),
        acs=lspci_text if isinstance(lspci_text, Unreadable) else parse_acs(lspci_text),
        iommu=iommu,
        memory=read_host_memory(),
        memory_total=read_host_memory_total(),
        hook=shutil.which(NVIDIA_HOOK),
        cdi=nvidia_cdi_specs(),
        weights=hub_weights([(r.repo_id, r.revision) for r in weight_repos(profile)],
                            settings.get("HF_ENDPOINT") or HUB, settings.hf_token()),
    )
    try:
        client = docker.from_env(timeout=10)
        info = client.info()
    except docker.errors.DockerException as err:
        why = Unreadable(f"the Docker engine does not answer ({type(err).__name__})")
        return HostFacts(**facts, runtimes=why, disk_free=why)
    root = info.get("DockerRootDir", "/var/lib/docker")
    free = (
        shutil.disk_usage(root).free
        if os.path.isdir(root)
        else Unreadable(f"{root} is not readable here")
    )
    size = None
    if image:
        try:
            size = int(client.images.get(image).attrs.get("Size") or 0) or None
        except docker.errors.DockerException:
            size = None
    return HostFacts(
        **facts,
        runtimes=sorted(info.get("Runtimes") or {}),
        disk_free=free,
        disk_root=root,
        image_bytes=size,
    )
