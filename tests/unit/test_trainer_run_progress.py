"""`python -m trainer run`'s bar and summary: seconds of the run, not a rate; no loss=nan
before the first step; version in decoupled mode, rounds in sync; the run's length beside
its training time."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from tqdm import tqdm

from trainer.__main__ import print_summary, run_timing
from trainer.launch import BAR_FORMAT, ProgressTail


def write(run_dir: Path, *records: dict) -> None:
    path = run_dir / "events" / "x.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")


def test_the_bar_counts_seconds_of_the_run_without_a_rate() -> None:
    text = tqdm.format_meter(n=12, total=60, elapsed=12.0, bar_format=BAR_FORMAT, postfix="loss=…, version=0",
                             ncols=100)
    assert "12/60 s" in text and "s/s" not in text and "loss=…, version=0" in text


def test_postfix_before_the_first_step_and_per_mode(tmp_path: Path) -> None:
    decoupled = ProgressTail(tmp_path, "decoupled")
    decoupled.poll()
    assert decoupled.postfix() == {"loss": "…", "version": 0}
    write(tmp_path, {"kind": "inner_step", "learner": 1, "loss": 2.0}, {"kind": "inner_step", "learner": 2, "loss": 3.0},
          {"kind": "merge", "version": 5})
    decoupled.poll()
    assert decoupled.postfix() == {"loss": "2.500", "version": 5}
    sync = ProgressTail(tmp_path, "sync")
    write(tmp_path, {"kind": "sync_step", "round": 7})
    sync.poll()
    assert sync.postfix() == {"loss": "2.500", "rounds": 8}


def test_run_timing_says_where_the_seconds_went() -> None:
    events = [{"kind": "process_start", "t": 101.0}, {"kind": "inner_step", "t": 108.0}]
    assert run_timing(events, started=100.0, elapsed=60.02) == {"run_seconds": 60.0, "startup_seconds": 8.0}
    assert run_timing([], started=0.0, elapsed=0.0) == {"run_seconds": 0.0}


def test_the_summary_heads_with_the_run_length_and_explains_training_time(capsys: pytest.CaptureFixture) -> None:
    print_summary({"mode": "decoupled", "learners": 3, "wall_seconds": 52.3, "run_seconds": 60.0,
                   "startup_seconds": 7.5, "final_loss": 1.9, "loss_floor": 1.717, "unigram_entropy": 2.637,
                   "goodput": 0.9, "tokens_processed": 10, "tokens_merged": 9, "merges": 3, "sync_rounds": 0,
                   "bytes_on_wire": 0}, Path("runs/x"))
    out = capsys.readouterr().out
    assert "summary (decoupled, 3 learners, 60 s run):" in out
    assert "52.3 s of the run, first to last inner step; the first 7.5 s went to starting the learners" in out
