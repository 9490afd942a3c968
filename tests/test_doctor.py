"""`launch doctor` on this machine (no driver, no GPU: it must say so and exit 2) and on host
outputs quoted in public reports (tests/fixtures/host/README.md names each source)."""

from __future__ import annotations

import pytest

from launch.__main__ import main as launch_main
from launch.doctor import (
    FAIL,
    OK,
    WARN,
    check_acs,
    check_driver,
    check_gpus,
    check_iommu,
    check_shared_memory,
    check_topology,
)
from launch.host_facts import (
    Unreadable,
    iommu_mode,
    parse_acs,
    parse_nvidia_smi,
    parse_topo,
    read_nvml,
)
from launch.loader import load
from tests.conftest import REPO

HOST = REPO / "tests" / "fixtures" / "host"
MTP3 = load("mtp3-tp4-split").profile


def smi(name: str):
    return parse_nvidia_smi((HOST / name).read_text(), name)


@pytest.mark.usefixtures("engine_unreachable")
def test_this_machine_as_nvml_sees_it(capsys):
    """Whatever host runs the tests: NVML's real answer here (nvidia-ml-py; no driver on the CI
    machines, four RTX PRO 6000s on the kit's own host) judged by the same rules, is what the
    doctor prints, and any FAIL makes its exit 2."""
    report = read_nvml()
    code = launch_main(["doctor", "mtp3-tp4-split"])
    out = capsys.readouterr().out
    for finding in (check_driver(report), check_gpus(report, MTP3)):
        word = "FAIL" if finding.status == FAIL else finding.status
        assert f"{word:<4}  {finding.name}" in out and finding.seen in out, out
    fails = int(out.rstrip().splitlines()[-1].rsplit(", ", 1)[1].split()[0])
    assert code == (2 if fails else 0) and fails == out.count("\nFAIL  ") + out.startswith("FAIL")
    if isinstance(report, Unreadable):  # no driver: both say so
        assert "FAIL  NVIDIA driver" in out and "FAIL  GPUs for TP4 x PP1" in out


def test_driver_older_than_cuda_13_fails_and_580_passes():
    old = check_driver(smi("nvidia-smi-535-quadro-rtx4000.txt"))
    assert old.status == FAIL and old.seen.startswith("535.129.03")
    assert "580.65.06" in old.fix
    assert check_driver(smi("nvidia-smi-575-rtx5070.txt")).status == FAIL
    new = check_driver(smi("nvidia-smi-580-2x-a100.txt"))
    assert new.status == OK and new.seen.startswith("580.126.09")


def test_too_few_gpus_fail_and_other_cards_warn():
    two = smi("nvidia-smi-580-2x-a100.txt")
    assert [(g.index, g.name, g.memory_mib, g.bus_id) for g in two.gpus] == [
        (0, "NVIDIA A100-SXM4-40GB", 40960, "00000000:10:1c.0"),
        (1, "NVIDIA A100-SXM4-40GB", 40960, "00000000:10:1d.0"),
    ]
    few = check_gpus(two, MTP3)
    assert few.status == FAIL and few.seen.startswith("2 GPU(s) on the host, 2 of GPU_DEVICES")
    assert "missing [2, 3]" in few.seen
    tp2 = load("mtp3-tp4-split", _overrides(TP="2", GPU_DEVICES="0,1")).profile
    other = check_gpus(two, tp2)
    assert other.status == WARN and "not the RTX PRO 6000" in other.seen
    assert check_gpus(Unreadable("NVML: no driver"), MTP3).status == FAIL


def _overrides(**env: str):
    from launch.overrides import from_environment

    return from_environment(env)


def test_acs_redirect_on_a_bridge_fails_with_the_reported_fixes():
    on = check_acs(parse_acs((HOST / "lspci-acsctl-redirect-on.txt").read_text()), MTP3)
    assert on.status == FAIL and on.seen.startswith("redirect on at 3 of 6 ports")
    assert "pci=noacs" in on.fix and "ECAP_ACS+6.w=0000" in on.fix
    off = check_acs(parse_acs((HOST / "lspci-acsctl-redirect-off.txt").read_text()), MTP3)
    assert off.status == OK
    assert check_acs(Unreadable("lspci is not installed"), MTP3).status == WARN


def test_translated_iommu_fails_a_tensor_parallel_profile_and_passthrough_passes():
    translated = iommu_mode("", [], (HOST / "dmesg-iommu-translated.txt").read_text())
    assert translated.mode == "translated"
    finding = check_iommu(translated, MTP3)
    assert finding.status == FAIL and "iommu=pt" in finding.fix
    passthrough = iommu_mode("", [], (HOST / "dmesg-iommu-passthrough.txt").read_text())
    assert check_iommu(passthrough, MTP3).status == OK
    assert iommu_mode("BOOT_IMAGE=/vmlinuz amd_iommu=off", ["DMA"]).mode == "off"
    assert iommu_mode("ro quiet", ["identity", "identity"]).mode == "passthrough"
    assert iommu_mode("ro quiet", ["DMA-FQ", "identity"]).mode == "translated"


