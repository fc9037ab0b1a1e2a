"""Schedules: loading, dumping, every kind of error, and the controller helpers."""

from __future__ import annotations

from pathlib import Path

import pytest

from faults.kinds import KINDS, Kill, Latency, LimitData, Partition, Pause, Slicer, Timeout
from faults.schedule import Event, Schedule, ScheduleError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "schedules"
KNOWN = ", ".join(KINDS)

KPL = Schedule(
    seed=7,
    learners=3,
    name="kill-partition-latency",
    faults=(
        Kill(8, 4, "learner-1"),
        Partition(16, 6, ("learner-2",)),
        Latency(24, 10, "learner-3", 150),
    ),
)

MIXED = Schedule(
    seed=42,
    learners=4,
    faults=(
        Latency(2.5, 10, "learner-1", 150, jitter_ms=20, direction="upstream", toxicity=0.5),
        Kill(1, 3, "syncer", restart=False),
        Pause(0.1, 0.2, "learner-2/rank-1"),
        Partition(0.3, 1, ("learner-3", "learner-4"), direction="downstream"),
        Partition(5, 1, ("learner-3",), mode="refuse"),
        Slicer(0, 20, "learner-2", 64, size_variation=8, delay_us=10),
        LimitData(3, 2, "learner-4", 1 << 20),
        Timeout(9, 1, "learner-1"),
    ),
)


def errors_of(text: str, fmt: str = "yaml", **kw: object) -> list[str]:
    with pytest.raises(ScheduleError) as err:
        Schedule.loads(text, fmt, **kw)  # type: ignore[arg-type]
    return err.value.errors


def one_fault(entry: str, learners: int | None = 3) -> list[str]:
    head = f"seed: 1\nlearners: {learners}\n" if learners else "seed: 1\n"
    return errors_of(head + f"faults:\n- {entry}\n")


# --------------------------------------------------------------------------- good files


def test_example_file_loads() -> None:
    assert Schedule.load(EXAMPLES / "kill-partition-latency.yaml") == KPL


def test_quick_example_is_quick() -> None:
    quick = Schedule.load(EXAMPLES / "quick.yaml")
    assert quick.horizon <= 10
    assert quick.validate() is quick


