"""Run a Python module where only what the installed vLLM itself requires can be imported.

The launcher and the geometry plugin run with a runtime image's own Python: the kit's image, or a
qualified runtime that knows nothing of the kit's dependencies (the Docker SDK, jsonschema, ...).
A top-level import outside vLLM's dependency closure works on the kit's images and ends a start
on a qualified runtime with ModuleNotFoundError. This guard makes that failure show everywhere:
the allowed set is computed from the installed distributions' metadata (vLLM's `Requires-Dist`,
followed through every installed dependency and the extras each requirement names), never a
hand-written list; the standard library and the kit's own run-path packages are allowed too.

    python docker/vllm_deps_only.py -m launch run --dry-run dflash-tp4-dcp4
    python docker/vllm_deps_only.py -c "import kvgeometry; kvgeometry.register()"

Exit status is the module's. For the kit's own code a module outside the closure is absent, as it
would be in such an image (`import docker` raises ModuleNotFoundError; a probe gets None); the
ones installed here but made absent are named on stderr at the end. vLLM's own imports pass: the
test environment's vLLM is installed without its declared dependencies, and what vLLM imports is
not the kit's to police.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import re
import runpy
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

from packaging.markers import UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement

KIT_PACKAGES = frozenset({"launch", "kvgeometry", "capacity"})
"""The kit's own packages on the run path (mounted at /opt/kit in a qualified runtime)."""


def canonical(name: str) -> str:
    """PEP 503's normalized distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _applies(req: Requirement, extras: frozenset[str]) -> bool:
    if req.marker is None:
        return True
    try:
        return any(req.marker.evaluate({"extra": extra}) for extra in extras | {""})
    except UndefinedEnvironmentName:
        return False


def dependency_closure(root: str = "vllm") -> set[str]:
    """Canonical names of the installed distributions `root` requires, transitively, with the
    extras each requirement asks for (vLLM's `fastapi[standard]` brings python-dotenv)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    pending = [(canonical(root), frozenset[str]())]
    while pending:
        name, extras = pending.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed: it contributes no module
        for line in requires:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if _applies(req, extras):
                pending.append((canonical(req.name), frozenset(req.extras)))
    return {name for name, _ in seen}


def allowed_modules(root: str = "vllm") -> frozenset[str]:
    """Top-level module names importable under the guard."""
    closure = dependency_closure(root)
    if canonical(root) not in {canonical(d.metadata["Name"] or "")
                               for d in importlib.metadata.distributions()}:  # fmt: skip
        raise SystemExit(f"vllm_deps_only: {root} is not installed here; nothing to guard by")
    owned = {
        module
        for module, dists in importlib.metadata.packages_distributions().items()
        if any(canonical(d) in closure for d in dists)
    }
    return frozenset(owned | set(sys.stdlib_module_names) | KIT_PACKAGES | {"__main__"})


def stdlib_dirs() -> list[str]:
    """Where this interpreter's standard library lives (its C modules in lib-dynload too): a
    module found there is the standard library's, named in sys.stdlib_module_names or not
    (`_sysconfigdata_*` is not)."""
    paths = sysconfig.get_paths()
    dirs = {paths["stdlib"], paths["platstdlib"]}
    return sorted(dirs | {str(Path(d) / "lib-dynload") for d in dirs})


def importer() -> str:
    """The module whose code asked for the import being found: the first frame outside the
    import machinery and this guard (which itself runs as `__main__`)."""
    frame = sys._getframe(2)
    while frame is not None:
        spec = frame.f_globals.get("__spec__")
        name = str(getattr(spec, "name", None) or frame.f_globals.get("__name__", ""))
        inside = frame.f_code.co_filename == __file__ or name.startswith(
            ("importlib", "_frozen_importlib"))  # fmt: skip
        if not inside:
            return name
        frame = frame.f_back
    return ""


class OnlyVllmDeps(importlib.abc.MetaPathFinder):
    """The path finder, with every top-level module outside `allowed` made absent for the kit's
    own code (the `-m` module, the `-c` code, `launch`, `kvgeometry`), the way it would be in an
    image without it: `import docker` raises ModuleNotFoundError, a probe gets None. What vLLM
    and its dependencies import is theirs to answer for and passes through unchanged."""

    def __init__(self, allowed: frozenset[str]) -> None:
        self.allowed = allowed
        self.stdlib = stdlib_dirs()
        self.refused: set[str] = set()

    def _allowed(self, top: str) -> bool:
        return top in self.allowed or (
            importlib.machinery.PathFinder.find_spec(top, self.stdlib) is not None
        )

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> object:
        top = fullname.partition(".")[0]
        if fullname == top and not self._allowed(top):
            asker = importer().partition(".")[0]
            if asker in KIT_PACKAGES or asker == "__main__":
                if importlib.machinery.PathFinder.find_spec(top) is not None:
                    self.refused.add(f"{top} (imported by {importer()})")
                return None
        return importlib.machinery.PathFinder.find_spec(fullname, path, target)  # type: ignore[arg-type]

    def invalidate_caches(self) -> None:
        importlib.machinery.PathFinder.invalidate_caches()

    def find_distributions(self, *args: object, **kwargs: object) -> object:
        """Metadata stays visible (vLLM and its dependencies read their own versions)."""
        return importlib.machinery.PathFinder.find_distributions(*args, **kwargs)  # type: ignore[arg-type]


def install(root: str = "vllm") -> OnlyVllmDeps:
    """Put the guard in place of the path finder for this process."""
    guard = OnlyVllmDeps(allowed_modules(root))
    sys.meta_path[:] = [guard if f is importlib.machinery.PathFinder else f
                        for f in sys.meta_path]  # fmt: skip
    return guard


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] not in ("-m", "-c"):
        print("usage: python docker/vllm_deps_only.py -m MODULE [ARG ...] | -c CODE [ARG ...]",
              file=sys.stderr)  # fmt: skip
        return 2
    guard = install()
    mode, target, rest = args[0], args[1], args[2:]
    try:
        if mode == "-m":
            sys.argv = [target, *rest]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = ["-c", *rest]
            exec(compile(target, "<-c>", "exec"), {"__name__": "__main__"})
    except SystemExit as done:
        code = done.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        if guard.refused:
            print(
                f"vllm_deps_only: made absent for the kit (installed here, outside vLLM's "
                f"dependency closure): {', '.join(sorted(guard.refused))}",
                file=sys.stderr,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
