"""The receipts of the bench and the soak: everything needed to read a result later, one
header (profile, plan, image) and one schema per kind, checked on every write and load.

Like `vllm bench sweep`, a receipt is rewritten after each cell (the bench) or interval line
(the soak), so an interrupted run keeps what it measured and the bench's `--resume` continues
with the cells still missing.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from launch.errors import UsageError
from launch.image_lock import PIN_KEYS, read_lock, resolve_image
from launch.kv_offload import tier_in_argv
from launch.settings import Settings

BENCH_KIND = "glm53-kit-bench-receipt"
SOAK_KIND = "glm53-kit-soak-receipt"
SCHEMA_VERSION = 1
"""Raised when a receipt's layout changes: a receipt of another version is refused by name, not
read as if it were this one."""
_CELL_KINDS = ["decode", "prefill", "prefix_reuse", "parity"]
_HEAD: dict[str, Any] = {
    "required": ["kind", "schema_version", "date", "profile", "plan", "image"],
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "date": {"type": "string"},
        "profile": {"type": "string"},
        "plan": {"type": "object", "required": ["profile", "argv", "deviations", "qualified"],
                 "properties": {"argv": {"type": "array", "items": {"type": "string"}},
                                "deviations": {"type": "array", "items": {"type": "string"}},
                                "qualified": {"type": "boolean"}}},
        "image": {"type": "object"},
    },
}  # fmt: skip
"""What every receipt (bench and soak) opens with: which kit, profile, plan and image."""


def _schema(kind: str, required: list[str], properties: dict[str, Any]) -> dict[str, Any]:
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
            "required": _HEAD["required"] + required,
            "properties": {"kind": {"const": kind}, **_HEAD["properties"], **properties}}


SCHEMAS: dict[str, dict[str, Any]] = {
    BENCH_KIND: _schema(BENCH_KIND, ["log", "settings", "cells"], {
        "log": {"type": ["object", "null"]},
        "settings": {"type": "object"},
        "cells": {"type": "object", "additionalProperties": {
            "type": "object", "required": ["kind", "samples", "summary"],
            "properties": {"kind": {"enum": _CELL_KINDS},
                           "samples": {"type": "array", "items": {"type": "object"}},
                           "summary": {"type": "object"}}}},
        "skipped": {"type": "object", "additionalProperties": {"type": "string"}},
        "limitations": {"type": "array", "items": {"type": "string"}},
    }),
    SOAK_KIND: _schema(SOAK_KIND, ["soak"], {
        "soak": {"type": "object",
                 "required": ["options", "mix", "rss_source", "lines", "verdict"],
                 "properties": {"lines": {"type": "array", "items": {"type": "object"}},
                                "verdict": {"type": "object", "required": ["passed"]}}},
    }),
}  # fmt: skip
"""What a receipt of this version holds, by kind (JSON Schema, checked on every save and load)."""


def check(receipt: Mapping[str, Any], where: str) -> None:
    """ValueError naming the first place `receipt` breaks its kind's schema (its version
    first)."""
    from jsonschema import Draft202012Validator

    version = receipt.get("schema_version") if isinstance(receipt, Mapping) else None
    if version != SCHEMA_VERSION:
        raise ValueError(f"{where} is a receipt of schema version {version}, this kit reads "
                         f"version {SCHEMA_VERSION}: take it again")  # fmt: skip
    schema = SCHEMAS.get(str(receipt.get("kind")))
    if schema is None:
        raise ValueError(f"{where} is not a receipt of this kit (kind {receipt.get('kind')!r})")
    error = next(iter(Draft202012Validator(schema).iter_errors(receipt)), None)
    if error is not None:
        path = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise ValueError(f"{where}: {path}: {error.message}")


def head(kind: str, profile: str, date: str, plan: dict[str, Any],
         image: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """What every receipt opens with."""
    return {"kind": kind, "schema_version": SCHEMA_VERSION, "date": date, "profile": profile,
            "plan": plan, "image": image}  # fmt: skip


def new(profile: str, date: str, plan: dict[str, Any], image: dict[str, Any],
        log: dict[str, Any] | None, settings: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """An empty bench receipt of this schema version."""
    return head(BENCH_KIND, profile, date, plan, image) | {"log": log, "settings": settings,
                                                           "cells": {}}  # fmt: skip


def image_record(source: str, settings: Settings) -> dict[str, Any]:
    """Which image served the run (the same IMAGE and lock `configure` used), for the bench's
    and the soak's receipts."""
    try:
        ref = resolve_image(source, settings.merged)
    except UsageError:
        ref = None
    lock = read_lock()
    return {
        "ref": ref,
        "source": source,
        "source_lock": lock.get(PIN_KEYS[source].replace("_IMAGE", "_SOURCE_LOCK")) or None,
    }


