"""The node nemesis: a whole host of a multi-host cluster fails (its power is cut) or is
cut off the cluster's networks, with everything it runs; at the fault's end it is back.

Which units were on the node is decided when the fault starts (Swarm places tasks, and a
`node-of:UNIT` target follows its unit), and recorded with the fault (`units`): the checks
judge the recovery of those learners, as for a kill or a partition of each.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from faults import Node

from .base import Nemesis

if TYPE_CHECKING:
    from ..backends.base import Cluster


class NodeNemesis(Nemesis):
    kind = "node"
    color = "#7b4173"
    impairs_learner = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hit: dict[tuple[int, Node], tuple[str, list[str]]] = {}  # (cluster, fault) -> (node, units)

    def start(self, cluster: Cluster, fault: Node) -> str:
        node = cluster.resolve_node(fault.target)
        units = cluster.units_on(node)
        with self._lock:
            self._hit[(id(cluster), fault)] = (node, units)
        ran = f" (it ran {', '.join(units)})" if units else " (it ran no unit)"
        if fault.mode == "kill":
            return cluster.node_off(node) + ran
        return cluster.node_cut(node, units) + ran

    def stop(self, cluster: Cluster, fault: Node) -> str:
        with self._lock:
            node, units = self._hit.get((id(cluster), fault), (cluster.resolve_node(fault.target), []))
        if fault.mode == "kill":
            did = cluster.node_on(node)
            return did + ("; " + cluster.rebalance(units) if fault.rebalance and units else "")
        return cluster.node_join(node, units)

    def affected(self, cluster: Cluster, fault: Node) -> list[str] | None:
        """The units the fault took down or cut off, as its start found them."""
        with self._lock:
            hit = self._hit.get((id(cluster), fault))
        return list(hit[1]) if hit is not None else None
