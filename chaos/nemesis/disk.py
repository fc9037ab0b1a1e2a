"""The disk nemesis: the syncer's state directory fills up, fails or slows down.

The state directory is a FUSE layer (chaos/diskfs, docs/diskfs.md) for the whole run when
a schedule holds a disk or power_loss fault; this sets its fault mode through the
backend (`Cluster.set_disk`): `full` answers writes ENOSPC, `eio` answers syncs EIO
(writes are taken, as a page cache takes them), `slow` adds `latency_ms` to every operation. The stop sets it sound again.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from faults import Disk

from .base import Nemesis

if TYPE_CHECKING:
    from ..backends.base import Cluster

WHAT = {"full": "full (ENOSPC on writes)", "eio": "failing (EIO on syncs)"}


class DiskNemesis(Nemesis):
    kind = "disk"
    color = "#6b6ecf"
    impairs_learner = True  # a syncer that cannot store a push keeps every learner from contributing
    needs_disk_layer = True

    def start(self, cluster: Cluster, fault: Disk) -> str:
        cluster.set_disk(fault.target, fault.mode, fault.latency_ms)
        what = WHAT.get(fault.mode, f"slow (+{fault.latency_ms:g} ms per operation)")
        return f"{fault.target}'s disk {what}"

    def stop(self, cluster: Cluster, fault: Disk) -> str:
        cluster.set_disk(fault.target, "none")
        return f"{fault.target}'s disk sound again"
