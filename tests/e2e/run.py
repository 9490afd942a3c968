"""`make e2e`: the whole user path on a real Docker engine and a real vLLM engine, no GPU.

Each step runs what a user types (make targets, plain `docker compose` in compose/) against the
kit's CPU image and profile `cpu-tiny`, and prints one line; the run ends with
`N passed, M failed` and exits 1 if any step failed. A step whose prerequisite failed is counted
as failed, not skipped. What it needs: a Docker engine with the compose plugin, `mmdebstrap`, and
a registry on 127.0.0.1 (`E2E_REGISTRY`, default 127.0.0.1:5000); `.ci/run` starts the engine and
the registry (tests/e2e/services.py). The steps live in tests/e2e/steps/, the harness they share
in tests/e2e/harness.py; this file is their order.

It pins into a copy of compose/images.lock (KIT_IMAGES_LOCK), so the tracked lock is never
rewritten, and moves an existing compose/.env aside for the run and puts it back afterwards.
Everything it starts is stopped at the end (`docker compose down --volumes`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from launch.compose_env import ENV_FILE_VAR
from launch.image_lock import COMPOSE_DIR, LOCK_VAR
from launch.kit_cache import CACHE_VAR
from launch.settings import SECRETS_DIR
from tests.e2e.harness import ENV_PATH, HF_CACHE_VOLUME, Beside, Run, Step
from tests.e2e.steps import (
    access,
    bench,
    capacity,
    clients,
    demo,
    faults,
    images,
    monitoring,
    recorded,
    restart,
    serving,
    soak,
    weights,
)

BESIDE = Beside((monitoring.PROMETHEUS_IMAGE, recorded.SPECULATION, images.CUDA_BASE,
                 images.CUDA_BUILD, images.CUDA_LAYERS, images.CUDA_SELFCHECK,
                 images.CUDA_PIN))  # fmt: skip
"""The image builds that run beside `make demo` (harness.Beside)."""
BESIDE_START = Step("the Prometheus and CUDA images start building beside make demo",
                    BESIDE.start, (images.ENGINE,))  # fmt: skip
BESIDE_JOIN = Step("the images built beside are done", BESIDE.join, (BESIDE_START,))

STEPS: tuple[Step, ...] = (
    images.ENGINE,
    BESIDE_START,
    demo.DEMO,
    demo.AGAIN,
    demo.ANSWERS,
    images.CPU_LAYERS,
    images.PUSH,
    images.PIN,
    images.REMOVE_LOCAL,
    BESIDE_JOIN,
    serving.COMPOSE_UP,
    serving.HEALTHY,
    serving.NON_ROOT,
    serving.PRIVATE_SHM,
    serving.SMOKE,
    capacity.PREDICTED,
    bench.BENCH,
    bench.PLOTS,
    restart.CRASH,
    weights.FETCH,
    weights.FULL_DISK,
    serving.REPLICAS,
    faults.KILLED_MID_CHECK,
    faults.PREFIX_OFF,
    faults.KV_DOES_NOT_FIT,
    capacity.REFUSED,
    capacity.UP_REFUSED,
    access.EVERY_ROUTE,
    clients.VANISHED,
    soak.SOAK,
    monitoring.SCRAPED,
    monitoring.TOP,
    faults.DOWN,
    monitoring.DATA_KEPT,
    images.CUDA_COMPOSE,
    capacity.CUDA_CAPACITY,
    images.REMOVE_IMAGES,
)


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="kit-e2e-"))
    lock = work / "images.lock"
    shutil.copy2(COMPOSE_DIR / "images.lock", lock)
    env = {**os.environ, LOCK_VAR: str(lock), "HF_CACHE_VOLUME": HF_CACHE_VOLUME,
           CACHE_VAR: str(work / "cache")}
    for name in ("IMAGE", "PROFILE", "COMPOSE_FILE", ENV_FILE_VAR):
        env.pop(name, None)
    saved_env = work / "user.env"
    if ENV_PATH.exists():
        shutil.move(ENV_PATH, saved_env)
    secrets_before = SECRETS_DIR.exists()  # `make configure` creates it; a user's stays
    run = Run(work, env)
    print(f"e2e work directory {work}", flush=True)
    try:
        for step in STEPS:
            run.step(step)
    finally:
        if ENV_PATH.exists():
            subprocess.run(["docker", "compose", "down", "--volumes", "--timeout", "5"],
                           cwd=COMPOSE_DIR, env=env, capture_output=True, check=False)
            ENV_PATH.unlink()
        (COMPOSE_DIR / "replicas.generated.yaml").unlink(missing_ok=True)
        if not secrets_before and SECRETS_DIR.exists():
            shutil.rmtree(SECRETS_DIR)
        if saved_env.exists():
            shutil.move(saved_env, ENV_PATH)
    passed = sum(ok for ok, _, _ in run.results.values())
    print(f"e2e: {passed} passed, {len(run.results) - passed} failed")
    return 0 if passed == len(run.results) else 1


if __name__ == "__main__":
    sys.exit(main())
