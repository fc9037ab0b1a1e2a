"""The disk, power_loss and clock kinds: fields, checks, file form, and how they share a process."""

from __future__ import annotations

import pytest

import faults
from faults.kinds import KINDS, Clock, Disk, Kill, Pause, PowerLoss, ProcessFault
from faults.schedule import Schedule, ScheduleError, stays_down

DISK_WHY = "disk faults act on a process's durable state, and only the syncer keeps any (its --state-dir)"
POWER_WHY = (
    "power_loss acts on a process's durable state, and only the syncer keeps any (a learner's power loss is a kill)"
)


def clock_why(unit: str, target: str) -> str:
    return (
        f"a clock belongs to a host (a unit's container), not to one of its ranks: name {unit!r} instead of {target!r}"
    )


# --------------------------------------------------------------------------- the dataclasses


def test_new_kinds_are_process_faults_in_kinds_and_exported() -> None:
    assert [KINDS[k] for k in ("disk", "power_loss", "clock")] == [Disk, PowerLoss, Clock]
    for cls in (Disk, PowerLoss, Clock):
        assert issubclass(cls, ProcessFault)
        assert getattr(faults, cls.__name__) is cls and cls.__name__ in faults.__all__
    assert (Kill.resource, Pause.resource, PowerLoss.resource, Disk.resource, Clock.resource) == (
        "process", "process", "process", "disk", "clock",
    )  # fmt: skip


def test_fields_and_defaults() -> None:
    assert Disk.field_names() == ("at", "duration", "target", "mode", "latency_ms")
    assert Disk.required_fields() == ("at", "duration", "target", "mode")
    assert PowerLoss.field_names() == ("at", "duration", "target", "restart")
    assert PowerLoss.required_fields() == ("at", "duration", "target")
    assert Clock.field_names() == ("at", "duration", "target", "mode", "offset_s", "rate")
    assert Clock.required_fields() == ("at", "duration", "target", "mode")
    assert Disk(0, 1, "syncer", "slow").latency_ms == 50
    assert PowerLoss(0, 1, "syncer").restart is True
    drift = Clock(0, 1, "learner-1", "drift", rate=2)
    assert (drift.offset_s, Clock(0, 1, "syncer", "skew", 5).rate) == (0, 1.0)


def test_clock_docstring_says_only_the_wall_clock_changes() -> None:
    doc = " ".join((Clock.__doc__ or "").split())
    assert "monotonic clock is not changed" in doc and "wall clock" in doc


def test_to_dict_leaves_defaults_out() -> None:
    assert Disk(1, 2, "syncer", "slow").to_dict() == {
        "kind": "disk", "at": 1, "duration": 2, "target": "syncer", "mode": "slow",
    }  # fmt: skip
    assert list(Disk(1, 2, "syncer", "slow", 200.0).to_dict().items())[-2:] == [("mode", "slow"), ("latency_ms", 200)]
    assert PowerLoss(3, 4, "syncer").to_dict() == {"kind": "power_loss", "at": 3, "duration": 4, "target": "syncer"}
    assert PowerLoss(3, 4, "syncer", restart=False).to_dict()["restart"] is False
    assert list(Clock(0, 9, "learner-2", "jump", -3600.0).to_dict().items()) == [
        ("kind", "clock"), ("at", 0), ("duration", 9), ("target", "learner-2"), ("mode", "jump"), ("offset_s", -3600),
    ]  # fmt: skip
    assert Clock(0, 9, "syncer", "drift", rate=0.5).to_dict() == {
        "kind": "clock", "at": 0, "duration": 9, "target": "syncer", "mode": "drift", "rate": 0.5,
    }  # fmt: skip


# --------------------------------------------------------------------------- field checks


def test_valid_faults_have_no_problems() -> None:
    good = [
        Disk(0, 1, "syncer", "full"),
        Disk(0, 1, "syncer", "eio", 50),  # the default latency, written out, is fine with any mode
        Disk(0, 1, "syncer", "slow", 1),
        Disk(0, 1, "syncer", "slow", 10_000),
        PowerLoss(0, 1, "syncer", restart=False),
        Clock(0, 1, "syncer", "skew", 1),
        Clock(0, 1, "learner-3", "jump", -315_360_000),
        Clock(0, 1, "learner-1", "skew", 0.25),
        Clock(0, 1, "learner-1", "drift", rate=0.001),
        Clock(0, 1, "learner-1", "drift", rate=1000),
    ]
    for fault in good:
        assert fault.problems(learners=3) == [], fault