STATIC_LIMITATIONS = [
    "Output tokens/s depends on the draft's acceptance; compare target steps/s across geometries.",
    "A parity hash from a cold JIT cache is not a determinism guarantee (seed 000): compare "
    "hashes taken on warmed servers.",
    "Decode cells use context zero (a one-word prompt), as the seeds' sustained-decode runs did; "
    "they say nothing about decode at long context.",
    "Means over the repeats only; no significance test is made.",
]


DECODE_SPEEDS = {"target_steps_s": "target steps/s", "output_tok_s": "output tok/s"}
"""A decode result's speed keys -> how they are shown."""


def decode_speed(values: Mapping[str, Any]) -> tuple[str, float | None]:
    """A decode sample's or summary's speed, as (key, value): target steps/s where acceptance was
    measured (a speculating server's tokens/s over-counts its steps), else output tok/s. The one
    choice `make compare` and its plot both use."""
    if values.get("target_steps_s") is not None:
        return "target_steps_s", values["target_steps_s"]
    return "output_tok_s", values.get("output_tok_s")


def summarize(kind: str, samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over the samples of one cell."""

    def mean(key: str) -> float | None:
        values = [s[key] for s in samples if s.get(key) is not None]
        return statistics.fmean(values) if values else None

    if kind == "decode":
        return {
            "output_tok_s": mean("output_tok_s"),
            "target_steps_s": mean("target_steps_s"),
            "acceptance_length": mean("acceptance_length"),
            "ttft_p50_s": statistics.fmean([s["ttft_s"]["p50"] for s in samples
                                            if s["ttft_s"]["p50"] is not None] or [0.0]),
            "requests_failed": sum(s["requests_failed"] for s in samples),
        }  # fmt: skip
    if kind == "prefill":
        ok = [s for s in samples if s.get("ok")]
        return {"prompt_tok_s": mean("prompt_tok_s"), "failed": len(samples) - len(ok)}
    if kind == "prefix_reuse":
        return {
            "ttft_first_s": mean("ttft_first_s"),
            "ttft_repeat_s": mean("ttft_repeat_s"),
            "repeat_speedup": mean("repeat_speedup"),
            "host_tier_hit_tokens": mean("host_tier_hit_tokens"),
        }
    if kind == "parity":
        hashes = sorted({s["sha256"] for s in samples if s.get("ok")})
        return {"sha256": hashes[0] if len(hashes) == 1 else None, "distinct_hashes": hashes}
    raise ValueError(kind)


def limitations(receipt: Mapping[str, Any]) -> list[str]:
    out = list(STATIC_LIMITATIONS)
    cells = receipt.get("cells", {})
    if any(c["kind"] == "decode" and c["summary"]["acceptance_length"] is None
           for c in cells.values()):  # fmt: skip
        out.append(
            "No speculative-decoding counters moved in /metrics: acceptance length and "
            "target steps/s are not computed."
        )
    failed = sum(c["summary"].get("requests_failed", 0) + c["summary"].get("failed", 0)
                 for c in cells.values())  # fmt: skip
    if failed:
        out.append(f"{failed} request(s) failed and are excluded from the figures.")
    argv = (receipt.get("plan") or {}).get("argv") or []
    if any(c["kind"] == "prefix_reuse" for c in cells.values()):
        if tier_in_argv(argv) is None:
            out.append(
                "The prefix-reuse cell ran without a host KV tier: its repeat TTFT is a full "
                "prefill again; compare with a receipt taken with CACHE_MODE=native."
            )
        if (receipt.get("log") or {}).get("kv_cache_device") == "CPU":
            out.append(
                "vLLM's CPU build has no host tier to offload to (it refuses "
                "--kv-offloading-backend), so on the CPU lane the cell measures recompute only."
            )
    for cell, why in (receipt.get("skipped") or {}).items():
        out.append(f"The {cell} cell was not run: {why}.")
    if any(c["kind"] == "prefix_reuse" and c["samples"][0].get("evicted") is False
           for c in cells.values()):  # fmt: skip
        out.append("In the prefix-reuse cell the first prompt was still in the GPU cache when "
                   "sent again (the GPU cache counted hits): it measures no tier.")  # fmt: skip
    if receipt.get("log") is None:
        out.append("No server log was given (--log): capacity, geometry and GPU names are absent.")
    if receipt.get("image", {}).get("ref") is None:
        out.append("The image digest is unknown: the lock has no digest for this profile.")
    return out


def load(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("kind") != BENCH_KIND:
        raise ValueError(f"{path} is not a bench receipt")
    check(data, str(path))
    return data


def write_atomic(path: Path, document: dict[str, Any]) -> None:
    """`document` as JSON at `path`, whole or not at all (a run killed mid-write leaves the
    previous version)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    tmp.replace(path)


def write_checked(path: Path, receipt: dict[str, Any]) -> None:
    """A receipt of either kind, checked against its schema, then written whole."""
    check(receipt, "the receipt being written")
    write_atomic(path, receipt)


def save(path: Path, receipt: dict[str, Any]) -> None:
    """A bench receipt, with the limitations its cells imply."""
    receipt["limitations"] = limitations(receipt)
    write_checked(path, receipt)
