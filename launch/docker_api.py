"""The Docker Engine API, for the commands that ask the local engine something.

`smoke` reads a compose service's containers and logs through it; `launch pin --local` reads a
locally built image's ID; `launch up` and `fetch` check that a locally pinned image is still
there. One place connects, negotiates the API version (the engine may be older than the SDK) and
turns an engine that does not answer into an error naming the socket and the fix.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from launch.errors import UsageError

DEFAULT_SOCKET = "unix:///var/run/docker.sock"


def engine_errors() -> tuple[type[BaseException], ...]:
    """What a call to the engine raises when the engine does not answer. The Docker SDK is
    imported here, not at module level: `launch run` imports this module on its way to vLLM in
    runtime images that have only vLLM's own dependencies (docker/vllm_deps_only.py)."""
    import requests
    from docker.errors import DockerException

    return (DockerException, requests.RequestException, OSError)


def engine_address() -> str:
    return os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET


def connect(fix: str) -> Any:
    """A Docker client with the API version negotiated; exit 2 naming the socket if none.
    `fix` is the caller's way around a missing engine, appended to the usual ones."""
    import docker

    where = engine_address()
    try:
        client = docker.DockerClient(base_url=where, version="auto", timeout=10)
        client.ping()
    except engine_errors() as err:
        cause = str(err).splitlines()[0][:160]
        raise UsageError(
            "docker engine",
            where,
            f"does not answer ({cause})",
            "start dockerd (or Docker Desktop), check you may use its socket (the docker group), "
            f"set DOCKER_HOST if it listens elsewhere, or {fix}",
        ) from err
    return client


def local_image_id(client: Any, ref: str) -> str | None:
    """The engine's ID (`sha256:<config digest>`) of image `ref`, or None if it has none."""
    from docker.errors import ImageNotFound

    try:
        return client.images.get(ref).id
    except ImageNotFound:
        return None


def docker_path() -> str:
    """The docker CLI that compose runs through, or exit 2 naming the fix."""
    docker = shutil.which("docker")
    if docker is None:
        raise UsageError(
            "docker", None, "is not on PATH", "install Docker with the compose plugin"
        )
    return docker


def require_local_image(image_id: str) -> None:
    """A locally pinned image must still be on this engine: compose would otherwise try to pull
    the bare ID from Docker Hub and fail with a registry error."""
    client = connect("pin a pushed image by digest instead (`make pin IMAGE=repo:tag`)")
    if local_image_id(client, image_id) is None:
        raise UsageError(
            "IMAGE", image_id, "is pinned as a local image ID, and this Docker engine has no such "
            "image (removed, or built on another machine)",
            "build it again and `make pin IMAGE=<tag> LOCAL=1`, or push it and pin the digest",
        )  # fmt: skip


SIOCGIFADDR = 0x8915
"""The ioctl that reads an interface's IPv4 address (linux/sockios.h)."""


def bridge_address(client: Any) -> str:
    """This host's address on Docker's default bridge (docker0), which containers, the classic
    builder's RUN steps among them, reach the host at: the bridge gateway when the engine records
    one, else the bridge interface's own address."""
    attrs = client.networks.get("bridge").attrs
    gateway = next((c.get("Gateway") for c in attrs["IPAM"]["Config"] or [] if c.get("Gateway")),
                   None)  # fmt: skip
    if gateway:
        return gateway
    import fcntl
    import socket
    import struct

    name = attrs["Options"].get("com.docker.network.bridge.name", "docker0")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("256s", name[:15].encode())
        return socket.inet_ntoa(fcntl.ioctl(sock.fileno(), SIOCGIFADDR, request)[20:24])


CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
"""Where the NVIDIA Container Toolkit writes its CDI specs (`nvidia-ctk cdi generate`)."""


def nvidia_cdi_specs() -> list[str]:
    return [str(p) for d in CDI_DIRS for p in sorted(Path(d).glob("nvidia*.yaml"))]


NVIDIA_HOOK = "nvidia-container-runtime-hook"


def gives_gpus(runtimes: list[str], hook: str | None, cdi: list[str]) -> bool:
    """Whether the NVIDIA Container Toolkit hands GPUs to this engine's containers: its `nvidia`
    runtime, its prestart hook, or a CDI spec (`make doctor` and `configure` judge alike)."""
    return "nvidia" in runtimes or bool(hook) or bool(cdi)


def nvidia_runtime() -> bool:
    """`gives_gpus` for this host (an engine that does not answer lists no runtime)."""
    import docker

    try:
        client = docker.DockerClient(base_url=engine_address(), version="auto", timeout=10)
        runtimes = sorted(client.info().get("Runtimes") or {})
    except engine_errors():
        runtimes = []
    return gives_gpus(runtimes, shutil.which(NVIDIA_HOOK), nvidia_cdi_specs())
