"""The host side of `make capacity`: the KV cache a profile will get, asked of the profile's
own image before it starts.

The question (budgets, `--for NxL`, `--largest-context`) from typed values; the container that
answers it (the profile's image, the checkout's packages mounted at /opt/kit as compose mounts
them, no network, no GPU: `python -m capacity.engine` runs vLLM's engine core sizing on the
CPU); a cache of answers per question and image; the start's prediction. The numbers all come
from that vLLM; this module only asks and keeps (`capacity.report` prints).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from capacity.answer import (
    Answer,
    BudgetPlan,
    EnginePlan,
    Refused,
    Unanswerable,
    answer_from_json,
)
from capacity.question import ANSWER, Question
from launch.compose_files import KIT_PACKAGES
from launch.errors import UsageError
from launch.image_lock import KIT_ROOT
from launch.kit_cache import kit_cache_dir
from launch.plan import Plan
from launch.sizes import GIB

MOUNTED = (*KIT_PACKAGES, "capacity")
"""What the question's container mounts at /opt/kit: the packages a serving container mounts,
and this one."""

KV_CACHE_SIZE = "KV cache size:"
"""How vLLM's engine core opens the line with the cache's tokens and concurrency."""
TABLE_GIB = (8, 12, 16, 24, 32, 48, 64)
"""Budgets shown for a profile sized by gpu_memory_utilization (its budget is known only after
the weights load)."""


def parse_requests(text: str) -> tuple[int, int]:
    """`4x1048576` -> (4 requests, 1,048,576 tokens each)."""
    count, sep, tokens = text.lower().partition("x")
    example = "e.g. --for 4x1048576 (4 concurrent requests of 1,048,576 tokens)"
    if not sep or not count.strip().isdigit():
        raise UsageError("for", text, "must be COUNTxTOKENS with a whole number of requests",
                         example)  # fmt: skip
    if not tokens.strip().isdigit():
        raise UsageError("for", text, f"{tokens.strip()!r} is not a whole number of tokens",
                         example)  # fmt: skip
    if int(count) < 1 or int(tokens) < 1:
        raise UsageError("for", text, "needs at least one request of at least one token", example)
    return int(count), int(tokens)


@dataclass(frozen=True)
class Budgets:
    """The budgets asked about, and where they come from (said in the report)."""

    sizes: tuple[int, ...]
    source: str


def budgets_for(plan: Plan, asked: tuple[int, ...]) -> Budgets:
    """`--budget` when given; else the profile's kv_cache_memory_bytes; else a table (a budget
    from gpu_memory_utilization is what the GPUs have left after the weights load)."""
    if asked:
        return Budgets(asked, "--budget")
    engine = plan.profile.engine
    if engine.kv_cache_memory_bytes:
        return Budgets((engine.kv_cache_memory_bytes,), "the profile's kv_cache_memory_bytes")
    return Budgets(tuple(g * GIB for g in TABLE_GIB), (
        "a table: the profile sizes the cache by gpu_memory_utilization "
        f"{engine.gpu_memory_utilization or 'default'}, so the real budget is known only after "
        "the weights load; the start logs it as 'Available KV cache memory: X GiB' "
        "(--budget asks about that figure)"))  # fmt: skip


def question_for(plan: Plan, budgets: Budgets, for_requests: tuple[int, int] | None,
                 largest_context: int) -> Question:  # fmt: skip
    profile = plan.profile
    return Question(profile.architecture or "", plan.argv, dict(plan.env),
                    "cpu" if profile.deployment.device == "cpu" else "cuda", budgets.sizes,
                    for_requests, largest_context)  # fmt: skip


def cache_dir() -> Path:
    return kit_cache_dir() / "capacity"


def cache_key(question: Question, image: str) -> str:
    """One answer per question and image (a digest reference or an image ID: both name the
    content, so a rebuilt image is a new key, and a hit needs no Docker engine), and per
    checkout of the code that answers (the mounted packages)."""
    code = hashlib.sha256()
    for package in MOUNTED:
        for path in sorted((KIT_ROOT / package).rglob("*.py")):
            code.update(path.read_bytes())
    blob = json.dumps([question.to_json(), image, code.hexdigest()], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def read_answer(stdout: str) -> Answer | Unanswerable | None:
    """The answer line of the container's output, if it printed one."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(ANSWER):
            return answer_from_json(json.loads(line[len(ANSWER):]))
    return None


def ask_image(image: str, question: Question) -> tuple[Answer | Unanswerable | None, str]:
    """Run the question in `image` (Docker Engine API): its answer and its output."""
    from launch.docker_api import connect

    client = connect("start the Docker engine; `make capacity` runs the profile's image")
    volumes = {str(KIT_ROOT / m): {"bind": f"/opt/kit/{m}", "mode": "ro"} for m in MOUNTED}
    env = {"PYTHONPATH": "/opt/kit", "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1",
           "CUDA_VISIBLE_DEVICES": ""}  # the question's own environment: capacity.engine.answer
    container = client.containers.run(
        image, [json.dumps(question.to_json())], entrypoint=["python3", "-m",
        "capacity.engine"], environment=env, volumes=volumes, network_mode="none",
        detach=True)  # fmt: skip
    try:
        container.wait()
        out = container.logs(stdout=True, stderr=True).decode(errors="replace")
        stdout = container.logs(stdout=True, stderr=False).decode(errors="replace")
    finally:
        # with its anonymous volumes: the kit's images declare /cache and /hf
        container.remove(force=True, v=True)
    return read_answer(stdout), out


