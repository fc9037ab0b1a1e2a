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

from .data import Corpus, evaluation_batches
from .events import EventLog
from .model import ModelConfig, build_model

DEFAULT_BUDGET = 0.1   # of one core
EVAL_BATCH_SIZE = 16   # windows per held-out batch, whatever the run trains with: one fixed set per corpus
STOP_JOIN_SECONDS = 10.0


@dataclass(frozen=True)
class Snapshot:
    """What one evaluation scores: Θ, its version per fragment and the tokens merged into it."""

    params: dict[str, torch.Tensor]
    versions: list[int]
    tokens: float


class HeldOut:
    """A model and a fixed set of held-out batches: the same windows every time, so two
    evaluations differ only by the parameters."""

    def __init__(self, model: ModelConfig, seed: int, corpus: Corpus) -> None:
        self.model = build_model(model, seed)
        self.model.eval()
        _, val = corpus.split()
        self.batches = list(evaluation_batches(val, model.block_size, EVAL_BATCH_SIZE))
        # What `trainer eval` reports beside the loss: the same figures for the same windows.
        self.facts = {"loss_floor": corpus.entropy_rate, "unigram_entropy": corpus.unigram_entropy,
                      "data": corpus.name}
        if not self.batches:
            raise ValueError(f"eval-data: {corpus.name} has no held-out window of {model.block_size + 1} bytes")

    def loss(self, params: dict[str, torch.Tensor]) -> float:
        """Mean cross-entropy (nats per byte) of `params` over the held-out batches."""
        self.model.load_state_dict(params)
        with torch.no_grad():
            losses = [float(self.model(x, y)[1]) for x, y in self.batches]
        return sum(losses) / len(losses)


class GlobalEvaluator:
    """Scores the newest snapshot whenever a merge made one and the budget allows."""

    def __init__(self, held_out: HeldOut, events: EventLog, snapshot: Callable[[], Snapshot],
                 budget: float = DEFAULT_BUDGET) -> None:
        if not 0 < budget <= 1:
            raise ValueError(f"eval-budget: must be in (0, 1], got {budget}")
        self.held_out = held_out
        self.events = events
        self.snapshot = snapshot
        self.budget = budget
        self._wake = threading.Event()
        self._running = False
        self._thread: threading.Thread | None = None
        self._next_allowed = 0.0
        self._last_versions: list[int] | None = None
        self.evaluations = 0
        self.last_cost = 0.0  # seconds the last evaluation took: the budget rests a multiple of it

    def start(self) -> None:
        """Score Θ as the syncer starts (initial or restored: the curve's first point), then follow merges."""
        self._evaluate("start")
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="syncer-eval", daemon=True)
        self._thread.start()

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
            self.events.emit("eval", final_loss=round(loss, 4), **self.held_out.facts)

    def _loop(self) -> None:
        while self._running:
            self._wake.wait(timeout=1.0)
            if not self._running:
                return
            delay = self._next_allowed - time.monotonic()
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
        started = time.monotonic()
        loss = self.held_out.loss(snap.params)
        cost = self.last_cost = time.monotonic() - started
        self._next_allowed = time.monotonic() + cost * (1.0 / self.budget - 1.0)
        self._last_versions = list(snap.versions)
        self.evaluations += 1
        self.events.emit("global_eval", versions=snap.versions, version=sum(snap.versions),
                         tokens=round(snap.tokens, 1), loss=loss, seconds=round(cost, 4), reason=reason)
        return loss
