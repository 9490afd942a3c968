"""The environment that turns a profile's fork features on: vLLM's own registered names (what
`launch run` sets, and what the capability check requires the installed vLLM to register)."""

from __future__ import annotations

from launch.profile import Features, SplitPages

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
