"""The e2e lane's `Beside`: steps run in a thread next to the main lane, pinning into their own
copy of the lock; the join carries over what the lane pinned and nothing else. (A first version
copied back every key that differed, which wrote the lane's stale empty CPU_IMAGE over the main
lane's pin, and `make configure` then found no digest.)"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

from launch.image_lock import LOCK_VAR, read_lock, write_lock
from tests.e2e.harness import Beside, Run, Step


def test_the_join_keeps_both_lanes_pins(tmp_path, hermetic_settings):
    lock = tmp_path / "images.lock"
    shutil.copy(hermetic_settings / "images.lock", lock)
    run = Run(tmp_path, {LOCK_VAR: str(lock)})
    main_pinned = threading.Event()

    def beside_pin(r: Run) -> str:
        main_pinned.wait(10)  # the main lane pins first, while this lane runs
        write_lock({"KIT_IMAGE": "sha256:" + "1" * 64}, lock_of(r))
        return "pinned KIT_IMAGE"

    def main_pin(r: Run) -> str:
        write_lock({"CPU_IMAGE": "registry.example/cpu@sha256:" + "2" * 64}, lock_of(r))
        main_pinned.set()
        return "pinned CPU_IMAGE"

    pin_beside = Step("beside", beside_pin)
    lane = Beside((pin_beside,))
    run.step(Step("start", lane.start))
    run.step(Step("main", main_pin))
    run.step(Step("join", lane.join))
    assert all(ok for ok, _, _ in run.results.values()), run.results
    pins = read_lock(lock)
    assert pins["CPU_IMAGE"] == "registry.example/cpu@sha256:" + "2" * 64
    assert pins["KIT_IMAGE"] == "sha256:" + "1" * 64
    assert run.results["join"][1].endswith("pinned KIT_IMAGE")


def lock_of(run: Run) -> Path:
    return Path(run.env[LOCK_VAR])
