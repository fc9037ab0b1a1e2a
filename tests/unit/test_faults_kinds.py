"""Fault kinds: target grammar, field checks, file form and Toxiproxy toxic specs."""

from __future__ import annotations

import pytest

from faults.kinds import (
    KINDS,
    LINK_KINDS,
    PROCESS_KINDS,
    Bandwidth,
    Kill,
    Latency,
    LimitData,
    Partition,
    Pause,
    ResetPeer,
    Slicer,
    SlowClose,
    Target,
    Timeout,
    is_link_target,
    parse_target,
    target_sort_key,
    targets_clash,
)


def test_kind_strings_are_stable() -> None:
    assert list(KINDS) == [
        "kill", "pause", "partition", "latency", "bandwidth",
        "reset_peer", "slow_close", "slicer", "limit_data", "timeout", "disk", "power_loss", "clock", "node",
    ]  # fmt: skip
    assert PROCESS_KINDS == ("kill", "pause", "disk", "power_loss", "clock")
    assert LINK_KINDS == ("latency", "bandwidth", "reset_peer", "slow_close", "slicer", "limit_data", "timeout")
    assert Kill(0, 1, "syncer").kind == "kill"


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("syncer", Target(None)),
        ("learner-1", Target(1)),
        ("learner-12", Target(12)),
        ("learner-3/rank-0", Target(3, 0)),
        ("learner-3/rank-15", Target(3, 15)),
    ],
)
def test_target_grammar_accepts(text: str, parsed: Target) -> None:
    assert parse_target(text) == parsed
    assert str(parsed) == text


