"""Fetch the host's extra CA certificates that docker/build.py serves for one test build.

`python build_inputs.py URL DEST`: the names listed in URL/ca/index.txt, each into DEST, for
update-ca-certificates (pip-locked.sh removes them again in the same RUN, so no layer keeps
them). Nothing listed (a release build, or no --trust-host-ca) fetches nothing. Standard library
only: it runs before the environment is installed.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from pathlib import Path


def main(argv: list[str]) -> int:
    url, dest = argv[0].rstrip("/") + "/ca/", Path(argv[1])
    try:
        with urllib.request.urlopen(url + "index.txt", timeout=30) as response:
            names = response.read().decode("utf-8").split()
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return 0
        raise
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        with urllib.request.urlopen(url + name, timeout=30) as response:
            (dest / name).write_bytes(response.read())
    print(f"trusting {len(names)} host CA certificate(s) for this step")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
