"""The pause nemesis: SIGSTOP a target, then SIGCONT it — a hung process whose sockets stay open."""
from __future__ import annotations

from typing import TYPE_CHECKING

from faults import Pause

from .base import Nemesis

if TYPE_CHECKING:
    from ..backends.base import Cluster


class PauseNemesis(Nemesis):
    kind = "pause"
    color = "#ff7f0e"
    impairs_learner = True

    def start(self, cluster: Cluster, fault: Pause) -> str:
        cluster.pause(fault.target)
        return f"SIGSTOP {fault.target}"

    def stop(self, cluster: Cluster, fault: Pause) -> str:
        cluster.resume(fault.target)
        return f"SIGCONT {fault.target}"
