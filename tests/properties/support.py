"""What the property suites share: cluster settings, one run per drawn schedule, replay commands."""
from __future__ import annotations

import itertools
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from chaos.checkers import FAIL
from chaos.runner import RunResult, run_schedule
from faults import Schedule

# A small model and short rounds: it learns the Markov source within ~15 s, and a round
# (H=10) completes a few times a second, so every fault meets traffic. (H=5 is too short:
# the outer momentum then overshoots and the global loss stays near the unigram entropy.)
FAST_TRAINER_ARGS = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8",
                     "--sync-every", "10"]
TAIL_SECONDS = 12.0
_counter = itertools.count()


@dataclass
class Trial:
    """One schedule run against a fresh local cluster."""

    schedule: Schedule
    result: RunResult
    learners: int
    trainer_args: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def failed(self, *checks: str) -> list[str]:
        names = {v.name for v in self.result.verdicts if v.status == FAIL}
        return sorted(names & set(checks)) if checks else sorted(names)

    def replay_command(self, schedule_path: Path | None = None) -> str:
        path = schedule_path or self.result.run_dir / "schedule.yaml"
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cmd = (f"python -m chaos run {shlex.quote(str(path))} --backend local --learners {self.learners}"
               f" -- {shlex.join(self.trainer_args)}")
        return f"{env} {cmd}".strip()

    def explain(self) -> str:
        rows = [f"  {v.status.upper():<7} {v.name}: {v.detail}" for v in self.result.verdicts]
        return "\n".join([f"schedule:\n{self.schedule.dumps()}", *rows, f"replay: {self.replay_command()}"])


def run_trial(schedule: Schedule, base: Path, learners: int, trainer_args: list[str] | None = None,
              env: dict[str, str] | None = None, evaluate: bool = True,
              checker_options: dict | None = None, tail: float = TAIL_SECONDS) -> Trial:
    args = list(FAST_TRAINER_ARGS if trainer_args is None else trainer_args)
    run_dir = base / f"trial-{next(_counter):03d}"
    result = run_schedule(schedule, run_dir, learners=learners, duration=schedule.horizon + tail,
                          trainer_args=args, evaluate=evaluate, checker_options=checker_options)
    return Trial(schedule, result, learners, args, dict(env or {}))


def save_artifacts(config, nodeid: str, trial: Trial) -> Path:
    """Copy a trial's schedule, history, verdict and events where --chaos-artifacts points."""
    root = Path(config.getoption("--chaos-artifacts", default=None) or "chaos-artifacts")
    dest = root / re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    run_dir = trial.result.run_dir
    for name in ("schedule.yaml", "history.jsonl", "verdict.json", "run.json"):
        if (run_dir / name).exists():
            shutil.copy2(run_dir / name, dest / name)
    shutil.copytree(run_dir / "events", dest / "events")
    (dest / "REPLAY.txt").write_text(trial.replay_command(dest / "schedule.yaml") + "\n")
    return dest