@pytest.mark.parametrize(
    "text",
    ["learner-0", "learner-01", "learner-", "learner-1/rank-", "learner-1/rank-01", "learner-1/rank--1",
     "Learner-1", "syncer-1", "learner-1 ", "learner-1\n", "syncer/rank-0", "", "learner-１"],
)  # fmt: skip
def test_target_grammar_rejects(text: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_target(text)
    assert str(err.value) == f"invalid target {text!r} (expected syncer, learner-N or learner-N/rank-R)"


def test_link_targets_and_clashes() -> None:
    assert is_link_target("learner-2")
    assert not is_link_target("syncer")
    assert not is_link_target("learner-2/rank-0")
    assert not is_link_target(2)
    assert targets_clash("learner-1", "learner-1")
    assert targets_clash("learner-1", "learner-1/rank-3")
    assert targets_clash("learner-1/rank-3", "learner-1")
    assert not targets_clash("learner-1/rank-0", "learner-1/rank-1")
    assert not targets_clash("learner-1", "learner-11")
    assert not targets_clash("syncer", "learner-1")
    names = ["learner-10", "learner-2/rank-1", "syncer", "learner-2", "learner-2/rank-0", "learner-1"]
    assert sorted(names, key=target_sort_key) == [
        "syncer", "learner-1", "learner-2", "learner-2/rank-0", "learner-2/rank-1", "learner-10",
    ]  # fmt: skip


def test_fields_and_defaults() -> None:
    assert Kill.field_names() == ("at", "duration", "target", "restart")
    assert Pause.field_names() == ("at", "duration", "target")
    assert Partition.field_names() == ("at", "duration", "targets", "direction", "mode")
    assert Latency.field_names() == ("at", "duration", "target", "latency_ms", "jitter_ms", "direction", "toxicity")
    assert Bandwidth.field_names() == ("at", "duration", "target", "rate_kbps", "direction", "toxicity")
    assert ResetPeer.field_names() == ("at", "duration", "target", "timeout_ms", "direction", "toxicity")
    assert SlowClose.field_names() == ("at", "duration", "target", "delay_ms", "direction", "toxicity")
    assert Slicer.field_names() == (
        "at", "duration", "target", "average_size", "size_variation", "delay_us", "direction", "toxicity",
    )  # fmt: skip
    assert LimitData.field_names() == ("at", "duration", "target", "bytes", "direction", "toxicity")
    assert Timeout.field_names() == ("at", "duration", "target", "timeout_ms", "direction", "toxicity")
    assert Latency.required_fields() == ("at", "duration", "target", "latency_ms")
    assert Timeout.required_fields() == ("at", "duration", "target")
    k = Kill(5, 3, "learner-1")
    assert k.restart is True
    assert Latency(0, 1, "learner-1", 10).direction == "both"
    assert Latency(0, 1, "learner-1", 10).toxicity == 1.0
    assert Partition(0, 1, ["learner-1"]).targets == ("learner-1",)  # lists become tuples
    assert Partition(0, 1, ("learner-1",)).mode == "blackhole"


def test_faults_are_frozen_and_hashable() -> None:
    k = Kill(5, 3, "learner-1")
    with pytest.raises(AttributeError):
        k.at = 1  # type: ignore[misc]
    assert len({k, Kill(5.0, 3.0, "learner-1"), Partition(0, 1, ["learner-2"])}) == 2


def test_end_is_rounded_so_tenths_add_up() -> None:
    assert Kill(5, 3, "learner-1").end == 8
    assert Kill(0.1, 0.2, "learner-1").end == 0.3  # not 0.30000000000000004
    assert Kill(8, 4, "learner-1").span == "8-12 s"
    assert Kill(0.5, 1.25, "learner-1").span == "0.5-1.75 s"


def test_to_dict_order_and_defaults() -> None:
    assert Kill(8, 4, "learner-1").to_dict() == {"kind": "kill", "at": 8, "duration": 4, "target": "learner-1"}
    assert list(Kill(8.0, 4.5, "learner-1", restart=False).to_dict().items()) == [
        ("kind", "kill"), ("at", 8), ("duration", 4.5), ("target", "learner-1"), ("restart", False),
    ]  # fmt: skip
    assert list(Latency(1, 2, "learner-3", 150.0, direction="upstream", toxicity=0.5).to_dict()) == [
        "kind", "at", "duration", "target", "latency_ms", "direction", "toxicity",
    ]  # fmt: skip
    assert Partition(1, 2, ("learner-1", "learner-2"), mode="refuse").to_dict() == {
        "kind": "partition", "at": 1, "duration": 2, "targets": ["learner-1", "learner-2"], "mode": "refuse",
    }  # fmt: skip


# --------------------------------------------------------------------------- field checks


def test_valid_faults_have_no_problems() -> None:
    faults = [
        Kill(0, 0.1, "learner-1/rank-0", restart=False),
        Pause(3.5, 1, "syncer"),
        Partition(1, 2, ("learner-1", "learner-2"), direction="upstream"),
        Partition(1, 2, ("learner-1",), mode="refuse"),
        Latency(0, 1, "learner-1", 0, jitter_ms=0),
        Bandwidth(0, 1, "learner-1", 1),
        ResetPeer(0, 1, "learner-1"),
        SlowClose(0, 1, "learner-1", 0),
        Slicer(0, 1, "learner-1", 1, 0, 0),
        LimitData(0, 1, "learner-1", 0),
        Timeout(0, 1, "learner-1", toxicity=0.01),
    ]
    for fault in faults:
        assert fault.problems(learners=2) == [], fault


@pytest.mark.parametrize(
    "fault, problems",
    [
        (Kill(-1, 0, "learner-1"), [("at", "must be >= 0"), ("duration", "must be > 0")]),
        (Kill(True, "3", None), [  # type: ignore[arg-type]
            ("at", "expected a number, got true"),
            ("duration", "expected a number, got '3' (a string)"),
            ("target", "expected a string, got null"),
        ]),
        (Kill(0, float("inf"), "learner-1", restart="yes"), [  # type: ignore[arg-type]
            ("duration", "must be a finite number, got inf"),
            ("restart", "expected true or false, got 'yes'"),
        ]),
        (Pause(0, float("nan"), "learner-4"), [
            ("duration", "must be a finite number, got nan"),
            ("target", "no such target 'learner-4' (learners: 1..3)"),
        ]),
        (Pause(0, 1, "learner-4/rank-0"), [("target", "no such target 'learner-4/rank-0' (learners: 1..3)")]),
        (Latency(0, 1, "syncer", "fast"), [  # type: ignore[arg-type]
            ("target", "invalid link target 'syncer' (expected learner-N, the link between learner N and the syncer)"),
            ("latency_ms", "expected a number, got 'fast'"),
        ]),
        (Latency(0, 1, "learner-1", 1.5, -1, "up", 0), [
            ("latency_ms", "must be a whole number"),
            ("jitter_ms", "must be >= 0"),
            ("direction", "unknown direction 'up' (expected both, upstream or downstream)"),
            ("toxicity", "must be > 0 and <= 1"),
        ]),
        (Bandwidth(0, 1, "learner-1", 0, toxicity=1.5), [
            ("rate_kbps", "must be > 0"),
            ("toxicity", "must be > 0 and <= 1"),
        ]),
        (Slicer(0, 1, "learner-1", 0, -1, 1.0), [  # type: ignore[arg-type]
            ("average_size", "must be >= 1"),
            ("size_variation", "must be >= 0"),
            ("delay_us", "expected an integer, got 1.0"),
        ]),
        (Slicer(0, 1, "learner-1", 100, 100), [("size_variation", "must be < average_size (100)")]),
        (LimitData(0, 1, "learner-1", [1]), [("bytes", "expected an integer, got a list")]),  # type: ignore[arg-type]
        (Partition(0, 1, "learner-1"), [  # type: ignore[arg-type]
            ("targets", "expected a list of learner names, got 'learner-1'"),
        ]),
        (Partition(0, 1, ()), [("targets", "must name at least one learner")]),
        (Partition(0, 1, ("learner-2", "syncer", "learner-2", "learner-9")), [
            ("targets[1]", "invalid link target 'syncer' (expected learner-N, the link between learner N and the syncer)"),
            ("targets", "duplicate target 'learner-2'"),
            ("targets[3]", "no such target 'learner-9' (learners: 1..3)"),
        ]),
        (Partition(0, 1, ("learner-1",), mode="drop"), [
            ("mode", "unknown mode 'drop' (expected blackhole, refuse or network)"),
        ]),
        (Partition(0, 1, ("learner-1",), direction="downstream", mode="refuse"), [
            ("direction", "mode 'refuse' cuts the whole link, so direction must be 'both', got 'downstream'"),
        ]),
    ],
)  # fmt: skip
def test_problems_name_the_field(fault: object, problems: list[tuple[str, str]]) -> None:
    assert fault.problems(learners=3) == problems  # type: ignore[attr-defined]


def test_learner_bound_only_when_known() -> None:
    assert Kill(0, 1, "learner-99").problems() == []
    assert Kill(0, 1, "learner-2").problems(learners=1) == [("target", "no such target 'learner-2' (learners: 1)")]


def test_check_fields_reports_missing_in_field_order() -> None:
    assert Latency.check_fields({"target": "learner-1"}) == [
        ("at", "missing required field"),
        ("duration", "missing required field"),
        ("latency_ms", "missing required field"),
    ]


# --------------------------------------------------------------------------- toxic specs


@pytest.mark.parametrize(
    "fault, toxic_type, attributes",
    [
        (Latency(0, 1, "learner-1", 150.0, 20.0), "latency", {"latency": 150, "jitter": 20}),
        (Bandwidth(0, 1, "learner-1", 512.0), "bandwidth", {"rate": 512}),
        (ResetPeer(0, 1, "learner-1", 100.0), "reset_peer", {"timeout": 100}),
        (SlowClose(0, 1, "learner-1", 250.0), "slow_close", {"delay": 250}),
        (Slicer(0, 1, "learner-1", 64, 8, 10), "slicer", {"average_size": 64, "size_variation": 8, "delay": 10}),
        (LimitData(0, 1, "learner-1", 4096), "limit_data", {"bytes": 4096}),
        (Timeout(0, 1, "learner-1", 3000.0), "timeout", {"timeout": 3000}),
        (Timeout(0, 1, "learner-1"), "timeout", {"timeout": 0}),
    ],
)
def test_toxic_specs_use_toxiproxy_names(fault: object, toxic_type: str, attributes: dict[str, int]) -> None:
    toxics = fault.toxics()  # type: ignore[attr-defined]
    kind = fault.kind  # type: ignore[attr-defined]
    assert toxics == [
        {"name": f"{kind}_upstream", "type": toxic_type, "stream": "upstream", "toxicity": 1.0, "attributes": attributes},
        {"name": f"{kind}_downstream", "type": toxic_type, "stream": "downstream", "toxicity": 1.0, "attributes": attributes},
    ]  # fmt: skip
    for toxic in toxics:
        assert all(type(v) is int for v in toxic["attributes"].values())


def test_one_direction_gives_one_toxic() -> None:
    up = Latency(0, 1, "learner-2", 150, direction="upstream", toxicity=0.5)
    assert up.toxics() == [
        {"name": "latency_upstream", "type": "latency", "stream": "upstream", "toxicity": 0.5,
         "attributes": {"latency": 150, "jitter": 0}},
    ]  # fmt: skip
    down = Bandwidth(0, 1, "learner-2", 10, direction="downstream")
    assert [t["stream"] for t in down.toxics()] == ["downstream"]
    assert up.streams == ("upstream",)
    assert Latency(0, 1, "learner-2", 1).streams == ("upstream", "downstream")


def test_partition_toxics() -> None:
    blackhole = Partition(0, 1, ("learner-1", "learner-2"))
    assert blackhole.toxics() == [
        {"name": "partition_upstream", "type": "timeout", "stream": "upstream", "toxicity": 1.0,
         "attributes": {"timeout": 0}},
        {"name": "partition_downstream", "type": "timeout", "stream": "downstream", "toxicity": 1.0,
         "attributes": {"timeout": 0}},
    ]  # fmt: skip
    assert [t["stream"] for t in Partition(0, 1, ("learner-1",), direction="upstream").toxics()] == ["upstream"]
    assert Partition(0, 1, ("learner-1",), mode="refuse").toxics() == []  # the proxy is disabled instead
    assert Partition(0, 1, ("learner-1",), mode="network").toxics() == []  # the container is disconnected instead
