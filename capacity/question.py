"""The capacity question and its answer line: what the host (`capacity.host`) writes and the
image's vLLM (`capacity.engine`) reads, one definition for both sides of the container."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

UNSUPPORTED_EXIT = 2
"""The engine side's exit status when this vLLM cannot build what the question needs."""
ANSWER = "KIT-CAPACITY "
"""The answer's line on stdout (vLLM logs to stdout too)."""


@dataclass(frozen=True)
class Question:
    """What `make capacity` asks (written by `capacity.host`, answered by `capacity.engine`)."""

    architecture: str
    argv: tuple[str, ...]
    env: dict[str, str]
    device: str
    budgets: tuple[int, ...]
    for_requests: tuple[int, int] | None = None
    largest_context: int = 0
    """0, or how many concurrent requests the longest max_model_len must hold."""

    def to_json(self) -> dict[str, Any]:
        return {"architecture": self.architecture, "argv": list(self.argv), "env": self.env,
                "device": self.device, "budgets": list(self.budgets),
                "for": list(self.for_requests) if self.for_requests else None,
                "largest_context": self.largest_context}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Question:
        wanted = data.get("for")
        return cls(str(data["architecture"]), tuple(data["argv"]), dict(data.get("env", {})),
                   str(data.get("device", "cuda")), tuple(data["budgets"]),
                   (int(wanted[0]), int(wanted[1])) if wanted else None,
                   int(data.get("largest_context") or 0))  # fmt: skip
