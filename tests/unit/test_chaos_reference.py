"""The fault-free reference (chaos/reference.py) and final_loss against it, without a cluster:
run_schedule is replaced by a stand-in that writes the events a fault-free run would."""
from __future__ import annotations

import json
import os
import threading
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace

import pytest

from chaos import reference as ref
from chaos.checkers import FAIL, PASS, REFERENCE_MARGIN, check_final_loss
from chaos.reference import ReferenceCurve
from chaos.runner import with_reference
from trainer.runspec import RunSpec

from .test_chaos_checkers import evaluation, global_eval, view

CURVE = ReferenceCurve("k", ((0.0, 5.5), (10000.0, 3.5), (20000.0, 8.0), (30000.0, 2.5), (100000.0, 2.0)))


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ISLANDS_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_at_interpolates_and_holds_the_last_point():
    assert CURVE.at(0.0) == 5.5
    assert CURVE.at(5000.0) == pytest.approx(4.5)
    assert CURVE.at(65000.0) == pytest.approx(2.25)
    assert CURVE.at(1e9) == 2.0  # the reference merged no further: its last point
    assert CURVE.final_tokens == 100000.0


def test_best_by_is_the_running_minimum_so_a_spike_in_the_reference_excuses_nothing():
    assert CURVE.at(20000.0) == 8.0
    assert CURVE.best_by(20000.0) == 3.5
    assert CURVE.best_by(25000.0) == pytest.approx(3.0)


def test_the_key_changes_with_what_decides_the_curve_but_not_with_the_order_of_learner_args():
    spec = RunSpec(learners=2, trainer_args=["--sync-every", "10"], learner_args={1: ["--ranks", "2"]})
    base = ref.settings_for(spec)
    assert base["trainer"] == ref.trainer_digest() and len(base["trainer"]) == 16
    assert set(base) == {f.name for f in fields(RunSpec)} - set(ref.NOT_IN_KEY) | {"trainer"}
    key = ref.reference_key(base)
    assert key == ref.reference_key(ref.settings_for(RunSpec(learners=2, trainer_args=["--sync-every", "10"],
                                                             learner_args={1: ["--ranks", "2"]})))
    both = {1: ["--ranks", "2"], 2: ["--speed", "0.5"]}
    assert ref.reference_key(ref.settings_for(spec.replace(learner_args=both))) == ref.reference_key(
        ref.settings_for(spec.replace(learner_args=dict(reversed(both.items())))))
    for other in (ref.settings_for(spec.replace(learners=3)),
                  ref.settings_for(spec.replace(mode="sync", learner_args={})),
                  ref.settings_for(spec.replace(trainer_args=["--sync-every", "20"])),
                  ref.settings_for(spec.replace(learner_args={})),
                  ref.settings_for(spec.replace(ranks=2)),
                  ref.settings_for(spec.replace(task="examples/tasks/digits.py:Digits")),
                  ref.settings_for(spec.replace(device="cpu")),
                  ref.settings_for(spec.replace(data="markov:seed=3")),
                  {**base, "trainer": "0" * 16}):
        assert ref.reference_key(other) != key
    # Where and how long a run goes, and its faults' seed, do not decide a fault-free curve.
    for same in (spec.replace(backend="compose"), spec.replace(duration=90.0), spec.replace(warm_spares=2),
                 spec.replace(seed=7), spec.replace(env={"ISLANDS_X": "1"})):
        assert ref.reference_key(ref.settings_for(same)) == key


def test_a_cached_reference_is_used_only_if_it_ran_long_enough_or_far_enough(home: Path):
    stored = ref.store(ReferenceCurve("abc", ((0.0, 5.5), (1000.0, 2.0)), 2.0, 60.0))
    assert Path(stored.path).parent == home / "references"
    assert ref.load_cached("abc", 60.0).points == stored.points
    assert ref.load_cached("abc", 90.0) is None
    assert ref.load_cached("missing", 1.0) is None
    # A 90 s chaos run that merged no more tokens than the 60 s reference did is covered by it.
    assert ref.load_cached("abc", 90.0, tokens=1000.0).points == stored.points
    assert ref.load_cached("abc", 90.0, tokens=1000.5) is None
    assert ref.load_cached("abc", 90.0, tokens=0.0) is None  # a run that merged nothing says nothing


