"""The kill nemesis: SIGKILL a target, then restart it (or leave it down until the final heal)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from faults import Kill

from .base import Nemesis

if TYPE_CHECKING:
    from ..backends.base import Cluster


class KillNemesis(Nemesis):
    """An outage: the target is taken down at the start and started again at the stop
    (`restart: false`: left down until the final heal). Subclasses change how it goes down."""

    kind = "kill"
    color = "#d62728"
    impairs_learner = True

    def take_down(self, cluster: Cluster, target: str) -> str:
        cluster.kill(target)
        return f"SIGKILL {target}"

    def start(self, cluster: Cluster, fault: Kill) -> str:
        did = self.take_down(cluster, fault.target)
        if not fault.restart:
            cluster.hold_down(fault.target)  # an engine that restarts by itself (Swarm) must not
        return did

    def stop(self, cluster: Cluster, fault: Kill) -> str:
        if not fault.restart:
            return f"left {fault.target} down until the final heal"
        # A backend may say more about the restart (e.g. when its scheduler had the new task running).
        note = cluster.restart(fault.target)
        return f"restarted {fault.target}" + (f" ({note})" if note else "")
