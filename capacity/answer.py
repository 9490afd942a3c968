"""The answer the image's vLLM gives (`capacity.engine`) and the host reads (`capacity.host`):
typed on both sides of the container, JSON between them (`to_json`/`from_json`, the shape
`make capacity --json` prints and the cache keeps)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvgeometry.line import KVGeometry


@dataclass(frozen=True)
class EnginePlan:
    """What the engine core decides for one budget: the lines it logs (the geometry plugin's
    included, when registered), the scheduler's KV cache config and the capacity it stored."""

    budget: int
    max_model_len: int
    num_blocks: int
    tokens: int
    max_concurrency: float
    geometry: KVGeometry
    lines: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"budget_bytes": self.budget, "max_model_len": self.max_model_len,
                "num_blocks": self.num_blocks, "tokens": self.tokens,
                "max_concurrency": self.max_concurrency, "geometry": self.geometry.to_json(),
                "engine_lines": list(self.lines)}  # fmt: skip

    def said(self, *marks: str) -> list[str]:
        """The engine lines that contain one of `marks`."""
        return [line for line in self.lines if any(m in line for m in marks)]


@dataclass(frozen=True)
class Refused:
    """The engine core refused to start with this budget; `why` is its own message."""

    budget: int
    max_model_len: int
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"budget_bytes": self.budget, "max_model_len": self.max_model_len,
                "refused": self.why}  # fmt: skip


BudgetPlan = EnginePlan | Refused


def plan_from_json(data: dict[str, Any]) -> BudgetPlan:
    if "refused" in data:
        return Refused(int(data["budget_bytes"]), int(data["max_model_len"]),
                       str(data["refused"]))  # fmt: skip
    return EnginePlan(int(data["budget_bytes"]), int(data["max_model_len"]),
                      int(data["num_blocks"]), int(data["tokens"]),
                      float(data["max_concurrency"]), KVGeometry.from_json(data["geometry"]),
                      tuple(data["engine_lines"]))  # fmt: skip


@dataclass(frozen=True)
class SmallestBudget:
    """The least budget holding `requests` concurrent requests of `tokens` tokens, planned."""

    requests: int
    tokens: int
    plan: EnginePlan

    def to_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "tokens": self.tokens,
                "smallest_budget": self.plan.to_json()}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SmallestBudget:
        plan = plan_from_json(data["smallest_budget"])
        if not isinstance(plan, EnginePlan):
            raise ValueError(f"a smallest budget the engine refuses: {plan.why}")
        return cls(int(data["requests"]), int(data["tokens"]), plan)


@dataclass(frozen=True)
class LargestContext:
    """The longest max_model_len at which `budget` holds `requests` concurrent requests (0:
    none)."""

    budget: int
    requests: int
    max_model_len: int

    def to_json(self) -> dict[str, Any]:
        return {"budget_bytes": self.budget, "requests": self.requests,
                "max_model_len": self.max_model_len}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LargestContext:
        return cls(int(data["budget_bytes"]), int(data.get("requests", 1)),
                   int(data["max_model_len"]))  # fmt: skip


@dataclass(frozen=True)
class Fix:
    """The two ways out of a refused budget, with numbers: the smallest budget that holds one
    request at the profile's max_model_len, the longest max_model_len each refused budget
    holds."""

    smallest_budget: SmallestBudget
    largest_context: tuple[LargestContext, ...]

    def to_json(self) -> dict[str, Any]:
        return {"smallest_budget": self.smallest_budget.to_json(),
                "largest_context": [c.to_json() for c in self.largest_context]}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fix:
        return cls(SmallestBudget.from_json(data["smallest_budget"]),
                   tuple(LargestContext.from_json(c) for c in data["largest_context"]))

    def longest_for(self, budget: int) -> int:
        return next(c.max_model_len for c in self.largest_context if c.budget == budget)


@dataclass(frozen=True)
class Answer:
    """Everything one question gets: a plan per budget, and what the question asked besides."""

    vllm: str
    architecture: str
    max_model_len: int
    plans: tuple[BudgetPlan, ...]
    notes: tuple[str, ...] = ()
    for_requests: SmallestBudget | None = None
    fix: Fix | None = None
    largest_context: tuple[LargestContext, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"vllm": self.vllm, "architecture": self.architecture,
                               "max_model_len": self.max_model_len,
                               "plans": [p.to_json() for p in self.plans],
                               "notes": list(self.notes)}  # fmt: skip
        if self.for_requests is not None:
            out["for"] = self.for_requests.to_json()
        if self.fix is not None:
            out["fix"] = self.fix.to_json()
        if self.largest_context:
            out["largest_context"] = [c.to_json() for c in self.largest_context]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Answer:
        wanted, fix = data.get("for"), data.get("fix")
        return cls(str(data["vllm"]), str(data["architecture"]), int(data["max_model_len"]),
                   tuple(plan_from_json(p) for p in data["plans"]),
                   tuple(str(n) for n in data.get("notes", ())),
                   SmallestBudget.from_json(wanted) if wanted else None,
                   Fix.from_json(fix) if fix else None,
                   tuple(LargestContext.from_json(c)
                         for c in data.get("largest_context") or ()))  # fmt: skip

    @property
    def refused(self) -> list[Refused]:
        return [p for p in self.plans if isinstance(p, Refused)]


@dataclass(frozen=True)
class Unanswerable:
    """This vLLM cannot build what the question needs; `why` names what is missing."""

    vllm: str
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"vllm": self.vllm, "unsupported": self.why}


def answer_from_json(data: dict[str, Any]) -> Answer | Unanswerable:
    if "unsupported" in data:
        return Unanswerable(str(data.get("vllm")), str(data["unsupported"]))
    return Answer.from_json(data)
