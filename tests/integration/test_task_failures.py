"""A user's task that is broken, end to end through `python -m trainer run`.

A task broken from the start is refused by the preflight, before any process starts, with
exit status 2 and the checked error on stderr. A task that breaks mid-run (its loss turns
NaN after some steps) makes its learner stop with TASK_EXIT, say why in its log and in a
task_error event, and be restarted by the launcher with a growing delay; the run still
ends with a summary that lists the task's errors.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trainer.events import read_events
from trainer.launch import restart_backoff
from trainer.learner import TASK_EXIT

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

TASK_BASE = """
import torch
import torch.nn.functional as F


class Base:
    def model(self):
        return torch.nn.Linear(8, 4)

    def batches(self, shard, shards, seed):
        self.shard = shard
        g = torch.Generator().manual_seed(seed * 100 + shard)
        while True:
            yield torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)

    def loss(self, model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y)

    def tokens(self, batch):
        return len(batch[1])

    def eval_batches(self):
        g = torch.Generator().manual_seed(12345)
        return [(torch.randn(32, 8, generator=g), torch.randint(0, 4, (32,), generator=g))]
"""

# Learner-1 (shard 0) trains FINITE_STEPS steps per incarnation, then its loss is NaN;
# learner-2 stays healthy. Only training-mode calls count, so the preflight and the held-out
# evaluations (model.eval()) always see a finite loss.
NAN_TASK = TASK_BASE + """
FINITE_STEPS = 30


class NanAfter(Base):
    def __init__(self):
        self.calls = 0
        self.shard = None

    def loss(self, model, batch):
        out = super().loss(model, batch)
        if model.training and self.shard == 0:
            self.calls += 1
            if self.calls > FINITE_STEPS:
                return torch.tensor(float("nan"), requires_grad=True)
        return out


task = NanAfter
"""

RESTART_DELAY = 1.0   # the launcher's default: restarts after 1, 2, 4 ... s
RESTARTS_WITHIN = 100.0


def _write_task(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "user_task.py"
    path.write_text(textwrap.dedent(source))
    return path


def _trainer_run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainer", "run", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("source,name,message", [
    (TASK_BASE + """
class LossOfShape8(Base):
    def loss(self, model, batch):
        return F.cross_entropy(model(batch[0]), batch[1], reduction="none")[:8]
""", "LossOfShape8", "task.loss returned a tensor of shape (8,), expected a scalar"),
    (TASK_BASE, "task", "no attribute 'task'"),
], ids=["loss-shape", "missing-attribute"])
def test_a_broken_task_is_refused_before_anything_starts(tmp_path: Path, source: str, name: str,
                                                         message: str) -> None:
    path = _write_task(tmp_path, source)
    out = tmp_path / "run"
    started = time.monotonic()
    proc = _trainer_run(["--task", f"{path}:{name}", "--duration", "10", "--learners", "2", "--quiet",
                         "--out", str(out)], timeout=60)
    assert proc.returncode == 2, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert message in proc.stderr, proc.stderr
    assert str(path) in proc.stderr, "the error should name the task file"
    assert not out.exists(), f"the refused run created {sorted(p.name for p in out.iterdir())}"
    assert "islands:" not in proc.stdout, f"the cluster started: {proc.stdout}"
    assert time.monotonic() - started < 30, "refusing a task should not wait for the run's duration"


def _restarts(run_dir: Path) -> list[dict]:
    if not (run_dir / "events").is_dir():
        return []
    return [e for e in read_events(run_dir) if e["kind"] == "restart" and e["process"] == "launcher"]


def test_a_nan_loss_mid_run_is_reported_and_its_learner_restarted_with_backoff(tmp_path: Path) -> None:
    """The run is long (--duration 300) and stopped, as a user would with ^C, once the
    launcher has restarted learner-1 twice: how long a learner takes to start varies with
    the machine's load, so a fixed duration would see 0, 1 or 3 restarts."""
    path = _write_task(tmp_path, NAN_TASK)
    spec = f"{path}:task"
    run_dir = tmp_path / "run"
    stdout, stderr = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(stdout, "w") as out, open(stderr, "w") as err:
        launcher = subprocess.Popen([sys.executable, "-m", "trainer", "run", "--task", spec, "--duration", "300",
                                     "--learners", "2", "--quiet", "--out", str(run_dir), "--restart-delay",
                                     str(RESTART_DELAY), "--sync-every", "10"], cwd=ROOT, stdout=out, stderr=err)
    try:
        deadline = time.monotonic() + RESTARTS_WITHIN
        while len(_restarts(run_dir)) < 2:
            assert launcher.poll() is None, \
                f"the launcher exited {launcher.returncode} early:\n{stdout.read_text()}\n{stderr.read_text()}"
            assert time.monotonic() < deadline, \
                f"learner-1 was not restarted twice within {RESTARTS_WITHIN} s: {_restarts(run_dir)}"
            try:
                launcher.wait(timeout=0.25)
            except subprocess.TimeoutExpired:
                pass
    finally:
        launcher.send_signal(signal.SIGINT)  # stop the cluster, then summarise
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.wait(timeout=10)
    assert launcher.returncode == 0, f"exit {launcher.returncode}\n{stdout.read_text()}\n{stderr.read_text()}"
    events = read_events(run_dir)

    # Learner-1 said why it stopped: a task_error naming the method and the NaN.
    errors = [e for e in events if e["kind"] == "task_error"]
    assert errors, f"no task_error event; kinds seen: {sorted({e['kind'] for e in events})}"
    assert {e["learner"] for e in errors} == {1}, f"only learner-1's loss turns NaN: {errors}"
    for e in errors:
        assert e["method"] == "loss" and e["task"] == spec, e
        assert e["error"].startswith(f"task {spec}: task.loss returned nan at step "), e["error"]
        assert isinstance(e["position"], int) and e["position"] > 0, e

    # ... in its log, too.
    log = (run_dir / "logs" / "learner-1.log").read_text(errors="replace")
    assert f"error: task {spec}: task.loss returned nan at step " in log, log[-2000:]

    # The summary lists the task's errors.
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary.get("task_errors"), f"summary.json has no task_errors: {sorted(summary)}"
    assert [e["error"] for e in summary["task_errors"]] == [e["error"] for e in errors]
    assert all(e["learner"] == 1 and e["method"] == "loss" for e in summary["task_errors"])
    assert summary.get("final_loss") is not None, summary

    # The launcher restarted learner-1 after each failure (exit status TASK_EXIT), waiting longer each time.
    restarts = [e for e in events if e["kind"] == "restart" and e["process"] == "launcher"]
    assert {e["target"] for e in restarts} == {"learner-1"}, restarts
    assert all(e["exit_code"] == TASK_EXIT for e in restarts), restarts
    delays = [e["delay"] for e in restarts]
    assert len(delays) >= 2, delays
    for k, delay in enumerate(delays, start=1):
        expected = restart_backoff(RESTART_DELAY, k)
        assert delay >= expected - 0.01, f"restart {k} came after {delay} s, before its backoff {expected} s: {delays}"
    assert all(b >= a for a, b in zip(delays, delays[1:])), f"restart delays shrank: {delays}"
    for restart in restarts:
        assert any(e["t"] < restart["t"] for e in errors), f"a restart with no task_error before it: {restart}"

    # The healthy learner kept training throughout.
    steps_2 = [e for e in events if e["kind"] == "inner_step" and e["learner"] == 2]
    assert steps_2 and steps_2[-1]["t"] > restarts[-1]["t"], "learner-2 stopped training"
