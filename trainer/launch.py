"""`python -m trainer run`: a local cluster of real processes, supervised, then a summary.

The syncer and N learners run as subprocesses talking TCP on 127.0.0.1. The launcher
restarts any that die (a learner after --restart-delay, the syncer on the same port),
shows a progress bar from the event files, stops everything cleanly, evaluates the final
global parameters on held-out data and prints the summary.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .config import TrainConfig
from .data import Corpus
from .events import EVENTS_DIR, EventLog
from .global_eval import HeldOut
from .runspec import RunSpec
from .keys import write_key_files
from .secretfile import ensure_secret
from .wire import SECRET_ENV, SECRET_FILE_ENV, load_secret
from .task import load_task
from .unit import FATAL_EXIT, HEALTHY_AFTER
from .unit import restart_backoff as unit_backoff
from .state import StateDir, load_tensors
from .sync_state import PARAM

START_TIMEOUT = 90.0
STOP_TIMEOUT = 20.0
MAX_RESTART_DELAY = 30.0


def restart_backoff(base: float, failures: int) -> float:
    """A learner's restart delay after `failures` short lives in a row (trainer.unit's
    backoff, from --restart-delay, at most MAX_RESTART_DELAY)."""
    return unit_backoff(base, failures, MAX_RESTART_DELAY)


@dataclass
class Proc:
    name: str
    argv: list[str]
    popen: subprocess.Popen | None = None
    restarts: int = 0
    died_at: float | None = None
    log: Path | None = None
    started_at: float = 0.0
    failures: int = 0     # consecutive short lives: each doubles the next restart's delay

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


@dataclass
class ClusterSpec:
    """Where a local cluster writes, what it runs (one RunSpec), and any learner's --speed."""

    run_dir: Path
    run: RunSpec
    speeds: dict[int, float] = field(default_factory=dict)