def test_topology_across_sockets_warns():
    matrix = parse_topo((HOST / "topo-5gpu-sys-node-phb.txt").read_text())
    assert matrix["GPU1"]["GPU2"] == "PHB" and matrix["GPU0"]["GPU4"] == "SYS"
    across = check_topology(matrix, MTP3)  # GPUs 0-3: GPU0 sits on the other node
    assert across.status == WARN and "GPU0-GPU1 SYS" in across.seen
    near = load("mtp3-tp4-split", _overrides(GPU_DEVICES="1,2,3,4")).profile
    assert check_topology(matrix, near).status == OK


def test_the_private_shm_must_fit_in_the_hosts_memory():
    """/proc/meminfo as the Linux kernel writes it, and a cgroup v2 memory.max: the container's
    /dev/shm (64 GiB for mtp3) must fit in what the host (or its cgroup) has."""
    from launch.kv_offload import mem_total_bytes

    meminfo = "MemTotal:       528012345 kB\nMemFree:        1000 kB\nMemAvailable:   2000 kB\n"
    total = mem_total_bytes(meminfo)
    assert total == 528012345 * 1024
    assert check_shared_memory(total, MTP3).status == OK
    capped = mem_total_bytes(meminfo, str(48 * 2**30))
    small = check_shared_memory(capped, MTP3)
    assert small.status == FAIL and "private /dev/shm is 64.00 GiB" in small.seen
    assert small.fix.startswith("SHM_SIZE_GIB=47 or less")
    assert check_shared_memory(None, MTP3).status == WARN


@pytest.mark.usefixtures("engine_unreachable")
def test_recorded_outputs_through_the_command(capsys):
    argv = ["doctor", "mtp3-tp4-split",
            "--nvidia-smi", str(HOST / "nvidia-smi-580-2x-a100.txt"),
            "--topo", str(HOST / "topo-5gpu-sys-node-phb.txt"),
            "--lspci", str(HOST / "lspci-acsctl-redirect-on.txt"),
            "--kernel-log", str(HOST / "dmesg-iommu-translated.txt")]  # fmt: skip
    assert launch_main(argv) == 2
    out = capsys.readouterr().out
    assert out.startswith("doctor: profile mtp3-tp4-split on recorded outputs")
    for line in ("ok    NVIDIA driver", "FAIL  GPUs for TP4 x PP1", "FAIL  IOMMU mode",
                 "FAIL  PCIe ACS redirect", "warn  GPU topology"):  # fmt: skip
        assert line in out


@pytest.mark.parametrize("flag", ["--nvidia-smi", "--lspci"])
def test_a_missing_recorded_file_is_exit_2_naming_the_flag(capsys, tmp_path, flag):
    assert launch_main(["doctor", "mtp3-tp4-split", flag, str(tmp_path / "nope.txt")]) == 2
    assert f"error: {flag}=" in capsys.readouterr().err


def test_weights_are_sized_from_the_hub_tree_and_a_gated_repo_needs_hf_token():
    """Against the Hub stand-in (tests/hub_standin.py: the tree API huggingface_hub reads; the
    Hub itself is not reachable here)."""
    from launch.doctor import check_disk, check_hf_token
    from launch.host_facts import hub_weights
    from tests.hub_standin import HubRepo, HubStandin

    commit = "5d1f0c8a2b7e4f9061c3d2a8b5e7f1029384abcd"
    files = {"config.json": b"{}\n", "model.safetensors": bytes(300_000)}
    hub = HubStandin({"org/open": HubRepo("org/open", commit, files),
                      "org/gated": HubRepo("org/gated", commit, files, gated=True)})  # fmt: skip
    server, url = hub.serve()
    try:
        open_ = hub_weights([("org/open", commit)], url, None)
        gated = hub_weights([("org/gated", commit)], url, None)
        with_token = hub_weights([("org/gated", commit)], url, "hf_x")
    finally:
        server.shutdown()
    assert open_.bytes == 300_003 and not open_.gated
    assert gated.bytes is None and gated.gated == ("org/gated",)
    assert with_token.bytes == 300_003
    need = check_hf_token(MTP3, None, gated)
    assert need.status == FAIL and "compose/secrets/hf_token" in need.fix
    assert check_hf_token(MTP3, None, open_).status == OK
    assert check_hf_token(MTP3, "hf_x", gated).fix == "use a token that has been granted access"
    full = check_disk(200_000, 150_000, open_, "/var/lib/docker")
    assert full.status == FAIL and "weights 0.00 GiB" in full.seen
    assert check_disk(10 * 2**30, 2**30, open_, "/var/lib/docker").status == OK
    unknown = check_disk(10 * 2**30, None, gated, "/var/lib/docker")
    assert unknown.status == WARN and "weights not sized (org/gated refused" in unknown.seen
