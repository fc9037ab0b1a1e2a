"""What the property suites share: cluster settings, one run per drawn schedule, replay commands."""
from __future__ import annotations

import itertools
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from chaos.checkers import failing
from chaos.pytest_plugin import streaming_trainer_args
from chaos.runner import RunResult, run_schedule
from faults import Schedule

# A small model and short rounds: it learns the Markov source within ~15 s, and a round
# (H=10) completes a few times a second, so every fault meets traffic. (H=5 is too short:
# the outer momentum then overshoots and the global loss stays near the unigram entropy.)
FAST_TRAINER_ARGS = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8",
                     "--sync-every", "10"]
TAIL_SECONDS = 12.0
_counter = itertools.count()
_streaming = False  # set for the session by tests/properties/conftest.py from --chaos-streaming
_reference = "auto"  # ... and from --chaos-reference: judge against a fault-free run (chaos/reference.py)


def use_streaming(on: bool) -> None:
    global _streaming
    _streaming = bool(on)


def use_reference(mode: str) -> None:
    global _reference
    _reference = mode


def suite_trainer_args(*extra: str, streaming: bool | None = None) -> list[str]:
    """The trainer args of every property-suite cluster: FAST_TRAINER_ARGS, then `extra`; with
    streaming (`--chaos-streaming` unless `streaming` says otherwise) also P=4 fragments, int4
    and tau=1, with H rounded up from 10 to 12."""
    args = [*FAST_TRAINER_ARGS, *extra]
    on = _streaming if streaming is None else streaming
    return streaming_trainer_args(args) if on else args


def fragment_count(events: list[dict]) -> int:
    """P, as the syncer announced it in its `process_start` config (1 when it did not)."""
    for e in events:
        if e["kind"] == "process_start" and e.get("role") == "syncer":
            return int((e.get("config") or {}).get("fragments") or 1)
    return 1


def not_rejoined(events: list[dict], since: float, learners: int) -> list[str]:
    """What stops `learners` from counting as back in sync since `since`: for each learner and
    fragment, whether a merge after `since` holds one of its pushes, and whether it has adopted
    (applied) a global version of that fragment since. With P=1 a merged push is followed by
    its adoption within a round; with P fragments (streaming) one merged push says nothing
    about the other P-1 fragments, and the learners' final drift (the `converged` check) is
    measured against the version of each fragment they last adopted."""
    fragments = range(fragment_count(events))
    contributed = {(c["learner"], e["fragment"]) for e in events if e["kind"] == "merge" and e["t"] > since
                   for c in e["contributors"]}
    adopted = {(e["learner"], e["fragment"]) for e in events if e["kind"] == "apply" and e["t"] > since
               and e.get("fragment") is not None}
    gaps = []
    for learner in range(1, learners + 1):
        unmerged = [f for f in fragments if (learner, f) not in contributed]
        unadopted = [f for f in fragments if (learner, f) not in adopted]
        if unmerged:
            gaps.append(f"learner-{learner}: no push merged into fragment(s) {unmerged}")
        if unadopted:
            gaps.append(f"learner-{learner}: adopted no new version of fragment(s) {unadopted}")
    return gaps


@dataclass
class Trial:
    """One schedule run against a fresh local cluster."""

    schedule: Schedule
    result: RunResult
    learners: int
    trainer_args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    ranks: int = 1

    def failed(self, *checks: str) -> list[str]:
        """The checks that fail the run (a required one left unknown among them), or those of `checks`."""
        names = {v.name for v in failing(self.result.verdicts)}
        return sorted(names & set(checks)) if checks else sorted(names)

    def replay_command(self, schedule_path: Path | None = None) -> str:
        path = schedule_path or self.result.run_dir / "schedule.yaml"
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        ranks = f" --ranks {self.ranks}" if self.ranks > 1 else ""
        cmd = (f"python -m chaos run {shlex.quote(str(path))} --backend local --learners {self.learners}{ranks}"
               f" -- {shlex.join(self.trainer_args)}")
        return f"{env} {cmd}".strip()

    def explain(self) -> str:
        rows = [f"  {v.status.upper():<7} {v.name}: {v.detail}" for v in self.result.verdicts]
        return "\n".join([f"schedule:\n{self.schedule.dumps()}", *rows, f"replay: {self.replay_command()}"])


def run_trial(schedule: Schedule, base: Path, learners: int, trainer_args: list[str] | None = None,
              env: dict[str, str] | None = None, evaluate: bool = True,
              checker_options: dict | None = None, tail: float = TAIL_SECONDS, ranks: int = 1) -> Trial:
    """One schedule against a fresh local cluster; `ranks` > 1 makes every learner a unit of that many."""
    args = list(suite_trainer_args() if trainer_args is None else trainer_args)
    run_dir = base / f"trial-{next(_counter):03d}"
    result = run_schedule(schedule, run_dir, learners=learners, ranks=ranks, duration=schedule.horizon + tail,
                          trainer_args=args, evaluate=evaluate, checker_options=checker_options,
                          reference=_reference)
    return Trial(schedule, result, learners, args, dict(env or {}), ranks)


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