def cached_answer(image: str, question: Question) -> Answer | None:
    path = cache_dir() / f"{cache_key(question, image)}.json"
    if not path.is_file():
        return None
    return Answer.from_json(json.loads(path.read_text(encoding="utf-8")))


def predict(image: str, question: Question, *, cached: bool = True) -> tuple[Answer, bool]:
    """The answer for `question` in `image` (pulled if absent), from the cache when it holds one
    (and whether it did). An answer naming what this vLLM cannot build is a UsageError; a
    crash is an error."""
    path = cache_dir() / f"{cache_key(question, image)}.json"
    if cached and (hit := cached_answer(image, question)) is not None:
        return hit, True
    answer, out = ask_image(image, question)
    if answer is None:
        tail = "\n".join(out.strip().splitlines()[-15:])
        raise RuntimeError(f"the capacity question failed in {image}:\n{tail}")
    if isinstance(answer, Unanswerable):
        raise UsageError("profile", question.architecture, f"vLLM {answer.vllm} in "
                         f"{image} cannot answer: {answer.why}",
                         "run it in the image that has it (IMAGE_SOURCE), or ask another "
                         "profile")  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(answer.to_json()), encoding="utf-8")
    return answer, False


class NotPredicted(Exception):
    """Why a start goes ahead without a prediction (said, never a reason to stop)."""


@dataclass(frozen=True)
class StartPrediction:
    """The prediction for a start: the profile's budget, `max_num_seqs` requests of
    `max_model_len` asked about too, so a refusal or a short cache comes with its fixes."""

    image: str
    budgets: Budgets
    answer: Answer
    cached: bool
    max_num_seqs: int | None

    @property
    def plan(self) -> BudgetPlan:
        return self.answer.plans[0]

    def summary(self) -> str:
        plan = self.plan
        if isinstance(plan, Refused):
            what = f"refused: {plan.why}"
        else:
            said = plan.said(KV_CACHE_SIZE)
            what = said[0] if said else f"{plan.tokens:,} tokens"
        cache = ", cached" if self.cached else ""
        return f"capacity predicted by vLLM {self.answer.vllm} in the image{cache}: {what}"

    def short_warning(self) -> str | None:
        """A predicted concurrency below max_num_seqs, with the two fixes' numbers."""
        plan, seqs = self.plan, self.max_num_seqs
        if not isinstance(plan, EnginePlan) or not seqs or plan.max_concurrency >= seqs:
            return None
        wanted, longest = self.answer.for_requests, self.answer.largest_context
        if wanted is None or not longest:
            return None
        need = wanted.plan.budget
        fix = f"KV_CACHE_MEMORY={need} ({need / GIB:.2f} GiB) holds {seqs}"
        if longest[0].max_model_len:
            fix += f", or MAX_MODEL_LEN={longest[0].max_model_len} does"
        return (f"warning: the predicted KV cache holds {plan.max_concurrency:.2f} requests of "
                f"{plan.max_model_len:,} tokens at once, fewer than max_num_seqs {seqs}: "
                f"{fix}")  # fmt: skip


def start_question(plan: Plan) -> tuple[Budgets, Question]:
    engine = plan.profile.engine
    if not engine.kv_cache_memory_bytes:
        raise NotPredicted("the profile sizes the cache by gpu_memory_utilization, so its budget "
                           "is known only after the weights load (`make capacity` shows a "
                           "table)")  # fmt: skip
    budgets = Budgets((engine.kv_cache_memory_bytes,), "the profile's kv_cache_memory_bytes")
    seqs = engine.max_num_seqs
    wanted = (seqs, engine.max_model_len) if seqs and engine.max_model_len else None
    return budgets, question_for(plan, budgets, wanted, seqs or 0)


def predict_start(plan: Plan, image: str, cached_only: bool = False) -> StartPrediction:
    """The start's prediction from the cache, else (unless `cached_only`: a dry run) from
    `image` when this host has it (a start that must pull it first is not held up by a pull of
    its own)."""
    from launch.docker_api import connect, engine_errors, local_image_id

    budgets, question = start_question(plan)
    seqs = plan.profile.engine.max_num_seqs
    hit = cached_answer(image, question)
    if hit is not None:
        return StartPrediction(image, budgets, hit, True, seqs)
    if cached_only:
        raise NotPredicted(f"no cached answer for this configuration in {image}; a start asks "
                           "the image (`make capacity` asks it now), a dry run does not")
    try:
        if local_image_id(connect("start the Docker engine"), image) is None:
            raise NotPredicted(f"{image} is not on this host yet (`make capacity` pulls it)")
        answer, cached = predict(image, question)
    except (UsageError, RuntimeError, *engine_errors()) as err:
        raise NotPredicted(str(err).splitlines()[0]) from err
    return StartPrediction(image, budgets, answer, cached, seqs)
