"""Θ's held-out loss while a run goes on, sampled by the syncer off the merge path.

A learner's training loss describes its own model; only the global parameters' loss says
whether the outer step is sound (one run read 2.57 on every learner while Θ scored 14.3).
The syncer hands this evaluator a snapshot after merges; a thread of its own scores it on
a fixed held-out set and writes a `global_eval` event, which the `no_divergence` and
`final_loss` checks and the report read. A CPU budget (a fraction of one core, measured
on its own evaluations) bounds how often it runs, so a slow machine samples less often
instead of slowing the merges.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .events import EventLog
from .task import CheckedTask

DEFAULT_BUDGET = 0.1   # of one core
# Batches of the held-out set a sample during the run scores, spread evenly over the whole
# set; the final score takes every batch. The whole validation split (issue 18) cost the
# default model ~6x the old sample: a 60 s run under load got 2 samples, and the checks
# that read the curve (no_divergence, the reference) had nothing to compare.
SAMPLE_BATCHES = 8
STOP_JOIN_SECONDS = 10.0


@dataclass(frozen=True)
class Snapshot:
    """What one evaluation scores: Θ, its version per fragment and the tokens merged into it."""

    params: dict[str, torch.Tensor]
    versions: list[int]
    tokens: float


class HeldOut:
    """The task's model and its fixed held-out batches (`task.eval_batches`): the same
    batches every time, so two evaluations differ only by the parameters."""

    def __init__(self, task: CheckedTask, seed: int) -> None:
        self.task = task
        self.model = task.model(seed)
        self.model.eval()
        self.batches = task.eval_batches()
        self.weights = {id(b): task.tokens(b) for b in self.batches}
        stride = max(1, -(-len(self.batches) // SAMPLE_BATCHES))  # ceil: at most SAMPLE_BATCHES
        self.sample = self.batches[stride // 2::stride]
        # What `trainer eval` reports beside the loss: the same figures for the same batches.
        self.facts = task.describe()
        self.last_metrics: dict[str, float] = {}

    def loss(self, params: dict[str, torch.Tensor], sample: bool = False) -> float:
        """`task.loss` over the held-out batches (with `sample`, over the spread subset a
        sample during the run scores), each weighed by its tokens (for the built-in task,
        nats per byte); the task's `metrics`, weighed alike, go to `last_metrics`."""
        self.model.load_state_dict(params, strict=False)
        sums: dict[str, float] = {}
        loss = weight = 0.0
        with torch.no_grad():
            for b in (self.sample if sample else self.batches):
                w = self.weights[id(b)]
                weight += w
                loss += float(self.task.loss(self.model, b)) * w
                for k, v in self.task.metrics(self.model, b).items():
                    sums[k] = sums.get(k, 0.0) + v * w
        self.last_metrics = {k: round(v / weight, 6) for k, v in sums.items()}
        return loss / weight


class GlobalEvaluator:
    """Scores the newest snapshot whenever a merge made one and the budget allows."""

    def __init__(self, held_out: HeldOut, events: EventLog, snapshot: Callable[[], Snapshot],
                 budget: float = DEFAULT_BUDGET, monotonic: Callable[[], float] = time.monotonic) -> None:
        if not 0 < budget <= 1:
            raise ValueError(f"eval-budget: must be in (0, 1], got {budget}")
        self.held_out = held_out
        self.events = events
        self.snapshot = snapshot
        self.budget = budget
        self.monotonic = monotonic
        self._wake = threading.Event()
        self._running = False
        self._thread: threading.Thread | None = None
        self._next_allowed = 0.0
        self._last_versions: list[int] | None = None
        self.evaluations = 0
        self.last_cost = 0.0  # seconds the last evaluation took: the budget rests a multiple of it

    def start(self, threaded: bool = True) -> None:
        """Score Θ as the syncer starts (initial or restored: the curve's first point), then
        follow merges: in a thread of its own, or (`threaded=False`, a simulator's single
        thread) when score_merges() is called."""
        self._evaluate("start")
        if not threaded:
            return
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="syncer-eval", daemon=True)
        self._thread.start()

    def score_merges(self) -> None:
        """Without a thread: score Θ now if a merge changed it and the budget allows."""
        if self._wake.is_set() and self.monotonic() >= self._next_allowed:
            self._wake.clear()
            self._evaluate("merge")

    def due_at(self) -> float | None:
        """When score_merges() would score a merge not yet scored (None: none waits)."""
        return self._next_allowed if self._wake.is_set() else None

    def note_merge(self) -> None:
        """A merge committed a new version: cheap, called under the syncer's lock."""
        self._wake.set()

    def stop(self) -> None:
        """End the thread and score the final parameters once, whatever the budget. Called
        after the final merges are durable, so the score is that of the final state: it is
        written as an `eval` event too, the one `trainer eval` of the state dir would write
        (same model, seed and windows), and a harness need not start a process to get it."""
        self._running = False
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=STOP_JOIN_SECONDS)
        loss = self._evaluate("final")
        if loss is not None:
            self.events.emit("eval", final_loss=round(loss, 4), **self.held_out.facts,
                             **({"metrics": self.held_out.last_metrics} if self.held_out.last_metrics else {}))

    def _loop(self) -> None:
        while self._running:
            self._wake.wait(timeout=1.0)
            if not self._running:
                return
            delay = self._next_allowed - self.monotonic()
            if delay > 0:
                time.sleep(min(delay, 1.0))
                continue  # the wake flag stays set: evaluate once the budget allows
            if self._wake.is_set():
                self._wake.clear()
                self._evaluate("merge")

    def _evaluate(self, reason: str) -> float | None:
        snap = self.snapshot()
        if reason == "merge" and snap.versions == self._last_versions:
            return None
        started = self.monotonic()
        whole = reason == "final"  # the score `trainer eval` and the summary give; samples before it are cheaper
        loss = self.held_out.loss(snap.params, sample=not whole)
        cost = self.last_cost = self.monotonic() - started
        self._next_allowed = self.monotonic() + cost * (1.0 / self.budget - 1.0)
        self._last_versions = list(snap.versions)
        self.evaluations += 1
        self.events.emit("global_eval", versions=snap.versions, version=sum(snap.versions),
                         tokens=round(snap.tokens, 1), loss=loss, seconds=round(cost, 4), reason=reason,
                         held_out="whole" if whole else "sample",
                         **({"metrics": self.held_out.last_metrics} if self.held_out.last_metrics else {}))
        return loss
