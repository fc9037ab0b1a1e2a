"""A run's own directory, even when several runs start in the same second.

The default run directory is named after the time to the second (`runs/<time>`,
`runs/chaos-<time>`): two runs started together used to pick the same one and share its
secret, address file, state and event logs, and judge each other's events. A default
directory is therefore claimed with mkdir(2), which exactly one caller wins; the others
take the next free name (`-2`, `-3`, ...).
"""
from __future__ import annotations

import os
from pathlib import Path

MAX_CLAIMS = 1000  # runs of one name in one second: far beyond any machine


def claim_run_dir(base: str | os.PathLike) -> Path:
    """Create and return `base`, or else the first of `base-2`, `base-3`, ... that this
    call created itself (never one another run holds)."""
    path = Path(base)
    path.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, MAX_CLAIMS + 1):
        candidate = path if n == 1 else path.with_name(f"{path.name}-{n}")
        try:
            os.mkdir(candidate)
        except FileExistsError:
            continue
        return candidate
    raise FileExistsError(f"{path} and {MAX_CLAIMS - 1} numbered neighbours exist; choose a directory with --out")


def release_if_empty(path: Path) -> None:
    """Give back a claimed directory that nothing was written to (a refused run leaves
    nothing behind); one holding anything stays."""
    try:
        path.rmdir()
    except OSError:
        pass
