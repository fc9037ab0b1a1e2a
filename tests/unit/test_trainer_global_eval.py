"""Θ's held-out loss sampled during a run (trainer/global_eval.py) and the merged-token count
that is its x-axis, durable in each fragment file."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from trainer.config import SyncerConfig
from trainer.data import load_corpus
from trainer.events import EventLog, read_events
from trainer.global_eval import GlobalEvaluator, HeldOut, Snapshot
from trainer.launch import evaluate
from trainer.model import ModelConfig, build_model
from trainer.task import TaskError, load_task
from trainer.tasks.gpt import EVAL_BATCH_SIZE
from trainer.state import StateDir
from trainer.syncer import Syncer

from .test_trainer_ledger import SECRET, Rig, push_frame, train_config, wait_until

SMALL = ModelConfig(n_layer=1, n_embd=16, n_head=2, block_size=16)


def held_out(model: ModelConfig, seed: int, corpus) -> HeldOut:
    """The built-in task's held-out set on `corpus`, as the syncer and `trainer eval` score it."""
    return HeldOut(load_task("gpt", {"model": model, "data": corpus}), seed)


def _params(seed: int) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in build_model(SMALL, seed).named_parameters()}


def test_held_out_is_a_fixed_set_that_only_the_parameters_change() -> None:
    corpus = load_corpus("markov")
    a, b = held_out(SMALL, 0, corpus), held_out(SMALL, 0, corpus)
    assert all(x.shape[0] == EVAL_BATCH_SIZE for x, _ in a.batches[:-1])
    _, val = corpus.split()  # the whole held-out split, not its first batches
    assert sum(x.numel() for x, _ in a.batches) == (len(val) - 1) // SMALL.block_size * SMALL.block_size
    assert a.loss(_params(0)) == b.loss(_params(0))
    assert a.loss(_params(0)) != a.loss(_params(1))


def test_held_out_refuses_a_corpus_without_one_window(tmp_path: Path) -> None:
    text = tmp_path / "small.txt"
    text.write_text("abcdefgh" * 600)  # 4,800 bytes: a held-out tail of 240, shorter than one window
    with pytest.raises(TaskError, match="task.eval_batches.* no held-out window of 513 bytes"):
        held_out(ModelConfig(n_layer=1, n_embd=16, n_head=2, block_size=512), 0, load_corpus(str(text)))


def test_launch_evaluate_scores_the_same_windows(tmp_path: Path) -> None:
    from trainer.config import TrainConfig
    corpus = load_corpus("markov")
    train = TrainConfig(model=SMALL, batch_size=3)  # the training batch size does not change the held-out set
    assert evaluate(_params(2), train, corpus) == held_out(SMALL, 0, corpus).loss(_params(2))


class _Source:
    """A stand-in syncer: a new version whenever bump() is called."""

    def __init__(self) -> None:
        self.versions = [0]
        self.calls = 0
        self.lock = threading.Lock()

    def bump(self) -> None:
        with self.lock:
            self.versions = [self.versions[0] + 1]

    def snapshot(self) -> Snapshot:
        with self.lock:
            self.calls += 1
            return Snapshot(_params(self.versions[0]), list(self.versions), 100.0 * self.versions[0])


def _evaluator(tmp_path: Path, budget: float) -> tuple[GlobalEvaluator, _Source, EventLog]:
    source = _Source()
    log = EventLog(tmp_path, "syncer")
    held = held_out(SMALL, 0, load_corpus("markov"))
    return GlobalEvaluator(held, log, source.snapshot, budget), source, log


def test_every_new_version_is_scored_with_its_tokens_and_the_final_one_at_stop(tmp_path: Path) -> None:
    ev, source, log = _evaluator(tmp_path, budget=1.0)
    ev.start()
    for _ in range(3):
        source.bump()
        ev.note_merge()
        deadline = time.monotonic() + 10
        while ev.evaluations < source.versions[0] + 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    ev.stop()
    log.close()
    rows = [e for e in read_events(tmp_path) if e["kind"] == "global_eval"]
    assert [r["versions"] for r in rows] == [[0], [1], [2], [3], [3]], "the start, each version once, the end"
    assert [r["reason"] for r in rows] == ["start", "merge", "merge", "merge", "final"]
    assert [r["tokens"] for r in rows] == [0.0, 100.0, 200.0, 300.0, 300.0]
    assert rows[-1]["loss"] == pytest.approx(held_out(SMALL, 0, load_corpus("markov")).loss(_params(3)))