@pytest.mark.parametrize("schedule", [KPL, MIXED, Schedule(seed=0, faults=())], ids=["kpl", "mixed", "empty"])
@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_round_trip_text(schedule: Schedule, fmt: str) -> None:
    schedule.validate()
    text = schedule.dumps(fmt)
    assert Schedule.loads(text, fmt) == schedule
    assert Schedule.loads(text, fmt).dumps(fmt) == text


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json", ".YAML"])
def test_round_trip_files(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"s{suffix}"
    MIXED.dump(path)
    assert Schedule.load(path) == MIXED
    assert Schedule.load(str(path)) == MIXED


def test_json_is_yaml_too(tmp_path: Path) -> None:
    assert Schedule.loads(MIXED.dumps("json"), "yaml") == MIXED


def test_yaml_text_is_readable_and_ordered() -> None:
    assert KPL.dumps() == (
        "name: kill-partition-latency\n"
        "seed: 7\n"
        "learners: 3\n"
        "faults:\n"
        "- {kind: kill, at: 8, duration: 4, target: learner-1}\n"
        "- {kind: partition, at: 16, duration: 6, targets: [learner-2]}\n"
        "- {kind: latency, at: 24, duration: 10, target: learner-3, latency_ms: 150}\n"
    )
    assert Schedule(seed=0, faults=()).dumps() == "seed: 0\nfaults: []\n"


def test_json_text_is_readable_and_ordered() -> None:
    assert KPL.dumps("json") == (
        "{\n"
        '  "name": "kill-partition-latency",\n'
        '  "seed": 7,\n'
        '  "learners": 3,\n'
        '  "faults": [\n'
        '    {"kind": "kill", "at": 8, "duration": 4, "target": "learner-1"},\n'
        '    {"kind": "partition", "at": 16, "duration": 6, "targets": ["learner-2"]},\n'
        '    {"kind": "latency", "at": 24, "duration": 10, "target": "learner-3", "latency_ms": 150}\n'
        "  ]\n"
        "}\n"
    )


def test_loaded_numbers_are_floats() -> None:
    fault = Schedule.loads("seed: 1\nfaults: [{kind: latency, at: 5, duration: 2, target: learner-1, latency_ms: 9}]").faults[0]
    assert type(fault.at) is float and type(fault.duration) is float and type(fault.latency_ms) is float  # type: ignore[union-attr]


def test_awkward_values_round_trip() -> None:
    for name in ["yes", "1.0", "a: b", "", "ünï – code", "two\nlines", "- x", "null", "#x", " sp "]:
        s = Schedule(seed=2**40, name=name, faults=(Kill(1e-7, 1e20, "syncer"), Pause(0.1 + 0.2, 0.7, "learner-1")))
        for fmt in ("yaml", "json"):
            assert Schedule.loads(s.dumps(fmt), fmt) == s, (name, fmt)


def test_yaml_merge_keys_are_not_duplicates() -> None:
    s = Schedule.loads("seed: 1\nfaults:\n- &k {kind: kill, at: 1, duration: 1, target: learner-1}\n- {<<: *k, at: 5}\n")
    assert s.faults == (Kill(1, 1, "learner-1"), Kill(5, 1, "learner-1"))


# --------------------------------------------------------------------------- bad files, one error each


@pytest.mark.parametrize(
    "entry, error",
    [
        ("{kind: explode, at: 1, duration: 1, target: learner-1}",
         f"faults[0].kind: unknown fault kind 'explode' (known: {KNOWN})"),
        ("{at: 1, duration: 1, target: learner-1}", "faults[0].kind: missing required field"),
        ("{kind: 3, at: 1}", "faults[0].kind: expected a string, got 3"),
        ("[kill, 1, 2]", "faults[0]: expected a mapping with a kind, got a list"),
        ("{kind: kill, at: 1, duration: 1, durration: 1, target: learner-1}", "faults[0]: unknown field 'durration'"),
        ("{kind: kill, at: 1, target: learner-1}", "faults[0].duration: missing required field"),
        ("{kind: kill, at: 1, duration: 0, target: learner-1}", "faults[0].duration: must be > 0"),
        ("{kind: kill, at: 1, duration: -2, target: learner-1}", "faults[0].duration: must be > 0"),
        ("{kind: kill, at: -1, duration: 1, target: learner-1}", "faults[0].at: must be >= 0"),
        ("{kind: kill, at: true, duration: 1, target: learner-1}", "faults[0].at: expected a number, got true"),
        ("{kind: kill, at: '5', duration: 1, target: learner-1}", "faults[0].at: expected a number, got '5' (a string)"),
        ("{kind: kill, at: 1e3, duration: 1, target: learner-1}", "faults[0].at: expected a number, got '1e3' (a string)"),
        ("{kind: kill, at: 1, duration: .inf, target: learner-1}", "faults[0].duration: must be a finite number, got inf"),
        ("{kind: kill, at: 1, duration: 1, target: learner-1, restart: maybe}",
         "faults[0].restart: expected true or false, got 'maybe'"),
        ("{kind: kill, at: 1, duration: 1, target: learner-9}",
         "faults[0].target: no such target 'learner-9' (learners: 1..3)"),
        ("{kind: pause, at: 1, duration: 1, target: learner-4/rank-0}",
         "faults[0].target: no such target 'learner-4/rank-0' (learners: 1..3)"),
        ("{kind: pause, at: 1, duration: 1, target: worker-1}",
         "faults[0].target: invalid target 'worker-1' (expected syncer, learner-N or learner-N/rank-R)"),
        ("{kind: pause, at: 1, duration: 1, target: null}", "faults[0].target: expected a string, got null"),
        ("{kind: latency, at: 1, duration: 1, target: learner-1, latency_ms: fast}",
         "faults[0].latency_ms: expected a number, got 'fast'"),
        ("{kind: latency, at: 1, duration: 1, target: learner-1, latency_ms: 1.5}",
         "faults[0].latency_ms: must be a whole number"),
        ("{kind: latency, at: 1, duration: 1, target: syncer, latency_ms: 1}",
         "faults[0].target: invalid link target 'syncer' (expected learner-N, the link between learner N and the syncer)"),
        ("{kind: latency, at: 1, duration: 1, target: learner-1, latency_ms: 1, direction: sideways}",
         "faults[0].direction: unknown direction 'sideways' (expected both, upstream or downstream)"),
        ("{kind: latency, at: 1, duration: 1, target: learner-1, latency_ms: 1, toxicity: 0}",
         "faults[0].toxicity: must be > 0 and <= 1"),
        ("{kind: bandwidth, at: 1, duration: 1, target: learner-1, rate_kbps: 0}", "faults[0].rate_kbps: must be > 0"),
        ("{kind: limit_data, at: 1, duration: 1, target: learner-1, bytes: 1.5}",
         "faults[0].bytes: expected an integer, got 1.5"),
        ("{kind: slicer, at: 1, duration: 1, target: learner-1, average_size: 8, size_variation: 8}",
         "faults[0].size_variation: must be < average_size (8)"),
        ("{kind: partition, at: 1, duration: 1, targets: learner-1}",
         "faults[0].targets: expected a list of learner names, got 'learner-1'"),
        ("{kind: partition, at: 1, duration: 1, targets: []}", "faults[0].targets: must name at least one learner"),
        ("{kind: partition, at: 1, duration: 1, targets: [learner-2, learner-2]}",
         "faults[0].targets: duplicate target 'learner-2'"),
        ("{kind: partition, at: 1, duration: 1, targets: [learner-1, learner-7]}",
         "faults[0].targets[1]: no such target 'learner-7' (learners: 1..3)"),
        ("{kind: partition, at: 1, duration: 1, targets: [learner-1], mode: drop}",
         "faults[0].mode: unknown mode 'drop' (expected blackhole, refuse or network)"),
        ("{kind: partition, at: 1, duration: 1, targets: [learner-1], mode: refuse, direction: upstream}",
         "faults[0].direction: mode 'refuse' cuts the whole link, so direction must be 'both', got 'upstream'"),
        ("{kind: partition, at: 1, duration: 1, targets: [learner-1], mode: network, direction: downstream}",
         "faults[0].direction: mode 'network' cuts the whole link, so direction must be 'both', got 'downstream'"),
    ],
)  # fmt: skip
def test_each_bad_entry_gets_its_precise_error(entry: str, error: str) -> None:
    assert one_fault(entry) == [error]


@pytest.mark.parametrize(
    "text, errors",
    [
        ("faults: []", ["seed: missing required field"]),
        ("seed: seven\nfaults: []", ["seed: expected an integer, got 'seven'"]),
        ("seed: 1.5\nfaults: []", ["seed: expected an integer, got 1.5"]),
        ("seed: false\nfaults: []", ["seed: expected an integer, got false"]),
        ("seed: -1\nfaults: []", ["seed: must be >= 0"]),
        ("seed: 1", ["faults: missing required field"]),
        ("seed: 1\nfaults: {kind: kill}", ["faults: expected a list, got a mapping"]),
        ("seed: 1\nlearners: 0\nfaults: []", ["learners: must be >= 1"]),
        ("seed: 1\nlearners: three\nfaults: []", ["learners: expected an integer, got 'three'"]),
        ("seed: 1\nname: [a]\nfaults: []", ["name: expected a string, got a list"]),
        ("seed: 1\nfualts: []",
         ["unknown top-level field 'fualts' (known: name, seed, learners, faults)", "faults: missing required field"]),
        ("", ["empty schedule (expected a mapping with seed and faults)"]),
        ("- seed: 1", ["expected a mapping with seed and faults at the top level, got a list"]),
    ],
)  # fmt: skip
def test_top_level_errors(text: str, errors: list[str]) -> None:
    assert errors_of(text) == errors


def test_null_optionals_are_absent() -> None:
    assert Schedule.loads("seed: 1\nlearners: null\nname: null\nfaults: []") == Schedule(seed=1, faults=())


def test_all_errors_are_collected_in_file_order() -> None:
    text = (
        "seed: x\n"
        "learners: 2\n"
        "faults:\n"
        "- {kind: kill, at: -1, duration: 0, target: learner-3, restart: 1, colour: red, size: 3}\n"
        "- {kind: explode}\n"
        "- {kind: latency, target: learner-1}\n"
    )
    assert errors_of(text) == [
        "seed: expected an integer, got 'x'",
        "faults[0]: unknown field 'colour'",
        "faults[0]: unknown field 'size'",
        "faults[0].at: must be >= 0",
        "faults[0].duration: must be > 0",
        "faults[0].target: no such target 'learner-3' (learners: 1..2)",
        "faults[0].restart: expected true or false, got 1",
        f"faults[1].kind: unknown fault kind 'explode' (known: {KNOWN})",
        "faults[2].at: missing required field",
        "faults[2].duration: missing required field",
        "faults[2].latency_ms: missing required field",
    ]


def test_bad_example_file_reports_everything() -> None:
    path = EXAMPLES / "bad.yaml"
    with pytest.raises(ScheduleError) as err:
        Schedule.load(path)
    assert err.value.errors == [
        "seed: expected an integer, got 'seven'",
        f"faults[0].kind: unknown fault kind 'explode' (known: {KNOWN})",
        "faults[1].target: no such target 'learner-9' (learners: 1..3)",
        "faults[2]: unknown field 'durration'",
        "faults[2].duration: missing required field",
        "faults[3].duration: must be > 0",
        "faults[4].latency_ms: expected a number, got 'fast'",
        "faults[5].direction: mode 'refuse' cuts the whole link, so direction must be 'both', got 'upstream'",
        "faults[7]: overlaps faults[6] on learner-1 (10-15 s and 12-14 s); a process can have only one fault at a time",
    ]
    assert err.value.source == str(path)
    assert str(err.value).splitlines()[0] == f"{path}: seed: expected an integer, got 'seven'"
    # the comment at the top of the file documents the same messages
    documented = [line[4:] for line in path.read_text().splitlines() if line.startswith("#   bad.yaml: ")]
    assert [d.removeprefix("bad.yaml: ") for d in documented if "(known:" not in d] == [
        e for e in err.value.errors if "(known:" not in e
    ]


def test_schedule_error_is_a_value_error() -> None:
    err = ScheduleError(["a: x", "b: y"])
    assert isinstance(err, ValueError)
    assert str(err) == "a: x\nb: y"
    assert str(ScheduleError("a: x", source="f.yaml")) == "f.yaml: a: x"


# --------------------------------------------------------------------------- clashing faults


def clash(*entries: str) -> list[str]:
    return errors_of("seed: 1\nlearners: 3\nfaults:\n" + "".join(f"- {e}\n" for e in entries))


def test_process_faults_on_one_target_cannot_overlap() -> None:
    assert clash(
        "{kind: kill, at: 8, duration: 4, target: learner-1}",
        "{kind: pause, at: 10, duration: 4, target: learner-1}",
    ) == ["faults[1]: overlaps faults[0] on learner-1 (8-12 s and 10-14 s); a process can have only one fault at a time"]


def test_a_unit_and_its_rank_clash() -> None:
    assert clash(
        "{kind: pause, at: 0, duration: 5, target: learner-2/rank-1}",
        "{kind: kill, at: 4.5, duration: 1, target: learner-2}",
    ) == [
        "faults[1]: overlaps faults[0] on learner-2/rank-1 and learner-2 (0-5 s and 4.5-5.5 s);"
        " a process can have only one fault at a time"
    ]


def test_kill_without_restart_blocks_later_faults() -> None:
    assert clash(
        "{kind: pause, at: 30, duration: 1, target: learner-1}",
        "{kind: kill, at: 1, duration: 1, target: learner-1, restart: false}",
    ) == [
        "faults[1]: overlaps faults[0] on learner-1: faults[1] kills learner-1 at 1 s with restart: false,"
        " so it stays down until the final heal"
    ]
    # but a fault that ends before the kill is fine
    Schedule.loads(
        "seed: 1\nfaults:\n- {kind: pause, at: 0, duration: 1, target: learner-1}\n"
        "- {kind: kill, at: 1, duration: 1, target: learner-1, restart: false}\n"
    )


def test_same_toxic_on_same_stream_cannot_overlap() -> None:
    assert clash(
        "{kind: latency, at: 0, duration: 5, target: learner-1, latency_ms: 5}",
        "{kind: latency, at: 4, duration: 5, target: learner-1, latency_ms: 9, direction: upstream}",
    ) == [
        "faults[1]: overlaps faults[0]: both put a latency toxic on the upstream stream of learner-1's link"
        " (0-5 s and 4-9 s); their Toxiproxy toxic names would collide"
    ]
    assert clash(
        "{kind: timeout, at: 0, duration: 5, target: learner-3}",
        "{kind: timeout, at: 1, duration: 1, target: learner-3}",
    ) == [
        "faults[1]: overlaps faults[0]: both put a timeout toxic on the upstream and downstream streams of"
        " learner-3's link (0-5 s and 1-2 s); their Toxiproxy toxic names would collide"
    ]


def test_partitions_of_one_link_cannot_overlap() -> None:
    assert clash(
        "{kind: partition, at: 0, duration: 3, targets: [learner-1, learner-2]}",
        "{kind: partition, at: 2, duration: 3, targets: [learner-3, learner-2], mode: refuse}",
    ) == [
        "faults[1]: overlaps faults[0]: both partition learner-2 (0-3 s and 2-5 s);"
        " a link can be partitioned only once at a time"
    ]


def test_faults_that_can_coexist() -> None:
    Schedule.loads(
        "seed: 1\nlearners: 3\nfaults:\n"
        # back to back on one target, in tenths that don't add up exactly in binary
        "- {kind: kill, at: 0.1, duration: 0.2, target: learner-1}\n"
        "- {kind: pause, at: 0.3, duration: 1, target: learner-1}\n"
        # different ranks of one unit
        "- {kind: pause, at: 5, duration: 5, target: learner-2/rank-0}\n"
        "- {kind: kill, at: 5, duration: 5, target: learner-2/rank-1}\n"
        # opposite streams, different toxic kinds, different links
        "- {kind: latency, at: 0, duration: 9, target: learner-1, latency_ms: 5, direction: upstream}\n"
        "- {kind: latency, at: 0, duration: 9, target: learner-1, latency_ms: 5, direction: downstream}\n"
        "- {kind: bandwidth, at: 0, duration: 9, target: learner-1, rate_kbps: 5}\n"
        "- {kind: latency, at: 0, duration: 9, target: learner-2, latency_ms: 5}\n"
        # a partition next to a timeout toxic and a process fault on the same learner
        "- {kind: partition, at: 0, duration: 9, targets: [learner-1]}\n"
        "- {kind: timeout, at: 0, duration: 9, target: learner-1}\n"
    )


def test_clashes_are_reported_alongside_field_errors() -> None:
    assert clash(
        "{kind: kill, at: 0, duration: 5, target: learner-1}",
        "{kind: kill, at: 1, duration: 5, target: learner-1}",
        "{kind: pause, at: 1, duration: 0, target: learner-1}",  # invalid: not also reported as a clash
    ) == [
        "faults[2].duration: must be > 0",
        "faults[1]: overlaps faults[0] on learner-1 (0-5 s and 1-6 s); a process can have only one fault at a time",
    ]


# --------------------------------------------------------------------------- syntax and files


def test_bad_yaml_syntax_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("seed: 1\nfaults:\n- {kind: kill, at: 1\n")
    with pytest.raises(ScheduleError) as err:
        Schedule.load(path)
    assert str(err.value) == f"{path}: invalid YAML at line 4, column 1: expected ',' or '}}', but got '<stream end>'"


def test_bad_json_syntax_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"seed": 1, "faults": [}')
    with pytest.raises(ScheduleError) as err:
        Schedule.load(path)
    assert str(err.value) == f"{path}: invalid JSON at line 1, column 24: Expecting value"


def test_duplicate_keys_are_errors() -> None:
    assert errors_of("seed: 1\nfaults:\n- {kind: kill, at: 1, at: 2, duration: 1, target: learner-1}\n") == [
        "duplicate key 'at' at line 3, column 23"
    ]
    assert errors_of('{"seed": 1, "seed": 2, "faults": []}', "json") == ["invalid JSON: duplicate key 'seed'"]


def test_unsupported_extension(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text("seed = 1")
    with pytest.raises(ScheduleError) as err:
        Schedule.load(path)
    assert str(err.value) == f"{path}: unsupported file extension '.toml' (use .yaml, .yml or .json)"
    with pytest.raises(ScheduleError):
        KPL.dump(tmp_path / "s")


def test_missing_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        Schedule.load(tmp_path / "nope.yaml")


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin.yaml"
    path.write_bytes(b"seed: 1\nname: caf\xe9\nfaults: []\n")
    with pytest.raises(ScheduleError) as err:
        Schedule.load(path)
    assert str(err.value) == f"{path}: not UTF-8 text (invalid continuation byte at byte 17)"


def test_unknown_format() -> None:
    with pytest.raises(ValueError):
        Schedule.loads("{}", "toml")


# --------------------------------------------------------------------------- validate() and learners


def test_validate_checks_schedules_built_in_code() -> None:
    bad = Schedule(
        seed=-1,
        learners=2,
        faults=(Kill(0, 1, "learner-3"), "kill", Latency(0, 1, "learner-1", latency_ms=True)),  # type: ignore[arg-type]
    )
    with pytest.raises(ScheduleError) as err:
        bad.validate()
    assert err.value.errors == [
        "seed: must be >= 0",
        "faults[0].target: no such target 'learner-3' (learners: 1..2)",
        "faults[1]: expected a fault, got 'kill'",
        "faults[2].latency_ms: expected a number, got true",
    ]
    assert KPL.validate() is KPL
    assert Schedule(seed=1, faults=[Kill(0, 1, "syncer")]).faults == (Kill(0, 1, "syncer"),)


def test_learners_argument_overrides_the_file() -> None:
    assert KPL.problems(learners=2) == ["faults[2].target: no such target 'learner-3' (learners: 1..2)"]
    assert KPL.problems(learners=5) == []
    unbounded = Schedule(seed=1, faults=(Kill(0, 1, "learner-40"),))
    assert unbounded.problems() == []
    assert unbounded.problems(learners=1) == ["faults[0].target: no such target 'learner-40' (learners: 1)"]
    text = KPL.dumps()
    assert errors_of(text, learners=2) == ["faults[2].target: no such target 'learner-3' (learners: 1..2)"]
    with pytest.raises(ValueError):
        KPL.validate(learners=0)


# --------------------------------------------------------------------------- controller helpers


def test_targets_horizon_sorted() -> None:
    assert KPL.targets() == ("learner-1", "learner-2", "learner-3")
    assert MIXED.targets() == (
        "syncer", "learner-1", "learner-2", "learner-2/rank-1", "learner-3", "learner-4",
    )  # fmt: skip
    assert KPL.horizon == 34
    assert MIXED.horizon == 20
    assert Schedule(seed=0, faults=()).horizon == 0.0
    assert [f.at for f in MIXED.sorted().faults] == [0, 0.1, 0.3, 1, 2.5, 3, 5, 9]
    assert MIXED.sorted().seed == MIXED.seed and MIXED.sorted().learners == MIXED.learners


def test_events_in_time_order() -> None:
    s = Schedule(
        seed=1,
        faults=(
            Pause(0.3, 1, "learner-1"),
            Kill(0.1, 0.2, "learner-1"),
            Kill(0.3, 5, "learner-2", restart=False),
            Latency(0, 0.3, "learner-1", 10),
        ),
    )
    assert [(e.time, e.action, e.index) for e in s.events()] == [
        (0, "start", 3),
        (0.1, "start", 1),
        (0.3, "stop", 1),  # stops before starts at the same instant
        (0.3, "stop", 3),
        (0.3, "start", 0),
        (0.3, "start", 2),  # kill without restart: no stop
        (1.3, "stop", 0),
    ]
    first = s.events()[0]
    assert isinstance(first, Event) and first.fault is s.faults[3]
    time, action, index, fault = first
    assert (time, action, index, fault) == (0, "start", 3, s.faults[3])


def test_a_fault_waits_for_every_earlier_fault_on_what_it_touches():
    """Contention is not transitive: a partition of learner-1 and learner-2 after one of each
    must wait for both; a latency on learner-3 waits for nothing."""
    from faults import Latency, Partition

    schedule = Schedule(seed=1, faults=(Partition(at=0, duration=1, targets=("learner-1",)),
                                        Partition(at=0, duration=1, targets=("learner-2",)),
                                        Latency(at=0, duration=5, target="learner-3", latency_ms=10),
                                        Partition(at=2, duration=1, targets=("learner-1", "learner-2"))))
    assert schedule.predecessors() == {3: [0, 1]}
