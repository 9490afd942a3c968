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
