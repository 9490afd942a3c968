"""The log's checks: the facts a server log states (`smoke.logparse`) against the profile's
`expect` section, one check per expectation, a pure function. An expectation the log does not
report fails (unverified is not passed). Each check's key and title are written once, in
`LOG_CHECKS`; checks of a named thing (a backend, an agreement) add the name to both.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from kvgeometry.report import PREFIX, UNKNOWN
from launch.kv_offload import CONNECTORS, OFF, region_bytes
from launch.profile import Profile
from smoke.check import Check, Label, result
from smoke.log_facts import LogFacts, OffloadFacts, SplitPageFacts

NOT_IN_LOG = "not reported in the log"
LOG_CHECKS: dict[str, str] = {
    "log.start": "log: last start succeeded",
    "log.identity": "log: engine runs this profile",
    "log.version": "log: engine version",
    "log.kv-tokens": "log: KV cache tokens",
    "log.kv-tokens-min": "log: KV cache tokens (floor)",
    "log.concurrency": "log: max concurrency (floor)",
    "log.kv-blocks": "log: KV blocks",
    "log.block-sizes": "log: block sizes",
    "log.page-bytes": "log: page bytes",
    "log.layers": "log: layers",
    "log.cp-sizes": "log: cache-group CP sizes",
    "log.agrees": "log: geometry agrees with vLLM ({})",
    "log.split-pages": "log: split cache pages",
    "log.cudagraph-mode": "log: CUDA graph mode",
    "log.decode-graphs": "log: decode graphs through concurrency",
    "log.no-offload": "log: no host KV tier",
    "log.offload-connector": "log: KV offload connector ({})",
    "log.offload-region": "log: KV offload region",
    "log.backend": "log: backend {}",
    "log.capacity": "log: capacity as predicted",
}
"""Key -> title of every log check; `{}` takes the thing a keyed family names."""


def label(key: str, detail: str | None = None) -> Label:
    """The label of log check `key` (of `detail`, for a family such as one backend)."""
    title = LOG_CHECKS[key]
    if detail is None:
        return Label(key, title)
    slug = re.sub(r"[^a-z0-9]+", "-", detail.lower()).strip("-")
    return Label(f"{key}.{slug}", title.format(detail))


def _check(key: str | Label, expected: Any, seen: Any, ok: bool) -> Check:
    shown = NOT_IN_LOG if seen is None else str(seen)
    return result(key if isinstance(key, Label) else label(key), str(expected), shown, ok)


def log_checks(profile: Profile, facts: LogFacts) -> list[Check]:
    """The log facts against the profile's expectations, one check per expectation."""
    e = profile.expect
    services = ", ".join(sorted(facts.services or {}))
    if facts.service_missing:
        started = f"no service {facts.service_missing!r} in the log (it has: {services})"
    elif facts.starts == 0 and "," in services:
        started = f"the log holds several services ({services}): pass --service NAME"
    elif facts.starts == 0 and not facts.errors:
        started = "no engine start in the log (no `non-default args:` line or engine banner)"
    else:
        started = "; ".join(facts.errors[-1:]) or (
            "failed" if facts.last_start_failed else "started"
        )
    checks = [
        _check(
            "log.start",
            "no startup failure",
            started,
            facts.starts > 0 and not facts.last_start_failed,
        ),
    ]
    checks.append(identity_check(profile, facts))
    if e.engine_version is not None:
        seen = facts.engine_version
        checks.append(
            _check("log.version", e.engine_version, seen, seen == e.engine_version)
        )
    tokens = facts.kv_cache_tokens
    if e.kv_cache_tokens is not None:
        checks.append(
            _check("log.kv-tokens", e.kv_cache_tokens, tokens, tokens == e.kv_cache_tokens)
        )
    if e.kv_cache_tokens_min is not None:
        checks.append(
            _check(
                "log.kv-tokens-min",
                f">= {e.kv_cache_tokens_min}",
                tokens,
                tokens is not None and tokens >= e.kv_cache_tokens_min,
            )
        )
    if e.max_concurrency_min is not None:
        checks.append(concurrency_check(e.max_concurrency_min, e.max_concurrency_tokens, facts))
    g = facts.kv_geometry
    absent = geometry_absent(facts)
    for name, want, got in (
        ("log.kv-blocks", e.kv_blocks, g and g.num_blocks),
        ("log.block-sizes", e.block_sizes, g and _roles(g.block_sizes, e.block_sizes)),
        ("log.page-bytes", e.page_bytes, g and _roles(g.page_bytes, e.page_bytes)),
        ("log.layers", e.layers, g and _roles(g.layers, e.layers)),
        ("log.cp-sizes", e.cache_group_cp_sizes, g and g.cp_sizes),
    ):
        if want:
            check = _check(name, want, got, got == want)
            checks.append(check if g else dataclasses.replace(check, seen=absent))
    checks += agreement_checks(facts)
    checks += split_page_checks(profile, facts)
    if e.cudagraph_mode is not None:
        seen = facts.cudagraph_mode_resolved
        checks.append(
            _check("log.cudagraph-mode", e.cudagraph_mode, seen, seen == e.cudagraph_mode)
        )
    if e.decode_graph_max_batch is not None:
        per_seq = profile.engine.tokens_per_step
        full = (facts.graph_profile or {}).get("FULL")
        seen_batch = None if full is None else full.largest // per_seq
        checks.append(
            _check(
                "log.decode-graphs",
                f">= {e.decode_graph_max_batch}",
                None
                if full is None
                else f"{seen_batch} (largest FULL graph {full.largest} tokens)",
                seen_batch is not None and seen_batch >= e.decode_graph_max_batch,
            )
        )
    checks += offload_checks(profile, facts)
    for want in e.backends:
        hits = [b for b in facts.backends if want in b]
        checks.append(
            _check(
                label("log.backend", want),
                f"a backend line naming {want}",
                hits[0] if hits else None,
                bool(hits),
            )
        )
    return checks


