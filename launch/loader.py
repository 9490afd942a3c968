"""Load a named profile once: read its YAML, apply overrides, build the typed model, validate.

Expectations that an override invalidates are dropped here, with the reason, so the smoke check
never compares a server against a number that no longer applies.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from launch.deviations import EXPECT_KEYS, Changed, Deviation, NotChecked, expect_key
from launch.errors import UsageError
from launch.overrides import Override, apply
from launch.profile import Expect, Profile
from launch.schema import build
from launch.validate import validate

PROFILE_DIR = Path(__file__).parent / "profiles"

# Engine settings that change what the API calls the model or how it parses the output, not what
# the engine computes: they never invalidate an expectation.
NEUTRAL_ENGINE_PATHS = (
    "engine.served_model_name",
    "engine.reasoning_parser",
    "engine.tool_call_parser",
    "engine.enable_auto_tool_choice",
)
# Capacity moves with nearly every engine or feature setting, so any other change there drops
# the capacity figures.
CAPACITY = ("engine.", "features.")

# Expectation -> the profile paths whose change makes it inapplicable.
EXPECT_DEPENDS: dict[str, tuple[str, ...]] = {
    "engine_version": (),
    "kv_cache_tokens": CAPACITY,
    "kv_cache_tokens_min": CAPACITY,
    "kv_blocks": CAPACITY,
    "max_concurrency_min": CAPACITY,
    "max_concurrency_tokens": CAPACITY,
    "block_sizes": (
        "engine.tensor_parallel_size",
        "engine.decode_context_parallel_size",
        "engine.kv_cache_dtype",
        "engine.speculative_config",
        "features.split_pages",
    ),
    # The MLA latent's bytes per token are the attention backend's format (vLLM 0.33.0 stored
    # fp8 as fp8_ds_mla, 656 bytes per token, for its SM120 sparse-MLA backend; 0.34.0's stores
    # GLM-5.3's in the runtime's 528: launch.capabilities keeps page_bytes where it is so).
    "page_bytes": (
        "engine.tensor_parallel_size",
        "engine.attention_backend",
        "engine.kv_cache_dtype",
        "engine.speculative_config",
        "features.split_pages",
    ),
    "layers": (
        "engine.model",
        "engine.pipeline_parallel_size",
        "engine.speculative_config",
        "features.split_pages",
    ),
    "cache_group_cp_sizes": (
        "engine.tensor_parallel_size",
        "engine.decode_context_parallel_size",
        "engine.speculative_config",
    ),
    "cudagraph_mode": ("engine.compilation_config.cudagraph_mode",),
    "decode_graph_max_batch": (
        "engine.compilation_config",
        "engine.max_num_seqs",
        "engine.speculative_config",
    ),
    "backends": (
        "engine.attention_backend",
        "engine.moe_backend",
        "engine.linear_backend",
        "engine.speculative_config.attention_backend",
        "features.b12x_pcie_allreduce",
    ),
    "spec_acceptance_length_min": ("engine.model", "engine.speculative_config"),
}
if set(EXPECT_DEPENDS) != EXPECT_KEYS:  # every expectation says what invalidates it, no other
    raise ValueError(f"EXPECT_DEPENDS and Expect differ: {set(EXPECT_DEPENDS) ^ EXPECT_KEYS}")


def invalidated_by(field: str, path: str) -> bool:
    """Whether changing profile `path` makes expectation `field` inapplicable."""
    if path.startswith(NEUTRAL_ENGINE_PATHS):
        return False
    return bool(EXPECT_DEPENDS[field]) and path.startswith(EXPECT_DEPENDS[field])


@dataclass(frozen=True)
class Loaded:
    """A validated profile and how it differs from the qualified one."""

    profile: Profile
    deviations: tuple[Deviation, ...]
    placement: tuple[Changed, ...] = ()
    """Changes of where the server runs (GPU selection, ports, ...): shown, never unqualifying."""


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def read_raw(name: str) -> dict[str, Any]:
    """The YAML mapping of a shipped profile."""
    path = PROFILE_DIR / f"{name}.yaml"
    if not path.is_file():
        names = profile_names()
        close = [n for n in names if n.startswith(name)] or difflib.get_close_matches(name, names)
        raise UsageError(
            "profile",
            name,
            "is not a shipped profile",
            f"did you mean '{close[0]}'?" if close else f"use one of: {', '.join(names)}",
        )
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise UsageError(
            "profile", str(path), f"is not valid YAML ({str(err).splitlines()[0]})",
            "fix or remove the file",
        ) from err  # fmt: skip
    if not isinstance(data, dict) or data.get("name") != name:
        raise UsageError(
            "profile",
            name,
            f"{path} must be a mapping whose name is {name!r}",
            "fix the profile file",
        )
    return data


def drop_expectations(expect: Expect, reasons: dict[str, str]) -> Expect:
    """`expect` without the named fields; `reasons` maps field -> why, kept in `sources`."""
    if not reasons:
        return expect
    cleared = {expect_key(name): () if name == "backends" else None for name in reasons}
    sources = {k: v for k, v in expect.sources.items() if k not in reasons}
    return dataclasses.replace(expect, **cleared, sources=sources)


def load(name: str, overrides: Iterable[Override] = ()) -> Loaded:
    """Read, override, build and validate a profile; the one entry point for launch and smoke.

    Expectations an override invalidates are dropped before validation, so the rules on the
    expect section judge only what will be checked.
    """
    raw, changes, placement = apply(read_raw(name), overrides)
    profile = build(Profile, raw, "")
    changed = [c.path for c in changes]
    deviations: list[Deviation] = list(changes)
    reasons = {}
    for field in profile.expect.set_fields():
        paths = [path for path in changed if invalidated_by(field, path)]
        if paths:
            reasons[field] = f"{', '.join(paths)} overridden"
    if reasons:
        profile = dataclasses.replace(profile, expect=drop_expectations(profile.expect, reasons))
        deviations += [NotChecked(field, why) for field, why in sorted(reasons.items())]
    try:
        validate(profile)
    except UsageError as err:
        given = [str(c) for c in (*changes, *placement)]
        if given:  # the value may not be the field's own: say which overrides were in effect
            err.rule += f" (overrides in effect: {'; '.join(given)})"
        raise
    return Loaded(profile, tuple(deviations), tuple(placement))
