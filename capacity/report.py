"""`make capacity`'s printed report and the refusal a start gets: the image's answer
(`capacity.host`) as the user reads it, every figure from that answer."""

from __future__ import annotations

from capacity.answer import Answer, BudgetPlan, Refused
from capacity.host import KV_CACHE_SIZE, Budgets
from kvgeometry.line import PREFIX
from launch.errors import UsageError
from launch.sizes import GIB


def _gib(size: int) -> str:
    return f"{size:,} bytes ({size / GIB:.2f} GiB)"


def plan_lines(plan: BudgetPlan) -> list[str]:
    """One budget's figures as the engine will log them, then the geometry report's fields."""
    if isinstance(plan, Refused):
        return [f"budget {_gib(plan.budget)}: the engine refuses to start:", f"  {plan.why}"]
    g = plan.geometry
    lines = [f"budget {_gib(plan.budget)}", "  the start will log:"]
    lines += [f"    {line}" for line in plan.said(KV_CACHE_SIZE, PREFIX)]
    lines.append(f"  blocks {plan.num_blocks:,}  pool stride {g.stride_bytes:,} B  tokens "
                 f"{plan.tokens:,}  max concurrency {plan.max_concurrency:.2f}x at "
                 f"{plan.max_model_len:,} tokens  scheduler block {g.scheduler_block}  "
                 f"hash block {g.hash_block}")  # fmt: skip
    for group in g.groups:
        lines.append(f"  group {group.group:>2} {group.role:<10} block "
                     f"{group.block_size:>5}  page {group.page_bytes:>10,} B  layers "
                     f"{group.layers:>2}  cp {group.cp_size}")  # fmt: skip
    return lines


def format_answer(profile: str, image: str, budgets: Budgets, answer: Answer,
                  cached: bool) -> str:  # fmt: skip
    cache = ", cached answer" if cached else ""
    lines = [f"capacity: {profile} in {image} (vLLM {answer.vllm}, planned on the CPU{cache})",
             f"budget from {budgets.source}"]  # fmt: skip
    lines += [f"note: {note}" for note in answer.notes]
    for plan in answer.plans:
        lines += plan_lines(plan)
    wanted = answer.for_requests
    if wanted:
        need = wanted.plan
        lines.append(f"smallest budget for {wanted.requests} concurrent requests of "
                     f"{wanted.tokens:,} tokens: {_gib(need.budget)} ({need.num_blocks:,} "
                     f"blocks, {need.max_concurrency:.2f}x)")  # fmt: skip
    for item in answer.largest_context:
        lines.append(f"largest max_model_len {item.requests} request(s) fit in "
                     f"{_gib(item.budget)}: {item.max_model_len:,} tokens (the "
                     "cache's limit; the model's own maximum may be lower)")  # fmt: skip
    return "\n".join(lines)


def refusal(answer: Answer, budgets: Budgets) -> UsageError | None:
    """The error for a budget the engine would refuse: its own reason and both fixes with
    numbers (the smallest budget that holds one request; the largest context this one holds)."""
    if not answer.refused or answer.fix is None:
        return None
    plan, fix = answer.refused[0], answer.fix
    need = fix.smallest_budget.plan.budget
    largest = fix.longest_for(plan.budget)
    field = "budget" if budgets.source == "--budget" else "KV_CACHE_MEMORY"
    shorter = (f"MAX_MODEL_LEN={largest} (the longest request {_gib(plan.budget)} "
               "holds)") if largest else "no max_model_len fits this budget"
    return UsageError(field, plan.budget, f"the engine would refuse to start: {plan.why}",
                      f"KV_CACHE_MEMORY={need} ({need / GIB:.2f} GiB, the smallest that holds one "
                      f"{plan.max_model_len:,}-token request), or {shorter}")  # fmt: skip