def geometry_absent(facts: LogFacts) -> str:
    """Why a geometry check has nothing to read: the plugin's own WARNING when it gave one."""
    if facts.geometry_missing:
        return f"not reported: {facts.geometry_missing}"
    return f"{NOT_IN_LOG} (no `{PREFIX}` line: the kit's plugin did not run in this engine)"


def agreement_checks(facts: LogFacts) -> list[Check]:
    """The plugin's line against what the runtime itself logs about the same plan, where both
    appear: its KV cache size, its resolved layout, the split-page block sizes and the DFlash
    draft's cache groups (the qualified runtime's lines). A disagreement names both."""
    geometry = facts.kv_geometry
    if geometry is None:
        return []
    blocks = geometry.block_sizes
    draft = [g for g in geometry.groups if g.role == "draft"]
    split = facts.split_pages
    pairs: list[tuple[str, Any, Any]] = [
        ("KV cache tokens", facts.kv_cache_tokens, geometry.tokens),
        ("layout", facts.kv_layout, geometry.layout),
    ]
    if split is not None and split.target_block_size is not None:
        pairs += [
            ("split target block", split.target_block_size, blocks.get("latent")),
            ("split recurrent block", split.recurrent_block_size, blocks.get("recurrent")),
        ]
    if facts.draft_groups:
        pairs.append(
            ("DFlash draft layers / groups",
             f"{facts.draft_groups.layers} / {facts.draft_groups.groups}",
             f"{geometry.layers.get('draft', 0)} / {len({g.group for g in draft})}")
        )  # fmt: skip
    return [
        result(
            label("log.agrees", what),
            f"vLLM's line: {runtime}",
            f"plugin: {UNKNOWN if plugin is None else plugin}",
            runtime == plugin,
        )
        for what, runtime, plugin in pairs
        if runtime is not None
    ]


def split_page_checks(profile: Profile, facts: LogFacts) -> list[Check]:
    """`features.split_pages` against the split-page line both images log (the qualified
    runtime's wording, which patch 0002 logs too): the sizes the platform kept."""
    split = profile.features.split_pages
    if split is None:
        return []
    want = (split.target_block_size, split.mamba_block_size)
    seen = facts.split_pages or SplitPageFacts()
    got = (seen.target_block_size, seen.recurrent_block_size)
    return [
        _check(
            "log.split-pages",
            f"target {want[0]} / recurrent-state {want[1]} tokens",
            None if got[0] is None else f"target {got[0]} / recurrent-state {got[1]} tokens",
            got == want,
        )
    ]


def offload_checks(profile: Profile, facts: LogFacts) -> list[Check]:
    """The host KV tier the log shows against `engine.kv_offload`: the connector vLLM created for
    the backend and, for native, the size of its /dev/shm region (vLLM prints decimal GB)."""
    o = profile.engine.kv_offload
    seen = facts.kv_offload or OffloadFacts()
    connector = seen.connector
    if o is None or o.backend == OFF:
        if connector is None:
            return []
        return [_check("log.no-offload", "no KV connector", connector, False)]
    wanted = CONNECTORS[o.backend]
    checks = [
        _check(
            label("log.offload-connector", o.backend),
            " or ".join(wanted),
            None if connector is None else f"{connector} (spec {seen.spec})",
            connector in wanted,
        )
    ]
    if o.backend == "native":
        want_gb = region_bytes(o.size_gib) / 1e9
        got = seen.region_gb
        checks.append(
            _check(
                "log.offload-region",
                f"{o.size_gib:g} GiB ({want_gb:.2f} GB)",
                None if got is None else f"{got:.2f} GB at {seen.region}",
                got is not None and abs(got - want_gb) <= 0.01 * want_gb + 0.005,
            )
        )
    return checks


def identity_check(profile: Profile, facts: LogFacts) -> Check:
    """The engine banner's model, revision and parallel sizes against the profile: numbers from
    another server (another model, TP8 instead of TP4) must not pass as this profile's."""
    e = profile.engine
    want = {
        "model": e.model,
        "revision": e.revision,
        "tensor_parallel_size": e.tensor_parallel_size,
        "pipeline_parallel_size": e.pipeline_parallel_size,
        "decode_context_parallel_size": e.decode_context_parallel_size,
    }
    seen = facts.engine_config
    got = None if seen is None else {k: getattr(seen, k) for k in want}
    shown = None if got is None else ", ".join(f"{k}={v}" for k, v in got.items())
    return _check(
        "log.identity",
        ", ".join(f"{k}={v}" for k, v in want.items()),
        shown,
        got == want,
    )


def concurrency_check(floor: float, length: int | None, facts: LogFacts) -> Check:
    """vLLM's concurrency figure is for one request length (max_model_len); a floor stated for
    another length says nothing about it, so the length must match before the number counts."""
    x, seen_len = facts.max_concurrency, facts.max_concurrency_tokens
    seen = None if x is None else f"{x}x for {seen_len:,} tokens"
    return _check(
        "log.concurrency",
        f">= {floor}x for {length:,} tokens",
        seen,
        x is not None and seen_len == length and x >= floor,
    )


def _roles(seen: Mapping[str, Any], want: Mapping[str, int] | None) -> dict[str, Any] | None:
    """The roles the profile names, from what the log reports (other roles are not judged)."""
    if not want:
        return None
    return {role: seen.get(role) for role in want}



