"""Model weights in the Hugging Face cache before the server's clock starts.

`make fetch` (`python -m launch fetch`) runs this module inside the profile's image, in compose's
`fetch` service, so the weights land in the cache volume the server reads and are fetched by the
image's own huggingface_hub:

    python -m launch.weights download model=ORG/NAME@COMMIT [draft=ORG/NAME@COMMIT ...]
    python -m launch.weights check    model=ORG/NAME@COMMIT ...
    python -m launch.weights verify   model=ORG/NAME@COMMIT ...

`download` first compares the bytes still to fetch (the Hub's tree, less what the cache holds,
partial transfers included) with the space free on the cache's filesystem, and stops naming both
when they do not fit. Then it fetches each repository at its pinned revision (huggingface_hub's
progress bars; an interrupted transfer is resumed with a range request, files already complete
are kept, so running it again continues) and verifies every file against the Hub's tree at that
commit (sha256 for LFS files, the git blob id for the rest). A file that fails verification is
removed and fetched once more, alone; the verified files, their sizes and digests are recorded
beside the cache. `check` reads only that record and the sizes on disk (no network): it is what
`make up` asks before starting. `verify` (`make fetch CHECK=1`) also hashes every file against
the digests recorded, so a changed byte is found and named (no network).

Exit status: 0 done, 1 a download or verification failed or (check) weights are missing, 2 the
Hub refused the repository or revision (the message names the profile field and the fix).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launch.errors import USAGE_EXIT, UsageError

if TYPE_CHECKING:
    from launch.profile import Profile

MISSING_EXIT = 1
NOT_FETCHED = "not fetched: "
"""How `check` starts each line it reports missing (what `launch up` reads back)."""
RECORD_DIR = "kit-verified"
"""Under HF_HOME, beside huggingface_hub's `hub/` cache: one JSON record per verified revision."""


@dataclass(frozen=True)
class WeightRepo:
    """One Hub repository a profile serves from, at its pinned revision."""

    role: str
    """`model` (the served model) or `draft` (the speculative model)."""
    repo_id: str
    revision: str

    @property
    def spec(self) -> str:
        return f"{self.role}={self.repo_id}@{self.revision}"

    @property
    def fields(self) -> tuple[str, str, str]:
        """The profile fields that name it, and the variable that overrides its revision."""
        if self.role == "draft":
            return (
                "engine.speculative_config.model",
                "engine.speculative_config.revision",
                "DFLASH_MODEL_REVISION",
            )
        return ("engine.model", "engine.revision", "MODEL_REVISION")


ROLES = ("model", "draft")


def parse_spec(text: str) -> WeightRepo:
    role, sep, rest = text.partition("=")
    repo_id, at, revision = rest.rpartition("@")
    if not sep or role not in ROLES or not at or repo_id.count("/") != 1 or not revision:
        raise UsageError(
            "weights",
            text,
            "is not ROLE=ORG/NAME@REVISION with ROLE one of " + ", ".join(ROLES),
            "pass e.g. model=zai-org/GLM-5.3-Flash@<40-hex commit> (`make fetch` builds these)",
        )
    return WeightRepo(role, repo_id, revision)


def weight_repos(profile: Profile) -> list[WeightRepo]:
    """The Hub repositories a profile's server loads: the model and a separate draft model.
    A model given as a directory (the CPU image's) is in the image and is not fetched."""
    e = profile.engine
    repos = []
    if not e.model_is_local:
        repos.append(WeightRepo("model", e.model, e.revision or "main"))
    spec = e.speculative_config
    if spec is not None and spec.model is not None and not spec.model.startswith("/"):
        repos.append(WeightRepo("draft", spec.model, spec.revision or "main"))
    return repos


def repo_folder(repo: WeightRepo) -> str:
    """The repository's folder name in huggingface_hub's cache (the record mirrors it)."""
    return "models--" + repo.repo_id.replace("/", "--")


def record_path(hf_home: Path, repo: WeightRepo) -> Path:
    return hf_home / RECORD_DIR / repo_folder(repo) / f"{repo.revision.replace('/', '%2F')}.json"


def hf_home() -> Path:
    return Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")


def write_record(path: Path, record: dict[str, Any]) -> None:
    """The verification record, whole or not at all: written beside it, then renamed over it (a
    fetch interrupted mid-write, or a full disk, leaves the old record or none, never half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with partial.open("w", encoding="utf-8") as fh:
        fh.write(json.dumps(record, indent=1) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(partial, path)


def read_record(path: Path) -> dict[str, Any] | None:
    """A verification record, or None when it is not one (cut short, not JSON, wrong shape): an
    unreadable record never counts as verified."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(record, dict) or not isinstance(record.get("snapshot"), str) or not (
        isinstance(files, dict) and all(isinstance(v, int) for v in files.values())
    ):
        return None
    digests = record.get("digests", {})
    if not isinstance(digests, dict) or not all(
        isinstance(v, str) and v.split(":", 1)[0] in (SHA256, GIT_BLOB) for v in digests.values()
    ):
        return None
    return record


