"""Model weights in the Hugging Face cache before the server's clock starts.

`make fetch` (`python -m launch fetch`) runs this module inside the profile's image, in compose's
`fetch` service, so the weights land in the cache volume the server reads and are fetched by the
image's own huggingface_hub:

    python -m launch.weights download model=ORG/NAME@COMMIT [draft=ORG/NAME@COMMIT ...]
    python -m launch.weights check    model=ORG/NAME@COMMIT ...

`download` fetches each repository at its pinned revision (huggingface_hub's progress bars; an
interrupted transfer is resumed with a range request, files already complete are kept, so running
it again continues), then verifies every file against the Hub's tree at that commit (sha256 for
LFS files, the git blob id for the rest) and records the verified file list beside the cache. A
file that fails verification is removed so the next run fetches it again. `check` reads only that
record and the files on disk (no network): it is what `make up` asks before starting.

Exit status: 0 done, 1 a download or verification failed or (check) weights are missing, 2 the
Hub refused the repository or revision (the message names the profile field and the fix).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from launch.errors import USAGE_EXIT, ProfileError

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
        raise ProfileError(
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


def record_path(hf_home: Path, repo: WeightRepo) -> Path:
    folder = "models--" + repo.repo_id.replace("/", "--")
    return hf_home / RECORD_DIR / folder / f"{repo.revision.replace('/', '%2F')}.json"


def hf_home() -> Path:
    return Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")


def check(repo: WeightRepo, home: Path) -> str | None:
    """None if `repo` was verified and every verified file is still there at its size; else
    what is missing. Reads the disk only."""
    path = record_path(home, repo)
    if not path.is_file():
        return f"{repo.repo_id}@{repo.revision} has not been fetched into {home}"
    record = json.loads(path.read_text(encoding="utf-8"))
    snapshot = Path(record["snapshot"])
    for name, size in record["files"].items():
        file = snapshot / name
        if not file.is_file() or file.stat().st_size != size:
            return (
                f"{repo.repo_id}@{repo.revision}: {name} is missing or changed since it was "
                "verified"
            )
    return None


def _hub_refusal(repo: WeightRepo, err: Exception) -> ProfileError | None:
    """The Hub's refusals that the profile (or the token) can fix, as the kit's usage error."""
    from huggingface_hub.errors import (
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    model_field, revision_field, revision_var = repo.fields
    if isinstance(err, RevisionNotFoundError):
        return ProfileError(
            revision_field, repo.revision, f"the Hub has no such revision in {repo.repo_id}",
            f"set {revision_var} to a commit of {repo.repo_id} (its history on the Hub)",
        )  # fmt: skip
    if isinstance(err, GatedRepoError):
        return ProfileError(
            model_field, repo.repo_id, "is gated on the Hub and this token has no access",
            "accept the model's terms on the Hub, then set HF_TOKEN in compose/.env",
        )  # fmt: skip
    if isinstance(err, RepositoryNotFoundError):
        return ProfileError(
            model_field, repo.repo_id, "is not a repository the Hub shows to this token",
            "check the name, or set HF_TOKEN in compose/.env for a private repository",
        )  # fmt: skip
    return None


def download(repo: WeightRepo, home: Path) -> list[str]:
    """Fetch `repo` into the cache under `home`, verify it, record it; the problems found (empty
    when verified)."""
    from huggingface_hub import HfApi, snapshot_download

    cache = home / "hub"
    print(f"{repo.role} {repo.repo_id}@{repo.revision}: downloading into {cache}", flush=True)
    try:
        snapshot = Path(snapshot_download(repo.repo_id, revision=repo.revision, cache_dir=cache))
        commit = snapshot.name
        print(f"{repo.role} {repo.repo_id}: verifying commit {commit} against the Hub", flush=True)
        result = HfApi().verify_repo_checksums(repo.repo_id, revision=commit, cache_dir=cache)
    except Exception as err:
        refusal = _hub_refusal(repo, err)
        if refusal is not None:
            raise refusal from err
        return [f"{repo.repo_id}@{repo.revision}: {type(err).__name__}: {err}"]
    problems = [f"{repo.repo_id}: {name} is missing" for name in result.missing_paths]
    for bad in result.mismatches:
        (snapshot / bad["path"]).resolve().unlink(missing_ok=True)
        (snapshot / bad["path"]).unlink(missing_ok=True)
        problems.append(
            f"{repo.repo_id}: {bad['path']} has {bad['algorithm']} {bad['actual']}, the Hub says "
            f"{bad['expected']} (removed; it is fetched again next run)"
        )
    if problems:
        return problems
    files = {
        name: (snapshot / name).stat().st_size
        for name in sorted(_tree_files(snapshot))
    }
    path = record_path(home, repo)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"repo_id": repo.repo_id, "revision": repo.revision, "commit": commit,
              "snapshot": str(snapshot), "files": files}  # fmt: skip
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
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
    parser.add_argument("action", choices=("download", "check"))
    parser.add_argument("repos", nargs="+", metavar="ROLE=ORG/NAME@REVISION")
    args = parser.parse_args(argv)
    home = hf_home()
    try:
        repos = [parse_spec(text) for text in args.repos]
        if args.action == "check":
            missing = [m for m in (check(r, home) for r in repos) if m is not None]
            for line in missing:
                print(f"{NOT_FETCHED}{line}", flush=True)
            if not missing:
                print(f"fetched and verified: {', '.join(r.repo_id for r in repos)}", flush=True)
            return MISSING_EXIT if missing else 0
        problems = [p for r in repos for p in download(r, home)]
    except ProfileError as err:
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
