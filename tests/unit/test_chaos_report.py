"""The run report on synthetic run directories written by hand on a fake monotonic clock."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from chaos.report import fault_windows, global_losses, load_run, main, rolling_mean, write_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
T0 = 5000.0  # the fake monotonic clock at the history's `begin`


class Writer:
    """Writes events as each process would: one JSON object per line."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        (run_dir / "events").mkdir(parents=True, exist_ok=True)
        self.lines: dict[str, list[str]] = {}

    def emit(self, process: str, t: float, kind: str, learner: int | None = None, **fields) -> None:
        record = {"t": T0 + t, "wall": 1.7e9 + t, "process": process, "pid": 100 + len(process),
                  "learner": learner, "kind": kind, **fields}
        self.lines.setdefault(process, []).append(json.dumps(record))

    def flush(self, torn: dict[str, str] | None = None) -> None:
        for process, lines in self.lines.items():
            text = "\n".join(lines) + "\n" + (torn or {}).get(process, "")
            (self.run_dir / "events" / f"{process}.jsonl").write_text(text)


def history_entry(t: float, event: str, **fields) -> str:
    return json.dumps({"t": T0 + t, "wall": 1.7e9 + t, "event": event, **fields})


def make_chaos_run(run_dir: Path) -> Path:
    """3 learners, -10..60 s; kill learner-1 at 15..25 s (rejoins), partition learner-2 at 30..40 s."""
    w = Writer(run_dir)
    w.emit("syncer", -12.0, "process_start", role="syncer", mode="decoupled")
    for learner in (1, 2, 3):
        w.emit(f"learner-{learner}", -11.0, "process_start", learner, role="learner", incarnation=1)
        w.emit("syncer", -10.5, "join", learner, incarnation=1, rejoin=False)
    killed = (15.0, 25.0)
    for learner in (1, 2, 3):
        step, incarnation = 0, 1
        t = -10.0
        while t < 60.0:
            if learner == 1 and killed[0] <= t < killed[1] + 2.0:
                if incarnation == 1 and t >= killed[0]:
                    incarnation, step = 2, 0  # the restart starts a new incarnation from step 0
                t += 0.1
                continue
            step += 1
            loss = 5.0 * (0.97 ** ((t + 10.0) / 1.5)) + 0.5 + 0.05 * ((step * 7919) % 13) / 13
            if learner == 3 and step == 200:
                loss = "nan"
            w.emit(f"learner-{learner}", t, "inner_step", learner, step=step, loss=loss, tokens=512,
                   compute_s=0.05, incarnation=incarnation)
            t += 0.1 + 0.02 * learner
    w.emit("syncer", 19.0, "heartbeat_lost", 1, incarnation=1, silent_for=4.0)
    w.emit("learner-1", 26.5, "process_start", 1, role="learner", incarnation=2, rejoin=True)
    w.emit("syncer", 26.8, "join", 1, incarnation=2, rejoin=True)
    w.emit("syncer", 34.0, "heartbeat_lost", 2, incarnation=1, silent_for=4.0)
    w.emit("syncer", 41.0, "join", 2, incarnation=1, rejoin=True)
    versions = {0: 0, 1: 0}
    t = -8.0
    while t < 60.0:
        fragment = int(t) % 2
        versions[fragment] += 1
        w.emit("syncer", t, "merge", fragment=fragment, version=versions[fragment], reason="quorum",
               contributors=[{"id": f"{i}:1:{versions[fragment]}", "learner": i, "incarnation": 1,
                              "seq": versions[fragment], "tokens": 2048, "staleness": 0, "weight": 0.5}
                             for i in (2, 3)],
               tokens=4096)
        t += 1.0
    w.flush(torn={"learner-1": '{"t": 5060.5, "kind": "inner_st'})  # killed mid-write at the end

    kill = {"kind": "kill", "at": 15.0, "duration": 10.0, "target": "learner-1"}
    part = {"kind": "partition", "at": 30.0, "duration": 10.0, "targets": ["learner-2"], "mode": "blackhole"}
    lat = {"kind": "latency", "at": 45.0, "duration": 5.0, "target": "syncer", "latency_ms": 200}
    history = [
        history_entry(-0.2, "heal", reason="start", did=[], ok=True),
        history_entry(0.0, "begin", seed=7, faults=3, duration=60.0),
        history_entry(15.01, "start", index=0, kind="kill", fault=kill, planned=15.0, at=15.01, took=0.01,
                      did="SIGKILL learner-1", ok=True, error=None),
        history_entry(25.02, "stop", index=0, kind="kill", fault=kill, planned=25.0, at=25.02, took=1.2,
                      did="restarted learner-1", ok=True, error=None),
        history_entry(30.01, "start", index=1, kind="partition", fault=part, planned=30.0, at=30.01, took=0.02,
                      did="added toxics learner-2/partition_up", ok=True, error=None),
        history_entry(40.0, "stop", index=1, kind="partition", fault=part, planned=40.0, at=40.0, took=0.02,
                      did="removed toxics learner-2/partition_up", ok=True, error=None),
        history_entry(45.0, "start", index=2, kind="latency", fault=lat, planned=45.0, at=45.0, took=0.0,
                      did=None, ok=False, error="NotFound: no proxy syncer"),
        history_entry(60.0, "heal", reason="end", did=["enabled all proxies"], ok=True),
        history_entry(60.1, "end", errors=["faults[2] start: NotFound: no proxy syncer"]),
    ]
    (run_dir / "history.jsonl").write_text("\n".join(history) + "\n")
    verdict = {
        "passed": False,
        "checks": [
            {"name": "progress", "status": "pass", "detail": "merges kept coming", "evidence": {"max_gap": 1.0}},
            {"name": "no_lost_pushes", "status": "fail", "detail": "push 2:1:7 acknowledged but never merged",
             "evidence": {"ids": ["2:1:7"]}},
            {"name": "recovery", "status": "unknown", "detail": "too few samples", "evidence": {}},
        ],
        "summary": {"goodput": 0.6321, "merges": 68, "sync_rounds": 0, "tokens_processed": 1234567,
                    "train_loss_recent": 0.61},
    }
    (run_dir / "verdict.json").write_text(json.dumps(verdict))
    (run_dir / "schedule.yaml").write_text(
        "seed: 7\nfaults:\n- kind: kill\n  at: 15\n  duration: 10\n  target: learner-1\n"
        "- kind: partition\n  at: 30\n  duration: 10\n  targets: [learner-2]\n")
    (run_dir / "run.json").write_text(json.dumps({"backend": "local", "learners": 3, "mode": "decoupled"}))
    return run_dir