def file_digest(path: Path, algorithm: str) -> str:
    """The Hub's digest of a file: sha256 of the bytes (LFS files), or the git blob id."""
    digest = hashlib.sha256() if algorithm == SHA256 else hashlib.sha1()
    if algorithm != SHA256:
        digest.update(b"blob %d\0" % path.stat().st_size)
    with path.open("rb") as fh:
        while chunk := fh.read(DIGEST_CHUNK):
            digest.update(chunk)
    return f"{algorithm}:{digest.hexdigest()}"


DIGEST_CHUNK = 8 * 2**20
SHA256 = "sha256"
GIT_BLOB = "git-sha1"


@dataclass(frozen=True)
class HubFile:
    """One file of the Hub's tree at a revision: its size and the digest the Hub states."""

    size: int
    algorithm: str
    hexdigest: str
    """The Hub's name for the bytes: the blob's file name in huggingface_hub's cache."""

    @property
    def digest(self) -> str:
        return f"{self.algorithm}:{self.hexdigest}"


def hub_tree(repo: WeightRepo) -> dict[str, HubFile]:
    """The files of `repo` at its revision, as the Hub's tree lists them."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    tree = HfApi().list_repo_tree(repo.repo_id, revision=repo.revision, recursive=True)
    return {
        f.path: HubFile(f.size, SHA256, f.lfs.sha256) if f.lfs is not None
        else HubFile(f.size, GIT_BLOB, f.blob_id)
        for f in tree if isinstance(f, RepoFile)
    }  # fmt: skip


def bytes_to_fetch(tree: dict[str, HubFile], blobs: Path) -> int:
    """What a download still has to write: each file's size less what huggingface_hub's cache
    holds of it (a complete blob, named by the Hub's digest, or a partial `.incomplete` one)."""
    needed = 0
    for f in tree.values():
        blob = blobs / f.hexdigest
        if blob.is_file():
            continue
        partial = blob.with_name(blob.name + ".incomplete")
        needed += f.size - (partial.stat().st_size if partial.is_file() else 0)
    return needed


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem that holds `path` (or would: its nearest existing parent)."""
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def too_big(repo: WeightRepo, needed: int, free: int, cache: Path) -> str | None:
    """None when `needed` bytes fit in `free`; else what to do, naming both."""
    if needed <= free:
        return None
    return (f"{repo.repo_id}@{repo.revision} needs {needed:,} bytes more ({needed / 2**30:.2f} "
            f"GiB) in {cache}, which has {free:,} bytes free ({free / 2**30:.2f} GiB): free space "
            "on the weights volume or give it a larger one (HF_CACHE_VOLUME), then run `make "
            "fetch` again; nothing was downloaded")  # fmt: skip


def changed_files(record: dict[str, Any]) -> list[str]:
    """Files of a record whose bytes no longer have the digest recorded at verification (all
    files are hashed: the whole repository is read)."""
    snapshot = Path(record["snapshot"])
    digests = record.get("digests") or {}
    return [name for name, digest in digests.items()
            if file_digest(snapshot / name, digest.split(":", 1)[0]) != digest]  # fmt: skip


def check(repo: WeightRepo, home: Path, *, deep: bool = False) -> str | None:
    """None if `repo` was verified and every verified file is still there at its size (and,
    `deep`, has the digest recorded at verification); else what is missing or changed. Reads
    the disk only."""
    path = record_path(home, repo)
    if not path.is_file():
        return f"{repo.repo_id}@{repo.revision} has not been fetched into {home}"
    record = read_record(path)
    if record is None:
        return (f"{repo.repo_id}@{repo.revision}: its verification record {path} is unreadable "
                "(a fetch was interrupted while writing it); it is fetched and verified again")
    snapshot = Path(record["snapshot"])
    for name, size in record["files"].items():
        file = snapshot / name
        if not file.is_file() or file.stat().st_size != size:
            return (
                f"{repo.repo_id}@{repo.revision}: {name} is missing or changed since it was "
                "verified"
            )
    if deep:
        if not record.get("digests"):
            return (f"{repo.repo_id}@{repo.revision}: its record {path} has no digests (an older "
                    "kit verified it); `make fetch` verifies it again and records them")
        changed = changed_files(record)
        if changed:
            return (f"{repo.repo_id}@{repo.revision}: {', '.join(changed)} changed since it was "
                    "verified (its digest differs from the Hub's); `make fetch` fetches "
                    f"{'it' if len(changed) == 1 else 'them'} again, alone")  # fmt: skip
    return None


def _hub_refusal(repo: WeightRepo, err: Exception) -> UsageError | None:
    """The Hub's refusals that the profile (or the token) can fix, as the kit's usage error."""
    from huggingface_hub.errors import (
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    model_field, revision_field, revision_var = repo.fields
    if isinstance(err, RevisionNotFoundError):
        return UsageError(
            revision_field, repo.revision, f"the Hub has no such revision in {repo.repo_id}",
            f"set {revision_var} to a commit of {repo.repo_id} (its history on the Hub)",
        )  # fmt: skip
    if isinstance(err, GatedRepoError):
        return UsageError(
            model_field, repo.repo_id, "is gated on the Hub and this token has no access",
            "accept the model's terms on the Hub, then write the token to compose/secrets/hf_token",
        )  # fmt: skip
    if isinstance(err, RepositoryNotFoundError):
        return UsageError(
            model_field, repo.repo_id, "is not a repository the Hub shows to this token",
            "check the name, or write a token to compose/secrets/hf_token for a private repository",
        )  # fmt: skip
    return None


FETCH_ATTEMPTS = 2
"""A file that fails verification is removed and fetched once more, alone, in the same run."""


def download(repo: WeightRepo, home: Path) -> list[str]:
    """Fetch `repo` into the cache under `home`, verify it, record it; the problems found (empty
    when verified)."""
    from huggingface_hub import HfApi, snapshot_download

    cache = home / "hub"
    folder = cache / repo_folder(repo)
    problems: list[str] = []
    try:
        tree = hub_tree(repo)
        needed, free = bytes_to_fetch(tree, folder / "blobs"), free_bytes(cache)
        if (refused := too_big(repo, needed, free, cache)) is not None:
            return [refused]
        print(f"{repo.role} {repo.repo_id}@{repo.revision}: downloading {needed:,} bytes into "
              f"{cache} ({free:,} free)", flush=True)  # fmt: skip
        for _ in range(FETCH_ATTEMPTS):
            snapshot = Path(snapshot_download(repo.repo_id, revision=repo.revision,
                                              cache_dir=cache))  # fmt: skip
            commit = snapshot.name
            print(f"{repo.role} {repo.repo_id}: verifying commit {commit} against the Hub",
                  flush=True)  # fmt: skip
            result = HfApi().verify_repo_checksums(repo.repo_id, revision=commit, cache_dir=cache)
            problems = [f"{repo.repo_id}: {name} is missing" for name in result.missing_paths]
            for bad in result.mismatches:
                (snapshot / bad["path"]).resolve().unlink(missing_ok=True)
                (snapshot / bad["path"]).unlink(missing_ok=True)
                problems.append(
                    f"{repo.repo_id}: {bad['path']} has {bad['algorithm']} {bad['actual']}, the "
                    f"Hub says {bad['expected']} (removed; it is fetched again next run)"
                )
            if not problems:
                break
            print(f"{repo.role} {repo.repo_id}: {len(problems)} file(s) failed verification "
                  "and were removed", flush=True)  # fmt: skip
    except Exception as err:
        refusal = _hub_refusal(repo, err)
        if refusal is not None:
            raise refusal from err
        return [f"{repo.repo_id}@{repo.revision}: {type(err).__name__}: {err}"]
    if problems:
        return problems
    files = {
        name: (snapshot / name).stat().st_size
        for name in sorted(_tree_files(snapshot))
    }
    digests = {name: tree[name].digest for name in files if name in tree}
    record = {"repo_id": repo.repo_id, "revision": repo.revision, "commit": commit,
              "snapshot": str(snapshot), "files": files, "digests": digests}  # fmt: skip
    write_record(record_path(home, repo), record)
    total = sum(files.values())
    print(f"{repo.role} {repo.repo_id}@{commit}: {len(files)} files, {total / 2**30:.2f} GiB "
          f"verified (sha256 / git blob id against the Hub)", flush=True)  # fmt: skip
    return []


def _tree_files(snapshot: Path) -> list[str]:
    return [p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m launch.weights",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("action", choices=("download", "check", "verify"))
    parser.add_argument("repos", nargs="+", metavar="ROLE=ORG/NAME@REVISION")
    args = parser.parse_args(argv)
    home = hf_home()
    try:
        repos = [parse_spec(text) for text in args.repos]
        if args.action in ("check", "verify"):
            missing = [m for m in (check(r, home, deep=args.action == "verify") for r in repos)
                       if m is not None]  # fmt: skip
            for line in missing:
                print(f"{NOT_FETCHED}{line}", flush=True)
            if not missing:
                print(f"fetched and verified: {', '.join(r.repo_id for r in repos)}", flush=True)
            return MISSING_EXIT if missing else 0
        problems = [p for r in repos for p in download(r, home)]
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return USAGE_EXIT
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    if problems:
        print("error: run `make fetch` again: verified files are kept, the rest is fetched again",
              file=sys.stderr)  # fmt: skip
    return MISSING_EXIT if problems else 0


if __name__ == "__main__":
    sys.exit(main())
