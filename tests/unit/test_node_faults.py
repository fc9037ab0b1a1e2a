"""The `node` fault kind: a whole host of a multi-host cluster killed or cut off. Its
vocabulary, its refusal by name where every process runs on one machine, the nemesis
(which units it hit, recorded for the checks), and its windows as the checks read them."""
from __future__ import annotations

from pathlib import Path

import pytest

from chaos.applied import fault_targets, timings
from chaos.backends.local import LocalCluster
from chaos.checkers import FAIL, PASS, check_self_heal
from chaos.nemesis import NEMESES
from faults import Node, Schedule, ScheduleError
from trainer.runspec import RunSpec

from .test_chaos_checkers import history_for, training, view


def schedule(*faults: dict, learners: int = 3) -> Schedule:
    return Schedule.from_dict({"seed": 1, "learners": learners, "faults": list(faults)})


def node(at: float = 5, duration: float = 10, target: str = "node-of:learner-2", mode: str = "kill", **more) -> dict:
    return {"kind": "node", "at": at, "duration": duration, "target": target, "mode": mode, **more}


# ----------------------------------------------------------------------------- vocabulary
def test_a_node_is_named_by_hostname_or_by_the_unit_it_runs():
    s = schedule(node(target="islands-node-3"), node(at=20, target="node-of:syncer", mode="partition"))
    assert s.faults == (Node(5.0, 10.0, "islands-node-3", "kill"), Node(20.0, 10.0, "node-of:syncer", "partition"))
    assert s.targets() == ("syncer",)  # a hostname names no process
    assert Schedule.loads(s.dumps()) == s


@pytest.mark.parametrize("changes,message", [
    ({"target": "node-of:learner-9"}, "faults[0].target: node-of:learner-9: no such target 'learner-9'"),
    ({"target": "node-of:learner-1/rank-0"}, "name node-of:learner-1 instead"),
    ({"target": "two words"}, "faults[0].target: invalid node 'two words'"),
    ({"mode": "melt"}, "faults[0].mode: unknown mode 'melt' (expected kill or partition)"),
    ({"duration": 0}, "faults[0].duration: must be > 0"),
    ({"mode": "partition", "rebalance": True}, "faults[0].rebalance: only a node that was killed had its units moved"),
])
def test_a_bad_node_fault_is_refused_naming_the_field(changes, message):
    with pytest.raises(ScheduleError) as info:
        schedule(node(**changes))
    assert message in str(info.value)


def test_two_faults_on_one_node_may_not_overlap():
    with pytest.raises(ScheduleError, match="faults\\[1\\]: overlaps faults\\[0\\] on node islands-node-2"):
        schedule(node(target="islands-node-2"), node(at=8, target="islands-node-2", mode="partition"))
    schedule(node(target="islands-node-2"), node(at=15, target="islands-node-2"))  # one after the other


# ----------------------------------------------------------------------------- refusal
def test_a_backend_on_one_machine_refuses_a_node_fault_by_name(tmp_path: Path):
    cluster = LocalCluster(tmp_path, RunSpec(learners=3))
    problems = cluster.unsupported(schedule(node(), {"kind": "kill", "at": 1, "duration": 1, "target": "learner-1"}))
    assert problems == ["faults[0].kind: 'node' faults need a cluster across several hosts, the swarm backend: "
                        "the local backend runs every process on this machine"]


def test_the_simulator_refuses_a_node_fault_by_name():
    from chaos.sim.world import unsupported
    assert any("faults[0]" in p and "'node'" in p for p in unsupported(schedule(node())))