def assert_png(path: Path) -> None:
    import matplotlib.image as mpimg

    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 20_000
    image = mpimg.imread(path)
    assert image.ndim == 3 and image.shape[0] > 500 and image.shape[1] > 500


def assert_self_contained(text: str) -> None:
    assert "data:image/png;base64," in text
    assert not re.search(r"https?://", text), "the report must reference no external resource"
    assert "<script" not in text.lower()


def test_full_chaos_run_report(tmp_path: Path) -> None:
    run_dir = make_chaos_run(tmp_path / "chaos-demo")
    png, html = write_report(run_dir)
    assert png == run_dir / "timeline.png" and html == run_dir / "timeline.html"
    assert_png(png)
    text = html.read_text()
    assert_self_contained(text)
    assert "chaos-demo" in text and "FAIL" in text and "63.2%" in text
    for name in ("progress", "no_lost_pushes", "recovery"):
        assert name in text
    for status in ("pass", "fail", "unknown"):
        assert f">{status}</td>" in text
    assert "acknowledged but never merged" in text
    for kind in ("kill", "partition", "latency"):
        assert kind in text
    for target in ("learner-1", "learner-2", "syncer"):
        assert target in text
    assert "restarted learner-1" in text
    assert "NotFound: no proxy syncer" in text  # the failed start is listed with its error
    assert "targets: [learner-2]" in text  # the schedule text
    assert "unreadable line" in text  # the torn learner-1 tail is noted
    # the embedded image is exactly the PNG written next to it
    import base64

    embedded = re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", text).group(1)
    assert base64.b64decode(embedded) == png.read_bytes()


