"""One chaos run: start a cluster, let it warm up, apply a schedule, heal, stop, check.

Shared by `python -m chaos run`, `replay` and the pytest plugin, so a failure found by a
test replays with exactly the same code path from the command line.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from faults import Schedule

from trainer.events import read_events
from trainer.metrics import summarize
from trainer.runspec import RunSpec

from .backends.base import Cluster
from .checkers import RunView, Verdict, final_tokens, run_checkers, verdict_document
from .backends.collect import incomplete_nodes
from .clock_probe import Prober
from .controller import HISTORY_FILE, Controller, History, read_history
from .nemesis import NEMESES
from .reference import MODES as REFERENCE_MODES
from .reference import ReferenceCurve, check_reference_seconds
from .reference import obtain as obtain_reference
from .timeline import ONE_CLOCK, Placement, estimate_all, read_samples, run_events, write_estimates

WARMUP_TIMEOUT = 120.0
TAIL_SECONDS = 20.0


@dataclass
class RunResult:
    run_dir: Path | None  # None: judged from memory
    verdicts: list[Verdict]
    document: dict
    summary: dict

    @property
    def passed(self) -> bool:
        return self.document["passed"]


def make_cluster(spec: RunSpec, run_dir: Path) -> Cluster:
    """The cluster of `spec.backend` that runs `spec` in `run_dir`."""
    if spec.backend == "local":
        from .backends.local import LocalCluster
        return LocalCluster(run_dir, spec=spec)
    if spec.backend == "compose":
        from .backends.compose import ComposeCluster
        return ComposeCluster(run_dir, spec=spec)
    if spec.backend == "swarm":
        from .backends.swarm import SwarmCluster
        return SwarmCluster(run_dir, spec=spec)
    raise ValueError(f"--backend: unknown backend {spec.backend!r} (known: local, compose, swarm)")


def check_task(spec: RunSpec) -> None:
    """Load the run's task and call each method once before anything starts: a broken task
    is refused with its clear error (ValueError) and leaves no run directory behind."""
    from trainer.__main__ import build_parser
    from trainer.cli_args import train_config
    from trainer.task import TaskError, check_run_task
    try:  # the training flags as the syncer will read them: model shape, batch size, seed
        parser = build_parser()
        syncer = parser._subparsers._group_actions[0].choices["syncer"]  # type: ignore[union-attr]
        args = parser.parse_args(["syncer", "--state-dir", "-", "--task", spec.task, *spec.trainer_args])
        train = train_config(args, syncer, spec.learners)
        shards = sum(spec.ranks_of(i) for i in range(1, spec.learners + 1))  # at least; each rank its own
        check_run_task(train, spec.data, shards)
    except SystemExit:  # argparse said why on stderr
        raise ValueError(f"trainer_args: {' '.join(spec.trainer_args)} are not valid trainer flags") from None
    except TaskError as exc:
        raise ValueError(str(exc) + (f"\n{exc.details}" if exc.details else "")) from None


def wait_until_training(run_dir: Path, learners: int, timeout: float = WARMUP_TIMEOUT) -> None:
    """Block until every learner has made an inner step; fail naming the ones that did not."""
    deadline = time.monotonic() + timeout
    while True:
        stepped = {e["learner"] for e in read_events(run_dir) if e["kind"] == "inner_step"}
        if stepped >= set(range(1, learners + 1)):
            return
        if time.monotonic() > deadline:
            missing = sorted(set(range(1, learners + 1)) - stepped)
            raise TimeoutError(f"learner(s) {missing} made no inner step within {timeout:.0f}s; see {run_dir}/logs")
        time.sleep(0.25)


def default_duration(schedule: Schedule) -> float:
    return schedule.horizon + TAIL_SECONDS


def syncer_final_eval(events: list[dict], data: str) -> dict | None:
    """The `eval` the syncer wrote as it stopped cleanly (trainer/global_eval.py), when it
    scored the run's final state on `data`: its last incarnation started with `--eval-data
    data`, wrote the eval, then stopped. None otherwise (killed at the end, no evaluator,
    other data): then only `trainer eval` of the state dir can say."""
    syncer = [e for e in events if e.get("process") == "syncer"]
    starts = [i for i, e in enumerate(syncer) if e["kind"] == "process_start"]
    if not starts:
        return None
    last = syncer[starts[-1]:]
    if (last[0].get("syncer") or {}).get("eval_data") != data:
        return None
    evals = [i for i, e in enumerate(last) if e["kind"] == "eval" and "final_loss" in e]
    stopped = any(e["kind"] == "process_stop" for e in last[evals[-1]:]) if evals else False
    if not stopped:
        return None
    e = last[evals[-1]]
    return {k: e.get(k) for k in ("final_loss", "loss_floor", "unigram_entropy", "data", "metrics") if k in e}


def final_loss(run_dir: Path | None, data: str, events: list[dict] | None = None) -> dict:
    """Held-out loss of the syncer's final parameters: the score the syncer wrote as it
    stopped, or else `trainer eval` of its state dir (the trainer's own CLI, a process
    that costs a torch import). `events`: the run's, when already read (None: read them
    from `run_dir`); no `run_dir`: no state dir to evaluate."""
    scored = syncer_final_eval(read_events(run_dir) if events is None else events, data)
    if scored is not None:
        return scored
    if run_dir is None:
        return {}
    state = run_dir / "state"
    if not state.is_dir():
        return {}
    try:
        out = subprocess.run([sys.executable, "-m", "trainer", "eval", "--state-dir", str(state), "--data", data,
                              "--run-dir", str(run_dir)],
                             capture_output=True, text=True, timeout=120, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError) as exc:
        return {"eval_error": str(exc)}


def with_reference(checker_options: dict | None, reference: ReferenceCurve | None) -> dict:
    """`checker_options` with the fault-free reference handed to the checks that compare with
    it; options given explicitly win."""
    options = {name: dict(opts) for name, opts in (checker_options or {}).items()}
    if reference is not None:
        for name in ("final_loss", "no_divergence"):
            options.setdefault(name, {}).setdefault("reference", reference)
    return options


def evaluate_run(run_dir: Path, learners: int, checker_options: dict | None = None, data: str = "markov",
                 evaluate: bool = True, reference: ReferenceCurve | None = None, align: bool = True,
                 verdict_file: str = "verdict.json") -> RunResult:
    """Check the run in `run_dir` and write its verdict (`verdict_file`, in it). Events
    stamped on other hosts' clocks are placed on the controller's timeline first
    (chaos/timeline.py), unless `align` is False (to see what a harness that trusts every
    clock would conclude)."""
    events, placement = run_events(run_dir, align)
    result = judge_events(events, read_history(run_dir / HISTORY_FILE), learners, run_dir,
                          checker_options, data, evaluate, reference, placement, incomplete_nodes(run_dir))
    (run_dir / verdict_file).write_text(json.dumps(result.document, indent=2))
    return result


def check_events(view: RunView, checker_options: dict | None = None,
                 reference: ReferenceCurve | None = None) -> list[Verdict]:
    """The checks' verdicts alone: what a search needs of a run, without the summary and
    the verdict document (a run of the simulator's search is judged and dropped)."""
    return run_checkers(view, with_reference(checker_options, reference))


def judge_events(events: list[dict], history: list[dict], learners: int, run_dir: Path | None,
                 checker_options: dict | None = None, data: str = "markov", evaluate: bool = True,
                 reference: ReferenceCurve | None = None, placement: Placement = ONE_CLOCK,
                 incomplete: dict | None = None) -> RunResult:
    """The checks' verdicts on a run's events and history, read once (the simulator's
    search hands them from memory, with no `run_dir`: no state dir to read)."""
    # Writes the `eval` event the final_loss check reads; without it that check says unknown.
    evaluation = final_loss(run_dir, data, events) if evaluate else {}
    view = RunView(events, history, state_dir=run_dir / "state" if run_dir is not None else None,
                   placement=placement, incomplete=incomplete or {})
    verdicts = check_events(view, checker_options, reference)
    document = verdict_document(verdicts)
    summary = summarize(view.events, learners)
    summary.update(evaluation)
    document["summary"] = summary
    return RunResult(run_dir, verdicts, document, summary)


def run_schedule(schedule: Schedule, run_dir: Path, spec: RunSpec | None = None,
                 checker_options: dict | None = None, evaluate: bool = True, reference: str = "auto",
                 on_phase: Callable[[str], None] | None = None, on_start: Callable[[], None] | None = None,
                 reference_seconds: float = 0.0, **settings) -> RunResult:
    """Run `spec` (or a RunSpec of `settings`: backend=, learners=, task=, ...) under
    `schedule`. `reference`: "auto" compares the final loss with a fault-free run of the
    same configuration (chaos/reference.py: cached, run after this one when missing, for
    this run's duration or `reference_seconds`, whichever is longer), "off"
    does not (nor does a run that is not evaluated). `on_phase` hears what the run does
    after its schedule (the progress printer's heartbeat says it); `on_start` is called once
    the run is accepted and its directory made (a refused run made none, and says nothing of one)."""
    phase = on_phase or (lambda text: None)
    if reference not in REFERENCE_MODES:
        raise ValueError(f"reference: must be one of {', '.join(REFERENCE_MODES)}, got {reference!r}")
    check_reference_seconds(reference_seconds)  # before the run, not minutes into it
    spec = (spec or RunSpec()).replace(**settings) if settings else (spec or RunSpec())
    spec = spec.replace(seed=schedule.seed, duration=spec.duration if spec.duration is not None
                        else default_duration(schedule),
                        disk_layer=spec.disk_layer or NEMESES.need_disk_layer(schedule.faults))
    schedule.validate(spec.learners)
    if spec.duration < schedule.horizon:
        raise ValueError(f"duration: {spec.duration:g} s ends before the schedule's last fault does, at "
                         f"{schedule.horizon:g} s; give at least that, or none (the default: the schedule's horizon "
                         f"+ {TAIL_SECONDS:g} s to recover)")
    # Every refusal (a bad schedule or task, a fault the backend cannot apply, a cluster
    # already running) comes before the run directory exists: a refused run leaves nothing behind.
    cluster = make_cluster(spec, run_dir)
    problems = cluster.unsupported(schedule)
    if problems:
        raise ValueError(f"backend {spec.backend}: " + "; ".join(problems))
    check_task(spec)
    cluster.preflight()
    run_dir.mkdir(parents=True, exist_ok=True)
    if on_start is not None:
        on_start()
    schedule.dump(run_dir / "schedule.yaml")
    (run_dir / "run.json").write_text(json.dumps(spec.to_json(), indent=2))
    history = History(run_dir / HISTORY_FILE)
    prober: Prober | None = None
    try:
        # The checks measure a cold start-up on this machine from here (chaos/pace.py).
        history.record(event="cluster_start", backend=spec.backend, learners=spec.learners)
        cluster.start()
        if getattr(cluster, "leftovers", None):
            history.record(event="cleanup", killed=cluster.leftovers)
        if cluster.clock_hosts():  # hosts on clocks of their own: probe them all run long
            prober = Prober(run_dir, cluster.clock_hosts).start()
        wait_until_training(run_dir, spec.learners)
        controller = Controller(cluster, schedule, history)
        controller.run(spec.duration)
    finally:
        try:
            phase("stopping the cluster (learners push what they have left, the syncer scores the final parameters)")
            cluster.stop()
        finally:
            try:
                if prober is not None:
                    prober.stop()
                    record_clocks(run_dir, prober, history)
            finally:
                history.close()
    curve = None
    if reference == "auto" and evaluate:
        curve = fault_free_reference(run_dir, spec, phase, reference_seconds)
    phase("checking the run")
    return evaluate_run(run_dir, spec.learners, checker_options, spec.data, evaluate, curve)


def record_clocks(run_dir: Path, prober: Prober, history: History) -> None:
    """clocks.json: each probed host's clock against the controller's, from the run's probes
    (a host none of whose probes came back is left out: its events stay unplaced)."""
    samples = read_samples(run_dir)
    write_estimates(run_dir, estimate_all(samples))
    history.record(event="clock_probes", sent=prober.sent, answered=prober.answered,
                   hosts=sorted({s.host for s in samples}))


def fault_free_reference(run_dir: Path, spec: RunSpec, on_phase: Callable[[str], None] | None = None,
                         at_least: float = 0.0) -> ReferenceCurve | None:
    """The reference for this run's configuration (cached, or run now, for at least
    `at_least` s), recorded in run.json (`reference`); None, with the reason recorded, when
    none could be had."""
    try:
        tokens = final_tokens(RunView(read_events(run_dir), []))
        curve = obtain_reference(spec, tokens=tokens, on_phase=on_phase, at_least=at_least)
        note = curve.describe() if curve is not None else {"error": "the reference run sampled no global loss"}
    except (RuntimeError, TimeoutError, OSError, ValueError) as exc:
        curve, note = None, {"error": f"{type(exc).__name__}: {exc}"}
    path = run_dir / "run.json"
    try:
        recorded = json.loads(path.read_text())
        recorded["reference"] = note
        path.write_text(json.dumps(recorded, indent=2))
    except (OSError, ValueError):
        pass
    return curve
