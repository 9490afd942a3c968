"""The one reader of a byte size, for every size the kit takes (a setting, an override, an option).

vLLM's own convention first (`vllm.utils.argparse_utils.human_readable_int`, what `vllm serve
--kv-cache-memory-bytes 12G` reads): `k`/`m`/`g`/`t` are decimal (x 1000), `K`/`M`/`G`/`T` are
binary (x 1024) and take a whole number. Then the units the kit and vLLM print: `KiB`..`TiB`
(binary, `12GiB`, `15.87 GiB`), and `KB`..`TB` (decimal, as disks are sold). A number without a
unit is in the field's own unit (bytes for `KV_CACHE_MEMORY` and `--budget`, GiB for
`SHM_SIZE_GIB` and `KV_OFFLOADING_SIZE_GB`). Fractions of a byte are rounded down. The table of
spellings is docs/configuration.md's; tests/test_sizes.py drives every size field through it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from launch.errors import UsageError

KIB, MIB, GIB, TIB = (1 << 10 * n for n in range(1, 5))
VLLM_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
VLLM_BINARY = {"K": KIB, "M": MIB, "G": GIB, "T": TIB}
PRINTED = {"KiB": KIB, "MiB": MIB, "GiB": GIB, "TiB": TIB,
           "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "B": 1}  # fmt: skip
PRINTED_ANY_CASE = {unit.lower(): size for unit, size in PRINTED.items()}
"""A unit of two letters or more is one unit however it is cased (`gib`, `GIB`, `gb`); vLLM's
one-letter suffixes are not (`g` is 10^9, `G` is 2^30)."""
LARGEST = 1 << 60
"""1 EiB: a size past it is a typo, and its digits would not even print (Python refuses to
convert an integer of more than 4,300 digits to text)."""
_SIZE = re.compile(r"(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[A-Za-z]*)")


@dataclass(frozen=True)
class SizeField:
    """A size the kit takes: its name as the user writes it, and the unit of a bare number."""

    name: str
    unit: int
    whole_units: bool = False
    """The field holds a whole number of its unit (`SHM_SIZE_GIB`: GiB for compose)."""
    example: str = "12GiB"


def bytes_of(text: str, unit: int = 1) -> int | None:
    """`text` in bytes by the convention above (a bare number in `unit` bytes), or None when it
    is not a size."""
    match = _SIZE.fullmatch(text.strip())
    if match is None or len(match["number"]) > 40:
        return None
    number, suffix = Fraction(match["number"]), match["unit"]
    if not suffix:
        return int(number * unit)
    if suffix in VLLM_BINARY:  # vLLM refuses "1.5G": a binary suffix takes a whole number
        return int(number) * VLLM_BINARY[suffix] if number.denominator == 1 else None
    scale = VLLM_DECIMAL.get(suffix) or PRINTED_ANY_CASE.get(suffix.lower())
    return int(number * scale) if scale else None


KV_CACHE_MEMORY = SizeField("KV_CACHE_MEMORY", 1)
BUDGET = SizeField("--budget", 1, example="16GiB")
SHM_SIZE = SizeField("SHM_SIZE_GIB", GIB, whole_units=True, example="64")
OFFLOAD_SIZE = SizeField("KV_OFFLOADING_SIZE_GB", GIB, example="64")
PROFILE_SIZES = {"engine.kv_cache_memory_bytes": KV_CACHE_MEMORY,
                 "deployment.shm_size_gib": SHM_SIZE, "engine.kv_offload.size_gib": OFFLOAD_SIZE}
"""The profile's size fields (what an override of each path is read as)."""


def read_size(field: SizeField, text: str, where: str | None = None) -> int:
    """The size `text` gives `field`, in bytes; a usage error naming the field (`where` when the
    caller knows better), the value and the forms otherwise."""
    size = bytes_of(text, field.unit)
    name = where or field.name
    example = f"{field.name} {field.example}" if field.name.startswith("-") else \
        f"{field.name}={field.example}"  # fmt: skip
    forms = (f"e.g. {example}: a number of {unit_name(field.unit)}, or one with vLLM's k/m/g/t "
             "(x 1000) or K/M/G/T (x 1024), KiB/MiB/GiB/TiB, or KB/MB/GB/TB")
    if size is None:
        raise UsageError(name, text, "is not a size", forms)
    if size <= 0:
        raise UsageError(name, text, "must be more than 0 bytes", forms)
    if size > LARGEST:
        raise UsageError(name, text, "is more than 1 EiB, larger than any host or GPU has",
                         forms)  # fmt: skip
    if field.whole_units and size % field.unit:
        raise UsageError(name, text, f"is not a whole number of {unit_name(field.unit)}",
                         f"e.g. {example}")  # fmt: skip
    return size


def unit_name(unit: int) -> str:
    return next((name for name, size in PRINTED.items() if size == unit and "i" in name),
                "bytes")  # fmt: skip


def in_units(size: int, unit: int) -> int | float:
    """`size` bytes as a number of `unit` (whole where it is whole)."""
    return size // unit if size % unit == 0 else size / unit
