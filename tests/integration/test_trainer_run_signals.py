"""`python -m trainer run` stops its cluster cleanly on ^C and on SIGTERM, and still writes
its summary, however it was started.

Found by CI run in the background: a process started by a non-interactive shell with `&`
inherits SIGINT *ignored*, so the launcher never saw the ^C a test sent it, went on
restarting learners, was SIGKILLed, and left its syncer and learners (each in a session of
its own) training for minutes. SIGTERM's default action had the same effect: the launcher
died alone.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer.events import read_events

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--block-size", "8", "--batch-size", "4",
         "--sync-every", "5"]
STEPS_WITHIN = 120.0
STOP_WITHIN = 60.0


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `cmd &` in a non-interactive shell leaves it


def _stepped(out: Path) -> bool:
    return (out / "events").exists() and any(e["kind"] == "inner_step" for e in read_events(out))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint-inherited-ignored", "sigterm"])
def test_trainer_run_stops_its_cluster_on_a_signal(tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "run"
    launcher = subprocess.Popen([sys.executable, "-m", "trainer", "run", "--learners", "2", "--duration", "300",
                                 "--quiet", "--out", str(out), *SMALL], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, preexec_fn=_ignore_sigint)
    try:
        deadline = time.monotonic() + STEPS_WITHIN
        while not _stepped(out):
            assert launcher.poll() is None, f"the launcher exited {launcher.returncode} early"
            assert time.monotonic() < deadline, f"no inner step within {STEPS_WITHIN:.0f} s"
            time.sleep(0.2)
        launcher.send_signal(sig)
        stdout, _ = launcher.communicate(timeout=STOP_WITHIN)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=10)
    assert launcher.returncode == 0, f"exit {launcher.returncode}:\n{stdout}"
    assert "interrupted: stopping the cluster" in stdout, stdout
    assert (out / "summary.json").exists() and json.loads((out / "summary.json").read_text())["final_loss"]
    pids = {e["pid"] for e in read_events(out) if e["kind"] == "process_start"}
    assert pids, "no process_start events"
    left = sorted(p for p in pids if p != os.getpid() and _alive(p))
    assert not left, f"processes of the run still alive after the launcher exited: {left}"
