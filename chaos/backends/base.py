"""One cluster interface for every backend: local processes, or docker compose.

The controller and the pytest fixtures speak only this interface. Targets are named by
role: `syncer`, `learner-1` … `learner-N`; the link of a learner is its Toxiproxy proxy.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from ..client import NotFound, ToxiproxyClient


class UnknownTarget(ValueError):
    pass


class UnsupportedFault(ValueError):
    """A fault this backend cannot apply (e.g. a network partition on local processes)."""


class Cluster(ABC):
    run_dir: Path
    learners: int
    toxiproxy: ToxiproxyClient

    # ----------------------------------------------------------- lifecycle
    @abstractmethod
    def start(self) -> None:
        """Clean up after any crashed earlier run, then bring everything up."""

    @abstractmethod
    def stop(self) -> None:
        """Stop cleanly: learners first (they push their residual progress), then the syncer."""

    # ----------------------------------------------------------- processes
    def services(self) -> list[str]:
        return ["syncer", *(f"learner-{i}" for i in range(1, self.learners + 1))]

    def check_target(self, target: str) -> str:
        if target not in self.services():
            raise UnknownTarget(f"no such target {target!r} (known: {', '.join(self.services())})")
        return target

    @abstractmethod
    def kill(self, target: str) -> None: ...

    @abstractmethod
    def pause(self, target: str) -> None: ...

    @abstractmethod
    def resume(self, target: str) -> None: ...

    @abstractmethod
    def restart(self, target: str) -> None:
        """Start `target` again if it is down (a new incarnation for a learner)."""

    @abstractmethod
    def is_running(self, target: str) -> bool: ...

    @abstractmethod
    def is_paused(self, target: str) -> bool: ...

    # ----------------------------------------------------------- links
    def link_proxy(self, target: str) -> str:
        """Toxiproxy proxy name of a learner's link to the syncer."""
        self.check_target(target)
        if target == "syncer":
            raise UnknownTarget("the syncer has no link of its own: name a learner, e.g. 'learner-1'")
        return target

    def link_proxies(self) -> list[str]:
        return [self.link_proxy(s) for s in self.services() if s != "syncer"]

    # ----------------------------------------------------------- networks
    supports_network_partitions = False

    def disconnect(self, target: str) -> None:
        """Cut `target`'s container off its networks (partition mode 'network')."""
        raise UnsupportedFault(f"{type(self).__name__} cannot disconnect {target!r} from a network: "
                               "partition mode 'network' needs the compose backend")

    def connect(self, target: str) -> None:
        raise UnsupportedFault(f"{type(self).__name__} cannot connect {target!r} to a network")

    def unsupported(self, schedule) -> list[str]:
        """One message per fault of `schedule` this backend cannot apply, naming the field."""
        if self.supports_network_partitions:
            return []
        return [f"faults[{i}].mode: 'network' partitions need the compose backend"
                for i, f in enumerate(schedule.faults) if getattr(f, "mode", None) == "network"]

    # ----------------------------------------------------------- healing
    def heal_all(self) -> list[str]:
        """Idempotent: remove every toxic, enable every proxy, resume what is paused,
        restart what should be up. Returns what it did, for the history."""
        done: list[str] = []
        for proxy in self.link_proxies():
            try:
                before = self.toxiproxy.proxy(proxy)
            except NotFound:
                continue
            removed = self.toxiproxy.clear(proxy)
            if removed:
                done.append(f"removed {removed} toxic(s) from {proxy}")
            if not before.get("enabled", True):
                done.append(f"enabled {proxy}")
        for target in self.services():
            if self.is_paused(target):
                self.resume(target)
                done.append(f"resumed {target}")
            if not self.is_running(target):
                self.restart(target)
                done.append(f"restarted {target}")
        return done
