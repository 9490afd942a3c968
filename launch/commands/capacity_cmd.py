"""`python -m launch capacity PROFILE`: the KV cache the profile will get, before it starts.

vLLM's own sizing runs in the profile's image on the CPU (`capacity.host`); the answer is kept
per question and image, so asking again costs nothing. Without options it asks what `make up`
asks (the profile's budget, and how `max_num_seqs` requests of `max_model_len` fit), so the two
share one answer. `--budget` asks about other budgets,
`--for 4x1048576` for the smallest budget that holds 4 concurrent requests of 1,048,576 tokens,
`--largest-context` for the longest request each budget holds. Bad input exits 2, and so does a
budget the engine would refuse (its reason, and both fixes with numbers).
"""

from __future__ import annotations

import argparse
import json

from capacity.host import budgets_for, parse_requests, predict, question_for, start_question
from capacity.report import format_answer, refusal
from launch.commands.common import add_profile_arguments
from launch.image_lock import resolve_image
from launch.plan import plan_for
from launch.settings import read_settings
from launch.sizes import BUDGET, read_size

NAME = "capacity"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help="the KV cache a profile will get, before start")
    add_profile_arguments(parser)
    parser.add_argument("--budget", action="append", default=[],
                        help="a KV cache budget to plan (bytes or e.g. 16GiB; repeatable)")
    parser.add_argument("--for", dest="for_requests", default=None, metavar="NxTOKENS",
                        help="the smallest budget holding N concurrent requests of TOKENS")
    parser.add_argument("--largest-context", action="store_true",
                        help="the largest max_model_len each budget holds for one request")
    parser.add_argument("--json", action="store_true", help="the answer as JSON")
    parser.add_argument("--no-cache", action="store_true", help="ask the image again")
    return parser  # fmt: skip


def run(args: argparse.Namespace) -> int:
    asked = tuple(read_size(BUDGET, b) for b in args.budget)
    wanted = parse_requests(args.for_requests) if args.for_requests else None
    settings = read_settings(args.sets)
    plan = plan_for(settings, args.profile)
    image = resolve_image(plan.profile.deployment.image, settings.merged)
    if not (asked or wanted or args.largest_context) and plan.profile.engine.kv_cache_memory_bytes:
        budgets, question = start_question(plan)  # what `make up` and `make smoke` ask
    else:
        budgets = budgets_for(plan, asked)
        question = question_for(plan, budgets, wanted, 1 if args.largest_context else 0)
    answer, cached = predict(image, question, cached=not args.no_cache)
    if args.json:
        head = {"profile": plan.profile.name, "image": image, "cached": cached,
                "budget_source": budgets.source}  # fmt: skip
        print(json.dumps(head | answer.to_json(), indent=2))
    else:
        print(format_answer(plan.profile.name, image, budgets, answer, cached))
    refused = refusal(answer, budgets)
    if refused is not None:
        raise refused
    return 0
