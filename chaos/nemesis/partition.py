"""The partition nemesis: cut learners' links off from the syncer, one way per mode.

- ``blackhole``: a timeout-0 toxic per stream (the fault's ``toxics()``): data vanishes,
  connections hang;
- ``refuse``: the links' proxies are disabled: connections are refused;
- ``network``: the learners' containers leave their networks (backends that support it).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from faults import Partition

from .base import Nemesis
from .toxic import add_toxics, remove_toxics

if TYPE_CHECKING:
    from ..backends.base import Cluster


def _refuse(cluster: Cluster, fault: Partition) -> str:
    proxies = [cluster.link_proxy(t) for t in fault.targets]
    for proxy in proxies:
        cluster.toxiproxy.disable(proxy)
    return f"disabled proxies {', '.join(proxies)}"


def _unrefuse(cluster: Cluster, fault: Partition) -> str:
    proxies = [cluster.link_proxy(t) for t in fault.targets]
    for proxy in proxies:
        cluster.toxiproxy.enable(proxy)
    return f"enabled proxies {', '.join(proxies)}"


def _disconnect(cluster: Cluster, fault: Partition) -> str:
    for target in fault.targets:
        cluster.disconnect(target)
    return f"disconnected {', '.join(fault.targets)} from their networks"


def _reconnect(cluster: Cluster, fault: Partition) -> str:
    for target in fault.targets:
        cluster.connect(target)
    return f"reconnected {', '.join(fault.targets)} with their aliases"


def _blackhole(cluster: Cluster, fault: Partition) -> str:
    return add_toxics(cluster, fault.targets, fault.toxics())


def _unblackhole(cluster: Cluster, fault: Partition) -> str:
    return remove_toxics(cluster, fault.targets, fault.toxics())


# mode -> (start, stop)
MODES = {
    "blackhole": (_blackhole, _unblackhole),
    "refuse": (_refuse, _unrefuse),
    "network": (_disconnect, _reconnect),
}


class PartitionNemesis(Nemesis):
    kind = "partition"
    color = "#9467bd"
    impairs_learner = True

    @staticmethod
    def _mode(fault: Partition) -> tuple:
        try:
            return MODES[fault.mode]
        except KeyError:
            raise ValueError(f"unknown partition mode {fault.mode!r} (known: {', '.join(MODES)})") from None

    def start(self, cluster: Cluster, fault: Partition) -> str:
        return self._mode(fault)[0](cluster, fault)

    def stop(self, cluster: Cluster, fault: Partition) -> str:
        return self._mode(fault)[1](cluster, fault)
