"""Resolve an image tag to its manifest digest through the registry's HTTP API (v2).

The Accept header lists the OCI and Docker v2 index and manifest media types: without them a
registry may answer 404 or return a different (converted) manifest and digest. The digest is the
registry's `Docker-Content-Digest`, checked against the SHA-256 of the body it sent. When the
registry asks for authentication (a bearer-token challenge, as Docker Hub and most registries
send, or HTTP Basic, as a registry with htpasswd does), the user's own `docker login`
credentials for that registry are used (the Docker CLI's config file, DOCKER_CONFIG, and its
credential helpers, read by the `docker` package); without any, bearer tokens are asked for
anonymously.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import httpx

from launch.errors import UsageError

MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
DOCKER_HUB = "registry-1.docker.io"
_BEARER = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class ImageRef:
    registry: str
    repository: str
    tag: str

    @property
    def name(self) -> str:
        """The reference's name as a user writes it (`repo` or `host:port/repo`)."""
        if self.registry == DOCKER_HUB:
            return self.repository.removeprefix("library/")
        return f"{self.registry}/{self.repository}"

    def pinned(self, digest: str) -> str:
        return f"{self.name}@{digest}"


def parse_ref(ref: str) -> ImageRef:
    """`[registry[:port]/]repository:tag` -> parts (Docker Hub when no registry is named)."""
    if "@" in ref:
        raise UsageError("IMAGE", ref, "is already a digest reference", "pass repo:tag to pin")
    name, sep, tag = ref.rpartition(":")
    if not sep or "/" in tag or not name:
        raise UsageError("IMAGE", ref, "has no tag", "pass repo:tag, e.g. kit/glm53:2026-11-29")
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first, rest
    else:
        registry, repository = DOCKER_HUB, name if slash else f"library/{name}"
    return ImageRef(registry, repository, tag)


def _scheme(registry: str) -> str:
    host = registry.split(":")[0]
    return "http" if host in ("localhost", "127.0.0.1", "::1") else "https"


def credentials(registry: str) -> tuple[str, str] | None:
    """(user, password) that `docker login` stored for `registry`, or None."""
    import docker.auth
    from docker.errors import DockerException

    try:
        found = docker.auth.resolve_authconfig(
            docker.auth.load_config(), None if registry == DOCKER_HUB else registry
        )
    except DockerException:  # a credential helper that fails counts as no login
        return None
    found = {k.lower(): v for k, v in (found or {}).items()}
    user, password = found.get("username"), found.get("password")
    return (user, password) if user and password else None


def _login_fix(ref: ImageRef) -> str:
    host = "" if ref.registry == DOCKER_HUB else f" {ref.registry}"
    return f"run `docker login{host}` (make pin uses the credentials docker stores), then retry"


def _get(url: str, timeout: float, **how: object) -> httpx.Response:
    """A GET as a registry client makes it: redirects followed (the distribution spec allows
    them), within `timeout`."""
    return httpx.get(url, timeout=timeout, follow_redirects=True, **how)  # type: ignore[arg-type]


def _token(
    challenge: str, ref: ImageRef, timeout: float, login: tuple[str, str] | None
) -> str:
    params = dict(_BEARER.findall(challenge))
    realm = params.pop("realm", None)
    if not realm:
        raise UsageError(
            "IMAGE",
            ref.name,
            f"registry asked for auth it did not describe: {challenge!r}",
            "log in to the registry or use a public image",
        )
    params.setdefault("scope", f"repository:{ref.repository}:pull")
    response = _get(realm, timeout, params=params, auth=login)
    if response.status_code in (401, 403):
        raise UsageError("IMAGE", ref.name, f"the token service refused "
                         f"{'the docker login of ' + login[0] if login else 'anonymous access'}",
                         _login_fix(ref))  # fmt: skip
    response.raise_for_status()
    body = response.json()
    return body.get("token") or body["access_token"]


def resolve_digest(ref: ImageRef, *, timeout: float = 30.0) -> str:
    """The manifest digest the registry serves for `ref` right now."""
    url = f"{_scheme(ref.registry)}://{ref.registry}/v2/{ref.repository}/manifests/{ref.tag}"
    headers = {"Accept": ", ".join(MANIFEST_TYPES)}
    login = None
    try:
        response = _get(url, timeout, headers=headers)
        challenge = response.headers.get("WWW-Authenticate", "")
        if response.status_code == 401:
            login = credentials(ref.registry)
        if response.status_code == 401 and challenge.startswith("Bearer"):
            token = _token(challenge, ref, timeout, login)
            headers["Authorization"] = f"Bearer {token}"
            response = _get(url, timeout, headers=headers)
        elif response.status_code == 401 and login is not None:
            response = _get(url, timeout, headers=headers, auth=login)
    except httpx.HTTPError as err:
        raise UsageError(
            "IMAGE",
            f"{ref.name}:{ref.tag}",
            f"registry {ref.registry} is not reachable ({type(err).__name__})",
            "check the name and network",
        ) from err
    if response.status_code == 404:
        raise UsageError(
            "IMAGE",
            f"{ref.name}:{ref.tag}",
            f"tag not found on {ref.registry}",
            "push the image first, or check the tag",
        )
    if response.status_code in (401, 403):
        who = f"the docker login of {login[0]!r}" if login else "a request without a login"
        raise UsageError("IMAGE", f"{ref.name}:{ref.tag}",
                         f"registry {ref.registry} refused {who} (HTTP {response.status_code})",
                         _login_fix(ref))  # fmt: skip
    if response.status_code != 200:
        raise UsageError(
            "IMAGE",
            f"{ref.name}:{ref.tag}",
            f"registry answered HTTP {response.status_code}",
            "check the name and your credentials",
        )
    body_digest = "sha256:" + hashlib.sha256(response.content).hexdigest()
    digest = response.headers.get("Docker-Content-Digest", body_digest)
    if digest != body_digest:
        raise UsageError(
            "IMAGE",
            f"{ref.name}:{ref.tag}",
            f"registry reported {digest} for a manifest whose SHA-256 is {body_digest}",
            "retry; do not pin this",
        )
    return digest