def fake_run(calls: list[dict], loss_at_end: float = 1.9):
    """A run_schedule stand-in that writes a fault-free run's global_eval events and eval."""
    def run_schedule(schedule, run_dir, spec=None, checker_options=None, evaluate=True, reference="auto",
                     **settings):
        calls.append({"faults": len(schedule.faults), "defect": os.environ.get("ISLANDS_SYNCER_DEFECT"),
                      "spec": spec, "reference": reference, **settings})
        events = Path(run_dir) / "events"
        events.mkdir(parents=True)
        rows = [global_eval(0.0, 0, 5.5, tokens=0.0, reason="start"), global_eval(5.0, 5, 2.5),
                global_eval(10.0, 10, loss_at_end, reason="final")]
        (events / "syncer.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return SimpleNamespace(summary={"final_loss": loss_at_end}, document={"failed": []}, passed=True)
    return run_schedule


def test_obtain_runs_a_fault_free_run_once_then_uses_the_cache(monkeypatch: pytest.MonkeyPatch):
    calls: list[dict] = []
    monkeypatch.setattr("chaos.runner.run_schedule", fake_run(calls))
    monkeypatch.setenv("ISLANDS_SYNCER_DEFECT", "double_apply")
    spec = RunSpec(backend="compose", learners=2, duration=22.0, trainer_args=["--sync-every", "10"], seed=5,
                   env={"ISLANDS_X": "1"})
    curve = ref.obtain(spec)
    assert curve is not None and curve.points == ((0.0, 5.5), (51200.0, 2.5), (102400.0, 1.9))
    assert curve.duration == 30.0  # rounded up to the grid
    # The same spec, run locally, for the grid's duration, with no spares and no environment of its own.
    assert calls == [{"faults": 0, "defect": None,
                      "spec": RunSpec(backend="local", learners=2, duration=30.0, mode="decoupled", data="markov",
                                      trainer_args=["--sync-every", "10"], seed=5),
                      "reference": "off"}]
    assert os.environ["ISLANDS_SYNCER_DEFECT"] == "double_apply"  # given back
    assert ref.obtain(spec).points == curve.points
    assert len(calls) == 1  # cached
    ref.obtain(spec.replace(backend="local", duration=45.0), tokens=90000.0)
    assert len(calls) == 1  # longer than the cached one, but it merged those tokens
    ref.obtain(spec.replace(backend="local", duration=45.0))
    assert len(calls) == 2  # longer than the cached one


def test_a_reference_run_lasts_at_least_what_is_asked_and_serves_the_longer_runs(monkeypatch: pytest.MonkeyPatch):
    """A 54 s run asking for a 90 s reference runs one of 90 s, which a 70 s run then finds
    cached; a shorter cached one, even one past the run's tokens, does not do for it."""
    calls: list[dict] = []
    monkeypatch.setattr("chaos.runner.run_schedule", fake_run(calls))
    spec = RunSpec(learners=3, duration=54.0, trainer_args=["--sync-every", "10"])
    assert ref.obtain(spec).duration == 60.0  # another run of the suite came first
    assert ref.obtain(spec, tokens=1.0).duration == 60.0
    assert ref.obtain(spec, tokens=1.0, at_least=55.0).duration == 60.0  # it ran that long
    assert ref.obtain(spec, tokens=1.0, at_least=80.0).duration == 90.0
    assert [c["spec"].duration for c in calls] == [60.0, 90.0]
    assert ref.obtain(spec.replace(duration=70.0)).duration == 90.0
    assert ref.obtain(spec, at_least=90.0).duration == 90.0
    assert len(calls) == 2
    ref.obtain(spec.replace(duration=100.0), at_least=10.0)
    assert [c["spec"].duration for c in calls] == [60.0, 90.0, 120.0]  # never shorter than the run's own
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="reference_seconds"):
            ref.obtain(spec, at_least=bad)


def test_a_run_asking_for_a_bad_reference_length_is_refused_before_it_starts(tmp_path: Path):
    from chaos.runner import run_schedule
    from faults import Schedule

    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="reference_seconds"):
            run_schedule(Schedule(seed=1, faults=()), tmp_path / "run", learners=2, reference_seconds=bad)
    assert not (tmp_path / "run").exists()


def test_final_loss_against_a_reference_at_equal_tokens():
    """The chaos run merged 65,000 tokens: the reference's best by then is 2.25."""
    def run(loss: float):
        return view([global_eval(9.0, 9, loss, tokens=65000.0, reason="final"),
                     evaluation(10.0, loss, unigram_entropy=2.64)])

    passing = check_final_loss(run(2.25 + REFERENCE_MARGIN), reference=CURVE)
    assert passing.status == PASS, passing.detail
    assert passing.evidence["reference_loss"] == pytest.approx(2.25)
    assert passing.evidence["tokens"] == 65000.0
    failing = check_final_loss(run(2.25 + REFERENCE_MARGIN + 0.01), reference=CURVE)
    assert failing.status == FAIL
    assert "reference 2.2500 by 65000 merged tokens" in failing.detail