def test_the_budget_spaces_evaluations_by_their_own_cost(tmp_path: Path) -> None:
    ev, source, log = _evaluator(tmp_path, budget=0.01)  # 1% of a core: 99 costs of rest after each
    before = time.monotonic()
    ev.start()  # scores the start synchronously, then rests
    after = time.monotonic()
    assert ev.evaluations == 1
    rest, cost = ev._next_allowed - after, ev.last_cost
    assert 99 * cost - (after - before) <= rest <= 99 * cost + 1e-6, \
        f"rest {rest:.3f} s after an evaluation of {cost:.3f} s (99 of it expected)"
    for _ in range(5):
        source.bump()
        ev.note_merge()
    time.sleep(0.05)
    if ev._next_allowed - time.monotonic() > 0.01:  # still resting: nothing more was scored
        assert ev.evaluations == 1
    ev.stop()  # the final score does not wait for the budget
    log.close()
    rows = [e for e in read_events(tmp_path) if e["kind"] == "global_eval"]
    assert [r["reason"] for r in rows][0] == "start" and rows[-1]["reason"] == "final"
    assert rows[-1]["versions"] == [5]


def test_budget_is_validated() -> None:
    with pytest.raises(ValueError, match="^eval-budget:"):
        SyncerConfig(eval_budget=0)
    with pytest.raises(ValueError, match="^eval-budget:"):
        SyncerConfig(eval_budget=1.5)


def test_fragment_file_keeps_the_merged_tokens(tmp_path: Path) -> None:
    store = StateDir(tmp_path)
    p = {"w": torch.ones(2)}
    store.write_fragment(0, p, {"w": torch.zeros(2)}, 3, ["1:1:1"], tokens=4096)
    assert store.read_fragment_file(0).tokens == 4096
    store.write_fragment(1, p, {"w": torch.zeros(2)}, 0, [])
    assert store.read_fragment_file(1).tokens == 0


def test_syncer_samples_theta_and_counts_tokens_across_a_restart(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    cfg = SyncerConfig(port=0, state_dir=str(rig.state_dir), quorum=1, grace=0.0, eval_data="markov", eval_budget=1.0)

    def start() -> Syncer:
        s = Syncer(cfg, train_config(1), SECRET, str(rig.run_dir))
        rig.syncers.append(s)
        s.start()
        return s

    s = start()
    c = rig.client(s)
    c.hello(1, "n")
    assert c.send(push_frame(1, 1, 1, rig.delta(s, 1), tokens=500)).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 1, "the merge")
    s.stop()
    s2 = start()  # a restart resumes the count from the fragment file
    assert s2.frags[0].tokens == 500
    s2.stop()
    rows = [e for e in read_events(tmp_path / "run") if e["kind"] == "global_eval"]
    assert rows, "the syncer wrote no global_eval event"
    assert rows[-1]["reason"] == "final" and rows[-1]["versions"] == [1] and rows[-1]["tokens"] == 500.0
    assert [r["reason"] for r in rows].count("start") == 2, "each syncer start scores Θ once"


def test_a_clean_stop_writes_the_eval_of_the_final_state(tmp_path: Path) -> None:
    """The syncer's `eval` at stop is what `trainer eval` of its state dir says, so the
    harness takes it instead of starting a process (chaos.runner.syncer_final_eval)."""
    from chaos.runner import syncer_final_eval
    from trainer.launch import final_parameters

    rig = Rig(tmp_path)
    cfg = SyncerConfig(port=0, state_dir=str(rig.state_dir), quorum=1, grace=0.0, eval_data="markov", eval_budget=1.0)
    train = train_config(1)
    s = Syncer(cfg, train, SECRET, str(rig.run_dir))
    rig.syncers.append(s)
    s.start()
    c = rig.client(s)
    c.hello(1, "n")
    assert c.send(push_frame(1, 1, 1, rig.delta(s, 1), tokens=500)).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 1, "the merge")
    events = read_events(tmp_path / "run")
    assert syncer_final_eval(events, "markov") is None, "a running syncer has not scored its final state"
    s.stop()
    events = read_events(tmp_path / "run")
    corpus = load_corpus("markov")
    scored = syncer_final_eval(events, "markov")
    assert scored is not None, [e["kind"] for e in events if e.get("process") == "syncer"]
    durable = evaluate(final_parameters(rig.run_dir, train, state_dir=rig.state_dir), train, corpus)
    assert scored == {"final_loss": round(durable, 4), "loss_floor": corpus.entropy_rate,
                      "unigram_entropy": corpus.unigram_entropy, "data": corpus.name}
    assert syncer_final_eval(events, "text:/elsewhere") is None, "scored on other data: not this run's eval"


def test_samples_during_the_run_score_a_spread_subset_and_the_final_score_the_whole_split() -> None:
    """The whole split is the final score; a sample during the run keeps its old cost, at
    most SAMPLE_BATCHES batches spread over the split, not its first part."""
    from trainer.global_eval import SAMPLE_BATCHES
    h = held_out(SMALL, 0, load_corpus("markov"))
    assert len(h.batches) > 2 * SAMPLE_BATCHES
    positions = [next(i for i, b in enumerate(h.batches) if b is s) for s in h.sample]
    assert 1 < len(positions) <= SAMPLE_BATCHES
    assert positions[0] > 0 and positions[-1] > len(h.batches) * 3 // 4, positions
    params = _params(0)
    assert h.loss(params, sample=True) != h.loss(params)