def test_the_global_held_out_loss_is_drawn_beside_the_training_losses(tmp_path: Path) -> None:
    """Θ's samples (global_eval) are read in order on the schedule's clock, a non-finite one left
    out; a one-version spike far above the axis still draws (clipped, its value written)."""
    run_dir = make_chaos_run(tmp_path / "run")
    w = Writer(run_dir)
    for i, (t, loss) in enumerate([(-12.0, 5.53), (-5.0, 3.5), (0.0, 17.13), (5.0, 2.1), (10.0, "nan"),
                                   (20.0, 1.9)]):
        w.emit("syncer", t, "global_eval", versions=[i], version=i, tokens=1000.0 * i, loss=loss, seconds=0.01,
               reason="start" if i == 0 else "merge")
    with open(run_dir / "events" / "syncer.jsonl", "a") as fh:
        fh.write("\n".join(w.lines["syncer"]) + "\n")
    run = load_run(run_dir)
    assert global_losses(run) == [(-12.0, 5.53), (-5.0, 3.5), (0.0, 17.13), (5.0, 2.1), (20.0, 1.9)]
    png, html = write_report(run_dir)
    assert_png(png)
    assert "held-out loss as the syncer sampled it" in html.read_text()


def test_fault_windows_pair_starts_with_stops(tmp_path: Path) -> None:
    run = load_run(make_chaos_run(tmp_path / "run"))
    assert run.t0 == T0
    windows = {w.index: w for w in fault_windows(run)}
    assert windows[0].kind == "kill" and windows[0].targets == ["learner-1"]
    assert windows[0].start == pytest.approx(T0 + 15.01) and windows[0].stop == pytest.approx(T0 + 25.02)
    assert windows[1].targets == ["learner-2"] and windows[1].stop == pytest.approx(T0 + 40.0)
    assert windows[2].start is None  # the failed start put nothing in force


