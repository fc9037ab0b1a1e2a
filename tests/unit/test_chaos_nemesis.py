"""Nemeses: one per fault kind, the calls each makes on a cluster, the history texts they return."""
from __future__ import annotations

from pathlib import Path

import pytest

from chaos.checkers import LEARNER_IMPAIRING
from chaos.client import ToxiproxyClient
from chaos.controller import Controller, History, read_history
from chaos.nemesis import NEMESES, Nemesis, Registry, UnknownKind, nemesis_for, start, stop
from chaos.nemesis.toxic import ToxicNemesis
from chaos.report import KIND_COLORS
from faults import KINDS, LINK_KINDS, Kill, Latency, Partition, Pause, Schedule, Slicer
from faults.kinds import Bandwidth, LimitData, ResetPeer, SlowClose, Timeout
from tests.unit.test_chaos_controller import FakeCluster, NetworkFakeCluster

LINK_FAULTS = [
    Latency(0, 1, "learner-1", 100, 10),
    Bandwidth(0, 1, "learner-1", 64),
    ResetPeer(0, 1, "learner-1"),
    SlowClose(0, 1, "learner-1", 50),
    Slicer(0, 1, "learner-1", 64),
    LimitData(0, 1, "learner-1", 1024),
    Timeout(0, 1, "learner-1"),
]


@pytest.fixture
def cluster(srv) -> FakeCluster:
    return FakeCluster(ToxiproxyClient(srv.url))


class NoteOnRestart(FakeCluster):
    """A backend whose restart says more, as a swarm backend says when its new task ran."""

    def restart(self, target: str) -> str:
        super().restart(target)
        return "task running after 1.2 s"


# ----------------------------------------------------------------- the registry


def test_every_kind_has_a_nemesis() -> None:
    assert list(NEMESES) == list(KINDS), "one nemesis per kind, in KINDS order (the report lists them so)"
    for kind in KINDS:
        assert isinstance(NEMESES[kind], Nemesis) and NEMESES[kind].kind == kind


def test_every_toxic_kind_is_served_by_the_generic_toxic_nemesis() -> None:
    assert {f.kind for f in LINK_FAULTS} == set(LINK_KINDS)
    for kind in LINK_KINDS:
        assert isinstance(NEMESES[kind], ToxicNemesis)


def test_kind_facts_come_from_the_nemeses() -> None:
    # exit: a process gone on its own; a clock fault must change nothing the trainer decides
    assert LEARNER_IMPAIRING == {"kill", "pause", "partition", "exit", "disk", "power_loss", "node"}
    assert KIND_COLORS == {
        "kill": "#d62728", "pause": "#ff7f0e", "partition": "#9467bd", "latency": "#1f77b4",
        "bandwidth": "#17becf", "reset_peer": "#8c564b", "slow_close": "#bcbd22", "slicer": "#e377c2",
        "limit_data": "#7f7f7f", "timeout": "#2ca02c", "disk": "#6b6ecf", "power_loss": "#393b79",
        "clock": "#9edae5", "node": "#7b4173",
    }


def test_an_unknown_kind_is_named() -> None:
    class Explode:
        kind = "explode"

    with pytest.raises(UnknownKind, match="no nemesis for fault kind 'explode' \\(known: kill, pause"):
        nemesis_for(Explode())
    with pytest.raises(UnknownKind, match="'explode'"):
        NEMESES["explode"]
    assert "explode" not in NEMESES


def test_two_nemeses_for_one_kind_are_refused() -> None:
    with pytest.raises(ValueError, match="two nemeses for fault kind 'latency'"):
        Registry(ToxicNemesis("latency"), ToxicNemesis("latency"))


def test_a_kind_without_a_colour_is_left_to_the_report() -> None:
    assert Registry(ToxicNemesis("latency", "#000000"), ToxicNemesis("jam")).colors() == {"latency": "#000000"}


# ----------------------------------------------------------------- process nemeses


def test_kill_then_restart(cluster: FakeCluster) -> None:
    fault = Kill(0, 1, "learner-2")
    assert start(cluster, fault) == "SIGKILL learner-2"
    assert not cluster.is_running("learner-2")
    assert stop(cluster, fault) == "restarted learner-2"
    assert cluster.calls == [("kill", "learner-2"), ("restart", "learner-2")]


def test_kill_without_restart_leaves_the_target_down(cluster: FakeCluster) -> None:
    fault = Kill(0, 1, "syncer", restart=False)
    start(cluster, fault)
    assert stop(cluster, fault) == "left syncer down until the final heal"
    assert cluster.calls == [("kill", "syncer")] and not cluster.is_running("syncer")


def test_a_restart_note_is_recorded(srv) -> None:
    cluster = NoteOnRestart(ToxiproxyClient(srv.url))
    assert stop(cluster, Kill(0, 1, "learner-2")) == "restarted learner-2 (task running after 1.2 s)"


