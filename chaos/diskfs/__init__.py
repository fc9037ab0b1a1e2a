"""diskfs: a FUSE file system that loses what was not synced (LazyFS-like) and injects disk faults.

Mounted over the syncer's state directory, it keeps the volatile view in memory and the
durable image in a backing directory: SIGKILL of the daemon is a power loss. At run time
its control socket switches it between `none`, `full` (ENOSPC), `eio` (EIO) and `slow`.
See docs/diskfs.md.

Nothing here imports mfusepy or libfuse: only `fs.serve` (run by the daemon) does, so the
model, the client and the launcher work on a machine without FUSE.
"""
from __future__ import annotations

import importlib
from typing import Any

# Loaded on first use, so `python -m chaos.diskfs.client` runs a module the package has not
# imported already (runpy warns of that, and the warning lands in every harness's output).
_HOMES = {"DiskControl": "client", "DiskControlError": "client", "DiskfsError": "launch", "cut_power": "launch",
          "power_loss": "launch", "reap_power_cut": "launch", "start_diskfs": "launch", "stop_diskfs": "launch",
          "Model": "model", "ERRNOS": "modes", "MODES": "modes", "unmount": "mounts"}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
