"""A stand-in for the Hugging Face Hub's download API, for `make fetch` tests.

A stand-in because the Hub is not reachable from these machines. It serves the part of the Hub's
HTTP API that huggingface_hub 2.4's `snapshot_download` and `verify_repo_checksums` call, with the
Hub's own headers: `/api/models/{repo}/revision/{rev}`, `/api/models/{repo}/tree/{rev}`, and
HEAD/GET `/{repo}/resolve/{rev}/{path}` (`X-Repo-Commit`, `ETag` = git blob id, or
`X-Linked-Etag` = sha256 and `X-Linked-Size` for LFS files; `Range` answered with 206), and the
Hub's `X-Error-Code` refusals (RepoNotFound, RevisionNotFound, GatedRepo, EntryNotFound).

Faults, each what a real transfer does to a download: `cut_once[path] = n` sends n bytes of the
first GET of `path` and drops the connection; `broken` paths answer 500; `corrupt` paths serve
bytes other than the ones the tree's hash was taken of. Every request is logged.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf")


def flipped(data: bytes) -> bytes:
    """The same length, every bit inverted: what `corrupt` serves."""
    return data.translate(bytes(255 - i for i in range(256)))


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class HubRepo:
    repo_id: str
    commit: str
    files: dict[str, bytes]
    gated: bool = False

    def is_lfs(self, path: str) -> bool:
        return path.endswith(LFS_SUFFIXES)

    def tree(self) -> list[dict]:
        out = []
        for path, data in sorted(self.files.items()):
            entry: dict = {"type": "file", "path": path, "size": len(data),
                           "oid": git_blob_id(data)}  # fmt: skip
            if self.is_lfs(path):
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                                "pointerSize": 134}  # fmt: skip
            out.append(entry)
        return out


@dataclass
class HubStandin:
    repos: dict[str, HubRepo]
    cut_once: dict[str, int] = field(default_factory=dict)
    broken: set[str] = field(default_factory=set)
    corrupt: set[str] = field(default_factory=set)
    log: list[tuple[str, str, str]] = field(default_factory=list)
    """(method, path, Range header or '') of every request."""

    def gets(self, name: str) -> list[str]:
        """The Range headers of the GETs of file `name` ('' for a whole-file GET)."""
        wanted = re.compile(r"/[^/]+/[^/]+/resolve/[^/]+/" + re.escape(name))
        return [r for m, p, r in self.log if m == "GET" and wanted.fullmatch(p)]

    def serve(self, host: str = "127.0.0.1") -> tuple[ThreadingHTTPServer, str]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                hub.handle(self, head=True)

            def do_GET(self) -> None:
                hub.handle(self, head=False)

        server = ThreadingHTTPServer((host, 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server, f"http://{host}:{server.server_address[1]}"

    # -- request handling ------------------------------------------------------------------

    def handle(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        url = urlparse(h.path)
        path = unquote(url.path)
        self.log.append(("HEAD" if head else "GET", path, h.headers.get("Range", "")))
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", path):
            repo = self._repo(h, m[1], m[2])
            if repo:
                body = {"id": repo.repo_id, "sha": repo.commit,
                        "siblings": [{"rfilename": p} for p in sorted(repo.files)]}  # fmt: skip
                self._json(h, body, repo)
        elif m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)", path):
            repo = self._repo(h, m[1], m[2])
            if repo:
                self._json(h, repo.tree(), repo)
        elif m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
            repo = self._repo(h, m[1], m[2])
            if repo:
                self._file(h, repo, m[3], head)
        else:
            self._error(h, 404, "", "not a Hub route")

    def _repo(self, h: BaseHTTPRequestHandler, repo_id: str, revision: str) -> HubRepo | None:
        repo = self.repos.get(repo_id)
        if repo is None:
            self._error(h, 404, "RepoNotFound", f"Repository {repo_id} not found")
        elif repo.gated and "authorization" not in {k.lower() for k in h.headers}:
            self._error(h, 401, "GatedRepo", f"Access to model {repo_id} is restricted")
        elif revision not in (repo.commit, "main"):
            self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {revision}")
        else:
            return repo
        return None

    def _file(self, h: BaseHTTPRequestHandler, repo: HubRepo, name: str, head: bool) -> None:
        data = repo.files.get(name)
        if data is None:
            self._error(h, 404, "EntryNotFound", f"{name} does not exist", repo)
            return
        if name in self.broken and not head:
            self._error(h, 500, "", "Internal Error", repo)
            return
        served = flipped(data) if name in self.corrupt else data
        start = 0
        if m := re.fullmatch(r"bytes=(\d+)-", h.headers.get("Range", "")):
            start = int(m[1])
        h.send_response(206 if start else 200)
        h.send_header("X-Repo-Commit", repo.commit)
        if repo.is_lfs(name):
            h.send_header("X-Linked-Etag", f'"{hashlib.sha256(data).hexdigest()}"')
            h.send_header("X-Linked-Size", str(len(data)))
            h.send_header("ETag", f'"{git_blob_id(data)}"')
        else:
            h.send_header("ETag", f'"{git_blob_id(data)}"')
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.send_header("Content-Length", str(len(data) - start))
        h.send_header("Accept-Ranges", "bytes")
        h.end_headers()
        if head:
            return
        body = served[start:]
        cut = self.cut_once.pop(name, None)
        if cut is not None:
            h.wfile.write(body[:cut])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(2)
            return
        h.wfile.write(body)

    def _json(self, h: BaseHTTPRequestHandler, body: object, repo: HubRepo) -> None:
        raw = json.dumps(body).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(raw)))
        h.send_header("X-Repo-Commit", repo.commit)
        h.end_headers()
        h.wfile.write(raw)

    def _error(self, h: BaseHTTPRequestHandler, status: int, code: str, message: str,
               repo: HubRepo | None = None) -> None:  # fmt: skip
        raw = json.dumps({"error": message}).encode()
        h.send_response(status)
        if code:
            h.send_header("X-Error-Code", code)
            h.send_header("X-Error-Message", message)
        if repo is not None:
            h.send_header("X-Repo-Commit", repo.commit)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(raw)))
        h.end_headers()
        h.wfile.write(raw)

