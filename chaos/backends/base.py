"""One cluster interface for every backend: local processes, or docker compose.

The controller and the pytest fixtures speak only this interface. Targets are named by
role: `syncer`, `learner-1` … `learner-N`; the link of a learner is its Toxiproxy proxy.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from trainer.runspec import RunSpec

from ..applied import DEFAULT_TOLERANCE
from ..client import NotFound, ToxiproxyClient


class UnknownTarget(ValueError):
    pass


class UnsupportedFault(ValueError):
    """A fault this backend cannot apply (e.g. a network partition on local processes)."""


class Cluster(ABC):
    run_dir: Path
    learners: int
    toxiproxy: ToxiproxyClient
    # Seconds a fault action may take on this backend before `faults_applied` calls the
    # fault late or short (chaos/applied.py); the controller records it in `begin`.
    action_tolerance: float = DEFAULT_TOLERANCE

    # ----------------------------------------------------------- lifecycle
    def preflight(self) -> None:
        """Refuse, before anything is created, a run this backend cannot start (raises, saying why).

        The runner calls it before it makes the run directory, so a refused run leaves none."""

    @abstractmethod
    def start(self) -> None:
        """Clean up after any crashed earlier run, then bring everything up."""

    @abstractmethod
    def stop(self) -> None:
        """Stop cleanly: learners first (they push their residual progress), then the syncer."""

    # ----------------------------------------------------------- processes
    spec: RunSpec = RunSpec()  # what runs: every backend starts its processes with the flags it gives

    def units(self) -> list[str]:
        """The syncer and the learner units: what a process or a container runs."""
        return ["syncer", *(f"learner-{i}" for i in range(1, self.learners + 1))]

    def ranks_of(self, learner: int) -> int:
        """Ranks of learner-N's unit, as its RunSpec says."""
        return self.spec.ranks_of(learner)

    def services(self) -> list[str]:
        """Every fault target: the units, and each rank of a unit of several."""
        out = []
        for unit in self.units():
            out.append(unit)
            if unit != "syncer" and (ranks := self.ranks_of(int(unit.split("-", 1)[1]))) > 1:
                out += [f"{unit}/rank-{r}" for r in range(ranks)]
        return out

    def check_target(self, target: str) -> str:
        if target not in self.services():
            raise UnknownTarget(f"no such target {target!r} (known: {', '.join(self.services())})")
        return target

    @abstractmethod
    def kill(self, target: str) -> None: ...

    def hold_down(self, target: str) -> None:
        """Keep a killed `target` down until restart() (a kill with restart: false). Only a
        backend whose engine restarts what dies by itself (swarm) has anything to do."""

    @abstractmethod
    def pause(self, target: str) -> None: ...

    @abstractmethod
    def resume(self, target: str) -> None: ...

    @abstractmethod
    def restart(self, target: str) -> str | None:
        """Start `target` again if it is down (a new incarnation for a learner).

        May return a short note for the history (e.g. when a scheduler had the new task
        running); the kill nemesis records it as `restarted learner-2 (NOTE)`. None: no note."""

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
        if "/" in target:
            raise UnknownTarget(f"{target!r} has no link of its own: only rank 0 talks to the syncer, through "
                                f"its unit's link {target.split('/', 1)[0]!r}")
        return target

    def link_proxies(self) -> list[str]:
        return [self.link_proxy(s) for s in self.units() if s != "syncer"]

    # ----------------------------------------------------------- networks
    supports_network_partitions = False

    def disconnect(self, target: str) -> None:
        """Cut `target`'s container off its networks (partition mode 'network')."""
        raise UnsupportedFault(f"{type(self).__name__} cannot disconnect {target!r} from a network: "
                               "partition mode 'network' needs the compose backend or the swarm backend")

    def connect(self, target: str) -> None:
        raise UnsupportedFault(f"{type(self).__name__} cannot connect {target!r} to a network")

    def unsupported(self, schedule) -> list[str]:
        """One message per fault of `schedule` this backend cannot apply, naming the field."""
        problems = []
        known = set(self.services())
        for i, f in enumerate(schedule.faults):
            target = getattr(f, "target", None)
            if isinstance(target, str) and "/rank-" in target and target not in known:
                unit = target.split("/", 1)[0]
                ranks = self.ranks_of(int(unit.split("-", 1)[1]))
                problems.append(f"faults[{i}].target: {unit} runs {ranks} rank(s), so {target!r} does not exist "
                                f"(give {unit} more with the learner flag --ranks)")
            if getattr(f, "mode", None) == "network" and not self.supports_network_partitions:
                problems.append(f"faults[{i}].mode: 'network' partitions need the compose backend or the swarm backend")
        return problems

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
        return done + self.heal_processes(self.services())

    def heal_processes(self, targets: list[str]) -> list[str]:
        """Resume what is paused and restart what is down, among `targets`; what it did."""
        done: list[str] = []
        for target in targets:
            if self.is_paused(target):
                self.resume(target)
                done.append(f"resumed {target}")
            if not self.is_running(target):
                self.restart(target)
                done.append(f"restarted {target}")
        return done
