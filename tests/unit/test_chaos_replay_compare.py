"""`chaos replay` read beside its original: the table, the drift, replay.json, and
originals without verdict.json (a pytest artifacts directory)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import chaos.runner
from chaos.__main__ import main
from chaos.checkers import Verdict, verdict_document
from chaos.replay_compare import compare, format_comparison, original_figures, replay_figures
from faults import Pause, Schedule
from trainer.runspec import RunSpec


def write_original(path: Path, verdict: dict | None = None) -> Path:
    path.mkdir(parents=True)
    Schedule(seed=7, faults=(Pause(at=1.0, duration=2.0, target="learner-2"),)).dump(path / "schedule.yaml")
    (path / "run.json").write_text(json.dumps({"backend": "local", "learners": 2, "seed": 7, "duration": 10}))
    if verdict is not None:
        (path / "verdict.json").write_text(json.dumps(verdict))
    return path


ORIGINAL = {"passed": True, "failed": [], "unknown": [],
            "checks": [{"name": "progress", "status": "pass", "detail": "", "evidence": {}},
                       {"name": "final_loss", "status": "pass", "detail": "", "evidence": {}}],
            "summary": {"goodput": 0.91, "final_loss": 1.92}}


def replay_document(final_loss: float, status: str = "fail") -> dict:
    verdicts = [Verdict("progress", "pass", ""), Verdict("final_loss", status, "")]
    summary = {"goodput": 0.85, "final_loss": final_loss, "merges": 12, "sync_rounds": 0,
               "tokens_processed": 40960, "train_loss_recent": 2.1, "unigram_entropy": 2.637, "loss_floor": 1.717}
    return {**verdict_document(verdicts), "summary": summary}


def test_the_comparison_puts_each_check_and_figure_side_by_side(tmp_path: Path) -> None:
    original = write_original(tmp_path / "run", ORIGINAL)
    comparison = compare(original, original_figures(original, 2), replay_figures(replay_document(2.26)))
    assert comparison["checks"] == [{"check": "progress", "original": "pass", "replay": "pass"},
                                    {"check": "final_loss", "original": "pass", "replay": "fail"}]
    assert comparison["changed"] == ["final_loss"] and comparison["failures_came_back"] == []
    assert comparison["final_loss"] == {"original": 1.92, "replay": 2.26, "drift": 0.34}
    assert comparison["goodput"]["drift"] == pytest.approx(-0.06)
    text = format_comparison(comparison)
    lines = text.splitlines()
    assert any(line.split() == ["check", "original", "replay"] for line in lines)
    assert any(line.split() == ["final_loss", "PASS", "FAIL"] for line in lines)
    assert any(line.split()[-2:] == ["91.0%", "85.0%"] and line.strip().startswith("goodput") for line in lines)
    assert "final loss +0.3400 (replay − original)" in text


def test_a_failure_that_came_back_is_named(tmp_path: Path) -> None:
    failed = {**ORIGINAL, "passed": False, "failed": ["final_loss"],
              "checks": [{"name": "final_loss", "status": "fail"}]}
    original = write_original(tmp_path / "run", failed)
    text = format_comparison(compare(original, original_figures(original, 2), replay_figures(replay_document(2.5))))
    assert "the original's failure came back: final_loss" in text


def test_an_original_without_verdict_json_is_said_and_its_events_still_count(tmp_path: Path) -> None:
    original = write_original(tmp_path / "artifacts")
    events = original / "events"
    events.mkdir()
    (events / "evaluator.jsonl").write_text(json.dumps({"t": 5.0, "kind": "eval", "final_loss": 2.01,
                                                         "learner": None}) + "\n")
    figures = original_figures(original, 2)
    assert figures.checks == {} and figures.final_loss == 2.01
    assert "verdict.json does not exist" in figures.note
    text = format_comparison(compare(original, figures, replay_figures(replay_document(2.11))))
    assert "note:" in text and "drift: final loss +0.1000" in text
    assert any(line.split() == ["final_loss", "—", "FAIL"] for line in text.splitlines())


def test_a_broken_verdict_json_is_a_note_not_a_crash(tmp_path: Path) -> None:
    original = write_original(tmp_path / "run")
    (original / "verdict.json").write_text("{oops")
    assert "not valid JSON" in original_figures(original, 2).note


def test_chaos_replay_prints_and_records_the_comparison(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture) -> None:
    specs: list = []

    def fake_run_schedule(schedule, run_dir, spec=None, checker_options=None, evaluate=True, reference="auto",
                          **settings):
        specs.append(spec)
        run_dir.mkdir(parents=True)
        document = replay_document(2.26)
        (run_dir / "verdict.json").write_text(json.dumps(document))
        verdicts = [Verdict(c["name"], c["status"], c["detail"]) for c in document["checks"]]
        return chaos.runner.RunResult(run_dir, verdicts, document, document["summary"])

    monkeypatch.setattr(chaos.runner, "run_schedule", fake_run_schedule)
    original = write_original(tmp_path / "run", ORIGINAL)
    assert main(["replay", str(original)]) == 1
    assert specs == [RunSpec(backend="local", learners=2, seed=7, duration=10.0)], "the replay runs run.json's spec"
    out = capsys.readouterr().out
    assert f"replay beside its original ({original})" in out
    assert "checks that changed: final_loss" in out
    recorded = json.loads((tmp_path / "run-replay-1" / "replay.json").read_text())
    assert recorded["original"] == str(original)
    assert recorded["final_loss"] == {"original": 1.92, "replay": 2.26, "drift": 0.34}
    assert recorded["verdict"] == {"original": "pass", "replay": "fail"}
    assert os.path.exists(tmp_path / "run-replay-1" / "verdict.json")
