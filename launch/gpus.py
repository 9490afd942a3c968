"""GPU index lists, one rule set for a profile's GPUs (GPU_DEVICES) and each replica's
(GPU_SETS): whole non-negative indices, each once, exactly TP x PP of them."""

from __future__ import annotations

from collections.abc import Sequence

SHOWN_GPUS = 16
"""An example list longer than this is abbreviated (a mistyped TP must not build a huge hint)."""


def example_gpus(count: int) -> str:
    """`0,1,...,count-1` as a user would type it (abbreviated when long)."""
    if count <= SHOWN_GPUS:
        return ",".join(map(str, range(count)))
    return f"0,1,...,{count - 1}"


def parse_gpus(text: str) -> tuple[int, ...] | None:
    """`4,5,6,7` -> the indices; None when a part is not a whole number."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not all(part.isascii() and part.isdigit() for part in parts):
        return None
    return tuple(int(part) for part in parts)


def gpu_list_problem(gpus: Sequence[int], need: int) -> str | None:
    """What is wrong with `gpus` for a replica of `need` GPUs, or None."""
    negative = [g for g in gpus if g < 0]
    if negative:
        return f"GPU index {negative[0]} is negative"
    if len(set(gpus)) != len(gpus):
        return "lists a GPU twice"
    if len(gpus) != need:
        return f"has {len(gpus)} GPUs but TP x PP = {need}"
    return None
