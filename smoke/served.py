"""The started server a load command talks to, from the same settings `configure` used: its
plan, base URL, API key and the bench client's target (a bad one exits 2 naming the field)."""

from __future__ import annotations

from dataclasses import dataclass

from launch.errors import UsageError
from launch.plan import Plan, plan_for
from launch.settings import Settings, read_settings
from smoke.bench.client import Target


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
