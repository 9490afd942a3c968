"""Property tests over what a user types: every override variable of every profile and every
numeric command-line option, with hostile values (huge, negative, zero, non-ASCII digits,
non-finite, unbalanced quotes, control characters, 10 kB strings). Each gives a plan or a parsed
value inside its stated bound, or the kit's one usage error; never a traceback, and in bounded
time (hypothesis' deadline) and memory (tracemalloc's peak). A fuzz of this shape found the
crashes fixed in issues 28 and 31: `TP=99999999999999999999` exhausting memory in an error hint,
shlex's ValueError, a bench that started hundreds of thousands of tasks."""

from __future__ import annotations

import argparse
import tracemalloc

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launch.__main__ import COMMANDS as LAUNCH_COMMANDS
from launch.cli_args import MAX_COUNT, MAX_SECONDS, positive_float, positive_int
from launch.errors import UsageError
from launch.loader import profile_names
from launch.overrides import ENV_OVERRIDES
from serving.__main__ import COMMANDS as SERVING_COMMANDS
from serving.commands.bench_cmd import MAX_CONCURRENCY, concurrency
from smoke.__main__ import COMMANDS as SMOKE_COMMANDS
from tests.conftest import plan_of

HOSTILE = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
    st.text(max_size=40),  # any code point: control characters, non-ASCII digits, quotes
    st.sampled_from(['"', "'", "\\", "1e999", "-inf", "nan", "-0", "\u0661\u0662", "\uff14",
                     "12GiB", "4,\u00a05", "0x10", "1_000", " 7 ", "--max-num-seqs 4"]),
    st.builds(lambda n, s: f"{n}{s}", st.integers(0, 10**30), st.sampled_from("kKmMgGtT")),
    st.builds(lambda c, n: c * n, st.sampled_from("9x\"\\"), st.integers(5_000, 10_000)),  # 10 kB
)  # fmt: skip
MEMORY_BOUND = 64 << 20
"""Peak allocation of one plan or one parse, hostile or not."""
FAST = settings(max_examples=250, deadline=5_000, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])  # fmt: skip


def peak_bytes(call) -> int:
    tracemalloc.start()
    try:
        call()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


@FAST
@given(profile=st.sampled_from(profile_names()), key=st.sampled_from(sorted(ENV_OVERRIDES)),
       value=HOSTILE)  # fmt: skip
def test_an_override_plans_or_is_one_usage_error(profile: str, key: str, value: str) -> None:
    def plan() -> None:
        try:
            plan_of(profile, {key: value})
        except UsageError as err:
            assert len(str(err)) < 2_000, (key, value[:20], len(str(err)))

    assert peak_bytes(plan) < MEMORY_BOUND


def numeric_options() -> list[tuple[str, str, object]]:
    """(command, option, argparse type) of every numeric option of `python -m launch` and
    `python -m smoke` and `python -m serving`, found from the parsers themselves."""
    found = []
    for prog, commands in (("launch", LAUNCH_COMMANDS), ("smoke", SMOKE_COMMANDS),
                           ("serving", SERVING_COMMANDS)):
        parser = argparse.ArgumentParser(prog=prog)
        subparsers = parser.add_subparsers(dest="command")
        for module in commands:
            module.add_parser(subparsers)
        for name, sub in subparsers.choices.items():
            for action in sub._actions:
                if action.type in (positive_int, positive_float, concurrency):
                    found.append((f"{prog} {name}", action.option_strings[0], action.type))
    return found


NUMERIC = numeric_options()


def test_the_numeric_options_are_found() -> None:
    options = {(command, option) for command, option, _ in NUMERIC}
    assert {("serving bench", "--concurrency"), ("smoke check", "--timeout"),
            ("serving bench", "--prefill-tokens"), ("launch configure", "--replicas")} <= options


BOUNDS = {positive_int: (1, MAX_COUNT), positive_float: (0, MAX_SECONDS),
          concurrency: (1, MAX_CONCURRENCY)}  # fmt: skip


@FAST
@given(option=st.sampled_from(NUMERIC), value=HOSTILE)
def test_a_numeric_option_parses_inside_its_bound_or_is_refused(option, value: str) -> None:
    command, flag, kind = option
    low, high = BOUNDS[kind]
    result: list[float] = []

    def parse() -> None:
        try:
            result.append(kind(value))
        except argparse.ArgumentTypeError as err:
            assert len(str(err)) < 200, (command, flag, str(err)[:80])

    assert peak_bytes(parse) < MEMORY_BOUND
    for parsed in result:
        assert low <= parsed <= high if kind is not positive_float else low < parsed <= high
