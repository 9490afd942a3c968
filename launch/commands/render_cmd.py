"""`python -m launch render PROFILE`: what would run, without starting it.

`--format text` (default) is a copyable shell rendering, `json` the plan for machines,
`compose` a compose file of one replica per `--gpu-sets` entry behind vLLM's router, and `k8s`
Kubernetes manifests for `--replicas` pods behind the router. Compose and Kubernetes output
reference images by digest only.
"""

from __future__ import annotations

import argparse
import json

import yaml

from capacity.host import NotPredicted, predict_start
from launch.cli_args import positive_int
from launch.commands.common import add_profile_arguments, vllm_to_check
from launch.compose_config import compose_document
from launch.compose_files import KIT_PACKAGES, merged_document
from launch.errors import UsageError
from launch.image_lock import KIT_ROOT, resolve_image
from launch.plan import Plan, format_plan, plan_for
from launch.scale import k8s_manifests, router_source
from launch.settings import Settings, port_number, read_settings

NAME = "render"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help="print the vllm serve command a profile runs")
    add_profile_arguments(parser)
    parser.add_argument("--json", action="store_true", help="same as --format json")
    parser.add_argument("--format", choices=["text", "json", "compose", "k8s"], default="text")
    parser.add_argument(
        "--gpu-sets",
        default=None,
        help='compose: one replica per set, e.g. "0,1,2,3 4,5,6,7" (default $GPU_SETS)',
    )
    parser.add_argument("--replicas", type=positive_int, default=None,
                        help="k8s: pods (default 1); compose: CPU replicas")  # fmt: skip
    parser.add_argument(
        "--host-port",
        default=None,
        help="compose: the router's host port, replica i gets port + 1 + i (default $HOST_PORT "
        "from the environment or compose/.env, else 8000)",
    )
    parser.add_argument("--bind", default=None,
                        help="compose: the host address (default $BIND_ADDRESS, else 127.0.0.1)")
    parser.add_argument(
        "--no-router", action="store_true", help="k8s: the vLLM pods only, no router in front"
    )
    parser.add_argument("--predict", action="store_true",
                        help="text: also the KV cache the start will get, when the image is here "
                        "(`make capacity`'s answer)")  # fmt: skip
    return parser


def kit_files() -> dict[str, str]:
    """The kit's mounted packages as text, path below /opt/kit -> content (the k8s ConfigMap)."""
    return {
        str(path.relative_to(KIT_ROOT)): path.read_text(encoding="utf-8")
        for package in KIT_PACKAGES
        for path in sorted((KIT_ROOT / package).rglob("*"))
        if path.suffix in (".py", ".yaml") and "__pycache__" not in path.parts
    }


def predicted_line(plan: Plan, settings: Settings) -> str:
    """The start's predicted KV cache line, or why there is none (never an error)."""
    try:
        image = resolve_image(plan.profile.deployment.image, settings.merged)
        return predict_start(plan, image).summary()
    except (NotPredicted, UsageError) as why:
        return f"capacity: not predicted: {why}"


def run(args: argparse.Namespace) -> int:
    settings = read_settings(args.sets)
    plan = plan_for(settings, args.profile, vllm_to_check(args.vllm_root))
    fmt = "json" if args.json else args.format
    if fmt == "text":
        print(format_plan(plan))
        if args.predict:
            print(f"# {predicted_line(plan, settings)}")
    elif fmt == "json":
        print(json.dumps(plan.to_json(), indent=2))
    elif fmt == "compose":
        port = (settings.host_port if args.host_port is None
                else port_number("--host-port", args.host_port, settings.host_port))  # fmt: skip
        bind = args.bind or settings.bind_address
        doc = compose_document(plan, args.gpu_sets or settings.gpu_sets, args.replicas, port, bind)
        print(yaml.safe_dump(doc, sort_keys=False), end="")
    else:
        # a cluster pulls its images: a local image ID of this engine cannot run there
        image = resolve_image(plan.profile.deployment.image, settings.merged, local_ok=False)
        router = None
        if not args.no_router:
            router = resolve_image(router_source(plan), settings.merged,
                                   override_var="ROUTER_IMAGE", local_ok=False)  # fmt: skip
        service = merged_document(plan.profile.deployment.device)["services"]["vllm"]
        docs = k8s_manifests(plan, image, router, args.replicas or 1, service=service,
                             kit_files=kit_files())  # fmt: skip
        print(yaml.safe_dump_all(docs, sort_keys=False), end="")
    return 0
