"""`python -m launch render PROFILE`: what would run, without starting it.

`--format text` (default) is a copyable shell rendering, `json` the plan for machines,
`compose` a compose file of one replica per `--gpu-sets` entry behind vLLM's router, and `k8s`
Kubernetes manifests for `--replicas` pods behind the router. Compose and Kubernetes output
reference images by digest only.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import yaml

from launch.commands.common import add_profile_arguments, plan_from_args
from launch.compose_config import compose_document
from launch.compose_files import merged_document
from launch.errors import ProfileError
from launch.image_lock import resolve_image
from launch.render import format_plan
from launch.scale import (
    k8s_manifests,
    router_source,
)

NAME = "render"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help="print the vllm serve command a profile runs")
    add_profile_arguments(parser)
    parser.add_argument("--json", action="store_true", help="same as --format json")
    parser.add_argument("--format", choices=["text", "json", "compose", "k8s"], default="text")
    parser.add_argument(
        "--gpu-sets",
        default=os.environ.get("GPU_SETS"),
        help='compose: one replica per set, e.g. "0,1,2,3 4,5,6,7" (GPU_SETS)',
    )
    parser.add_argument(
        "--replicas", type=int, default=None, help="k8s: pods (default 1); compose: CPU replicas"
    )
    parser.add_argument(
        "--host-port",
        type=int,
        default=int(os.environ.get("HOST_PORT", "8000")),
        help="compose: the router's host port; replica i gets port + 1 + i",
    )
    parser.add_argument("--bind", default=os.environ.get("BIND_ADDRESS", "127.0.0.1"))
    parser.add_argument(
        "--no-router", action="store_true", help="k8s: the vLLM pods only, no router in front"
    )
    return parser


KIT_PACKAGES = ("launch", "kvgeometry")
"""The packages compose mounts into an image without the kit (compose/compose.yaml)."""


def kit_files() -> dict[str, str]:
    """The kit's mounted packages as text, path below /opt/kit -> content (the k8s ConfigMap)."""
    root = Path(__file__).resolve().parent.parent.parent
    return {
        str(path.relative_to(root)): path.read_text(encoding="utf-8")
        for package in KIT_PACKAGES
        for path in sorted((root / package).rglob("*"))
        if path.suffix in (".py", ".yaml") and "__pycache__" not in path.parts
    }


def run(args: argparse.Namespace) -> int:
    plan = plan_from_args(args)
    fmt = "json" if args.json else args.format
    if fmt == "text":
        print(format_plan(plan))
    elif fmt == "json":
        print(json.dumps(plan.to_json(), indent=2))
    elif fmt == "compose":
        doc = compose_document(plan, args.gpu_sets, args.replicas, args.host_port, args.bind)
        print(yaml.safe_dump(doc, sort_keys=False), end="")
    else:
        args.replicas = 1 if args.replicas is None else args.replicas
        if args.replicas < 1:
            raise ProfileError("--replicas", args.replicas, "must be at least 1", "e.g. 2")
        # a cluster pulls its images: a local image ID of this engine cannot run there
        image = resolve_image(plan.profile.deployment.image, os.environ, local_ok=False)
        router = None
        if not args.no_router:
            router = resolve_image(router_source(plan), os.environ, override_var="ROUTER_IMAGE",
                                   local_ok=False)  # fmt: skip
        service = merged_document(plan.profile.deployment.device)["services"]["vllm"]
        docs = k8s_manifests(plan, image, router, args.replicas, service=service,
                             kit_files=kit_files())  # fmt: skip
        print(yaml.safe_dump_all(docs, sort_keys=False), end="")
    return 0
