"""The image lanes: for the CUDA image, a Debian base from Debian's packages, pinned, and the
image built from the Dockerfile (the CPU image's are `make demo`'s, tests/e2e/steps/demo.py);
for both, no build input left in any layer. Then, for the CPU image, the registry path (push,
`make pin`, every local copy removed so compose must pull by digest), and for the CUDA image,
its self-check without a GPU, `make pin LOCAL=1` and `docker compose config` of both GLM
profiles against it. The last step removes every image and
volume the run made."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import requests

from tests.e2e.harness import (
    REGISTRY,
    REPO,
    Run,
    Step,
    StepFailed,
    compose_down,
    image_present,
    make,
    volumes,
)
from tests.e2e.steps.demo import DEMO


@dataclass(frozen=True)
class ImageLane:
    engine: str
    """docker/build.py --engine: cpu or cuda."""
    debian: str
    base_source: str
    """`make pin SOURCE=` of the base."""
    base_key: str
    tag: str
    make_target: str
    build_timeout: float

    @property
    def base_tag(self) -> str:
        return f"{REGISTRY}/glm53/debian:{self.debian}"


CPU = ImageLane("cpu", "bookworm", "cpu-base", "CPU_BASE_IMAGE",
                f"{REGISTRY}/glm53/kit-cpu:e2e", "build-cpu", 1800)  # fmt: skip
CUDA = ImageLane("cuda", "trixie", "base", "BASE_IMAGE", "glm53-kit:e2e", "build", 2700)
CUDA_MAX_BYTES = 12_000_000_000
"""The CUDA image's uncompressed size must stay within 12 GB (an nvidia/cuda devel base alone
adds about 8 GB to the same environment)."""
GLM_PROFILES = ("mtp3-tp4-split", "dflash-tp4-dcp4")
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
"""Where the host's extra CAs are, which docker/build.py --trust-host-ca serves to a build."""
INPUT_MARKS = (".whl", "build-inputs", "usr/local/share/ca-certificates/")
"""Paths a per-build input would leave in a layer: a wheel, the old inputs directory, a trusted
extra certificate."""
DEBIAN_WHEELS = "usr/share/python-wheels/"
"""Debian's own pip and setuptools wheels (python3-pip-whl, for ensurepip): not build inputs."""


def engine(run: Run) -> str:
    run.state.volumes_before = volumes(run)
    server = run.sh(["docker", "version", "--format", "{{.Server.Version}}"]).stdout.strip()
    plugin = run.sh(["docker", "compose", "version", "--short"]).stdout.strip()
    requests.get(f"http://{REGISTRY}/v2/", timeout=5).raise_for_status()
    return f"Docker engine {server}, compose {plugin}, registry {REGISTRY}"


def base(lane: ImageLane, run: Run) -> str:
    run.sh([sys.executable, "docker/debian_base.py", "--engine", lane.engine, "--tag",
            lane.base_tag, "--push"], timeout=600)  # fmt: skip
    run.state.images[f"{lane.engine}-base"] = lane.base_tag
    make(run, "pin", f"IMAGE={lane.base_tag}", f"SOURCE={lane.base_source}")
    return f"{lane.base_key}={run.lock[lane.base_key]}"


def build(lane: ImageLane, run: Run) -> str:
    start = time.monotonic()
    make(run, lane.make_target, f"TAG={lane.tag}", "BUILD_ARGS=--trust-host-ca --allow-dirty",
         timeout=lane.build_timeout)  # fmt: skip
    secs = time.monotonic() - start
    inspect = run.sh(["docker", "image", "inspect", "--format",
                      "{{json .Config.Labels}} {{.Size}}", lane.tag]).stdout  # fmt: skip
    labels_json, size = inspect.rsplit(" ", 1)
    labels = json.loads(labels_json)
    run.state.images[lane.engine] = lane.tag
    summary = (f"{lane.tag} built in {secs:.0f} s, {int(size) / 1e9:.2f} GB uncompressed; "
               f"engine label {labels['io.glm53-kit.engine']}, source lock "
               f"{labels['io.glm53-kit.source-lock.sha256'][:12]}")  # fmt: skip
    if lane is CUDA and int(size) > CUDA_MAX_BYTES:
        raise StepFailed(f"{summary}: over {CUDA_MAX_BYTES / 1e9:.0f} GB")
    return summary