def test_kill_without_restart_lasts_until_the_final_heal(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    w = Writer(run_dir)
    for i in range(50):
        w.emit("learner-1", i * 0.5, "inner_step", 1, step=i + 1, loss=3.0 - i * 0.01, tokens=64, compute_s=0.1,
               incarnation=1)
    w.flush()
    kill = {"kind": "kill", "at": 5.0, "duration": 5.0, "target": "learner-1", "restart": False}
    (run_dir / "history.jsonl").write_text("\n".join([
        history_entry(0.0, "begin", seed=1, faults=1, duration=20.0),
        history_entry(5.0, "start", index=0, kind="kill", fault=kill, planned=5.0, at=5.0, did="SIGKILL learner-1",
                      ok=True, error=None),
        history_entry(20.0, "heal", reason="end", did=[], ok=True),
    ]) + "\n")
    [window] = fault_windows(load_run(run_dir))
    assert window.stop == pytest.approx(T0 + 20.0) and "final heal" in window.stop_note
    png, html = write_report(run_dir)
    assert_png(png)
    assert "final heal" in html.read_text()


def test_syncer_only_run_without_history_still_reports(tmp_path: Path) -> None:
    run_dir = tmp_path / "plain"
    w = Writer(run_dir)
    w.emit("syncer", 0.0, "process_start", role="syncer", mode="sync")
    for r in range(1, 30):
        w.emit("syncer", r * 0.7, "sync_step", round=r, contributors=[1, 2], tokens=1024)
    w.flush()
    png, html = write_report(run_dir)
    assert_png(png)
    text = html.read_text()
    assert_self_contained(text)
    assert "No verdict.json" in text and "No history.jsonl" in text
    assert "syncer" in text


def test_run_with_no_merges_and_only_torn_lines_elsewhere(tmp_path: Path) -> None:
    run_dir = tmp_path / "partial"
    w = Writer(run_dir)
    for i in range(10):
        w.emit("learner-2", float(i), "inner_step", 2, step=i + 1, loss="inf" if i == 4 else 2.0, tokens=8,
               compute_s=0.01, incarnation=1)
    w.flush()
    (run_dir / "events" / "syncer.jsonl").write_text('{"t": 5000.0, "kind": "proc')  # torn, nothing complete
    (run_dir / "verdict.json").write_text("{not json")
    png, html = write_report(run_dir)
    assert_png(png)
    text = html.read_text()
    assert "not valid JSON" in text and "syncer.jsonl" in text


def test_main_writes_both_files_and_prints_their_paths(tmp_path: Path, capsys) -> None:
    run_dir = make_chaos_run(tmp_path / "run")
    assert main([str(run_dir)]) == 0
    out = capsys.readouterr().out.split()
    assert out == [str(run_dir / "timeline.png"), str(run_dir / "timeline.html")]


@pytest.mark.parametrize("setup", ["empty", "empty_events", "missing"])
def test_main_without_events_exits_2(tmp_path: Path, capsys, setup: str) -> None:
    run_dir = tmp_path / "run"
    if setup != "missing":
        run_dir.mkdir()
    if setup == "empty_events":
        (run_dir / "events").mkdir()
        (run_dir / "events" / "syncer.jsonl").write_text("")
    assert main([str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert str(run_dir) in err and ("no events" in err or "not a directory" in err)
    assert not (run_dir / "timeline.png").exists()


def test_rolling_mean_ignores_non_finite_values() -> None:
    import numpy as np

    out = rolling_mean(np.array([1.0, 3.0, np.nan, 5.0]), 2)
    assert out.tolist() == [1.0, 2.0, 3.0, 5.0]


def test_the_report_lists_the_required_checks_and_an_undecided_one(tmp_path: Path) -> None:
    """A verdict whose no_lost_acks was unknown failed for it: the report says which checks
    were required and that the unknown one failed the run."""
    run_dir = make_chaos_run(tmp_path / "run")
    verdict = json.loads((run_dir / "verdict.json").read_text())
    verdict.update(passed=False, failed=[], required=["no_lost_acks", "no_double_apply", "monotonic_versions",
                                                      "finite"], undecided=["no_lost_acks"], not_applicable=[])
    verdict["checks"] = [{"name": "no_lost_acks", "status": "unknown", "detail": "no final state", "evidence": {}},
                         {"name": "progress", "status": "pass", "detail": "merges kept coming", "evidence": {}}]
    (run_dir / "verdict.json").write_text(json.dumps(verdict))
    _, html_path = write_report(run_dir)
    text = html_path.read_text()
    assert "required to pass: no_lost_acks, no_double_apply, monotonic_versions, finite" in text
    assert "unknown, which fails the run: no_lost_acks" in text
    rows = re.findall(r"<tr><td>(\w+)</td><td class=\"status\"[^>]*>(\S+)</td><td>(\w*)</td>", text)
    assert ("no_lost_acks", "unknown", "yes") in rows and ("progress", "pass", "") in rows


def test_a_verdict_from_before_required_checks_still_reports(tmp_path: Path) -> None:
    _, html_path = write_report(make_chaos_run(tmp_path / "run"))
    assert "required checks: not recorded" in html_path.read_text()


def test_the_loss_axis_names_the_tasks_unit() -> None:
    """Issue 26: the report's loss axis said nats/byte for a user's conv net."""
    from chaos.report import loss_unit

    def start(**fields):
        return {"kind": "process_start", "role": "learner", "learner": 1, **fields}

    assert loss_unit([start(task="gpt", loss_unit="nats/byte")]) == "nats/byte"
    assert loss_unit([start(task="conv.py:task")]) == "the task's units"
    assert loss_unit([start(task="conv.py:task", loss_unit="cross-entropy, nats/image")]) == "cross-entropy, nats/image"
    assert loss_unit([start(task="gpt")]) == "nats/byte"  # runs from before the task said
