"""Sync mode's first round waits for every configured learner to join (at most
--start-wait): a learner whose process started later would otherwise miss the first
rounds and step alone at the end, and sync DP's result would hang on start-up times."""
from __future__ import annotations

import threading
from pathlib import Path

import torch

from trainer import wire
from trainer.codec import encode
from trainer.config import SyncerConfig, TrainConfig
from trainer.syncer import Syncer

from tests.unit.syncer_rig import MODEL, SECRET, SEED, Client, poll_until

TOKENS = 128


def _syncer(tmp_path: Path, start_wait: float) -> Syncer:
    train = TrainConfig(model=MODEL, mode="sync", num_learners=2, seed=SEED, batch_size=2,
                        heartbeat_interval=0.2, heartbeat_timeout=600.0)
    cfg = SyncerConfig(host="127.0.0.1", port=0, state_dir=str(tmp_path / "state"), start_wait=start_wait)
    s = Syncer(cfg, train, SECRET, str(tmp_path / "run"))
    s.start()
    return s


def _grad(s: Syncer, client: Client, learner: int, out: dict) -> threading.Thread:
    grads = {n: torch.full(shape, 0.01 * learner) for n, shape in s.shapes.items()}
    msg = wire.message(wire.GRAD, {"round": 0, "tokens": TOKENS, "position": 1}, encode(grads, "fp32"))
    thread = threading.Thread(target=lambda: out.__setitem__(learner, client.send(msg)), daemon=True)
    thread.start()
    return thread


def _hello(s: Syncer, learner: int) -> Client:
    assert s.address is not None
    c = Client(s.address)
    c.request(wire.HELLO, {"learner": learner, "nonce": f"n{learner}", "mode": "sync", "want_params": False})
    return c


def test_the_first_round_waits_for_the_second_learner_to_join(tmp_path: Path) -> None:
    s = _syncer(tmp_path, start_wait=60.0)
    try:
        replies: dict[int, wire.Frame] = {}
        first = _grad(s, _hello(s, 1), 1, replies)
        first.join(0.5)
        assert first.is_alive() and s.sync is not None and s.sync.round == 0, \
            "the first round completed with one of two learners"
        second = _grad(s, _hello(s, 2), 2, replies)
        for t in (first, second):
            t.join(10)
        assert sorted(replies) == [1, 2] and s.sync.round == 1
        assert all(r.header["round"] == 0 and not r.header["resync"] for r in replies.values())
    finally:
        s.stop()


def test_a_learner_that_never_comes_holds_the_first_round_only_for_start_wait(tmp_path: Path) -> None:
    s = _syncer(tmp_path, start_wait=0.3)
    try:
        replies: dict[int, wire.Frame] = {}
        _grad(s, _hello(s, 1), 1, replies).join(10)
        assert s.sync is not None
        poll_until(lambda: s.sync.round == 1, "the first round to complete after --start-wait")
        assert replies[1].header["round"] == 0
    finally:
        s.stop()