@pytest.mark.parametrize(
    "fault, problems",
    [
        (Disk(0, 1, "learner-1", "full"), [("target", DISK_WHY)]),
        (Disk(0, 1, "learner-1/rank-0", "full"), [("target", DISK_WHY)]),
        (Disk(0, 1, "worker-1", "full"), [
            ("target", "invalid target 'worker-1' (expected syncer, learner-N or learner-N/rank-R)"),
        ]),
        (Disk(0, 1, "syncer", "broken"), [("mode", "unknown mode 'broken' (expected full, eio or slow)")]),
        (Disk(0, 1, "syncer", None), [("mode", "expected a string, got null")]),  # type: ignore[arg-type]
        (Disk(0, 1, "syncer", "slow", 0), [("latency_ms", "must be > 0 and <= 10000")]),
        (Disk(0, 1, "syncer", "slow", 10_001), [("latency_ms", "must be > 0 and <= 10000")]),
        (Disk(0, 1, "syncer", "slow", 2.5), [("latency_ms", "must be a whole number")]),
        (Disk(0, 1, "syncer", "full", 200), [
            ("latency_ms", "latency_ms is for mode 'slow'; mode 'full' adds no latency, so leave it out"),
        ]),
        (Disk(0, 1, "syncer", "full", 0), [("latency_ms", "must be > 0 and <= 10000")]),  # fields first
        (PowerLoss(0, 1, "learner-2"), [("target", POWER_WHY)]),
        (PowerLoss(0, 1, "syncer", restart="no"), [  # type: ignore[arg-type]
            ("restart", "expected true or false, got 'no'"),
        ]),
        (Clock(0, 1, "learner-2/rank-1", "skew", 1), [("target", clock_why("learner-2", "learner-2/rank-1"))]),
        (Clock(0, 1, "learner-4", "skew", 1), [("target", "no such target 'learner-4' (learners: 1..3)")]),
        (Clock(0, 1, "syncer", "warp", 1), [("mode", "unknown mode 'warp' (expected skew, jump or drift)")]),
        (Clock(0, 1, "syncer", "skew", 315_360_001), [("offset_s", "must be >= -315360000 and <= 315360000")]),
        (Clock(0, 1, "syncer", "skew", "1h"), [("offset_s", "expected a number, got '1h'")]),  # type: ignore[arg-type]
        (Clock(0, 1, "syncer", "drift", rate=0), [("rate", "must be > 0 and <= 1000")]),
        (Clock(0, 1, "syncer", "drift", rate=1001), [("rate", "must be > 0 and <= 1000")]),
        (Clock(0, 1, "syncer", "skew"), [("offset_s", "mode 'skew' needs a non-zero offset_s")]),
        (Clock(0, 1, "syncer", "jump", 0, 2), [
            ("offset_s", "mode 'jump' needs a non-zero offset_s"),
            ("rate", "rate is for mode 'drift'; leave it out (1) for mode 'jump'"),
        ]),
        (Clock(0, 1, "syncer", "skew", 60, 0.5), [
            ("rate", "rate is for mode 'drift'; leave it out (1) for mode 'skew'"),
        ]),
        (Clock(0, 1, "syncer", "drift"), [
            ("rate", "mode 'drift' needs a rate other than 1 (e.g. 2: twice true speed)"),
        ]),
        (Clock(0, 1, "syncer", "drift", 5, 2), [
            ("offset_s", "mode 'drift' accumulates its offset from rate; leave offset_s out (0)"),
        ]),
    ],
)  # fmt: skip
def test_problems_name_the_field(fault: ProcessFault, problems: list[tuple[str, str]]) -> None:
    assert fault.problems(learners=3) == problems


# --------------------------------------------------------------------------- files


def errors_of(*entries: str, **kw: object) -> list[str]:
    with pytest.raises(ScheduleError) as err:
        text = "seed: 1\nlearners: 3\nfaults:\n" + "".join(f"- {e}\n" for e in entries)
        Schedule.loads(text, **kw)  # type: ignore[arg-type]
    return err.value.errors


ALL_NEW = Schedule(
    seed=3,
    learners=2,
    faults=(
        Disk(0, 10, "syncer", "slow", latency_ms=200),
        PowerLoss(4, 2, "syncer"),
        Disk(12, 3, "syncer", "eio"),
        Clock(0, 30, "learner-1", "jump", -3600),
        Clock(1, 5, "syncer", "drift", rate=0.5),
        Clock(6, 5, "syncer", "skew", 60.5),
        Kill(5, 1, "learner-1"),
        PowerLoss(20, 1, "syncer", restart=False),
    ),
)


