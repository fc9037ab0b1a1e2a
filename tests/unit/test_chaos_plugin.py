"""The pytest plugin (chaos.pytest_plugin) and `python -m chaos replay`, without a real cluster.

Inner pytest sessions run in-process through `pytester`; their conftest replaces
`chaos.runner.run_schedule`, `make_cluster` and `wait_until_training` with fakes (through
`monkeypatch`, so nothing leaks into this session).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import trainer.task  # noqa: F401  (imports torch; see below)
from chaos import pytest_plugin as plugin
from chaos.replay import ReplayError, load_recorded, next_replay_dir
from chaos.runner import default_duration
from faults import Pause, Schedule
from trainer.runspec import RunSpec

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
# The plugin resolves a session's task through trainer.task, which imports torch. An inner
# session that imported it first would have it unloaded by pytester afterwards (it restores
# sys.modules), and torch cannot be imported twice in one process: import it out here.
# Block the entry point's name, then load the module by name: works whether or not the
# `islands` pytest11 entry point is installed.
PLUGIN_ARGS = ("-p", "no:islands", "-p", "chaos.pytest_plugin", "-p", "no:cacheprovider")

FAKES = r'''
import json
from pathlib import Path

import pytest

import chaos.runner
from chaos.checkers import Verdict, verdict_document
from chaos.runner import RunResult
from trainer.runspec import RunSpec

CALLS = []


def fake_run_schedule(schedule, run_dir, spec=None, checker_options=None, evaluate=True, reference="auto", on_phase=None, on_start=None, reference_seconds=0.0,
                      **settings):
    spec = (spec or RunSpec()).replace(**settings)
    CALLS.append(dict(schedule=schedule, run_dir=run_dir, spec=spec, reference=reference))
    run_dir.mkdir(parents=True, exist_ok=True)
    schedule.dump(run_dir / "schedule.yaml")
    (run_dir / "run.json").write_text(json.dumps({"backend": spec.backend, "learners": spec.learners}))
    (run_dir / "events").mkdir(exist_ok=True)
    (run_dir / "events" / "syncer.jsonl").write_text('{"t": 1.0, "kind": "merge"}\n')
    (run_dir / "history.jsonl").write_text('{"t": 1.0, "event": "begin"}\n')
    fail = schedule.name == "failing"
    verdicts = [Verdict("progress", "pass", "ok"),
                Verdict("self_heal", "fail" if fail else "pass", "learner-1 never came back" if fail else "ok")]
    document = verdict_document(verdicts)
    (run_dir / "verdict.json").write_text(json.dumps(document))
    return RunResult(run_dir, verdicts, document, {})


class FakeCluster:
    """Processes are flags; every call is logged, teardown order included."""

    def __init__(self, run_dir, learners):
        self.run_dir, self.learners, self.toxiproxy = run_dir, learners, "fake-toxiproxy"
        self.calls = []

    def start(self):
        self.calls.append("start")
        (self.run_dir / "events").mkdir(parents=True, exist_ok=True)
        (self.run_dir / "events" / "learner-1.jsonl").write_text('{"t": 0.5, "kind": "inner_step"}\n')

    def heal_all(self):
        self.calls.append("heal_all")
        return []

    def stop(self):
        self.calls.append("stop")
        Path(self.run_dir, "stopped").write_text("yes")

    def pause(self, target):
        self.calls.append(f"pause {target}")

    def resume(self, target):
        self.calls.append(f"resume {target}")


CLUSTERS = []


def fake_make_cluster(spec, run_dir):
    CLUSTERS.append(FakeCluster(run_dir, spec.learners))
    CLUSTERS[-1].spec, CLUSTERS[-1].warm_spares = spec, spec.warm_spares
    return CLUSTERS[-1]


@pytest.fixture(autouse=True)
def fakes(monkeypatch):
    monkeypatch.setattr(chaos.runner, "run_schedule", fake_run_schedule)
    monkeypatch.setattr(chaos.runner, "make_cluster", fake_make_cluster)
    monkeypatch.setattr(chaos.runner, "wait_until_training", lambda run_dir, learners: None)
'''

FAILING = "name: failing\nseed: 7\nfaults:\n- {kind: pause, at: 1, duration: 2, target: learner-1}\n"
PASSING = "name: fine\nseed: 7\nfaults:\n- {kind: pause, at: 1, duration: 2, target: learner-1}\n"


def run_inner(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(*PLUGIN_ARGS, *args)


# --------------------------------------------------------------------------- options and markers


def test_options_are_listed_in_help(pytester: pytest.Pytester) -> None:
    result = run_inner(pytester, "--help")
    out = result.stdout.str()
    assert "islands chaos" in out
    for option in ("--chaos-backend", "--chaos-seed", "--chaos-learners", "--chaos-artifacts", "--chaos-streaming",
                   "--chaos-warm-spares"):
        assert option in out, option


def test_options_parse_into_chaos_options(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_opts="""
        from pathlib import Path

        def test_defaults(chaos_options, pytestconfig):
            if pytestconfig.getoption("chaos_seed") is None:
                assert chaos_options.backend == "local" and chaos_options.seed is None
                assert chaos_options.learners == 3 and chaos_options.artifacts == Path("chaos-artifacts")
            else:
                assert chaos_options.backend == "compose" and chaos_options.seed == 11
                assert chaos_options.learners == 2 and chaos_options.artifacts == Path("out/arts")
    """)
    run_inner(pytester).assert_outcomes(passed=1)
    run_inner(pytester, "--chaos-backend", "compose", "--chaos-seed", "11", "--chaos-learners", "2",
              "--chaos-artifacts", "out/arts").assert_outcomes(passed=1)
    bad = run_inner(pytester, "--chaos-learners", "0")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "--chaos-learners" in bad.stderr.str()


def test_markers_are_registered_for_strict_markers(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_marks="""
        import pytest

        @pytest.mark.slow
        def test_slow(): raise AssertionError("deselected")

        @pytest.mark.integration
        def test_integration(): pass

        @pytest.mark.property
        def test_property(): pass

        @pytest.mark.compose
        def test_compose(): pass
    """)
    result = run_inner(pytester, "--strict-markers", "-m", "not slow")
    result.assert_outcomes(passed=2, skipped=1, deselected=1)  # compose tests need --chaos-backend compose
    assert "needs the compose backend" in run_inner(pytester, "-rs", "-m", "compose").stdout.str()
    markers = run_inner(pytester, "--markers").stdout.str()
    for name in ("chaos(schedule=PATH", "integration:", "slow:", "property:", "compose:"):
        assert f"@pytest.mark.{name}" in markers, name


def test_ci_profile_is_loaded_by_default_and_nightly_is_registered(pytester: pytest.Pytester) -> None:
    from hypothesis import settings

    before = settings.get_current_profile_name()
    pytester.makepyfile(test_prof="""
        from hypothesis import HealthCheck, Phase, settings

        def test_profile(pytestconfig):
            want = pytestconfig.getoption("hypothesis_profile") or "ci"
            assert settings.get_current_profile_name() == want
            assert settings.get_profile("ci").max_examples == 3
            assert settings.get_profile("nightly").max_examples == 200
            for name in ("ci", "nightly"):
                p = settings.get_profile(name)
                assert p.deadline is None and p.print_blob and not p.derandomize
                assert HealthCheck.function_scoped_fixture in p.suppress_health_check
                assert HealthCheck.too_slow in p.suppress_health_check
            assert settings.default.max_examples == (3 if want == "ci" else 200)
            # A live property test reports its first failure at once in ci (no minutes of
            # shrinking live runs) and shrinks in nightly; other tests always shrink.
            from chaos.pytest_plugin import live_settings
            assert Phase.shrink in settings.default.phases
            live = live_settings()
            assert (Phase.shrink in live.phases) == (want == "nightly") and Phase.generate in live.phases
            assert live.max_examples == (1 if want == "ci" else 200)
    """)
    settings.load_profile("default")  # as in a session without the plugin
    try:
        run_inner(pytester).assert_outcomes(passed=1)
        assert settings.get_current_profile_name() == "default", "the inner session must restore the profile"
        run_inner(pytester, "--hypothesis-profile", "nightly").assert_outcomes(passed=1)
        assert settings.get_current_profile_name() == "default"
    finally:
        settings.load_profile(before)


# --------------------------------------------------------------------------- the chaos marker


def test_failing_chaos_marker_writes_artifacts_and_prints_the_replay_command(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(FAKES)
    pytester.mkdir("schedules")
    pytester.path.joinpath("schedules", "failing.yaml").write_text(FAILING)
    pytester.makepyfile(test_marked="""
        import pytest
        import conftest

        @pytest.mark.chaos(schedule="schedules/failing.yaml", learners=2, trainer_args=["--grace", "1"])
        def test_empty_body():
            pass

        def test_the_fake_got_the_marker_settings():
            call, = conftest.CALLS
            spec = call["spec"]
            assert spec.learners == 2 and spec.backend == "local" and spec.mode == "decoupled"
            assert spec.trainer_args == ("--grace", "1") and spec.duration is None
            assert spec.task == "gpt" and spec.warm_spares == 0 and call["reference"] == "auto"
            assert call["schedule"].seed == 99, "--chaos-seed overrides the schedule's seed"
            assert call["run_dir"].name == "run"
    """)
    artifacts = pytester.path / "arts"
    result = run_inner(pytester, "--chaos-artifacts", str(artifacts), "--chaos-seed", "99", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    dest = artifacts / plugin.sanitize_nodeid("test_marked.py::test_empty_body")
    for name in ("schedule.yaml", "history.jsonl", "events/syncer.jsonl", "verdict.json", "run.json", "REPLAY.txt"):
        assert (dest / name).is_file(), name
    command = (f"python -m chaos run {dest / 'schedule.yaml'} --backend local --learners 2 -- --grace 1")
    assert command in out
    assert "islands chaos replay" in out
    assert f"python -m chaos replay {dest}" in out  # what the README says a failing test prints
    assert "self_heal" in out and "learner-1 never came back" in out
    assert str(dest) in out
    assert command in (dest / "REPLAY.txt").read_text()
    assert Schedule.load(dest / "schedule.yaml").seed == 99
    recorded = load_recorded(dest)  # the artifacts dir is replayable
    assert recorded.learners == 2 and recorded.trainer_args == ("--grace", "1") and recorded.schedule.seed == 99
    # run.json is the whole RunSpec, with the seed and the duration the run had.
    assert json.loads((dest / "run.json").read_text()) == RunSpec(
        learners=2, trainer_args=["--grace", "1"], seed=99,
        duration=default_duration(Schedule.load(dest / "schedule.yaml"))).to_json()


def test_passing_chaos_marker_passes_and_leaves_no_artifacts(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(FAKES)
    pytester.path.joinpath("fine.yaml").write_text(PASSING)
    pytester.makepyfile(test_ok="""
        import pytest

        @pytest.mark.chaos("fine.yaml")
        def test_marked(chaos_result):
            assert chaos_result.passed and chaos_result.run_dir.name == "run"
    """)
    artifacts = pytester.path / "arts"
    result = run_inner(pytester, "--chaos-artifacts", str(artifacts))
    result.assert_outcomes(passed=1)
    assert not artifacts.exists()
    assert "islands chaos replay" not in result.stdout.str()


def test_missing_schedule_file_is_named(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(FAKES)
    pytester.makepyfile(test_missing="""
        import pytest

        @pytest.mark.chaos(schedule="nowhere.yaml")
        def test_marked():
            pass
    """)
    result = run_inner(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*no schedule file 'nowhere.yaml'*"])


# --------------------------------------------------------------------------- cluster and chaos fixtures


def test_chaos_fixture_heals_and_stops_on_failure_and_records_the_shrunk_schedule(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(FAKES)
    pytester.makepyfile(test_session="""
        from hypothesis import Phase, given, settings, strategies as st
        import conftest
        from faults import Pause, Schedule

        # Shrinking on, as in the nightly profile (ci reports the first failure unshrunk).
        @settings(max_examples=40, database=None, phases=list(Phase))
        @given(seed=st.integers(0, 1000))
        def test_seeds_below_three(chaos, seed):
            schedule = Schedule(seed=seed, faults=(Pause(at=0.0, duration=0.01, target="learner-1"),))
            chaos.run(schedule, duration=0.02)
            assert seed < 3, "seed too large"

        def test_teardown_healed_then_stopped():
            cluster = conftest.CLUSTERS[0]
            assert cluster.calls[0] == "start"
            assert cluster.calls[-2:] == ["heal_all", "stop"]
            assert "pause learner-1" in cluster.calls
    """)
    artifacts = pytester.path / "arts"
    result = run_inner(pytester, "--chaos-artifacts", str(artifacts), "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    dest = artifacts / plugin.sanitize_nodeid("test_session.py::test_seeds_below_three")
    assert Schedule.load(dest / "schedule.yaml").seed == 3, "the shrunk example is the one recorded"
    assert (dest / "events" / "learner-1.jsonl").is_file()
    history = [json.loads(line) for line in (dest / "history.jsonl").read_text().splitlines()]
    assert sum(h["event"] == "begin" for h in history) > 1, "the history appends across runs"
    assert history[0]["event"] == "cluster_start", "the checks measure the cold start-up from the cluster's start"
    assert json.loads((dest / "run.json").read_text())["duration"] == 0.02
    out = result.stdout.str()
    assert f"python -m chaos run {dest / 'schedule.yaml'} --backend local --learners 3 --duration 0.02" in out


def test_cluster_fixture_failure_without_a_schedule_still_copies_traces(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(FAKES)
    pytester.makepyfile(test_plain="""
        def test_uses_cluster(cluster, toxiproxy):
            assert toxiproxy == "fake-toxiproxy"
            assert cluster.run_dir.name == "run"
            raise AssertionError("boom")
    """)
    artifacts = pytester.path / "arts"
    result = run_inner(pytester, "--chaos-artifacts", str(artifacts))
    result.assert_outcomes(failed=1)
    dest = artifacts / plugin.sanitize_nodeid("test_plain.py::test_uses_cluster")
    assert (dest / "events" / "learner-1.jsonl").is_file()
    assert not (dest / "schedule.yaml").exists()
    assert "nothing to replay" in (dest / "REPLAY.txt").read_text()


def test_record_failure_artifacts_for_tests_that_run_on_their_own(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_own="""
        from chaos.pytest_plugin import record_failure_artifacts
        from faults import Schedule

        def test_own_run(request, tmp_path):
            run_dir = tmp_path / "run-1"
            (run_dir / "events").mkdir(parents=True)
            (run_dir / "events" / "syncer.jsonl").write_text("{}\\n")
            (run_dir / "run.json").write_text('{"duration": 21.5, "mode": "sync"}')
            schedule = Schedule(seed=5, faults=())
            dest = record_failure_artifacts(request, run_dir, schedule, 2, ["--quorum", "1"],
                                            env={"ISLANDS_DEFECT": "drop-acks"})
            assert dest.name == "test_own.py__test_own_run"
            raise AssertionError("the run failed")
    """)
    artifacts = pytester.path / "arts"
    result = run_inner(pytester, "--chaos-artifacts", str(artifacts))
    result.assert_outcomes(failed=1)
    dest = artifacts / "test_own.py__test_own_run"
    assert {p.name for p in dest.iterdir()} >= {"schedule.yaml", "events", "run.json", "REPLAY.txt"}
    command = f"ISLANDS_DEFECT=drop-acks python -m chaos run {dest / 'schedule.yaml'} --backend local --learners 2 " \
              "--mode sync --duration 21.5 -- --quorum 1"
    assert command in result.stdout.str()
    recorded = load_recorded(dest)
    assert recorded.duration == 21.5 and recorded.mode == "sync" and recorded.env == {"ISLANDS_DEFECT": "drop-acks"}


@pytest.mark.parametrize("run_json, backend", [(None, "compose"), ('{"mode": "sync"}', "compose"),
                                               ('{"backend": "local"}', "local")])
def test_record_failure_artifacts_takes_the_sessions_backend_unless_run_json_names_one(
        pytester: pytest.Pytester, run_json: str | None, backend: str) -> None:
    pytester.makepyfile(test_own=f"""
        from chaos.pytest_plugin import record_failure_artifacts
        from faults import Schedule

        def test_own_run(request, tmp_path):
            run_dir = tmp_path / "run-1"
            run_dir.mkdir()
            if {run_json!r} is not None:
                (run_dir / "run.json").write_text({run_json!r})
            record_failure_artifacts(request, run_dir, Schedule(seed=5, faults=()), 2)
            raise AssertionError("the run failed")
    """)
    artifacts = pytester.path / "arts"
    result = run_inner(pytester, "--chaos-artifacts", str(artifacts), "--chaos-backend", "compose")
    result.assert_outcomes(failed=1)
    dest = artifacts / "test_own.py__test_own_run"
    assert f"python -m chaos run {dest / 'schedule.yaml'} --backend {backend} --learners 2" in result.stdout.str()
    assert load_recorded(dest).backend == backend


def test_non_chaos_failures_leave_no_artifacts(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_fails(): assert False")
    result = run_inner(pytester, "--chaos-artifacts", "arts")
    result.assert_outcomes(failed=1)
    assert not (pytester.path / "arts").exists()
    assert "islands chaos replay" not in result.stdout.str()


# --------------------------------------------------------------------------- ChaosSession on a fake cluster


def test_chaos_session_verdicts_see_only_the_last_run(tmp_path: Path) -> None:
    class Quiet:
        learners = 2

        def heal_all(self):
            return []

        def pause(self, target):
            pass

        def resume(self, target):
            pass

    record = plugin.RunRecord(tmp_path, RunSpec(learners=2))
    session = plugin.ChaosSession(Quiet(), record, seed=42)
    assert session.replay_command() is None
    session.run(Schedule(seed=1, faults=(Pause(at=0.0, duration=0.01, target="learner-1"),)), duration=0.02)
    session.run(Schedule(seed=2, faults=()), duration=0.01)
    assert session.last_schedule.seed == 42 and session.runs == 2
    verdicts = {v.name: v for v in session.verdicts()}
    assert verdicts["progress"].status == "fail"  # no events at all: nothing merged
    assert (tmp_path / "verdict.json").is_file() and (tmp_path / "schedule.yaml").is_file()
    with pytest.raises(AssertionError, match=r"(?s)chaos check\(s\) failed.*FAIL +progress.*replay: python -m chaos"):
        session.assert_ok()
    assert session.replay_command() == f"python -m chaos run {tmp_path / 'schedule.yaml'} --backend local " \
                                       f"--learners 2 --duration 0.01"
    session.close()


def test_sanitize_nodeid() -> None:
    assert plugin.sanitize_nodeid("tests/x.py::test_y[a-1]") == "tests_x.py__test_y_a-1"
    long = plugin.sanitize_nodeid("tests/x.py::test_" + "z" * 300)
    assert len(long) == 120
    assert long != plugin.sanitize_nodeid("tests/x.py::test_" + "z" * 299)


# --------------------------------------------------------------------------- chaos replay


def write_run_dir(path: Path, **run: object) -> Path:
    path.mkdir(parents=True)
    Schedule(seed=7, faults=(Pause(at=1.0, duration=2.0, target="learner-2"),), name="x").dump(path / "schedule.yaml")
    settings = {"backend": "local", "learners": 2, "mode": "sync", "data": "markov",
                "trainer_args": ["--grace", "1"], "seed": 9, "duration": 12.5, **run}
    (path / "run.json").write_text(json.dumps(settings))
    return path


def test_replay_without_run_json_exits_2_naming_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    Schedule(seed=1, faults=()).dump(run_dir / "schedule.yaml")
    proc = subprocess.run([sys.executable, "-m", "chaos", "replay", str(run_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert str(run_dir / "run.json") in proc.stderr and "schedule.yaml" not in proc.stderr


def test_replay_without_schedule_exits_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from chaos.__main__ import main

    (tmp_path / "run").mkdir()
    assert main(["replay", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "run.json" in err and "schedule.yaml" in err
    with pytest.raises(ReplayError, match="no such directory"):
        load_recorded(tmp_path / "nowhere")


def test_replay_reruns_with_the_recorded_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture) -> None:
    import chaos.runner
    from chaos.__main__ import main
    from chaos.checkers import Verdict, verdict_document

    calls = []
    outcome = {"status": "pass"}

    def fake_run_schedule(schedule, run_dir, spec=None, checker_options=None, evaluate=True, reference="auto", on_phase=None, on_start=None, reference_seconds=0.0,
                          **settings):
        assert os.environ.get("ISLANDS_DEFECT") == "slow-merge"
        calls.append((schedule, run_dir, {"spec": spec, "reference": reference, **settings}))
        run_dir.mkdir(parents=True)
        verdicts = [Verdict("progress", outcome["status"], "merges every 2 s")]
        return chaos.runner.RunResult(run_dir, verdicts, verdict_document(verdicts), {})

    monkeypatch.setattr(chaos.runner, "run_schedule", fake_run_schedule)
    monkeypatch.delenv("ISLANDS_DEFECT", raising=False)
    run_dir = write_run_dir(tmp_path / "run", env={"ISLANDS_DEFECT": "slow-merge"})
    assert main(["replay", str(run_dir)]) == 0
    assert "ISLANDS_DEFECT" not in os.environ, "the recorded env is set only for the replay"
    schedule, out, kwargs = calls[-1]
    assert out == tmp_path / "run-replay-1"
    assert schedule.seed == 9 and schedule.faults == Schedule.load(run_dir / "schedule.yaml").faults
    assert kwargs == {"spec": RunSpec(backend="local", learners=2, duration=12.5, mode="sync", data="markov",
                                      trainer_args=["--grace", "1"], seed=9, env={"ISLANDS_DEFECT": "slow-merge"}),
                      "reference": "auto"}
    printed = capsys.readouterr().out
    assert "verdict: PASS" in printed and "PASS    progress" in printed

    outcome["status"] = "fail"
    assert main(["replay", str(run_dir)]) == 1
    assert calls[-1][1] == tmp_path / "run-replay-2"
    assert "verdict: FAIL" in capsys.readouterr().out
    assert main(["replay", str(run_dir), "--out", str(tmp_path / "elsewhere")]) == 1
    assert calls[-1][1] == tmp_path / "elsewhere"
    assert next_replay_dir(run_dir) == tmp_path / "run-replay-3"


def test_replay_rejects_a_bad_run_json(tmp_path: Path) -> None:
    run_dir = write_run_dir(tmp_path / "run", learners=0)
    with pytest.raises(ReplayError, match="learners"):
        load_recorded(run_dir)
    (run_dir / "run.json").write_text("{not json")
    with pytest.raises(ReplayError, match="not valid JSON"):
        load_recorded(run_dir)


# --------------------------------------------------------------------------- --chaos-streaming


STREAMING = ["--fragments", "4", "--encoding", "int4", "--overlap", "1"]


def _train_config(args: list[str]):
    """`args` as the syncer reads them (argparse errors exit, like the real process)."""
    import argparse

    from trainer.cli_args import add_common_args, add_syncer_args, add_train_args, train_config

    parser = argparse.ArgumentParser()
    add_common_args(parser)
    add_train_args(parser)
    add_syncer_args(parser)
    return train_config(parser.parse_args(args), parser, num_learners=3)


@pytest.mark.parametrize(("given", "expected"), [
    ([], STREAMING),  # the trainer's default H=20 already fits P=4, tau=1
    (["--sync-every", "10"], ["--sync-every", "12", *STREAMING]),
    (["--sync-every=12", "--grace", "1"], ["--grace", "1", "--sync-every", "12", *STREAMING]),
    (["-H", "2"], ["--sync-every", "8", *STREAMING]),  # tau=1 needs H/P >= 2
    (["--fragments", "2", "-P", "5", "--encoding", "fp32", "--overlap=3", "--n-layer", "1", "-H", "20"],
     ["--n-layer", "1", "--sync-every", "20", *STREAMING]),  # streaming flags replace the ones given
])
def test_streaming_trainer_args(given: list[str], expected: list[str]) -> None:
    assert plugin.streaming_trainer_args(given) == expected
    assert plugin.streaming_trainer_args(tuple(given)) == expected
    config = _train_config(expected)
    assert (config.fragments, config.encoding, config.overlap) == (4, "int4", 1)
    assert config.sync_every % 4 == 0 and config.overlap < config.sync_every // 4


def test_streaming_default_h_matches_the_trainer() -> None:
    from trainer.config import TrainConfig

    assert plugin._DEFAULT_SYNC_EVERY == TrainConfig.sync_every


def test_streaming_option_is_in_help_and_off_by_default(pytester: pytest.Pytester) -> None:
    out = run_inner(pytester, "--help").stdout.str()
    assert "--chaos-streaming" in out and "int4" in out
    pytester.makepyfile(test_opt="""
        def test_streaming(chaos_options, pytestconfig):
            on = pytestconfig.getoption("chaos_streaming")
            assert chaos_options.streaming is on
            assert chaos_options.trainer_args(["-H", "10"]) == (
                ["--sync-every", "12", "--fragments", "4", "--encoding", "int4", "--overlap", "1"] if on else ["-H", "10"])
    """)
    run_inner(pytester).assert_outcomes(passed=1)
    run_inner(pytester, "--chaos-streaming").assert_outcomes(passed=1)


def test_streaming_reaches_the_marker_the_cluster_fixture_and_the_replay_command(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(FAKES)
    pytester.path.joinpath("failing.yaml").write_text(FAILING)
    pytester.makepyfile(test_streamed="""
        import pytest
        import conftest

        STREAMING = ["--fragments", "4", "--encoding", "int4", "--overlap", "1"]

        @pytest.mark.chaos(schedule="failing.yaml", learners=2, trainer_args=["--sync-every", "10"])
        def test_marked():
            pass

        def test_cluster(cluster, chaos):
            assert chaos.record.spec.trainer_args == tuple(STREAMING)
            assert conftest.CLUSTERS[-1].spec.trainer_args == tuple(STREAMING)

        def test_the_fake_got_the_streaming_args():
            call, = conftest.CALLS
            assert call["spec"].trainer_args == ("--sync-every", "12", *STREAMING)
    """)
    artifacts = pytester.path / "arts"
    result = run_inner(pytester, "--chaos-artifacts", str(artifacts), "--chaos-streaming", "-p", "no:randomly")
    result.assert_outcomes(passed=2, failed=1)
    dest = artifacts / plugin.sanitize_nodeid("test_streamed.py::test_marked")
    command = (f"python -m chaos run {dest / 'schedule.yaml'} --backend local --learners 2 -- --sync-every 12 "
               "--fragments 4 --encoding int4 --overlap 1")
    assert command in result.stdout.str()
    assert load_recorded(dest).trainer_args == ("--sync-every", "12", *STREAMING)



def test_replay_keeps_the_recorded_learner_flags(tmp_path: Path) -> None:
    from chaos.replay import load_recorded
    run_dir = write_run_dir(tmp_path / "run", learner_args={"1": ["--ranks", "2"]})
    assert load_recorded(run_dir).learner_args == {1: ("--ranks", "2")}


def test_replay_keeps_the_recorded_warm_spares_and_refuses_a_bad_count(tmp_path: Path) -> None:
    from chaos.replay import ReplayError, load_recorded
    assert load_recorded(write_run_dir(tmp_path / "a", warm_spares=2)).warm_spares == 2
    assert load_recorded(write_run_dir(tmp_path / "b")).warm_spares == 0, "older run.json files have none"
    with pytest.raises(ReplayError, match=r"run\.json: warm_spares: must be >= 0, got -1"):
        load_recorded(write_run_dir(tmp_path / "c", warm_spares=-1))


def test_replay_refuses_bad_learner_flags_naming_the_field(tmp_path: Path) -> None:
    from chaos.replay import ReplayError, load_recorded
    run_dir = write_run_dir(tmp_path / "run", learner_args={"one": ["--ranks", "2"]})
    with pytest.raises(ReplayError, match="learner_args: expected an object of learner number to a list"):
        load_recorded(run_dir)


def _rerun(command: str, monkeypatch: pytest.MonkeyPatch, cwd: Path) -> RunSpec:
    """The RunSpec `chaos run` builds from a printed replay command (run_schedule faked)."""
    import shlex

    import chaos.runner
    from chaos.__main__ import main

    specs: list[RunSpec] = []

    def fake_run_schedule(schedule, run_dir, spec=None, checker_options=None, evaluate=True, reference="auto", on_phase=None, on_start=None, reference_seconds=0.0,
                          **settings):
        specs.append((spec or RunSpec()).replace(**settings))
        raise RuntimeError("stand-in: no cluster in unit tests")

    monkeypatch.setattr(chaos.runner, "run_schedule", fake_run_schedule)
    monkeypatch.chdir(cwd)
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "chaos"]
    assert main(argv[3:]) == 1 and len(specs) == 1, "the replay command was refused"
    return specs[0]


def test_replay_command_of_units_of_several_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from chaos.pytest_plugin import RunRecord, replay_command
    schedule = tmp_path / "s.yaml"
    Schedule(seed=3, faults=(Pause(at=1.0, duration=1.0, target="learner-2/rank-1"),)).dump(schedule)
    record = RunRecord(Path("/r"), RunSpec(learners=2, ranks=2))
    command = replay_command(schedule, record)
    assert f"python -m chaos run {schedule} --backend local --learners 2 --ranks 2" == command
    assert record.run_json()["ranks"] == 2 and record.run_json()["learner_args"] == {}
    assert _rerun(command, monkeypatch, tmp_path) == record.spec, "the command reruns the same spec"
    # A run.json of per-learner --ranks (as `chaos run --ranks` wrote them before RunSpec had
    # ranks) keeps them, and its replay command gives each learner its own.
    old = RunSpec.from_json({"learners": 2, "learner_args": {"1": ["--ranks", "3"], "2": ["--ranks", "3"]}})
    assert (old.ranks, old.ranks_of(1), old.ranks_of(2)) == (1, 3, 3)
    command = replay_command(schedule, RunRecord(Path("/r"), old))
    assert command == (f"python -m chaos run {schedule} --backend local --learners 2 "
                       "'--learner-args=1:--ranks 3' '--learner-args=2:--ranks 3'")
    assert _rerun(command, monkeypatch, tmp_path) == old


def test_warm_spares_reach_run_json_and_the_replay_command_on_the_local_backend_only() -> None:
    from chaos.pytest_plugin import ChaosOptions, RunRecord, replay_command
    record = RunRecord(Path("/r"), RunSpec(learners=2, warm_spares=2))
    assert "--learners 2 --warm-spares 2" in replay_command("s.yaml", record)
    assert record.run_json()["warm_spares"] == 2
    cold = RunRecord(Path("/r"), RunSpec(learners=2))
    assert cold.run_json()["warm_spares"] == 0, "run.json holds every RunSpec key"
    assert "--warm-spares" not in replay_command("s.yaml", cold)
    options = ChaosOptions(warm_spares=3)
    assert options.spares_for("local") == 3 and options.spares_for("compose") == 0
    assert options.spec().warm_spares == 3
    assert ChaosOptions(backend="compose", warm_spares=3).spec().warm_spares == 0


def test_the_warm_spares_option_parses_and_refuses_a_negative_count(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_spares="""
        def test_spares(chaos_options, pytestconfig):
            assert chaos_options.warm_spares == pytestconfig.getoption("chaos_warm_spares")
    """)
    run_inner(pytester).assert_outcomes(passed=1)
    run_inner(pytester, "--chaos-warm-spares", "2").assert_outcomes(passed=1)
    bad = run_inner(pytester, "--chaos-warm-spares", "-1")
    assert bad.ret != 0
    assert "--chaos-warm-spares: must be >= 0" in bad.stderr.str()


def test_demo_runs_the_demo_schedule_with_every_setting_run_needs(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import chaos.runner
    from chaos.__main__ import main
    from chaos.checkers import Verdict, verdict_document

    calls = []

    def fake_run_schedule(schedule, run_dir, spec=None, checker_options=None, evaluate=True, reference="auto", on_phase=None, on_start=None, reference_seconds=0.0,
                          **settings):
        calls.append((schedule, run_dir, {"spec": spec, "reference": reference, **settings}))
        verdicts = [Verdict("progress", "pass", "ok")]
        return chaos.runner.RunResult(run_dir, verdicts, verdict_document(verdicts), {})

    monkeypatch.setattr(chaos.runner, "run_schedule", fake_run_schedule)
    assert main(["demo", "--out", str(tmp_path / "demo")]) == 0
    schedule, out, kwargs = calls[-1]
    assert out == tmp_path / "demo" and len(schedule.faults) == 3
    spec = kwargs.pop("spec")
    assert kwargs == {"reference": "auto"}
    assert spec.backend == "local" and spec.learners == 3 and spec.learner_args == {} and spec.ranks == 1
    assert (spec.mode, spec.task, spec.device, spec.data) == ("decoupled", "gpt", "auto", "markov")
    assert spec.warm_spares == 1, "the demo's killed learner comes back from a warm spare"


def test_replay_reference_off_reaches_run_schedule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`chaos replay --reference off` judges without a fault-free reference run."""
    import chaos.runner
    from chaos.__main__ import main
    from chaos.checkers import Verdict, verdict_document

    seen = []

    def fake_run_schedule(schedule, run_dir, spec=None, checker_options=None, evaluate=True, reference="auto", on_phase=None, on_start=None, reference_seconds=0.0,
                          **settings):
        seen.append(reference)
        run_dir.mkdir(parents=True)
        verdicts = [Verdict("progress", "pass", "ok")]
        return chaos.runner.RunResult(run_dir, verdicts, verdict_document(verdicts), {})

    monkeypatch.setattr(chaos.runner, "run_schedule", fake_run_schedule)
    run_dir = write_run_dir(tmp_path / "run")
    assert main(["replay", str(run_dir), "--reference", "off"]) == 0
    assert seen == ["off"]
