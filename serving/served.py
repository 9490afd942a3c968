"""The started server a load command talks to, from the same settings `configure` used: its
plan, base URL, API key and the bench client's target (a bad one exits 2 naming the field)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from launch.cli_args import add_api_key_argument, add_set_argument
from launch.errors import UsageError
from launch.plan import Plan, plan_for
from launch.settings import Settings, read_settings
from serving.bench.client import Target


def add_served_arguments(parser: argparse.ArgumentParser) -> None:
    """`--profile`, `--set`, `--url`, `--api-key`: what `served` takes, for the commands that
    load a started server."""
    parser.add_argument("--profile", help="the started server's profile (default $PROFILE)")
    add_set_argument(parser)
    parser.add_argument("--url", help="server base URL (default http://127.0.0.1:<HOST_PORT>)")
    add_api_key_argument(parser)


@dataclass(frozen=True)
class Served:
    settings: Settings
    plan: Plan
    url: str
    api_key: str | None
    target: Target


def served(profile: str | None, sets: list[str], url: str | None,
           api_key: str | None) -> Served:  # fmt: skip
    """The server of `profile` (default $PROFILE) at `url` (default the published port)."""
    settings = read_settings(sets)
    if not (profile or settings.get("PROFILE")):
        raise UsageError("--profile", None, "no profile given", "pass --profile or set PROFILE")
    plan = plan_for(settings, profile)
    url = url or settings.url(plan.profile.deployment.port)
    api_key = api_key or settings.client_api_key()
    try:
        target = Target.from_url(url, api_key)
    except ValueError as err:
        raise UsageError("--url", url, str(err), "e.g. --url http://127.0.0.1:8000") from err
    return Served(settings, plan, url, api_key, target)


def replica_urls(generated: Mapping[str, str], replicas_file: Path) -> dict[str, str]:
    """Each replica's own URL when `configure` scaled the service out (compose/.env runs the
    replicas file): service name -> http://127.0.0.1:<its published port>, as the file publishes
    it; empty for a single server."""
    if generated.get("COMPOSE_FILE") != replicas_file.name or not replicas_file.is_file():
        return {}
    services = yaml.safe_load(replicas_file.read_text(encoding="utf-8")).get("services", {})
    urls = {}
    for name in sorted(services, key=lambda n: (len(n), n)):
        if name.startswith("vllm-") and services[name].get("ports"):
            host, port, _inner = str(services[name]["ports"][0]).rsplit(":", 2)
            # published on every address: this host reaches it on loopback
            urls[name] = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    return urls