def test_examples_of_each_kind_load() -> None:
    text = (
        "seed: 3\nlearners: 2\nfaults:\n"
        "- {kind: disk, at: 0, duration: 10, target: syncer, mode: slow, latency_ms: 200}\n"
        "- {kind: power_loss, at: 4, duration: 2, target: syncer}\n"
        "- {kind: disk, at: 12, duration: 3, target: syncer, mode: eio}\n"
        "- {kind: clock, at: 0, duration: 30, target: learner-1, mode: jump, offset_s: -3600}\n"
        "- {kind: clock, at: 1, duration: 5, target: syncer, mode: drift, rate: 0.5}\n"
        "- {kind: clock, at: 6, duration: 5, target: syncer, mode: skew, offset_s: 60.5}\n"
        "- {kind: kill, at: 5, duration: 1, target: learner-1}\n"
        "- {kind: power_loss, at: 20, duration: 1, target: syncer, restart: false}\n"
    )
    assert Schedule.loads(text) == ALL_NEW
    assert ALL_NEW.dumps() == text


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_round_trip(fmt: str) -> None:
    text = ALL_NEW.validate().dumps(fmt)
    assert Schedule.loads(text, fmt) == ALL_NEW
    assert Schedule.loads(text, fmt).dumps(fmt) == text


@pytest.mark.parametrize(
    "entry, error",
    [
        ("{kind: disk, at: 1, duration: 1, target: syncer}", "faults[0].mode: missing required field"),
        ("{kind: disk, at: 1, duration: 1, target: syncer, mode: slow, latency_ms: 0.5}",
         "faults[0].latency_ms: must be a whole number"),
        ("{kind: disk, at: 1, duration: 1, target: syncer, mode: eio, latency_ms: 10}",
         "faults[0].latency_ms: latency_ms is for mode 'slow'; mode 'eio' adds no latency, so leave it out"),
        ("{kind: disk, at: 1, duration: 1, target: learner-1, mode: full}", f"faults[0].target: {DISK_WHY}"),
        ("{kind: disk, at: 1, duration: 1, target: syncer, mode: full, offset_s: 1}",
         "faults[0]: unknown field 'offset_s'"),
        ("{kind: power_loss, at: 1, duration: 1, target: learner-3}", f"faults[0].target: {POWER_WHY}"),
        ("{kind: power_loss, at: 1, duration: 0, target: syncer}", "faults[0].duration: must be > 0"),
        ("{kind: clock, at: 1, duration: 1, target: learner-1/rank-0, mode: skew, offset_s: 1}",
         f"faults[0].target: {clock_why('learner-1', 'learner-1/rank-0')}"),
        ("{kind: clock, at: 1, duration: 1, target: learner-1, mode: skew}",
         "faults[0].offset_s: mode 'skew' needs a non-zero offset_s"),
        ("{kind: clock, at: 1, duration: 1, target: learner-1, mode: drift, rate: 1}",
         "faults[0].rate: mode 'drift' needs a rate other than 1 (e.g. 2: twice true speed)"),
        ("{kind: clock, at: 1, duration: 1, target: learner-1, mode: jump, offset_s: 1e3}",
         "faults[0].offset_s: expected a number, got '1e3' (a string)"),
        ("{kind: clock, at: 1, duration: 1, target: learner-1, offset_s: 1}", "faults[0].mode: missing required field"),
    ],
)  # fmt: skip
def test_each_bad_entry_gets_its_precise_error(entry: str, error: str) -> None:
    assert errors_of(entry) == [error]


def test_a_clock_rank_target_is_refused_once_with_ranks() -> None:
    # the field check names the unit; the rank-count check does not add a second message
    entry = "{kind: clock, at: 1, duration: 1, target: learner-1/rank-1, mode: skew, offset_s: 1}"
    assert errors_of(entry, ranks=2) == [f"faults[0].target: {clock_why('learner-1', 'learner-1/rank-1')}"]


# --------------------------------------------------------------------------- sharing a process


def test_power_loss_and_kill_of_the_syncer_clash() -> None:
    assert errors_of(
        "{kind: kill, at: 8, duration: 4, target: syncer}",
        "{kind: power_loss, at: 10, duration: 4, target: syncer}",
    ) == ["faults[1]: overlaps faults[0] on syncer (8-12 s and 10-14 s); a process can have only one fault at a time"]
    assert errors_of(
        "{kind: power_loss, at: 0, duration: 5, target: syncer}",
        "{kind: pause, at: 4, duration: 1, target: syncer}",
        "{kind: power_loss, at: 4.5, duration: 1, target: syncer}",
    ) == [
        "faults[1]: overlaps faults[0] on syncer (0-5 s and 4-5 s); a process can have only one fault at a time",
        "faults[2]: overlaps faults[0] on syncer (0-5 s and 4.5-5.5 s); a process can have only one fault at a time",
        "faults[2]: overlaps faults[1] on syncer (4-5 s and 4.5-5.5 s); a process can have only one fault at a time",
    ]


