"""Every size the kit takes, through one table of spellings (launch/sizes.py): the same text gives
the same bytes in `KV_CACHE_MEMORY`, `make capacity --budget`, `SHM_SIZE_GIB` and
`KV_OFFLOADING_SIZE_GB`, and the same refusal. The bytes a one-letter suffix gives are vLLM's own
(`vllm.utils.argparse_utils.human_readable_int`, which `vllm serve --kv-cache-memory-bytes`
reads); the IEC and decimal units are their definitions."""

from __future__ import annotations

from argparse import ArgumentTypeError
from collections.abc import Callable
from fractions import Fraction

import pytest
from vllm.utils.argparse_utils import human_readable_int as vllm_reads

from launch.errors import UsageError
from launch.loader import load
from launch.overrides import from_environment
from launch.sizes import BUDGET, GIB, bytes_of, read_size

SPELLINGS: list[tuple[str, int | None]] = [
    ("12GiB", 12 * GIB),
    ("12 GiB", 12 * GIB),
    ("12gib", 12 * GIB),
    ("12288MiB", 12 * GIB),
    ("12G", 12 * GIB),  # vLLM: binary
    ("12g", 12 * 10**9),  # vLLM: decimal
    ("12GB", 12 * 10**9),
    ("15.87 GiB", 17_040_282_746),  # as vLLM logs "15.87 GiB available for KV" (floor)
    ("1.5G", None),  # vLLM refuses a fraction with a binary suffix
    ("12XB", None),
    ("twelve", None),
    ("0GiB", None),
]
"""Spelling -> bytes (None: refused)."""


def kv_cache_memory(text: str) -> int:
    return load("cpu-tiny", from_environment({"KV_CACHE_MEMORY": text})).profile.engine \
        .kv_cache_memory_bytes  # fmt: skip


def shm_size(text: str) -> int:
    return load("cpu-tiny", from_environment({"SHM_SIZE_GIB": text})).profile.deployment \
        .shm_size_gib * GIB  # fmt: skip


def offload_size(text: str) -> int:
    sets = {"CACHE_MODE": "native", "KV_OFFLOADING_SIZE_GB": text}
    offload = load("mtp3-tp4-split", from_environment(sets)).profile.engine.kv_offload
    return int(Fraction(offload.size_gib) * GIB)


FIELDS: dict[str, Callable[[str], int]] = {
    "KV_CACHE_MEMORY": kv_cache_memory,
    "--budget": lambda text: read_size(BUDGET, text),
    "SHM_SIZE_GIB": shm_size,
    "KV_OFFLOADING_SIZE_GB": offload_size,
}


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize(("text", "size"), SPELLINGS)
def test_every_size_field_reads_every_spelling_alike(field, text, size):
    whole_gib = field == "SHM_SIZE_GIB"
    if size is None or (whole_gib and size % GIB):
        with pytest.raises(UsageError) as refused:
            FIELDS[field](text)
        assert field in str(refused.value) and repr(text) in str(refused.value)
        assert "Fix: e.g. " in str(refused.value)
        return
    assert FIELDS[field](text) == size


@pytest.mark.parametrize("text", [t for t, _ in SPELLINGS if t[-1] in "kKmMgGtT" and
                                  t[:-1].replace(".", "").isdigit()])  # fmt: skip
def test_one_letter_suffixes_are_vllms(text):
    try:
        theirs = vllm_reads(text)
    except (ValueError, ArgumentTypeError):  # vLLM's refusal of "1.5G"
        theirs = None
    assert bytes_of(text) == theirs


def test_a_bare_number_is_in_the_fields_unit():
    assert kv_cache_memory("12884901888") == 12 * GIB
    assert read_size(BUDGET, "12884901888") == 12 * GIB
    assert shm_size("12") == 12 * GIB
    assert offload_size("12") == 12 * GIB