def host_ca_bodies() -> list[bytes]:
    """One base64 line of each of the host's extra CA certificates (what a test build trusts)."""
    bodies = []
    for crt in sorted(HOST_CA_DIR.glob("*.crt")):
        lines = crt.read_bytes().splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith(b"-----BEGIN"))
        bodies.append(lines[start + 2])  # past the first line, which every RSA key shares
    return bodies


def layer_entries(fileobj: IO[bytes] | None) -> Iterator[tuple[tarfile.TarFile, tarfile.TarInfo]]:
    """The entries of one layer tar as it streams; nothing for a blob that is not a tar."""
    try:
        with tarfile.open(fileobj=fileobj, mode="r|*") as layer:
            for entry in layer:
                yield layer, entry
    except tarfile.ReadError:
        return


def overlay_layer_dirs(tag: str) -> list[Path] | None:
    """The image's layers as the engine stores them, when it stores them as overlay2 directories
    this process can read (root on the CI machine); None otherwise."""
    out = subprocess.run(["docker", "image", "inspect", "--format", "{{json .GraphDriver}}", tag],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    driver = json.loads(out)
    data = driver.get("Data") or {}
    if driver.get("Name") != "overlay2" or not data.get("UpperDir"):
        return None
    lower = [Path(d) for d in (data.get("LowerDir") or "").split(":") if d]
    dirs = [Path(data["UpperDir"]), *lower]
    return dirs if all(os.access(d, os.R_OK | os.X_OK) for d in dirs) else None


def overlay_entries(dirs: list[Path]) -> Iterator[tuple[int, str, bool, Callable[[], bytes]]]:
    """(layer, path in the image, regular file, its bytes) of every entry of every layer
    directory (a file a later layer deletes is still in its own layer, as in the tar)."""
    for index, top in enumerate(dirs):
        for root, subdirs, names in os.walk(top):
            for name in [*subdirs, *names]:
                path = Path(root, name)
                yield (index, path.relative_to(top).as_posix(),
                       path.is_file() and not path.is_symlink(), path.read_bytes)  # fmt: skip


def saved_entries(tag: str) -> Iterator[tuple[int, str, bool, Callable[[], bytes]]]:
    """The same from `docker save TAG`, read as it streams (any storage driver, no root)."""
    proc = subprocess.Popen(["docker", "save", tag], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    index = 0
    with tarfile.open(fileobj=proc.stdout, mode="r|") as image:
        for member in image:
            if not member.isfile() or member.name.endswith((".json", "repositories", "oci-layout")):
                continue
            for layer, entry in layer_entries(image.extractfile(member)):
                extract = layer.extractfile
                yield (index, entry.name, entry.isfile(),
                       lambda e=entry, x=extract: x(e).read())  # fmt: skip
            index += 1
    if proc.wait() != 0:
        raise StepFailed(f"docker save {tag} exited {proc.returncode}")


def build_inputs_in_layers(run: Run, tag: str) -> str:
    """Every layer of image TAG (its overlay2 directories, or `docker save TAG` where the
    engine stores layers otherwise): no wheel, no inputs directory, no extra certificate file,
    and no host CA in any CA bundle. Returns what was read."""
    bodies = host_ca_bodies()
    dirs = overlay_layer_dirs(tag)
    entries = overlay_entries(dirs) if dirs is not None else saved_entries(tag)
    found: list[str] = []
    layers: set[int] = set()
    files = 0
    for layer, name, regular, read in entries:
        layers.add(layer)
        files += 1
        if any(mark in name for mark in INPUT_MARKS) and regular and DEBIAN_WHEELS not in name:
            found.append(name)
        elif name.endswith("ca-certificates.crt") and regular:
            bundle = read()
            found += [f"{name} holds a host CA" for b in bodies if b in bundle]
    if found:
        raise StepFailed(f"build inputs in the layers of {tag}: {found[:5]}")
    source = "overlay2 layer directories" if dirs is not None else "docker save"
    return (f"{len(layers)} layers ({source}), {files} entries: no wheel, no build-inputs, no "
            f"extra certificate; none of the host's {len(bodies)} CA(s) in a bundle")


def layers(lane: ImageLane, run: Run) -> str:
    return build_inputs_in_layers(run, run.state.image(lane.engine))


def push(run: Run) -> str:
    """The image `make demo` built, tagged for the registry and pushed."""
    run.sh(["docker", "tag", run.state.image("cpu"), CPU.tag])
    run.state.images["cpu-registry"] = CPU.tag
    out = run.sh(["docker", "push", CPU.tag], timeout=900).stdout
    match = re.search(r"digest: (sha256:[0-9a-f]{64})", out)
    if match is None:
        raise StepFailed(f"docker push printed no digest: {out[-200:]!r}")
    run.state.images["cpu-digest"] = match.group(1)
    return f"pushed, registry digest {match.group(1)}"


def pin(run: Run) -> str:
    make(run, "pin", f"IMAGE={CPU.tag}", "SOURCE=cpu")
    pinned = run.lock["CPU_IMAGE"]
    want = f"{REGISTRY}/glm53/kit-cpu@{run.state.image('cpu-digest')}"
    if pinned != want:
        raise StepFailed(f"lock has {pinned}, the registry said {want}")
    run.state.images["cpu-pinned"] = pinned
    return f"CPU_IMAGE={pinned}"


def remove_local(run: Run) -> str:
    """The demo's server stopped and every local name of its image removed, so the image is
    gone from the engine and compose must pull the pinned digest from the registry."""
    ref = run.state.image("cpu-pinned")
    compose_down(run)
    for name in (run.state.image("cpu"), CPU.tag, ref):
        if image_present(run, name):
            run.sh(["docker", "image", "rm", name])
    left = [r for r in (ref, run.state.image("cpu-demo")) if image_present(run, r)]
    if left:
        raise StepFailed(f"still present locally: {left}")
    return "the demo's server stopped, its image removed; compose must pull the digest"


def cuda_selfcheck(run: Run) -> str:
    out = run.sh(["docker", "run", "--rm", "--entrypoint", "python", CUDA.tag,
                  "/opt/kit/docker/selfcheck.py", "--engine", "cuda"], timeout=900)  # fmt: skip
    return " | ".join(out.stdout.strip().splitlines())


def cuda_pin(run: Run) -> str:
    make(run, "pin", f"IMAGE={CUDA.tag}", "SOURCE=kit", "LOCAL=1")
    pinned = run.lock["KIT_IMAGE"]
    image_id = run.sh(["docker", "image", "inspect", "--format", "{{.Id}}", CUDA.tag]).stdout
    if pinned != image_id.strip():
        raise StepFailed(f"KIT_IMAGE={pinned}, the image's ID is {image_id.strip()}")
    run.state.images["kit-id"] = pinned
    return f"KIT_IMAGE={pinned}"


def rendered_service(run: Run, profile: str, env: dict[str, str] | None = None) -> dict:
    make(run, "configure", f"PROFILE={profile}", env=env)
    config = run.sh(["docker", "compose", "config", "--format", "json"], cwd=REPO / "compose")
    return json.loads(config.stdout)["services"]["vllm"]


def cuda_compose(run: Run) -> str:
    """`docker compose config` of both GLM profiles against the pinned CUDA image, with the GPU
    reservation; then each on its qualified runtime (which does not contain the kit) with the
    launcher and the geometry plugin mounted."""
    seen = []
    for profile in GLM_PROFILES:
        service = rendered_service(run, profile, {"IMAGE_SOURCE": "kit"})
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        if service["image"] != run.state.image("kit-id"):
            raise StepFailed(f"{profile}: image {service['image']}, not the pinned CUDA image")
        if devices != [{"driver": "nvidia", "device_ids": ["0,1,2,3"], "capabilities": ["gpu"]}]:
            raise StepFailed(f"{profile}: GPU reservation {devices}")
        seen.append(f"{profile} on {service['image'][:19]} with {devices[0]['driver']} GPUs")
    for profile, key in (("dflash-tp4-dcp4", "QUALIFIED_IMAGE"),
                         ("mtp3-tp4-split", "QUALIFIED_SPLIT_IMAGE")):  # fmt: skip
        qualified = rendered_service(run, profile)
        if qualified["image"] != run.lock[key]:
            raise StepFailed(f"{profile}: image {qualified['image']}, not {key}")
        binds = {v["target"]: v["source"] for v in qualified["volumes"] if v["type"] == "bind"}
        if binds.get("/opt/kit/kvgeometry") != str(REPO / "kvgeometry") or \
                binds.get("/opt/kit/launch") != str(REPO / "launch"):
            raise StepFailed(f"{profile}: its qualified image does not get the kit: binds {binds}")
        seen.append(f"{profile} on {key} {qualified['image'][:36]}... mounts launch/ and "
                    "kvgeometry/ at /opt/kit")  # fmt: skip
    return "; ".join(seen)


def remove_images(run: Run) -> str:
    """Every image the run made or pulled leaves the engine again (the CPU image compose pulled,
    the CUDA image, both bases), and every volume it made; the registry's copies go with
    `.ci/run`'s state directory."""
    compose_down(run)
    made = volumes(run) - run.state.volumes_before
    if made:
        run.sh(["docker", "volume", "rm", *sorted(made)])
    images = run.state.images
    # children before the bases they were built on
    refs = [r for r in (CUDA.tag, images.get("cuda-base"), images.get("cpu-pinned"),
                        images.get("cpu"), images.get("cpu-registry"), images.get("cpu-base"),
                        images.get("prometheus")) if r]  # fmt: skip
    present = [r for r in refs if image_present(run, r)]
    for ref in present:
        run.sh(["docker", "image", "rm", ref])
    left = [r for r in [*refs, images.get("kit-id")] if r and image_present(run, r)]
    if left:
        raise StepFailed(f"still on the engine: {left}")
    return f"removed {len(present)} image(s): {', '.join(present)}; {len(made)} volume(s)"


ENGINE = Step("docker engine, compose, registry", engine)
CPU_LAYERS = Step("no build input in any layer (the CPU image make demo built)",
                  lambda r: layers(CPU, r), (DEMO,))  # fmt: skip
PUSH = Step("push to the local registry", push, (DEMO,))
PIN = Step("make pin", pin, (PUSH,))
REMOVE_LOCAL = Step("remove the local copy", remove_local, (PIN,))
CUDA_BASE = Step("CUDA base: Debian 13 from Debian's packages, pinned", lambda r: base(CUDA, r),
                 (ENGINE,))  # fmt: skip
CUDA_BUILD = Step("build the CUDA image from the Dockerfile", lambda r: build(CUDA, r),
                  (CUDA_BASE,))  # fmt: skip
CUDA_LAYERS = Step("no build input in any layer (CUDA image)", lambda r: layers(CUDA, r),
                   (CUDA_BUILD,))  # fmt: skip
CUDA_SELFCHECK = Step("CUDA image self-check in a container, no GPU", cuda_selfcheck,
                      (CUDA_BUILD,))  # fmt: skip
CUDA_PIN = Step("make pin LOCAL=1 (CUDA image)", cuda_pin, (CUDA_BUILD,))
CUDA_COMPOSE = Step("docker compose config of both GLM profiles", cuda_compose, (CUDA_PIN,))
REMOVE_IMAGES = Step("remove every image and volume the run made", remove_images, (ENGINE,))
