"""The one list of the smoke's request checks: key (what `--only`/`--skip` take), name, when it
applies to a profile, and how it runs. The verdict and its JSON show each by name; a check that
does not apply, or that `--only`/`--skip` leaves out, is reported as skipped with the reason."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from launch.profile import Profile
from smoke import agent_api, api, counter_checks, tool_edges
from smoke.check import Check, Label, skipped
from smoke.client import Server


@dataclass(frozen=True)
class Context:
    """What a check may use besides the server: the profile it was started with and the
    engine's own figures read from its log."""

    server: Server
    profile: Profile
    concurrency: int = agent_api.DEFAULT_CONCURRENCY
    context_tokens: int | None = None
    hash_block: int | None = None
    """The engine's prefix-cache hash block (the geometry plugin's `hash_block=`), when read."""

    @property
    def needle_tokens(self) -> int | None:
        return self.context_tokens or self.profile.smoke.context_tokens

    @property
    def reuse_tokens(self) -> int | None:
        """Length of the prefix check's prompt: several hash blocks, a few thousand tokens."""
        block = self.reuse_block
        if block is None:
            return None
        return max(counter_checks.PREFIX_BLOCKS * block, counter_checks.PREFIX_MIN_TOKENS)

    @property
    def reuse_block(self) -> int | None:
        """The hash block the prefix check counts in: the engine's own, else the largest block
        the profile expects (None: neither is known)."""
        sizes = self.profile.expect.block_sizes
        return self.hash_block or (max(sizes.values()) if sizes else None)


Applies = Callable[[Context], str | None]
"""Why the check does not apply, or None when it does."""


def always(_: Context) -> str | None:
    return None


def tools(ctx: Context) -> str | None:
    e = ctx.profile.engine
    if e.tool_call_parser and e.enable_auto_tool_choice:
        return None
    return "the profile sets no tool-call parser with auto tool choice"


def reasoning(ctx: Context) -> str | None:
    return None if ctx.profile.engine.reasoning_parser else "the profile sets no reasoning parser"


def reasoning_and_tools(ctx: Context) -> str | None:
    return reasoning(ctx) or tools(ctx)


def vision(ctx: Context) -> str | None:
    return None if ctx.profile.smoke.vision else "the profile's model takes no images"


def needle(ctx: Context) -> str | None:
    if ctx.needle_tokens:
        return None
    return "the profile states no long-context check (smoke.context_tokens)"


def prefix_caching(ctx: Context) -> str | None:
    if ctx.profile.engine.enable_prefix_caching is False:
        return "the profile turns prefix caching off"
    tokens, context = ctx.reuse_tokens, ctx.server.max_model_len
    if tokens is None:
        return "no hash block known: read the server log (the geometry line gives it)"
    if context is not None and tokens + counter_checks.PROMPT_SLACK > context:
        return f"the served context ({context:,}) cannot hold its {tokens:,}-token prompt"
    return None


def speculative(ctx: Context) -> str | None:
    return None if ctx.profile.engine.speculative_config else "the profile does not speculate"


@dataclass(frozen=True)
class RequestCheck:
    """One request check: its key and title (the only place either is written), how it runs
    (handed its label), and when it applies."""

    key: str
    name: Callable[[Context], str] | str
    run: Callable[[Label, Context], Check]
    applies: Applies = always

    def label(self, ctx: Context) -> Label:
        return Label(self.key, self.name if isinstance(self.name, str) else self.name(ctx))


def on_server(check: Callable[[Label, Server], Check]) -> Callable[[Label, Context], Check]:
    """A check that needs only the server."""
    return lambda label, ctx: check(label, ctx.server)


REQUEST_CHECKS: tuple[RequestCheck, ...] = (
    RequestCheck("model", "api: served model id", on_server(api.check_model_id)),
    RequestCheck("ready", "api: chat answers READY", on_server(api.check_ready_answer)),
    RequestCheck("stream", "api: streaming SSE", on_server(api.check_stream)),
    RequestCheck("length", "api: max_tokens honoured", on_server(api.check_length_limit)),
    RequestCheck("usage", "api: usage counts consistent", on_server(api.check_usage)),
    RequestCheck("reasoning", "api: reasoning separated", on_server(agent_api.check_reasoning),
                 reasoning),
    RequestCheck("tool", "api: tool call", on_server(agent_api.check_tool_call), tools),
    RequestCheck("tool-stream", "api: streamed tool call",
                 on_server(agent_api.check_tool_call_stream), tools),
    RequestCheck("tool-noargs", "api: tool call without arguments",
                 on_server(tool_edges.check_noarg_call), tools),
    RequestCheck("tool-noargs-stream", "api: streamed tool call without arguments",
                 on_server(tool_edges.check_noarg_call_stream), tools),
    RequestCheck("no-tools-stream", "api: streamed answer without tools",
                 on_server(tool_edges.check_stream_without_tools), tools),
    RequestCheck("reasoning-tool", "api: reasoning then tool call",
                 lambda label, c: tool_edges.check_reasoning_then_call(
                     label, c.server, agent_api.TOOL_PROMPT, agent_api.WEATHER_TOOL),
                 reasoning_and_tools),
    RequestCheck("structured", "api: structured output",
                 on_server(agent_api.check_structured_output)),
    RequestCheck("concurrent", lambda c: f"api: {c.concurrency} concurrent answers",
                 lambda label, c: agent_api.check_concurrency(label, c.server, c.concurrency)),
    RequestCheck("vision", "api: vision", on_server(agent_api.check_vision), vision),
    RequestCheck("needle",
                 lambda c: (f"api: needle in {c.needle_tokens:,} tokens" if c.needle_tokens
                            else "api: needle in a long prompt"),
                 lambda label, c: agent_api.check_long_context(
                     label, c.server, c.needle_tokens or 0, c.profile.smoke.needle_depth),
                 needle),
    RequestCheck("prefix", "api: prefix cache reuse",
                 lambda label, c: counter_checks.check_prefix_reuse(
                     label, c.server, c.reuse_block or 0, c.reuse_tokens or 0),
                 prefix_caching),
    RequestCheck("spec", "api: speculative acceptance",
                 lambda label, c: counter_checks.check_spec_acceptance(
                     label, c.server, c.profile.expect.spec_acceptance_length_min),
                 speculative),
)  # fmt: skip
CHECK_KEYS = tuple(check.key for check in REQUEST_CHECKS)


def run_request_checks(ctx: Context, only: tuple[str, ...] = (),
                       skip: tuple[str, ...] = ()) -> list[Check]:  # fmt: skip
    """Every check in order: run, or skipped with the reason."""
    out = []
    for check in REQUEST_CHECKS:
        reason = ("not in --only" if only and check.key not in only
                  else "--skip" if check.key in skip else check.applies(ctx))  # fmt: skip
        label = check.label(ctx)
        out.append(skipped(label, reason) if reason else check.run(label, ctx))
    return out
