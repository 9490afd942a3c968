"""One settings value per command: compose/.env's user lines, then the process environment, then
`--set`, read once and passed down.

Every command that loads a profile, resolves an image, publishes a port or writes a receipt
reads its settings here, so `configure`, `render --format compose|k8s`, `doctor`, smoke and the
bench receipt agree on `HOST_PORT`, `BIND_ADDRESS`, `IMAGE` and the profile overrides, and each
entry can say where it came from. Values that are not profile overrides (the host port, the bind
address) are checked here with the kit's one error.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from launch.compose_env import env_path, user_settings
from launch.errors import UsageError
from launch.image_lock import COMPOSE_DIR
from launch.route_guard import KEY_FILE_VAR, read_key

ENV_FILE = "compose/.env"
SECRETS_DIR = COMPOSE_DIR / "secrets"
"""The secret files compose mounts at /run/secrets (`make configure` creates them empty, 0644 in a
0700 directory: readable by the server's unprivileged user through the mount, by no other user
of the host)."""
SECRETS = {"VLLM_API_KEY": "vllm_api_key", "HF_TOKEN": "hf_token",
           "GRAFANA_ADMIN_PASSWORD": "grafana_admin_password"}
"""The secrets a user gives -> their file name under compose/secrets and /run/secrets."""
HF_TOKEN_FILE_VAR = "HF_TOKEN_PATH"
"""Where huggingface_hub reads the Hub token's file from, and so does the kit."""
SECRET_FILE_VARS = (KEY_FILE_VAR, HF_TOKEN_FILE_VAR)
"""The variables naming the API key's and the Hub token's files (tests point them elsewhere)."""
ENVIRONMENT = "environment"
DEFAULT_HOST_PORT = 8000
DEFAULT_BIND = "127.0.0.1"


@dataclass(frozen=True)
class Settings:
    """What the user set, by source; a later source wins (`--set` only reaches the profile)."""

    env_file: Mapping[str, str] = field(default_factory=dict)
    """The user's lines of compose/.env (the block `configure` writes is not a setting)."""
    environ: Mapping[str, str] = field(default_factory=dict)
    sets: tuple[str, ...] = ()
    env_path: Path | None = None

    @property
    def merged(self) -> dict[str, str]:
        """compose/.env under the environment: what compose and the launcher both see."""
        return {**self.env_file, **self.environ}

    def get(self, name: str) -> str | None:
        return self.merged.get(name)

    def source(self, name: str) -> str | None:
        """Where `name` comes from: "environment", "compose/.env" or None."""
        return ENVIRONMENT if name in self.environ else ENV_FILE if name in self.env_file else None

    def profile_name(self, given: str | None) -> str:
        """The profile argument, else PROFILE."""
        name = given or self.get("PROFILE")
        if not name:
            raise UsageError("profile", None, "no profile given",
                             "pass a profile name or set PROFILE (see `python -m launch list`)")
        return name

    @property
    def host_port(self) -> int:
        """HOST_PORT: where compose publishes the API (or the router) on this host."""
        return port_number("HOST_PORT", self.get("HOST_PORT"), DEFAULT_HOST_PORT,
                           self.source("HOST_PORT"))  # fmt: skip

    @property
    def bind_address(self) -> str:
        """BIND_ADDRESS: the host address the API is published on."""
        text = self.get("BIND_ADDRESS") or DEFAULT_BIND
        try:
            ipaddress.ip_address(text)
        except ValueError as err:
            origin = where(self.source("BIND_ADDRESS"))
            raise UsageError(
                "BIND_ADDRESS", text, f"is not an IP address ({origin})",
                "use 127.0.0.1 (this host only) or 0.0.0.0 (every interface, with an API key in "
                "compose/secrets/vllm_api_key)",
            ) from err  # fmt: skip
        return text

    @property
    def api_key_file(self) -> Path:
        """The API key's secret file: $KIT_API_KEY_FILE (inside the container compose points it
        at /run/secrets/vllm_api_key), else compose/secrets/vllm_api_key."""
        given = self.environ.get(KEY_FILE_VAR)
        return Path(given) if given else SECRETS_DIR / SECRETS["VLLM_API_KEY"]

    def api_key(self) -> str | None:
        """The server's API key, from its secret file; None when no key is set."""
        return read_key(self.api_key_file)

    def client_api_key(self) -> str | None:
        """The key a client of this server sends (smoke, bench): $VLLM_API_KEY of the client's
        own shell (a client on another host), else the server's key file."""
        return self.environ.get("VLLM_API_KEY") or self.api_key()

    def hf_token(self) -> str | None:
        """The Hub token, from its secret file ($HF_TOKEN_PATH, as huggingface_hub reads it,
        else compose/secrets/hf_token); None when none is set."""
        given = self.environ.get(HF_TOKEN_FILE_VAR)
        return read_key(Path(given) if given else SECRETS_DIR / SECRETS["HF_TOKEN"])


    @property
    def gpu_sets(self) -> str | None:
        return self.get("GPU_SETS") or None

    def url(self, port: int | None = None) -> str:
        """Where a started profile answers on this host: HOST_PORT when set, else `port`."""
        chosen = self.host_port if self.get("HOST_PORT") or port is None else port
        return f"http://127.0.0.1:{chosen}"


def refuse_secrets_as_environment(values: Mapping[str, str], origin: str) -> None:
    """A secret set in `values` (compose/.env's lines, which compose passes to the container as
    its environment, or the server's own environment) is where `docker inspect`,
    `/proc/<pid>/environ` and crash reports show it: exit 2 naming the file it belongs in."""
    names = [name for name in SECRETS if values.get(name)]
    if names:
        first = names[0]
        raise UsageError(
            ", ".join(names), f"set in {origin}",
            "would reach the server as environment, which `docker inspect` shows; secrets reach "
            "it as files (Compose secrets, mounted at /run/secrets)",
            f"move it into its file and delete the line, e.g. `printf %s \"$VALUE\" > "
            f"compose/secrets/{SECRETS[first]}` (`make configure` creates compose/secrets)",
        )  # fmt: skip


def where(source: str | None) -> str:
    return f"from {source}" if source else "the default"


def port_number(name: str, text: str | None, default: int, origin: str | None = None) -> int:
    """A TCP port from its text: ASCII digits, 1..65535 (`origin`: where the text came from)."""
    if text is None or text == "":
        return default
    if not (text.isascii() and text.isdigit() and len(text) <= 5) or not 1 <= int(text) <= 65535:
        raise UsageError(name, text, f"must be a TCP port, 1 to 65535 ({where(origin)})",
                         f"e.g. {name}={default}")  # fmt: skip
    return int(text)


def read_settings(sets: Sequence[str] = (), environ: Mapping[str, str] | None = None) -> Settings:
    """The settings of this command: the settings file (compose/.env, or $KIT_ENV_FILE), the
    process environment and the `--set` items."""
    path = env_path()
    return Settings(user_settings(path), dict(os.environ if environ is None else environ),
                    tuple(sets), path)  # fmt: skip
