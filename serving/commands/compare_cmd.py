"""`python -m serving compare A.json B.json`: two bench receipts as the seeds' A/B table.

Per cell: the mean of A and of B and the relative change of B against A (target steps/s for
decode when acceptance was measured, else output tok/s; prompt tok/s for prefill; the repeat's
TTFT for the prefix-reuse cell, beside each side's host KV tier), the KV capacity each server's
log reported, and whether the parity hashes match. It also draws both as a PNG (`--plot`,
default beside B: `<A>-vs-<B>.png`; serving.bench.plot) and prints its path.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from launch.errors import UsageError
from launch.kv_offload import OFFLOAD_FLAGS, tier_in_argv
from serving import receipt as receipts
from serving.bench.plot import write_png

NAME = "compare"
COLD_JIT = ("a matching hash is warmed-path evidence, not a determinism guarantee: a first "
            "request after an empty JIT cache can continue differently (seed 000)")  # fmt: skip


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="compare two bench receipts (A = control, B = candidate)")
    p.add_argument("a", type=Path, help="control receipt")
    p.add_argument("b", type=Path, help="candidate receipt")
    p.add_argument("--plot", type=Path,
                   help="the PNG (default <B's directory>/<A>-vs-<B>.png)")
    return p


def default_plot(a: Path, b: Path) -> Path:
    return b.parent / f"{a.stem}-vs-{b.stem}.png"


def _metric(cell: dict[str, Any]) -> tuple[str, float | None]:
    s = cell["summary"]
    if cell["kind"] == "decode":
        key, value = receipts.decode_speed(s)
        return receipts.DECODE_SPEEDS[key], value
    if cell["kind"] == "prefix_reuse":
        return "repeat TTFT s", s["ttft_repeat_s"]
    return "prompt tok/s", s["prompt_tok_s"]


def _fmt(value: float | int | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.3f}" if isinstance(value, float) and value < 1000 else f"{value:,.0f}"


def _change(a: float | None, b: float | None) -> str:
    if a is None or b is None or a == 0:
        return "-"
    return f"{(b - a) / a * 100:+.2f}%"


def table(a: dict[str, Any], b: dict[str, Any]) -> str:
    rows = [("cell", "metric", "A", "B", "change")]
    names = [n for n in a["cells"] if n in b["cells"] and a["cells"][n]["kind"] != "parity"]
    for name in names:
        label, va = _metric(a["cells"][name])
        label_b, vb = _metric(b["cells"][name])
        if label_b != label:
            vb = None
        rows.append((name, label, _fmt(va), _fmt(vb), _change(va, vb)))
    tiers = [_tier((r.get("plan") or {}).get("argv") or []) for r in (a, b)]
    if any(n.startswith("reuse-") for n in names) or tiers[0] != tiers[1]:
        rows.append(("host KV tier", "backend, GiB", tiers[0], tiers[1], "-"))
    capacity = [((r.get("log") or {}).get("kv_cache_tokens")) for r in (a, b)]
    rows.append(("capacity", "KV tokens (log)", _fmt(capacity[0]), _fmt(capacity[1]),
                 _change(*capacity)))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(f"{c:<{w}}" for c, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]  # fmt: skip
    parity = [r["cells"].get("parity", {}).get("summary", {}).get("sha256") for r in (a, b)]
    if None in parity:
        lines.append("parity: not measured in both receipts")
    else:
        verdict = "match" if parity[0] == parity[1] else "DIFFER"
        lines.append(
            f"parity: {verdict} (A {parity[0][:16]}..., B {parity[1][:16]}...); {COLD_JIT}"
        )
    return "\n".join(lines)


def _tier(argv: list[str]) -> str:
    """The host KV tier a rendered command asks for, as `backend, GiB`, or none."""
    tier = tier_in_argv(argv)
    return "none" if tier is None else ", ".join(tier.get(f, "?") for f in OFFLOAD_FLAGS)


def kv_budget(argv: list[str]) -> str | None:
    """The KV budget flag and value of a rendered command, as vLLM was given it."""
    for flag_name in ("--kv-cache-memory-bytes", "--gpu-memory-utilization"):
        if flag_name in argv[:-1]:
            return f"{flag_name} {argv[argv.index(flag_name) + 1]}"
    return None


def warnings(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What makes the two receipts not a like-for-like A/B: another profile or another KV budget
    (the seeds compare geometries at the same budget)."""
    out = []
    if a["profile"] != b["profile"]:
        out.append(f"WARNING: different profiles (A {a['profile']}, B {b['profile']})")
    budgets = [kv_budget((r.get("plan") or {}).get("argv") or []) for r in (a, b)]
    if budgets[0] != budgets[1]:
        out.append(f"WARNING: different KV budgets (A {budgets[0]}, B {budgets[1]}): capacity and "
                   "speed are not compared at the same budget")  # fmt: skip
    return out


def run(args: argparse.Namespace) -> int:
    loaded = []
    for field, path in (("A", args.a), ("B", args.b)):
        try:
            loaded.append(receipts.load(path))
        except (OSError, ValueError) as err:
            raise UsageError(
                field,
                str(path),
                f"is not a readable bench receipt ({err})",
                "pass two files written by make bench",
            ) from err
    a, b = loaded
    print(f"A: {args.a} ({a['profile']}, {a['date']})\nB: {args.b} ({b['profile']}, {b['date']})")
    for line in warnings(a, b):
        print(line)
    print(table(a, b))
    png = write_png([("A", a), ("B", b)], args.plot or default_plot(args.a, args.b))
    print(f"plot: {png}")
    return 0
