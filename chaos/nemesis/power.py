"""The power_loss nemesis: the syncer and its disk lose power together.

A SIGKILL keeps the page cache, so a killed process loses no byte it wrote. Here the
syncer's state directory is the disk-fault layer (chaos/diskfs), which holds whatever was
not synced in its own memory; the backend's `power_loss` SIGKILLs the syncer and that
layer at once, so everything not made durable is gone, as after a power cut. The stop
powers them up again: the layer comes back with only its durable image, and the syncer
recovers from it (or, with `restart: false`, stays down until the final heal).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from faults import PowerLoss

from .base import Nemesis

if TYPE_CHECKING:
    from ..backends.base import Cluster


class PowerLossNemesis(Nemesis):
    kind = "power_loss"
    color = "#393b79"
    impairs_learner = True
    needs_disk_layer = True

    def start(self, cluster: Cluster, fault: PowerLoss) -> str:
        cluster.power_loss(fault.target)
        if not fault.restart:
            cluster.hold_down(fault.target)
        return f"cut the power of {fault.target} and its disk (unsynced writes lost)"

    def stop(self, cluster: Cluster, fault: PowerLoss) -> str:
        if not fault.restart:
            return f"left {fault.target} down until the final heal"
        note = cluster.restart(fault.target)
        return f"powered {fault.target} up again" + (f" ({note})" if note else "")