def test_power_loss_without_restart_keeps_the_syncer_down() -> None:
    message = (
        "faults[1]: overlaps faults[0] on syncer: faults[0] cuts the power of syncer at 2 s with restart: false,"
        " so it stays down until the final heal"
    )
    for later in (
        "{kind: kill, at: 30, duration: 1, target: syncer}",
        "{kind: disk, at: 30, duration: 1, target: syncer, mode: full}",
        "{kind: clock, at: 30, duration: 1, target: syncer, mode: skew, offset_s: 1}",
        "{kind: power_loss, at: 30, duration: 1, target: syncer}",
    ):
        assert errors_of("{kind: power_loss, at: 2, duration: 1, target: syncer, restart: false}", later) == [message]
    # a disk fault in force when the syncer goes down for good targets it while it is down
    assert errors_of(
        "{kind: disk, at: 0, duration: 10, target: syncer, mode: eio}",
        "{kind: kill, at: 5, duration: 1, target: syncer, restart: false}",
    ) == [
        "faults[1]: overlaps faults[0] on syncer: faults[1] kills syncer at 5 s with restart: false,"
        " so it stays down until the final heal"
    ]
    # but one that ends before is fine, and the learners are untouched
    Schedule.loads(
        "seed: 1\nfaults:\n- {kind: disk, at: 0, duration: 2, target: syncer, mode: eio}\n"
        "- {kind: power_loss, at: 2, duration: 1, target: syncer, restart: false}\n"
        "- {kind: clock, at: 3, duration: 1, target: learner-1, mode: jump, offset_s: 60}\n"
    )


def test_two_disk_faults_may_not_overlap() -> None:
    assert errors_of(
        "{kind: disk, at: 0, duration: 5, target: syncer, mode: full}",
        "{kind: disk, at: 4, duration: 5, target: syncer, mode: slow}",
    ) == ["faults[1]: overlaps faults[0] on syncer's disk (0-5 s and 4-9 s); a disk has only one fault mode at a time"]


def test_two_clock_faults_on_one_target_may_not_overlap() -> None:
    assert errors_of(
        "{kind: clock, at: 0, duration: 5, target: learner-2, mode: skew, offset_s: 1}",
        "{kind: clock, at: 1, duration: 1, target: learner-2, mode: drift, rate: 2}",
    ) == [
        "faults[1]: overlaps faults[0] on learner-2's clock (0-5 s and 1-2 s);"
        " a clock can have only one fault at a time"
    ]


def test_different_parts_of_one_process_may_overlap() -> None:
    s = Schedule.loads(
        "seed: 1\nlearners: 2\nfaults:\n"
        "- {kind: disk, at: 0, duration: 20, target: syncer, mode: slow}\n"
        "- {kind: power_loss, at: 2, duration: 2, target: syncer}\n"
        "- {kind: kill, at: 5, duration: 2, target: syncer}\n"
        "- {kind: pause, at: 8, duration: 1, target: syncer}\n"
        "- {kind: clock, at: 0, duration: 20, target: syncer, mode: skew, offset_s: -60}\n"
        "- {kind: clock, at: 0, duration: 9, target: learner-1, mode: jump, offset_s: 3600}\n"
        "- {kind: kill, at: 1, duration: 2, target: learner-1}\n"
        "- {kind: disk, at: 20, duration: 1, target: syncer, mode: full}\n"  # back to back on the disk
        "- {kind: clock, at: 9, duration: 1, target: learner-1, mode: drift, rate: 2}\n"  # and on the clock
    )
    # overlapping parts are not ordered (the power_loss must not wait for the disk's end);
    # one process's faults that follow one another still are
    assert s.predecessors() == {
        2: [1],  # the kill after the power_loss, not after the disk or clock faults it overlaps
        3: [1, 2],
        7: [0, 4, 1, 2, 3],  # everything on the syncer before it, back to back included
        8: [5, 6],
    }


def test_events_and_targets() -> None:
    assert [stays_down(f) for f in ALL_NEW.faults] == [False] * 7 + [True]
    assert ALL_NEW.targets() == ("syncer", "learner-1")
    stops = [e.index for e in ALL_NEW.events() if e.action == "stop"]
    assert sorted(stops) == [0, 1, 2, 3, 4, 5, 6]  # clock jump and drift stop too; power_loss without restart not
    assert ALL_NEW.horizon == 30