def test_the_unigram_entropy_stays_a_sanity_floor_under_a_reference():
    curve = ReferenceCurve("k", ((0.0, 5.5), (1000.0, 3.0)))
    v = view([global_eval(9.0, 9, 2.7, tokens=1000.0), evaluation(10.0, 2.7, unigram_entropy=2.64)])
    verdict = check_final_loss(v, reference=curve)
    assert verdict.status == FAIL
    assert "sanity floor" in verdict.detail


def test_a_reference_that_diverged_itself_is_refused_for_the_fallback_rule():
    bad = ReferenceCurve("k", ((0.0, 5.5), (1000.0, 3.0)), settings={"failed": ["no_divergence"]})
    verdict = check_final_loss(view([evaluation(10.0, 3.5, unigram_entropy=4.0)]), reference=bad)
    assert verdict.status == PASS
    assert "no fault-free reference" in verdict.evidence["rule"]
    assert verdict.evidence["reference_refused"]["unusable"] == ["no_divergence"]


def test_explicit_checker_options_win_over_the_reference():
    options = with_reference({"final_loss": {"reference": 1.0}}, CURVE)
    assert options == {"final_loss": {"reference": 1.0}, "no_divergence": {"reference": CURVE}}
    assert with_reference(None, None) == {}


def test_the_run_records_which_reference_it_was_judged_against(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from chaos import runner

    (tmp_path / "run.json").write_text(json.dumps({"learners": 2}))
    monkeypatch.setattr(runner, "obtain_reference", lambda *a, **k: CURVE)
    spec = RunSpec(learners=2, duration=22.0)
    assert runner.fault_free_reference(tmp_path, spec) is CURVE
    assert json.loads((tmp_path / "run.json").read_text())["reference"] == CURVE.describe()

    def broken(*a, **k):
        raise TimeoutError("learner(s) [1] made no inner step within 120s")
    monkeypatch.setattr(runner, "obtain_reference", broken)
    assert runner.fault_free_reference(tmp_path, spec) is None
    assert "no inner step" in json.loads((tmp_path / "run.json").read_text())["reference"]["error"]


@pytest.mark.parametrize("argv, expected", [([], "auto"), (["--reference", "off"], "off")])
def test_chaos_run_uses_the_reference_unless_told_off(argv: list[str], expected: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch):
    import chaos.runner
    from chaos.__main__ import main

    seen: list[str] = []

    def fake_run_schedule(schedule, run_dir, spec=None, checker_options=None, evaluate=True, reference="auto",
                          **settings):
        seen.append(reference)
        raise RuntimeError("stand-in: no cluster in unit tests")

    monkeypatch.setattr(chaos.runner, "run_schedule", fake_run_schedule)
    quick = Path(__file__).resolve().parents[2] / "examples" / "schedules" / "quick.yaml"
    assert main(["run", str(quick), "--out", str(tmp_path / "run"), *argv]) == 1
    assert seen == [expected]


def test_editing_a_task_file_makes_a_new_reference(tmp_path: Path):
    from trainer.runspec import RunSpec
    task = tmp_path / "mine.py"
    task.write_text("task = None  # v1\n")
    spec = RunSpec(task=f"{task}:task")
    before = ref.reference_key(ref.settings_for(spec))
    assert before == ref.reference_key(ref.settings_for(spec)), "the same files, the same key"
    task.write_text("task = None  # v2: another model\n")
    assert ref.reference_key(ref.settings_for(spec)) != before, "a stale curve would judge the edited task"
    assert "task_source" not in ref.settings_for(RunSpec()), "the built-in task is in the trainer's digest"


def test_two_runs_wanting_one_missing_reference_at_once_run_it_once(monkeypatch: pytest.MonkeyPatch):
    """Two `chaos run`s of one configuration started together both find no reference when
    they end: the second used to delete the first's reference run directory
    (`<key>-run`) under it and run its own there. Now it waits for the first's and uses it."""
    calls: list[dict] = []
    write = fake_run(calls)
    spec = RunSpec(learners=2, duration=20.0, trainer_args=["--sync-every", "10"])
    second_ran = threading.Event()
    waiting: list[threading.Thread] = []
    got: dict[str, ReferenceCurve | None] = {}

    def run_schedule(schedule, run_dir, spec=None, **kwargs):
        if not waiting:  # the first: the other run asks for the same reference meanwhile
            waiting.append(threading.Thread(target=lambda: got.setdefault("second", ref.obtain(spec))))
            waiting[0].start()
            second_ran.wait(timeout=2.0)  # it would be here by now, had nothing held it back
        else:
            second_ran.set()
        return write(schedule, run_dir, spec, **kwargs)

    monkeypatch.setattr("chaos.runner.run_schedule", run_schedule)
    first = ref.obtain(spec)
    waiting[0].join(timeout=30)
    assert not waiting[0].is_alive()
    assert len(calls) == 1, "one reference run for one configuration"
    assert first is not None and got["second"] is not None and got["second"].points == first.points
