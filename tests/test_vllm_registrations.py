"""Capability detection reads what vLLM registers, and agrees with the imported vLLM 0.33.0.

The readers parse registration sites (launch/vllm_registrations.py); each is compared here with
the object vLLM itself builds from the same file, so a site the reader misreads fails. Then the
cases the old substring search got wrong: a name in a comment, in a docstring, inside a longer
name, or only written into additional_config, was counted as read.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import vllm
import vllm.envs
import vllm.reasoning
import vllm.tool_parsers
from vllm.config.cache import KVOffloadingBackend
from vllm.v1.attention.backends.registry import AttentionBackendEnum

from launch import vllm_registrations as reg
from launch.capabilities import requirements, resolve
from launch.errors import UsageError
from launch.feature_env import FEATURE_ENV
from launch.loader import load
from launch.vllm_install import find_vllm
from tests.conftest import FORK_REGISTRATIONS, registration_tree

UPSTREAM = Path(vllm.__file__).parent


def test_env_table_is_the_one_vllm_envs_answers_from():
    table = reg.env_table((UPSTREAM / "envs.py").read_text())
    assert set(table) == set(vllm.envs.environment_variables)
    # a variable declared with env_with_choices keeps its choices; a plain one takes any value
    assert table["VLLM_WORKER_MULTIPROC_METHOD"] == ("spawn", "fork")
    assert table["VLLM_HOST_IP"] is None


def test_enum_tables_and_literal_are_vllms_own():
    install = find_vllm()
    assert install.attention_backends == set(AttentionBackendEnum.__members__)
    assert install.reasoning_parsers == set(vllm.reasoning._REASONING_PARSERS_TO_REGISTER)
    assert install.tool_parsers == set(vllm.tool_parsers._TOOL_PARSERS_TO_REGISTER)
    assert install.kv_offloading_backends == set(KVOffloadingBackend.__args__)


def test_additional_config_reads_are_reads_not_writes():
    source = (
        "def f(vllm_config, self):\n"
        "    additional_config = vllm_config.additional_config\n"
        '    a = additional_config.get("read_by_get", "auto")\n'
        '    b = self.vllm_config.additional_config["read_by_index"]\n'
        '    c = "read_by_in" in additional_config\n'
        '    additional_config["written_only"] = 1\n'
        '    other.get("not_additional_config")\n'
        '    """docstring naming additional_config.get("in_docstring")"""\n'
        '    # additional_config.get("in_comment")\n'
    )
    assert reg.mapping_keys_read(source) == {"read_by_get", "read_by_index", "read_by_in"}


def test_names_outside_the_registration_sites_do_not_count(tmp_path):
    """The old substring search (`VllmInstall.reads`, c43faa7) counted b12x_pcie_allreduce,
    dcp_ckv_gather, split_pages and glm53_kda_decode_backend as provided by this tree: the fork's
    all-reduce module reads B12X_PCIE_ALLREDUCE_ALGORITHM, a comment names DCP_CKV_GATHER, string
    constants name the split variables, and `additional_config[...] = ...` only writes the key."""
    root = registration_tree(tmp_path / "vllm")
    (root / "mentions.py").write_text(
        '"""The launcher sets VLLM_B12X_MLA_CKV_GATHER and glm53_kda_decode_backend."""\n'
        "import os\n"
        '# VLLM_ENABLE_PCIE_ALLREDUCE=1 VLLM_PCIE_ALLREDUCE_BACKEND=b12x DCP_CKV_GATHER\n'
        'ALGORITHM = os.getenv("B12X_PCIE_ALLREDUCE_ALGORITHM", "auto")\n'
        "def setup(config):\n"
        '    config.additional_config["glm53_kda_decode_backend"] = "auto"\n'
        '    return "VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE", "VLLM_GLM53_SPLIT_MAMBA_BLOCK_SIZE"\n'
    )  # fmt: skip
    install = find_vllm(root)
    for name in ("dflash-tp4-dcp4", "mtp3-tp4-split"):
        met = {r.name: r.met(install) for r in requirements(load(name).profile)}
        fork_knobs = {"b12x_pcie_allreduce", "dcp_ckv_gather", "glm53_kda_decode_backend",
                      "split_pages", "attention_backend"}  # fmt: skip
        assert not any(v for k, v in met.items() if k in fork_knobs), (name, met)


def test_a_registered_name_without_the_value_refuses_naming_the_choices(tmp_path):
    """A vLLM with the PCIe all-reduce switch whose backend choices lack b12x (registered as the
    fork registers it, minus the b12x choice): setting b12x would fail at start, so it is refused
    now, saying which choices that vLLM gives."""
    env = {**FORK_REGISTRATIONS, "VLLM_PCIE_ALLREDUCE_BACKEND":
           'env_with_choices("VLLM_PCIE_ALLREDUCE_BACKEND", "cpp", ["cpp"])'}  # fmt: skip
    root = registration_tree(tmp_path / "vllm", env, ("B12X_MLA_SPARSE",),
                             ("glm53_kda_decode_backend",))  # fmt: skip
    install = find_vllm(root)
    assert install.env_problem(FEATURE_ENV["b12x_pcie_allreduce"]) == (
        "envs.py gives VLLM_PCIE_ALLREDUCE_BACKEND the choices cpp, not b12x"
    )
    with pytest.raises(UsageError) as refused:
        resolve(load("dflash-tp4-dcp4").profile, install)
    message = str(refused.value)
    assert message.startswith("features.b12x_pcie_allreduce='true': ")
    assert "features.b12x_pcie_allreduce=true: vLLM must register VLLM_ENABLE_PCIE_ALLREDUCE=1 " \
        "and VLLM_PCIE_ALLREDUCE_BACKEND=b12x (envs.py gives VLLM_PCIE_ALLREDUCE_BACKEND the " \
        "choices cpp, not b12x)" in message


def test_names_vllm_033_reads_without_registering_are_found_where_they_are_read():
    """vLLM 0.33.0's own source reads a few `VLLM_*` names straight from the environment without
    registering them in envs.py (its start warns "Unknown vLLM environment variable detected" for
    each that is set): the reader finds them in the modules that read them, and a registered name
    is not among the unregistered."""
    install = find_vllm(UPSTREAM)
    readers = install.environ_readers
    assert "VLLM_SNAPSHOT_TIMEOUT_S" not in vllm.envs.environment_variables
    assert readers["VLLM_SNAPSHOT_TIMEOUT_S"] == ("snapshot/runtime.py",)  # os.environ.get
    assert set(readers["VLLM_CPU_SIM_MULTI_NUMA"]) == {  # .get, and `in os.environ`
        "utils/ompmultiprocessing.py", "utils/cpu_resource_utils.py"}
    assert install.unregistered(["VLLM_SNAPSHOT_TIMEOUT_S", "VLLM_USE_V2_MODEL_RUNNER"]) == {
        "VLLM_SNAPSHOT_TIMEOUT_S": ("snapshot/runtime.py",)}
    source = ('import os\nfrom os import getenv\nos.environ["WRITTEN"] = "1"\n'
              'NAME = "ONLY_A_STRING"\na = getenv("BARE")\n'
              'b = os.environ["INDEXED"]\n')  # fmt: skip
    assert reg.environ_reads(source) == {"BARE", "INDEXED"}


SPLIT_READS = {
    # Where #535 reads the split-page sizes (seed 004: the change touches
    # tests/v1/core/test_kv_cache_utils.py, vllm/platforms/interface.py and
    # vllm/v1/core/kv_cache_utils.py, not envs.py). The kv_cache_utils read is the fork's line as
    # public notes on the fork's image quote it (`os.getenv("VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE")
    # is not None and contains_glm5_next_mla`); the platform's validation is written here the same
    # way (a stand-in: the fork's interface.py is not public at that commit).
    "v1/core/kv_cache_utils.py": (
        "import os\n\n\ndef c4_stride_unit(contains_glm5_next_mla):\n"
        '    if (\n        os.getenv("VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE") is not None\n'
        "        and contains_glm5_next_mla\n    ):\n        return 64 * 132\n    return 1\n"
    ),
    "platforms/interface.py": (
        "import os\n\n\ndef split_block_sizes():\n"
        '    target = os.getenv("VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE")\n'
        '    mamba = os.getenv("VLLM_GLM53_SPLIT_MAMBA_BLOCK_SIZE", target)\n'
        "    return target, mamba\n"
    ),
}  # fmt: skip


def test_mtp3_plans_on_a_runtime_that_reads_the_split_sizes_without_registering_them(tmp_path):
    """The published runtime mtp3 runs (compose/images.lock QUALIFIED_SPLIT_IMAGE) registers the
    fork's knobs but reads #535's split-page sizes straight from the environment: the profile
    plans there with no fallback and every expectation kept, and the plan says which start-up
    warnings to expect. Before, the check wanted envs.py to register them and refused."""
    split = ("VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE", "VLLM_GLM53_SPLIT_MAMBA_BLOCK_SIZE")
    env = {k: v for k, v in FORK_REGISTRATIONS.items() if k not in split}
    root = registration_tree(tmp_path / "vllm", env, ("B12X_MLA_SPARSE",),
                             ("glm53_kda_decode_backend",))  # fmt: skip
    for rel, text in SPLIT_READS.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    from launch.plan import assemble

    loaded = load("mtp3-tp4-split")
    plan = assemble(loaded, resolve(loaded.profile, find_vllm(root)))
    assert plan.qualified and plan.profile.expect == loaded.profile.expect
    assert plan.env["VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE"] == "512"
    assert plan.expected_warnings() == [
        'vLLM warns "Unknown vLLM environment variable detected: '
        'VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE": it reads VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE '
        "straight from the environment (platforms/interface.py, v1/core/kv_cache_utils.py) "
        "without registering it in envs.py",
        'vLLM warns "Unknown vLLM environment variable detected: '
        'VLLM_GLM53_SPLIT_MAMBA_BLOCK_SIZE": it reads VLLM_GLM53_SPLIT_MAMBA_BLOCK_SIZE '
        "straight from the environment (platforms/interface.py) without registering it in "
        "envs.py",
    ]
    # with neither the registration nor the reads, the split pages are refused as before
    for rel in SPLIT_READS:
        (root / rel).unlink()
    with pytest.raises(UsageError) as refused:
        resolve(load("mtp3-tp4-split").profile, find_vllm(root))
    assert ("envs.py does not register VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE, "
            "VLLM_GLM53_SPLIT_MAMBA_BLOCK_SIZE and no module reads them from the environment"
            in str(refused.value))  # fmt: skip
