"""The nemesis interface and the registry that finds one by fault kind.

A nemesis only injects and undoes; it never judges. Its start/stop return the
human text the controller records as the history entry's ``did``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    from ..backends.base import Cluster


class UnknownKind(LookupError):
    """A fault whose kind no nemesis handles."""

    def __str__(self) -> str:  # LookupError would quote the message like a KeyError
        return str(self.args[0])


class Nemesis(ABC):
    """Starts and stops one fault kind on a Cluster, and carries the harness's facts about it.

    ``impairs_learner``: whether the fault keeps its target from contributing (the
    checkers judge recovery only after such faults). ``color``: the report's colour for
    the kind; None lets the report pick a spare one.
    """

    kind: str
    color: str | None = None
    impairs_learner: bool = False
    needs_disk_layer: bool = False  # the syncer's state dir must be the disk-fault layer from the start

    @abstractmethod
    def start(self, cluster: Cluster, fault: Any) -> str:
        """Inject `fault`; returns what was done, for the history."""

    @abstractmethod
    def stop(self, cluster: Cluster, fault: Any) -> str:
        """Undo `fault`; returns what was done, for the history."""

    def affected(self, cluster: Cluster, fault: Any) -> list[str] | None:
        """The units a started fault turned out to hit, when its target does not name them
        (a node's units): recorded with the fault for the checks. None: its target says."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kind!r})"


class Registry:
    """Nemeses keyed by fault kind, in the order given (the report lists kinds in it)."""

    def __init__(self, *nemeses: Nemesis) -> None:
        self._by_kind: dict[str, Nemesis] = {}
        for nemesis in nemeses:
            if nemesis.kind in self._by_kind:
                raise ValueError(f"two nemeses for fault kind {nemesis.kind!r}: "
                                 f"{self._by_kind[nemesis.kind]!r} and {nemesis!r}")
            self._by_kind[nemesis.kind] = nemesis

    def __getitem__(self, kind: str) -> Nemesis:
        try:
            return self._by_kind[kind]
        except KeyError:
            raise UnknownKind(f"no nemesis for fault kind {kind!r} "
                              f"(known: {', '.join(self._by_kind)})") from None

    def __contains__(self, kind: object) -> bool:
        return kind in self._by_kind

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_kind)

    def __len__(self) -> int:
        return len(self._by_kind)

    def for_fault(self, fault: Any) -> Nemesis:
        """The nemesis of `fault`'s kind; UnknownKind names the kind when there is none."""
        return self[getattr(fault, "kind", type(fault).__name__)]

    def impairing(self) -> set[str]:
        """Kinds that keep their target learner (or, on the syncer, every learner) from contributing."""
        return {kind for kind, n in self._by_kind.items() if n.impairs_learner}

    def need_disk_layer(self, faults: Any) -> bool:
        """Whether any of `faults` needs the disk-fault layer under the syncer's state dir."""
        return any(getattr(self._by_kind.get(getattr(f, "kind", "")), "needs_disk_layer", False) for f in faults)

    def colors(self) -> dict[str, str]:
        """The report's colour of every kind that has one."""
        return {kind: n.color for kind, n in self._by_kind.items() if n.color is not None}
