"""diskfs: a FUSE file system that loses what was not synced (LazyFS-like) and injects disk faults.

Mounted over the syncer's state directory, it keeps the volatile view in memory and the
durable image in a backing directory: SIGKILL of the daemon is a power loss. At run time
its control socket switches it between `none`, `full` (ENOSPC), `eio` (EIO) and `slow`.
See docs/diskfs.md.

Nothing here imports mfusepy or libfuse: only `fs.serve` (run by the daemon) does, so the
model, the client and the launcher work on a machine without FUSE.
"""
from __future__ import annotations

from .client import DiskControl, DiskControlError
from .launch import DiskfsError, power_loss, start_diskfs, stop_diskfs
from .model import Model
from .modes import ERRNOS, MODES
from .mounts import unmount

__all__ = ["DiskControl", "DiskControlError", "DiskfsError", "ERRNOS", "MODES", "Model", "power_loss",
           "start_diskfs", "stop_diskfs", "unmount"]
