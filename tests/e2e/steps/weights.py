"""`make fetch` on the real engine: the image's own huggingface_hub downloads into the weights
volume from a stand-in Hub on this host (the Hub is not reachable here; tests/hub_standin.py),
at the container network's gateway address, and verifies. Then into a volume too small for the
files (a size-limited tmpfs volume made here): the fetch stops naming the bytes needed and free
and counts nothing as verified; after room is made it completes; a byte flipped in the volume is
found by `make fetch CHECK=1` and that file alone is fetched again."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from launch.docker_api import bridge_address, connect
from tests.e2e.harness import HF_CACHE_VOLUME, PROFILE, Run, Step, StepFailed
from tests.e2e.steps.images import PIN
from tests.hub_standin import HubRepo, HubStandin

HUB_REPO = "kit-e2e/tiny-weights"
HUB_COMMIT = "5d1f0c8a2b7e4f9061c3d2a8b5e7f1029384abcd"
FILES = {"config.json": b'{"model_type": "llama"}\n',
         "model.safetensors": bytes(range(256)) * 48_000}  # fmt: skip
SMALL_VOLUME = "glm53-e2e-small-hf"
HOLDER = "glm53-e2e-small-hf-holder"
"""A container that keeps the small tmpfs volume mounted for the whole step: Docker mounts a
tmpfs volume afresh (empty) for a container that finds it unmounted, and the fetch service's
containers come and go."""
SMALL_SIZE = 16 * 2**20
FILLER = 8 * 2**20
"""The small volume: 16 MiB of tmpfs, 8 MiB of it taken by a file, leaves less than the
12,288,024 bytes the repository needs."""


@contextmanager
def hub() -> Iterator[tuple[HubStandin, dict[str, str]]]:
    """The stand-in Hub serving the e2e repository, and the environment that points compose's
    fetch service at it."""
    standin = HubStandin({HUB_REPO: HubRepo(HUB_REPO, HUB_COMMIT, FILES)})
    server, url = standin.serve(host="0.0.0.0")
    gateway = bridge_address(connect("start dockerd (tests/e2e/services.py start)"))
    try:
        yield standin, {"HF_ENDPOINT": f"http://{gateway}:{url.rsplit(':', 1)[1]}"}
    finally:
        server.shutdown()


def fetch_argv(*extra: str) -> list[str]:
    """`launch fetch` of the e2e repository, what `make fetch [CHECK=1]` runs."""
    sets = ["--set", f"engine.model={HUB_REPO}", "--set", f"engine.revision={HUB_COMMIT}"]
    return [sys.executable, "-m", "launch", "fetch", PROFILE, *sets, *extra]


def fetch(run: Run) -> str:
    with hub() as (standin, env):
        before = run.sh(fetch_argv("--check"), env=env, check=False)
        if before.returncode != 1 or "has not been fetched" not in before.stdout:
            raise StepFailed(f"check before fetching: exit {before.returncode}, {before.stdout!r}")
        done = run.sh(fetch_argv(), env=env, timeout=600)
        if f"{HUB_REPO}@{HUB_COMMIT}: 2 files" not in done.stdout:
            raise StepFailed(f"no verification line: {done.stdout[-300:]!r}")
        after = run.sh(fetch_argv("--check"), env=env)
        again = run.sh(fetch_argv(), env=env, timeout=600)
    gets = len(standin.gets("model.safetensors"))
    if gets != 1:
        raise StepFailed(f"model.safetensors fetched {gets} times; a second run must reuse it")
    return (f"downloaded into volume {HF_CACHE_VOLUME} and verified; check before: not fetched, "
            f"after: {after.stdout.strip().splitlines()[-1][:80]}; a second run "
            f"{'downloads nothing' if again.returncode == 0 else 'failed'}")  # fmt: skip


def in_volume(run: Run, code: str) -> str:
    """Python `code` run in the holder (the pinned CPU image with the small volume at /hf, as
    the fetch service mounts it, and as its user)."""
    return run.sh(["docker", "exec", HOLDER, "python3", "-c", code]).stdout


FLIP = f"""
import pathlib
blob = next(pathlib.Path('/hf/hub').glob('models--*/snapshots/{HUB_COMMIT}/model.safetensors'))
blob = blob.resolve()
data = bytearray(blob.read_bytes())
data[1_000_000] ^= 1
blob.write_bytes(bytes(data))
print(blob)
"""


def full_disk(run: Run) -> str:
    run.sh(["docker", "volume", "create", "--driver", "local", "--opt", "type=tmpfs", "--opt",
            "device=tmpfs", "--opt", f"o=size={SMALL_SIZE},uid=1000,gid=1000",
            SMALL_VOLUME])  # fmt: skip
    small = {"HF_CACHE_VOLUME": SMALL_VOLUME}
    needed = sum(len(data) for data in FILES.values())
    try:
        run.sh(["docker", "run", "--detach", "--rm", "--name", HOLDER, "--volume",
                f"{SMALL_VOLUME}:/hf", "--entrypoint", "sleep", run.lock["CPU_IMAGE"],
                "infinity"])  # fmt: skip
        in_volume(run, f"open('/hf/filler', 'wb').write(bytes({FILLER}))")
        with hub() as (standin, env):
            env = {**env, **small}
            full = run.sh(fetch_argv(), env=env, check=False, timeout=600)
            said = full.stdout + full.stderr
            if full.returncode != 1 or f"needs {needed:,} bytes more" not in said:
                raise StepFailed(f"a fetch into a full volume: exit {full.returncode}, "
                                 f"{said[-300:]!r}")  # fmt: skip
            refusal = next(line for line in said.splitlines() if "bytes more" in line)
            if standin.gets("model.safetensors"):
                raise StepFailed("the refused fetch downloaded model.safetensors anyway")
            unverified = run.sh(fetch_argv("--check"), env=env, check=False)
            if unverified.returncode != 1 or "has not been fetched" not in unverified.stdout:
                raise StepFailed(f"after the refusal, CHECK=1 said: {unverified.stdout!r}")
            in_volume(run, "import os; os.remove('/hf/filler')")
            run.sh(fetch_argv(), env=env, timeout=600)
            flipped = in_volume(run, FLIP).strip()
            found = run.sh(fetch_argv("--check"), env=env, check=False)
            if found.returncode != 1 or "model.safetensors changed" not in found.stdout:
                raise StepFailed(f"CHECK=1 after a flipped byte: exit {found.returncode}, "
                                 f"{found.stdout!r}")  # fmt: skip
            run.sh(fetch_argv(), env=env, timeout=600)
            run.sh(fetch_argv("--check"), env=env)
        gets = {name: len(standin.gets(name)) for name in FILES}
        if gets != {"config.json": 1, "model.safetensors": 2}:
            raise StepFailed(f"files fetched {gets}: the flipped file alone must be fetched again")
    finally:
        run.sh(["docker", "rm", "--force", HOLDER], check=False)
        run.sh(["docker", "volume", "rm", "--force", SMALL_VOLUME], check=False)
    return (f"{SMALL_SIZE // 2**20} MiB volume with {FILLER // 2**20} MiB taken: "
            f"{refusal.strip()[:170]}...; CHECK=1: not fetched; after room was made: fetched; a "
            f"byte flipped in {flipped.rsplit('/', 1)[-1][:12]}... found by CHECK=1, then fetched "
            f"again alone (GETs {gets})")


FETCH = Step("make fetch: weights into the cache volume, verified", fetch, (PIN,))
FULL_DISK = Step("make fetch into a full volume, then a flipped byte", full_disk, (PIN,))
