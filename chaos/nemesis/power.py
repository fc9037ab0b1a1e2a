"""The power_loss nemesis: the syncer and its disk lose power together.

A SIGKILL keeps the page cache, so a killed process loses no byte it wrote. Here the
syncer's state directory is the disk-fault layer (chaos/diskfs), which holds whatever was
not synced in its own memory; the backend's `power_loss` SIGKILLs the syncer and that
layer at once, so everything not made durable is gone, as after a power cut. The stop
powers them up again, as a kill's does: the layer comes back with only its durable image,
and the syncer recovers from it (or, with `restart: false`, stays down until the final heal).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .kill import KillNemesis

if TYPE_CHECKING:
    from ..backends.base import Cluster


class PowerLossNemesis(KillNemesis):
    kind = "power_loss"
    color = "#393b79"
    needs_disk_layer = True

    def take_down(self, cluster: Cluster, target: str) -> str:
        cluster.power_loss(target)
        return f"cut the power of {target} and its disk (unsynced writes lost)"
