"""The toxic nemesis: Toxiproxy toxics on learner links, driven by the fault's ``toxics()``.

One generic nemesis serves every link fault (latency, bandwidth, reset_peer, slow_close,
slicer, limit_data, timeout): the fault data says which toxics, this adds and removes
them by name. A new toxic kind needs only a line in COLORS; a module of its own only if
it behaves differently.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from ..client import NotFound
from .base import Nemesis

if TYPE_CHECKING:
    from ..backends.base import Cluster

# The report's colour per toxic kind; also the list of kinds this nemesis serves.
COLORS: dict[str, str] = {
    "latency": "#1f77b4",
    "bandwidth": "#17becf",
    "reset_peer": "#8c564b",
    "slow_close": "#bcbd22",
    "slicer": "#e377c2",
    "limit_data": "#7f7f7f",
    "timeout": "#2ca02c",
}


def add_toxics(cluster: Cluster, targets: Iterable[str], specs: list[dict[str, Any]]) -> str:
    """Add every spec to each target's link; every link is resolved first, so a bad target adds nothing."""
    proxies = [cluster.link_proxy(t) for t in targets]
    added = []
    for proxy in proxies:
        for spec in specs:
            cluster.toxiproxy.add_toxic(proxy, **spec)
            added.append(f"{proxy}/{spec['name']}")
    return f"added toxics {', '.join(added)}"


def remove_toxics(cluster: Cluster, targets: Iterable[str], specs: list[dict[str, Any]]) -> str:
    """Remove the specs' toxics by name; one already gone (a heal got there first) is no error."""
    removed = []
    for proxy in [cluster.link_proxy(t) for t in targets]:
        for spec in specs:
            try:
                cluster.toxiproxy.remove_toxic(proxy, spec["name"])
                removed.append(f"{proxy}/{spec['name']}")
            except NotFound:
                pass
    return f"removed toxics {', '.join(removed) or '(none left)'}"


class ToxicNemesis(Nemesis):
    """One link fault kind: its toxics on the link of ``fault.target``."""

    def __init__(self, kind: str, color: str | None = None) -> None:
        self.kind = kind
        self.color = color

    def start(self, cluster: Cluster, fault: Any) -> str:
        return add_toxics(cluster, (fault.target,), fault.toxics())

    def stop(self, cluster: Cluster, fault: Any) -> str:
        return remove_toxics(cluster, (fault.target,), fault.toxics())


NEMESES: tuple[ToxicNemesis, ...] = tuple(ToxicNemesis(kind, color) for kind, color in COLORS.items())
