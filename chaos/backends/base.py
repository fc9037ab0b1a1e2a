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

    # ----------------------------------------------------------- the syncer's disk
    # A `disk` or `power_loss` fault needs the disk-fault layer (chaos/diskfs) mounted over the
    # syncer's state dir from the start (RunSpec.disk_layer). A backend that can mount it says
    # so; one that cannot says why, and schedules with those faults are refused before a run.
    supports_disk_layer = False
    disk_layer_refusal = "this backend cannot mount the disk-fault layer"

    def set_disk(self, target: str, mode: str, latency_ms: float = 50.0) -> None:
        """Put `target`'s disk (the syncer's state dir) in fault mode `mode` (full, eio, slow, none)."""
        raise UnsupportedFault(f"{type(self).__name__}: disk faults: {self.disk_layer_refusal}")

    def power_loss(self, target: str) -> None:
        """Kill `target` and its disk layer together: every write not made durable is lost.
        `restart(target)` powers both up again."""
        raise UnsupportedFault(f"{type(self).__name__}: power_loss: {self.disk_layer_refusal}")

    def _needs_disk_layer(self, kind: str) -> str:
        """The refusal of a disk/power_loss fault on a cluster started without the layer."""
        return (f"{kind} faults need the disk-fault layer under the syncer's state dir from the start, and this "
                f"cluster was started without it (RunSpec(disk_layer=True); the pytest fixture's "
                f"ClusterSettings(disk_layer=True); `chaos run` sets it from the schedule)")

    def unsupported(self, schedule) -> list[str]:
        """One message per fault of `schedule` this backend cannot apply, naming the field."""
        from ..nemesis import NEMESES  # the nemeses know the backends' interface, not the reverse

        problems = []
        known = set(self.services())
        for i, f in enumerate(schedule.faults):
            if NEMESES.need_disk_layer([f]) and not self.supports_disk_layer:
                problems.append(f"faults[{i}].kind: {f.kind} needs the disk-fault layer (chaos/diskfs) under the "
                                f"syncer's state dir, and {self.disk_layer_refusal}")
            target = getattr(f, "target", None)
            if isinstance(target, str) and "/rank-" in target and target not in known:
                unit = target.split("/", 1)[0]
                ranks = self.ranks_of(int(unit.split("-", 1)[1]))
                problems.append(f"faults[{i}].target: {unit} runs {ranks} rank(s), so {target!r} does not exist "
                                f"(give {unit} more with the learner flag --ranks)")
            if getattr(f, "mode", None) == "network" and not self.supports_network_partitions:
                problems.append(f"faults[{i}].mode: 'network' partitions need the compose backend or the swarm backend")
            if f.kind == "node":
                problems += [f"faults[{i}].{field}: {why}" for field, why in self.node_fault_problems(f)]
        return problems

    # ----------------------------------------------------------- nodes
    # A `node` fault acts on a whole host. A backend whose processes all run on this machine
    # has no node to fail but the controller's own, and refuses the kind by name.
    def node_fault_problems(self, fault) -> list[tuple[str, str]]:
        """(field, why) for each reason this backend cannot apply the node fault `fault`."""
        return [("kind", f"'node' faults need a cluster across several hosts, the swarm backend: the "
                         f"{getattr(self, 'backend_name', type(self).__name__)} backend runs every process on "
                         f"this machine")]

    def resolve_node(self, target: str) -> str:
        """The node a `node` fault's target names now (a hostname, or node-of:UNIT)."""
        raise UnsupportedFault(self.node_fault_problems(None)[0][1])

    def units_on(self, node: str) -> list[str]:
        """The units whose task runs on `node` now."""
        return []

    def node_off(self, node: str) -> str:
        raise UnsupportedFault(self.node_fault_problems(None)[0][1])

    def node_on(self, node: str) -> str:
        raise UnsupportedFault(self.node_fault_problems(None)[0][1])

    def rebalance(self, units: list[str]) -> str:
        """Start `units` again wherever the scheduler now places them (a node came back)."""
        raise UnsupportedFault(self.node_fault_problems(None)[0][1])

    def node_cut(self, node: str, units: list[str]) -> str:
        raise UnsupportedFault(self.node_fault_problems(None)[0][1])

    def node_join(self, node: str, units: list[str]) -> str:
        raise UnsupportedFault(self.node_fault_problems(None)[0][1])

    # ----------------------------------------------------------- clocks
    def clock_hosts(self) -> dict[str, tuple[str, int]]:
        """Each host whose clock is not the controller's, and where its clock probe answers
        (chaos/clock_probe.py): the runner probes them through the run and places their
        events on its timeline. None here: every process shares this machine's clock."""
        return {}

    # A process reads its wall clock through a file per role in this directory
    # (trainer/clock.py; $ISLANDS_CLOCK_DIR names it to every process, as the process sees
    # it: `clock_dir_env`). The clock nemesis writes the files; what steps and drifts left
    # behind, per target, is in `clock_offsets` until the final heal.
    @property
    def clock_dir(self) -> Path:
        return self.run_dir / "clocks"

    @property
    def clock_dir_env(self) -> str:
        """$ISLANDS_CLOCK_DIR as the processes see it (a container may mount the run dir elsewhere)."""
        return str(self.clock_dir)

    def clock_file(self, target: str) -> Path:
        """The clock file of `target`'s unit (a clock belongs to a host: a unit's ranks share it)."""
        return self.clock_dir / f"{self.check_target(target).split('/', 1)[0]}.json"

    @property
    def clock_offsets(self) -> dict[str, float]:
        return self.__dict__.setdefault("_clock_offsets", {})

    @property
    def clock_anchors(self) -> dict[str, float]:
        return self.__dict__.setdefault("_clock_anchors", {})

    def clock_file_written(self, target: str, path: Path) -> None:
        """`target`'s clock file was just written at `path` in the run dir; a backend whose
        processes do not read the run dir (swarm: each node has its own) copies it to them."""

    def heal_clocks(self) -> list[str]:
        """Every wall clock true again (a cluster with no run directory has no clock files)."""
        if getattr(self, "run_dir", None) is None:
            return []
        done = [f"set {p.stem}'s wall clock true" for p in sorted(self.clock_dir.glob("*.json"))]
        for path in self.clock_dir.glob("*.json"):
            path.unlink(missing_ok=True)
        self.clock_offsets.clear()
        self.clock_anchors.clear()
        return done

    # ----------------------------------------------------------- healing
    def heal_all(self) -> list[str]:
        """Idempotent: remove every toxic, enable every proxy, resume what is paused,
        restart what should be up, set every clock true. Returns what it did, for the history."""
        done: list[str] = self.heal_clocks()
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