class LocalCluster:
    """The syncer plus N learners as local subprocesses (no proxies: see chaos/ for those)."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.run_dir = spec.run_dir
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        self.secret_file = ensure_secret(self.run_dir / "secret")
        self.env = dict(os.environ, ISLANDS_SECRET_FILE=str(self.secret_file), PYTHONUNBUFFERED="1",
                        OMP_NUM_THREADS="1")
        # A learner gets its own key file (keys.py), not the run secret: it can speak only as itself.
        self.key_files = write_key_files(self.run_dir / "keys", load_secret(str(self.secret_file)),
                                         spec.run.learners)
        self.learner_env = {k: v for k, v in self.env.items() if k not in (SECRET_FILE_ENV, SECRET_ENV)}
        self.address_file = self.run_dir / "syncer.json"
        self.port = 0
        self.events = EventLog(self.run_dir, "launcher")
        self.syncer = Proc("syncer", [])
        self.learners = {i: Proc(f"learner-{i}", []) for i in range(1, spec.run.learners + 1)}

    def _spawn(self, proc: Proc, env: dict[str, str] | None = None) -> None:
        proc.log = self.run_dir / "logs" / f"{proc.name}.log"
        with open(proc.log, "ab") as log:
            proc.popen = subprocess.Popen(proc.argv, env=self.env if env is None else env, stdout=log,
                                          stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        proc.died_at = None
        proc.started_at = time.monotonic()

    def start_syncer(self) -> None:
        self.address_file.unlink(missing_ok=True)
        self.syncer.argv = [sys.executable, "-m", "trainer", "syncer", "--state-dir", str(self.run_dir / "state"),
                            "--run-dir", str(self.run_dir), "--address-file", str(self.address_file),
                            "--host", "127.0.0.1", "--port", str(self.port), *self.spec.run.syncer_flags()]
        self._spawn(self.syncer)
        deadline = time.monotonic() + START_TIMEOUT
        while not self.address_file.exists():
            if self.syncer.popen.poll() is not None:
                raise RuntimeError(f"syncer exited with {self.syncer.popen.returncode} before listening; "
                                   f"see {self.syncer.log}:\n{_tail(self.syncer.log)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"syncer did not listen within {START_TIMEOUT:.0f}s; see {self.syncer.log}")
            time.sleep(0.05)
        self.port = int(json.loads(self.address_file.read_text())["port"])

    def start_learner(self, i: int) -> None:
        proc = self.learners[i]
        proc.argv = [sys.executable, "-m", "trainer", "learner", "--learner", str(i),
                     "--connect", f"127.0.0.1:{self.port}", "--run-dir", str(self.run_dir),
                     "--speed", str(self.spec.speeds.get(i, 1.0)), "--key-file", str(self.key_files[i]),
                     *self.spec.run.learner_flags(i)]
        self._spawn(proc, self.learner_env)

    def start(self) -> None:
        self.start_syncer()
        for i in self.learners:
            self.start_learner(i)

    def supervise(self, restart_delay: float) -> None:
        """Restart whatever died: the syncer at once on the same port, learners after a delay."""
        now = time.monotonic()
        if not self.syncer.alive():
            self.syncer.restarts += 1
            self.events.emit("restart", target="syncer", exit_code=self.syncer.popen.returncode)
            self.start_syncer()
        for i, proc in self.learners.items():
            if proc.alive() or proc.popen is None or proc.popen.returncode == FATAL_EXIT:
                continue  # a learner refused, or whose task cannot load, would only fail again
            if proc.died_at is None:
                proc.died_at = now
                lived = now - proc.started_at
                proc.failures = 0 if lived >= HEALTHY_AFTER else proc.failures + 1
            elif now - proc.died_at >= restart_backoff(restart_delay, proc.failures):
                proc.restarts += 1
                self.events.emit("restart", target=proc.name, exit_code=proc.popen.returncode,
                                 delay=round(now - proc.died_at, 2))
                self.start_learner(i)

    def stop(self) -> None:
        """SIGTERM learners first (they push their residual progress), then the syncer."""
        for group in (list(self.learners.values()), [self.syncer]):
            for proc in group:
                if proc.alive():
                    proc.popen.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT
            for proc in group:
                if proc.popen is None:
                    continue
                try:
                    proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.popen.kill()
                    proc.popen.wait(timeout=5)
        self.events.close()

    def kill(self) -> None:
        for proc in [*self.learners.values(), self.syncer]:
            if proc.alive():
                proc.popen.kill()
                proc.popen.wait(timeout=5)


def _tail(path: Path | None, lines: int = 15) -> str:
    if path is None or not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


# The bar counts seconds of the run (`12/60 s`), not a rate: "s/s" would read as a speed.
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} s [{elapsed}<{remaining}{postfix}]"


class ProgressTail:
    """Follows the event files to show loss and the global version (sync mode: rounds) on the bar."""

    def __init__(self, run_dir: Path, mode: str = "decoupled") -> None:
        self.dir = run_dir / EVENTS_DIR
        self.mode = mode
        self.offsets: dict[Path, int] = {}
        self.loss: dict[int, float] = {}
        self.version = 0
        self.rounds = 0

    def poll(self) -> None:
        for path in self.dir.glob("*.jsonl"):
            size = path.stat().st_size
            start = self.offsets.get(path, 0)
            if size <= start:
                continue
            with open(path, encoding="utf-8") as fh:
                fh.seek(start)
                chunk = fh.read()
            complete = chunk[: chunk.rfind("\n") + 1]
            self.offsets[path] = start + len(complete.encode())
            for line in complete.splitlines():
                try:
                    e = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if e["kind"] == "inner_step":
                    self.loss[e["learner"]] = e["loss"]
                elif e["kind"] == "merge":
                    self.version = max(self.version, e["version"])
                elif e["kind"] == "sync_step":
                    self.rounds = e["round"] + 1

    def postfix(self) -> dict:
        """Mean of the learners' last losses (… before the first step), and the clock that
        moves in this mode: the merged version (decoupled) or completed rounds (sync)."""
        loss = f"{sum(self.loss.values()) / len(self.loss):.3f}" if self.loss else "…"
        if self.mode == "sync":
            return {"loss": loss, "rounds": self.rounds}
        return {"loss": loss, "version": self.version}


def final_parameters(run_dir: Path, train: TrainConfig, state_dir: Path | None = None) -> dict[str, torch.Tensor]:
    store = StateDir(state_dir if state_dir is not None else run_dir / "state")
    if train.mode == "sync":
        tensors, _ = load_tensors(store.sync_path)
        return {k[len(PARAM):]: v for k, v in tensors.items() if k.startswith(PARAM)}
    return store.read_params(train.fragments)


def score(params: dict[str, torch.Tensor], train: TrainConfig, data: str | Corpus = "markov") -> dict:
    """The task's held-out loss of `params` (for the built-in task, nats per byte on the
    corpus's held-out tail: the windows the syncer's global_eval scores), its metrics and
    what it knows of the data."""
    held_out = held_out_of(train, data)
    loss = held_out.loss(params)
    return {"final_loss": round(loss, 4), **held_out.facts,
            **({"metrics": held_out.last_metrics} if held_out.last_metrics else {})}


def evaluate(params: dict[str, torch.Tensor], train: TrainConfig, data: str | Corpus = "markov") -> float:
    """The held-out loss alone, unrounded."""
    return held_out_of(train, data).loss(params)


def held_out_of(train: TrainConfig, data: str | Corpus) -> HeldOut:
    """The run's task's held-out set, as the syncer's global_eval scores it."""
    return HeldOut(load_task(train.task, train.task_options(data)), train.seed)  # type: ignore[arg-type]


def learner_logs_tail(run_dir: Path) -> str:
    out = []
    for log in sorted((run_dir / "logs").glob("*.log")):
        tail = _tail(log, 5)
        if "Error" in tail or "Traceback" in tail:
            out.append(f"--- {log.name}\n{tail}")
    return "\n".join(out)
