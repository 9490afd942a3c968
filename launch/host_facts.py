"""What a GPU host is, read from the tools and files that say it: NVML (nvidia-ml-py) for the
driver and GPUs, `nvidia-smi topo -m` for the links between them, `lspci -vvv` for the PCIe
bridges' ACS redirect, /proc/cmdline and /sys/kernel/iommu_groups for the IOMMU mode.

The parsers take the text users paste into bug reports (`nvidia-smi`, `nvidia-smi topo -m`,
`lspci -vvv`, the kernel's `iommu: Default domain type:` line), so `launch doctor` judges a
recorded host the same way as a live one. Readers return None (with why) when a source cannot
be read; nothing here decides what is good or bad (`launch.doctor` does).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_mib: int
    bus_id: str


@dataclass(frozen=True)
class GpuReport:
    driver: str
    gpus: tuple[Gpu, ...]
    source: str


@dataclass(frozen=True)
class Unreadable:
    """A source that could not be read, and why (shown as the check's `seen`)."""

    why: str


_DRIVER = re.compile(r"Driver Version:\s*(?P<v>[0-9][0-9.]*)")
_GPU_ROW = re.compile(r"^\|\s+(?P<i>\d+)\s+(?P<name>.+?)\s+(?:On|Off)\s+\|\s+"
                      r"(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])")
_MEMORY = re.compile(r"(?P<used>\d+)MiB\s*/\s*(?P<total>\d+)MiB")


def parse_nvidia_smi(text: str, source: str = "nvidia-smi") -> GpuReport | Unreadable:
    """The default `nvidia-smi` table: driver version, then per GPU its row (index, name,
    bus id) and the next row's memory total."""
    driver = _DRIVER.search(text)
    if driver is None:
        return Unreadable(f"no 'Driver Version' in the {source} output")
    lines = text.splitlines()
    gpus = []
    for n, line in enumerate(lines):
        row = _GPU_ROW.match(line.strip())
        memory = _MEMORY.search(lines[n + 1]) if row and n + 1 < len(lines) else None
        if row and memory:
            gpus.append(Gpu(int(row["i"]), row["name"].strip(), int(memory["total"]),
                            row["bus"].lower()))  # fmt: skip
    return GpuReport(driver["v"], tuple(gpus), source)


def read_nvml() -> GpuReport | Unreadable:
    """The driver and GPUs through NVML (the library nvidia-smi itself reads)."""
    try:
        import pynvml
    except ImportError:
        return Unreadable("nvidia-ml-py is not installed (pip install nvidia-ml-py)")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return Unreadable(f"NVML: {err} (no NVIDIA driver loaded)")
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
            bus = pynvml.nvmlDeviceGetPciInfo(handle).busId
            gpus.append(Gpu(i, _text(name), int(memory), _text(bus).lower()))
        return GpuReport(_text(pynvml.nvmlSystemGetDriverVersion()), tuple(gpus), "NVML")
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def parse_topo(text: str) -> dict[str, dict[str, str]]:
    """`nvidia-smi topo -m`: GPU row -> GPU column -> link (X, PIX, PXB, PHB, NODE, SYS, NV#)."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = next((line.split() for line in lines if line.split()[:1] == ["GPU0"]), None)
    if header is None:
        return {}
    columns = [c for c in header if re.fullmatch(r"GPU\d+", c)]
    matrix = {}
    for line in lines:
        cells = line.split()
        if len(cells) > len(columns) and re.fullmatch(r"GPU\d+", cells[0]) and cells != header:
            matrix[cells[0]] = dict(zip(columns, cells[1 : len(columns) + 1], strict=True))
    return matrix


_DEVICE = re.compile(r"^(?P<bdf>(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+"
                     r"(?P<what>.*)$")  # fmt: skip
_ACS = re.compile(r"ACSCtl:\s*(?P<flags>.*)$")


@dataclass(frozen=True)
class AcsControl:
    device: str
    """The device's header line in lspci (`00:03.1 PCI bridge: ...`), or '' when the text
    holds ACSCtl lines only (as `lspci -vvv | grep ACSCtl` prints)."""
    flags: str

    @property
    def redirects(self) -> bool:
        return "ReqRedir+" in self.flags or "CmpltRedir+" in self.flags


def parse_acs(text: str) -> list[AcsControl]:
    """Every `ACSCtl:` of an `lspci -vvv` output, with the device it belongs to."""
    device, out = "", []
    for raw in text.splitlines():
        line = raw.strip()
        if (head := _DEVICE.match(raw)) is not None:
            device = f"{head['bdf']} {head['what']}".strip()
        elif (acs := _ACS.search(line)) is not None:
            out.append(AcsControl(device, " ".join(acs["flags"].split())))
    return out


@dataclass(frozen=True)
class Iommu:
    mode: str
    """`off`, `passthrough`, `translated`, or `unknown`."""
    seen: str


_DOMAIN = re.compile(r"iommu: Default domain type: (?P<type>\w+)")
OFF_ARGS = ("amd_iommu=off", "intel_iommu=off", "iommu=off")
PASSTHROUGH_ARGS = ("iommu=pt", "iommu.passthrough=1")


def iommu_mode(cmdline: str, group_types: list[str], kernel_log: str = "") -> Iommu:
    """The IOMMU's DMA mode from the kernel command line, the groups' domain types (`identity`
    is passthrough; `DMA` and `DMA-FQ` translate) or the kernel's own boot line."""
    args = cmdline.split()
    off = [a for a in args if a in OFF_ARGS]
    if off:
        return Iommu("off", f"/proc/cmdline has {off[0]}")
    types = sorted(set(group_types))
    if types:
        mode = "passthrough" if types == ["identity"] else "translated"
        return Iommu(mode, f"IOMMU groups' domain types {types}")
    if (line := _DOMAIN.search(kernel_log)) is not None:
        mode = {"Passthrough": "passthrough", "Translated": "translated"}.get(line["type"],
                                                                             "unknown")
        return Iommu(mode, line.group(0))
    pt = [a for a in args if a in PASSTHROUGH_ARGS]
    if pt:
        return Iommu("passthrough", f"/proc/cmdline has {pt[0]}")
    return Iommu("off", "no IOMMU groups (no IOMMU active)") if cmdline else Iommu(
        "unknown", "nothing read")  # fmt: skip


def read_iommu(root: Path = Path("/")) -> Iommu:
    cmdline = root / "proc/cmdline"
    groups = root / "sys/kernel/iommu_groups"
    types = [p.read_text().strip() for p in sorted(groups.glob("*/type")) if p.is_file()]
    text = cmdline.read_text() if cmdline.is_file() else ""
    return iommu_mode(text, types)


def run_tool(argv: list[str]) -> str | Unreadable:
    """A tool's standard output, or why there is none."""
    if shutil.which(argv[0]) is None:
        return Unreadable(f"{argv[0]} is not installed")
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        return Unreadable(f"`{' '.join(argv)}` exited {result.returncode}: "
                          f"{(result.stderr or result.stdout).strip()[:120]}")  # fmt: skip
    return result.stdout


@dataclass(frozen=True)
class HubWeights:
    """What the Hub says of a profile's weight repositories at their pinned revisions."""

    bytes: int | None
    """Their files' total size, None when not every repository answered."""
    gated: tuple[str, ...] = ()
    """Repositories that refused an anonymous request (401/403): they need HF_TOKEN."""
    why: str = ""
    """Why a size is missing (unreachable, not found), when it is."""


def hub_weights(specs: list[tuple[str, str]], endpoint: str, token: str | None,
                timeout: float = 10.0) -> HubWeights:  # fmt: skip
    """Sizes of (repo, revision) from the Hub's tree API (`/api/models/{repo}/tree/{rev}`, the
    listing huggingface_hub's `list_repo_tree` reads), LFS files at their real size."""
    import httpx

    total, gated, problems = 0, [], []
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    for repo, revision in specs:
        url = f"{endpoint.rstrip('/')}/api/models/{repo}/tree/{revision}"
        try:
            response = httpx.get(url, params={"recursive": "true"}, headers=headers,
                                 timeout=timeout, follow_redirects=True)  # fmt: skip
        except httpx.HTTPError as err:
            problems.append(f"{endpoint} not reachable ({type(err).__name__})")
            continue
        if response.status_code in (401, 403):
            gated.append(repo)
            problems.append(f"{repo} refused a request {'with' if token else 'without'} a token")
        elif response.status_code != 200:
            problems.append(f"{repo}@{revision}: HTTP {response.status_code}")
        else:
            total += sum((e.get("lfs") or {}).get("size", e.get("size", 0))
                         for e in response.json() if e.get("type") == "file")  # fmt: skip
    return HubWeights(None if problems else total, tuple(gated), "; ".join(dict.fromkeys(problems)))