def test_the_restart_note_appears_in_the_history(srv, tmp_path: Path) -> None:
    cluster = NoteOnRestart(ToxiproxyClient(srv.url))
    schedule = Schedule(seed=1, faults=(Kill(at=0.0, duration=0.1, target="learner-2"),)).validate(3)
    Controller(cluster, schedule, History(tmp_path / "h.jsonl")).run(duration=0.2)
    stops = [e for e in read_history(tmp_path / "h.jsonl") if e["event"] == "stop"]
    assert [e["did"] for e in stops] == ["restarted learner-2 (task running after 1.2 s)"]


def test_pause_then_resume(cluster: FakeCluster) -> None:
    fault = Pause(0, 1, "learner-3")
    assert start(cluster, fault) == "SIGSTOP learner-3" and cluster.is_paused("learner-3")
    assert stop(cluster, fault) == "SIGCONT learner-3" and not cluster.is_paused("learner-3")
    assert cluster.calls == [("pause", "learner-3"), ("resume", "learner-3")]


# ----------------------------------------------------------------- partitions


def test_blackhole_partition_adds_then_removes_timeout_toxics(cluster: FakeCluster) -> None:
    fault = Partition(0, 1, ("learner-1", "learner-3"))
    assert start(cluster, fault) == ("added toxics learner-1/partition_upstream, learner-1/partition_downstream, "
                                     "learner-3/partition_upstream, learner-3/partition_downstream")
    toxic = next(t for t in cluster.toxiproxy.toxics("learner-3") if t["name"] == "partition_upstream")
    assert toxic["type"] == "timeout" and toxic["attributes"] == {"timeout": 0}
    assert stop(cluster, fault) == ("removed toxics learner-1/partition_upstream, learner-1/partition_downstream, "
                                    "learner-3/partition_upstream, learner-3/partition_downstream")
    assert all(cluster.toxiproxy.toxics(p) == [] for p in cluster.link_proxies())


def test_a_one_way_blackhole_cuts_one_stream(cluster: FakeCluster) -> None:
    assert start(cluster, Partition(0, 1, ("learner-2",), direction="upstream")) == (
        "added toxics learner-2/partition_upstream")


def test_refuse_partition_disables_then_enables_proxies(cluster: FakeCluster) -> None:
    fault = Partition(0, 1, ("learner-1", "learner-2"), mode="refuse")
    assert start(cluster, fault) == "disabled proxies learner-1, learner-2"
    assert cluster.toxiproxy.proxy("learner-2")["enabled"] is False
    assert stop(cluster, fault) == "enabled proxies learner-1, learner-2"
    assert cluster.toxiproxy.proxy("learner-2")["enabled"] is True
    assert all(cluster.toxiproxy.toxics(p) == [] for p in cluster.link_proxies())


def test_network_partition_disconnects_then_reconnects(srv) -> None:
    cluster = NetworkFakeCluster(ToxiproxyClient(srv.url))
    fault = Partition(0, 1, ("learner-2", "learner-3"), mode="network")
    assert start(cluster, fault) == "disconnected learner-2, learner-3 from their networks"
    assert stop(cluster, fault) == "reconnected learner-2, learner-3 with their aliases"
    assert cluster.calls == [("disconnect", "learner-2"), ("disconnect", "learner-3"),
                             ("connect", "learner-2"), ("connect", "learner-3")]


def test_network_partition_on_a_backend_without_networks_says_so(cluster: FakeCluster) -> None:
    with pytest.raises(ValueError, match="needs the compose backend"):
        start(cluster, Partition(0, 1, ("learner-2",), mode="network"))


def test_an_unknown_partition_mode_is_named(cluster: FakeCluster) -> None:
    with pytest.raises(ValueError, match="unknown partition mode 'flood'"):
        start(cluster, Partition(0, 1, ("learner-2",), mode="flood"))


def test_a_bad_link_target_adds_nothing(cluster: FakeCluster) -> None:
    from chaos.backends.base import UnknownTarget

    with pytest.raises(UnknownTarget, match="learner-9"):
        start(cluster, Partition(0, 1, ("learner-1", "learner-9")))
    assert cluster.toxiproxy.toxics("learner-1") == []


# ----------------------------------------------------------------- toxics


@pytest.mark.parametrize("fault", LINK_FAULTS, ids=lambda f: f.kind)
def test_toxic_faults_add_then_remove_their_toxics(cluster: FakeCluster, fault) -> None:
    names = [f"learner-1/{fault.kind}_upstream", f"learner-1/{fault.kind}_downstream"]
    assert start(cluster, fault) == f"added toxics {', '.join(names)}"
    present = {t["name"]: t for t in cluster.toxiproxy.toxics("learner-1")}
    for spec in fault.toxics():
        assert present[spec["name"]]["type"] == fault.toxic_type
        assert present[spec["name"]]["attributes"] == spec["attributes"]
    assert stop(cluster, fault) == f"removed toxics {', '.join(names)}"
    assert cluster.toxiproxy.toxics("learner-1") == []


def test_removing_toxics_a_heal_already_removed_is_no_error(cluster: FakeCluster) -> None:
    fault = Latency(0, 1, "learner-2", 100, direction="downstream")
    assert start(cluster, fault) == "added toxics learner-2/latency_downstream"
    cluster.heal_all()
    assert stop(cluster, fault) == "removed toxics (none left)"