# ----------------------------------------------------------------------------- the nemesis
class FakeNodes:
    """Records what the node nemesis asks of a backend."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def resolve_node(self, target: str) -> str:
        return "islands-node-3" if target == "node-of:learner-2" else target

    def units_on(self, node: str) -> list[str]:
        return ["learner-2", "learner-3"] if node == "islands-node-3" else []

    def node_off(self, node: str) -> str:
        self.calls.append(("off", node))
        return f"powered off {node}"

    def node_on(self, node: str) -> str:
        self.calls.append(("on", node))
        return f"powered on {node}"

    def rebalance(self, units: list[str]) -> str:
        self.calls.append(("rebalance", tuple(units)))
        return "rebalanced: " + ", ".join(f"{u} on islands-node-3" for u in units)

    def node_cut(self, node: str, units: list[str]) -> str:
        self.calls.append(("cut", node, tuple(units)))
        return f"cut {node} off the overlay networks"

    def node_join(self, node: str, units: list[str]) -> str:
        self.calls.append(("join", node, tuple(units)))
        return f"joined {node}"


def test_the_nemesis_fails_the_node_its_target_names_and_says_what_it_ran():
    nemesis, cluster = NEMESES["node"], FakeNodes()
    kill = Node(5.0, 10.0, "node-of:learner-2", "kill")
    assert nemesis.start(cluster, kill) == "powered off islands-node-3 (it ran learner-2, learner-3)"
    assert nemesis.affected(cluster, kill) == ["learner-2", "learner-3"]
    assert nemesis.stop(cluster, kill) == "powered on islands-node-3"
    cut = Node(30.0, 5.0, "islands-node-1", "partition")
    assert nemesis.start(cluster, cut) == "cut islands-node-1 off the overlay networks (it ran no unit)"
    nemesis.stop(cluster, cut)
    assert cluster.calls == [("off", "islands-node-3"), ("on", "islands-node-3"),
                             ("cut", "islands-node-1", ()), ("join", "islands-node-1", ())]
    assert nemesis.impairs_learner


def test_a_rebalance_starts_the_moved_units_again_once_the_node_is_back():
    nemesis, cluster = NEMESES["node"], FakeNodes()
    kill = Node(5.0, 10.0, "node-of:learner-2", "kill", rebalance=True)
    nemesis.start(cluster, kill)
    assert nemesis.stop(cluster, kill) == ("powered on islands-node-3; rebalanced: learner-2 on islands-node-3, "
                                           "learner-3 on islands-node-3")
    assert cluster.calls[-2:] == [("on", "islands-node-3"), ("rebalance", ("learner-2", "learner-3"))]


# ----------------------------------------------------------------------------- what the checks read
def node_history(units: list[str], start: float = 20.0, stop: float = 30.0, back_after: float = 8.0) -> list[dict]:
    """A node kill from `start` to `stop` that took `units` down; the node ready `back_after` s
    after its power-on was issued."""
    fault = {"kind": "node", "at": start, "duration": stop - start, "target": "islands-node-3", "mode": "kill"}
    history = history_for([], duration=80.0)
    t0 = next(h["t"] for h in history if h.get("event") == "begin")
    history += [
        {"t": t0 + start, "event": "start", "index": 0, "kind": "node", "fault": fault, "planned": start, "at": start,
         "took": 0.05, "did": "powered off islands-node-3", "ok": True, "error": None, "units": units},
        {"t": t0 + stop, "event": "stop", "index": 0, "kind": "node", "fault": fault, "planned": stop, "at": stop,
         "took": back_after, "did": "powered on islands-node-3", "ok": True, "error": None}]
    return sorted(history, key=lambda h: h["t"])


def test_a_node_faults_window_names_the_units_it_took_down():
    history = node_history(["learner-1"])
    start = next(h for h in history if h.get("event") == "start")
    assert fault_targets(start) == ["learner-1"]
    assert fault_targets({**start, "units": []}) == ["islands-node-3"]  # it ran none: it hits no learner
    # Down until the node is back, not until its power-on was issued; not late for that.
    (timing,) = timings(history, tolerance=2.0)
    assert timing.in_force == (20.05, 38.0) and not timing.problems


def test_self_heal_judges_the_learners_that_were_on_the_node():
    events = training(80.0, absent={1: [(20.0, 75.0)]})  # learner-1 never contributes again
    judged = check_self_heal(view(events, node_history(["learner-1"])))
    assert judged.status == FAIL and judged.evidence["failed"][0]["learner"] == 1
    elsewhere = check_self_heal(view(events, node_history(["learner-2"])))
    assert elsewhere.status != FAIL or all(r["learner"] != 1 for r in elsewhere.evidence["failed"])
    healthy = training(80.0, absent={1: [(20.0, 32.0)]})
    assert check_self_heal(view(healthy, node_history(["learner-1"]))).status == PASS
