"""Checks and the verdict: each check has a name, what was expected, what was seen, pass or fail.

`geometry_checks` compares the parsed server log with the profile's `expect` section, a pure
function; an expectation the log does not report fails (unverified is not passed).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kvgeometry.report import PREFIX, UNKNOWN
from launch.kv_offload import CONNECTORS, OFF, region_bytes
from launch.profile import Profile
from smoke.log_facts import LogFacts, OffloadFacts, SplitPageFacts

NOT_IN_LOG = "not reported in the log"


@dataclass(frozen=True)
class Check:
    name: str
    expected: str
    seen: str
    ok: bool
    skipped: bool = False
    """Does not apply to this profile (`seen` says why): neither passed nor failed."""


def skipped(name: str, reason: str) -> Check:
    return Check(name, "-", f"skipped: {reason}", False, skipped=True)


def _check(name: str, expected: Any, seen: Any, ok: bool) -> Check:
    return Check(name, str(expected), NOT_IN_LOG if seen is None else str(seen), ok)


def geometry_checks(profile: Profile, facts: LogFacts) -> list[Check]:
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
            "log: last start succeeded",
            "no startup failure",
            started,
            facts.starts > 0 and not facts.last_start_failed,
        ),
    ]
    checks.append(identity_check(profile, facts))
    if e.engine_version is not None:
        seen = facts.engine_version
        checks.append(
            _check("log: engine version", e.engine_version, seen, seen == e.engine_version)
        )
    tokens = facts.kv_cache_tokens
    if e.kv_cache_tokens is not None:
        checks.append(
            _check("log: KV cache tokens", e.kv_cache_tokens, tokens, tokens == e.kv_cache_tokens)
        )
    if e.kv_cache_tokens_min is not None:
        checks.append(
            _check(
                "log: KV cache tokens (floor)",
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
        ("log: KV blocks", e.kv_blocks, g and g.num_blocks),
        ("log: block sizes", e.block_sizes, g and _roles(g.block_sizes, e.block_sizes)),
        ("log: page bytes", e.page_bytes, g and _roles(g.page_bytes, e.page_bytes)),
        ("log: layers", e.layers, g and _roles(g.layers, e.layers)),
        ("log: cache-group CP sizes", e.cache_group_cp_sizes, g and g.cp_sizes),
    ):
        if want:
            check = _check(name, want, got, got == want)
            checks.append(check if g else dataclasses.replace(check, seen=absent))
    checks += agreement_checks(facts)
    checks += split_page_checks(profile, facts)
    if e.cudagraph_mode is not None:
        seen = facts.cudagraph_mode_resolved
        checks.append(
            _check("log: CUDA graph mode", e.cudagraph_mode, seen, seen == e.cudagraph_mode)
        )
    if e.decode_graph_max_batch is not None:
        spec = profile.engine.speculative_config
        per_seq = 1 + (spec.num_speculative_tokens if spec else 0)
        full = (facts.graph_profile or {}).get("FULL")
        seen_batch = None if full is None else full.largest // per_seq
        checks.append(
            _check(
                "log: decode graphs through concurrency",
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
                f"log: backend {want}",
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
        Check(
            f"log: geometry agrees with vLLM ({what})",
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
            "log: split cache pages",
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
        return [_check("log: no host KV tier", "no KV connector", connector, False)]
    wanted = CONNECTORS[o.backend]
    checks = [
        _check(
            f"log: KV offload connector ({o.backend})",
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
                "log: KV offload region",
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
        "log: engine runs this profile",
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
        "log: max concurrency (floor)",
        f">= {floor}x for {length:,} tokens",
        seen,
        x is not None and seen_len == length and x >= floor,
    )


def _roles(seen: Mapping[str, Any], want: Mapping[str, int] | None) -> dict[str, Any] | None:
    """The roles the profile names, from what the log reports (other roles are not judged)."""
    if not want:
        return None
    return {role: seen.get(role) for role in want}



def exit_status(checks: Sequence[Check]) -> int:
    ran = [c for c in checks if not c.skipped]
    return 0 if ran and all(c.ok for c in ran) else 1


def format_table(checks: Sequence[Check]) -> str:
    rows = [("check", "expected", "seen", "result")]
    rows += [(c.name, c.expected, _cut(c.seen), _result(c)) for c in checks]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}" for r in rows]
    passed = sum(c.ok for c in checks)
    skips = sum(c.skipped for c in checks)
    lines.append(f"{passed} passed, {len(checks) - passed - skips} failed"
                 + (f", {skips} skipped" if skips else ""))  # fmt: skip
    return "\n".join(lines)


def _result(c: Check) -> str:
    return "skip" if c.skipped else "pass" if c.ok else "FAIL"


def to_json(checks: Sequence[Check], **extra: Any) -> str:
    return json.dumps(
        {"ok": exit_status(checks) == 0, "checks": [asdict(c) for c in checks], **extra}, indent=2
    )


def _cut(text: str, width: int = 90) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
