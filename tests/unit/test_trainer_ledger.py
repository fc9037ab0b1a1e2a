"""The syncer's push ledger: exactly-once merging, staleness, recovery from its state dir.

A real trainer.syncer.Syncer runs in-process on 127.0.0.1 (port 0) with a tiny model;
the test speaks the wire protocol to it from plain sockets, the way a learner would.
Expected parameters are computed independently with torch.optim.SGD(nesterov=True).
"""
from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest
import torch

import trainer.syncer.service as syncer_mod
from trainer import wire
from trainer.config import SyncerConfig, TrainConfig
from trainer.ranks import param_digest
from trainer.syncer import Syncer

from tests.unit.syncer_rig import (BATCH, H, LR, MODEL, MU, SECRET, SEED, TIMEOUT, TOKENS, Client, Rig,  # noqa: F401
                                   initial_params, merged_ids, poll_until, push_frame, sgd_reference,
                                   train_config, wait_until)


# ----------------------------------------------------------------------------- ACK statuses

def test_accept_then_duplicate_is_merged_once(rig: Rig) -> None:
    s = rig.start(quorum=1, grace=0.0)
    c = rig.client(s)
    welcome = c.hello(1, "nonce-a")
    assert welcome.type == wire.WELCOME
    assert welcome.header["incarnation"] == 1 and welcome.header["versions"] == [0]

    delta = rig.delta(s, seed=1)
    frame = push_frame(1, 1, 1, delta)
    ack = c.send(frame)
    assert ack.type == wire.ACK and ack.header["status"] == "accepted" and ack.header["seq"] == 1
    wait_until(s, lambda: s.frags[0].version >= 1, "the push to be merged")

    again = c.send(frame)  # the same bytes again: a retry after a lost ACK
    assert again.header["status"] == "duplicate"
    frag = s.frags[0]
    assert frag.version == 1 and frag.pending == [] and frag.applied == ["1:1:1"]
    assert s.counters["accepted"] == 1 and s.counters["duplicates"] == 1
    assert s.counters["merges"] == 1

    # One live learner reported: weight 1, so the merged step is exactly one SGD step on Δ.
    expected = sgd_reference(initial_params(), [delta])
    for n, t in expected.items():
        torch.testing.assert_close(frag.params[n], t, rtol=1e-6, atol=1e-7)

    s.stop()
    assert merged_ids(rig.events()) == ["1:1:1"]
    assert len(rig.events("push_accepted")) == 1
    assert [e["id"] for e in rig.events("push_duplicate")] == ["1:1:1"]
    final = rig.events("final_state")[-1]
    assert final["versions"] == [1] and final["applied"] == {"0": ["1:1:1"]}


def test_duplicate_while_pending_then_quorum_merge(rig: Rig) -> None:
    # Two live learners and quorum 2: a push stays pending until the second arrives.
    s = rig.start(quorum=2, grace=3600.0)
    c1, c2 = rig.client(s), rig.client(s)
    c1.hello(1, "n1")
    c2.hello(2, "n2")
    d1, d2 = rig.delta(s, 1), rig.delta(s, 2)
    f1 = push_frame(1, 1, 1, d1)
    assert c1.send(f1).header["status"] == "accepted"
    assert c1.send(f1).header["status"] == "duplicate"
    assert s.frags[0].version == 0 and len(s.frags[0].pending) == 1
    assert len(s.store.pending_files(0)) == 1

    assert c2.send(push_frame(2, 1, 1, d2)).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 1, "the quorum merge")
    frag = s.frags[0]
    assert frag.version == 1 and sorted(frag.applied) == ["1:1:1", "2:1:1"]
    assert s.store.pending_files(0) == [], "merged pushes leave no pending file"
    # Equal tokens, every live learner reported: weights 1/2 each.
    merged = {n: 0.5 * d1[n] + 0.5 * d2[n] for n in d1}
    for n, t in sgd_reference(initial_params(), [merged]).items():
        torch.testing.assert_close(frag.params[n], t, rtol=1e-5, atol=1e-7)


def test_a_round_of_short_pushes_weighs_one_not_steps_over_h(rig: Rig) -> None:
    """Every live learner reported, each a quarter of H (the first staggered push of a
    fragment): weights 1/2 each, as for full pushes, not 1/8 (issue 18)."""
    s = rig.start(quorum=2, grace=3600.0)
    c1, c2 = rig.client(s), rig.client(s)
    c1.hello(1, "n1")
    c2.hello(2, "n2")
    d1, d2 = rig.delta(s, 1), rig.delta(s, 2)
    assert c1.send(push_frame(1, 1, 1, d1, tokens=TOKENS // 4, steps=H // 4)).header["status"] == "accepted"
    assert c2.send(push_frame(2, 1, 1, d2, tokens=TOKENS // 4, steps=H // 4)).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 1, "the quorum merge")
    s.stop()
    merge = rig.events("merge")[0]
    assert [c["weight"] for c in merge["contributors"]] == [0.5, 0.5]
    assert merge["expected_tokens"] == TOKENS // 2


def test_stale_push_is_dropped_and_counted(rig: Rig) -> None:
    s = rig.start(quorum=1, grace=0.0, max_staleness=1)
    c = rig.client(s)
    c.hello(1, "n")
    d1, d2, d3, d4 = (rig.delta(s, i) for i in range(1, 5))
    assert c.send(push_frame(1, 1, 1, d1, base_version=0)).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 1, "merge 1")
    assert c.send(push_frame(1, 1, 2, d2, base_version=1)).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 2, "merge 2")

    stale = c.send(push_frame(1, 1, 3, d3, base_version=0))  # 2 versions behind > 1
    assert stale.header["status"] == "stale" and stale.header["version"] == 2
    assert s.counters["dropped_stale"] == 1
    assert s.frags[0].pending == [] and s.store.pending_files(0) == []
    assert "1:1:3" not in s.frags[0].applied

    at_bound = c.send(push_frame(1, 1, 4, d4, base_version=1))  # exactly max_staleness behind
    assert at_bound.header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 3, "merge 3")
    assert s.frags[0].applied == ["1:1:1", "1:1:2", "1:1:4"]
    for n, t in sgd_reference(initial_params(), [d1, d2, d4]).items():
        torch.testing.assert_close(s.frags[0].params[n], t, rtol=1e-5, atol=1e-7)

    s.stop()
    dropped = rig.events("push_dropped")
    assert [(e["id"], e["reason"], e["staleness"]) for e in dropped] == [("1:1:3", "stale", 2)]
    assert "1:1:3" not in merged_ids(rig.events())


# ----------------------------------------------------------------------------- persistence

def test_versions_ledger_and_members_persist_across_restart(rig: Rig) -> None:
    s = rig.start(quorum=1, grace=0.0, fragments=2)
    c1, c2 = rig.client(s), rig.client(s)
    c1.hello(1, "nonce-1")
    c2.hello(2, "nonce-2")
    f_retry = push_frame(1, 1, 1, rig.delta(s, 1, fragment=0), fragment=0, position=10)  # within 4 rounds
    assert c1.send(f_retry).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 1, "fragment 0 merge")
    assert c2.send(push_frame(2, 1, 1, rig.delta(s, 2, fragment=1), fragment=1, position=7)).header[
        "status"] == "accepted"
    wait_until(s, lambda: s.frags[1].version >= 1, "fragment 1 merge")
    assert c1.send(push_frame(1, 1, 2, rig.delta(s, 3, fragment=1), fragment=1, base_version=1,
                              position=14)).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[1].version >= 2, "second fragment 1 merge")
    before = [(f.version, list(f.applied), {n: t.clone() for n, t in f.params.items()},
               {n: t.clone() for n, t in f.momentum.items()}) for f in s.frags]
    for c in (c1, c2):
        c.close()
    s.stop()

    s2 = rig.make(quorum=1, grace=0.0, fragments=2)
    assert [f.version for f in s2.frags] == [1, 2]
    for f, (version, applied, params, momentum) in zip(s2.frags, before):
        assert f.version == version and f.applied == applied and f.pending == []
        for n in params:
            assert torch.equal(f.params[n], params[n]) and torch.equal(f.momentum[n], momentum[n])
    m1, m2 = s2.members.members[1], s2.members.members[2]
    assert (m1.incarnation, m1.nonce, m1.position, m1.tokens) == (1, "nonce-1", 14, 2 * TOKENS)
    assert (m2.incarnation, m2.nonce, m2.position) == (1, "nonce-2", 7)
    # Presumed live until their leases run out, as before the crash (Membership.presume_alive).
    assert m1.alive and m2.alive and m1.conn is None and m2.conn is None

    s2.start()
    d1 = rig.client(s2)
    w = d1.hello(1, "nonce-1")  # the same process reconnecting: same incarnation
    assert w.header["incarnation"] == 1 and w.header["rejoin"] is False
    assert w.header["position"] == 14 and w.header["versions"] == [1, 2]
    assert d1.send(f_retry).header["status"] == "duplicate", "the ledger must survive the restart"
    d2 = rig.client(s2)
    w2 = d2.hello(2, "a-new-process")
    assert w2.header["incarnation"] == 2 and w2.header["rejoin"] is True
    assert s2.frags[0].applied == ["1:1:1"]


def test_state_dir_of_another_run_is_refused(rig: Rig) -> None:
    rig.make()  # writes the state dir's fingerprint
    cfg = SyncerConfig(state_dir=str(rig.state_dir))
    other = TrainConfig(model=MODEL, num_learners=3, sync_every=H, seed=SEED + 1,
                        heartbeat_interval=0.2, heartbeat_timeout=600.0)
    with pytest.raises(ValueError, match="different run"):
        Syncer(cfg, other, SECRET, None)


def test_pending_file_already_in_ledger_is_deleted_at_recovery(rig: Rig, tmp_path: Path) -> None:
    s = rig.start(quorum=2, grace=3600.0)
    c1, c2 = rig.client(s), rig.client(s)
    c1.hello(1, "n1")
    c2.hello(2, "n2")
    assert c1.send(push_frame(1, 1, 1, rig.delta(s, 1))).header["status"] == "accepted"
    [pending] = s.store.pending_files(0)
    saved = tmp_path / "aside.safetensors"
    shutil.copy2(pending, saved)  # the file as it was before the merge committed

    assert c2.send(push_frame(2, 1, 1, rig.delta(s, 2))).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 1, "the quorum merge")
    assert not pending.exists()
    params_after = {n: t.clone() for n, t in s.frags[0].params.items()}

    # A crash between the commit (fragment rename) and the unlink leaves the file behind.
    shutil.copy2(saved, pending)
    for c in (c1, c2):
        c.close()
    s.stop()
    assert pending.exists()

    s2 = rig.start(quorum=1, grace=0.0)
    assert not pending.exists(), "a pending file whose id is in the applied ledger must be deleted"
    frag = s2.frags[0]
    assert frag.pending == [] and frag.version == 1
    assert sorted(frag.applied) == ["1:1:1", "2:1:1"] and frag.applied.count("1:1:1") == 1
    for n, t in params_after.items():
        assert torch.equal(frag.params[n], t)
    loaded = rig.events("state_loaded")[-1]
    assert loaded["pending"] == 0 and loaded["versions"] == [1]
    s2.stop()
    assert merged_ids(rig.events()).count("1:1:1") == 1
    assert rig.events("final_state")[-1]["versions"] == [1]


def test_accepted_push_not_merged_before_crash_is_recovered(rig: Rig) -> None:
    s = rig.start(quorum=2, grace=3600.0)
    c1, c2 = rig.client(s), rig.client(s)
    c1.hello(1, "n1")
    c2.hello(2, "n2")
    delta = rig.delta(s, 5)
    frame = push_frame(1, 1, 1, delta)
    assert c1.send(frame).header["status"] == "accepted"
    assert s.frags[0].version == 0 and len(s.store.pending_files(0)) == 1
    rig.crash(s)
    assert s.frags[0].version == 0, "the crashed syncer must not have merged"

    s2 = rig.start(quorum=1, grace=0.0)  # recovers the write-ahead log, then merges it
    assert s2.members.members[1].incarnation == 1 and s2.members.members[2].incarnation == 1
    wait_until(s2, lambda: s2.frags[0].version >= 1, "the recovered push to be merged")
    frag = s2.frags[0]
    assert frag.applied == ["1:1:1"]
    assert s2.store.pending_files(0) == []
    # Both learners seen before the crash are presumed live until their leases run out, so
    # the recovered push weighs as one of two (1/2), not as a full round on its own; half a
    # round on a zero momentum buffer moves Θ by lr·(1+μ)·Δ/2.
    initial = initial_params()
    for n, d in delta.items():
        torch.testing.assert_close(frag.params[n], initial[n] - LR * (1 + MU) * d / 2, rtol=1e-6, atol=1e-7)

    c = rig.client(s2)
    assert c.hello(1, "n1").header["incarnation"] == 1
    assert c.send(frame).header["status"] == "duplicate"
    assert s2.frags[0].version == 1


# ----------------------------------------------------------------------------- HELLO

def test_hello_nonce_and_incarnation(rig: Rig) -> None:
    s = rig.start()
    a = rig.client(s)
    w = a.hello(2, "first")
    assert w.header["incarnation"] == 1 and w.header["rejoin"] is False
    assert w.header["learner"] == 2 and w.header["config"]["model"]["n_embd"] == MODEL.n_embd
    assert w.tensors() == {}, "want_params=False must not send parameters"

    b = rig.client(s)
    w = b.hello(2, "first")  # same nonce: a reconnect of the same process
    assert w.header["incarnation"] == 1 and w.header["rejoin"] is False
    # The newer connection speaks for learner 2: the old one is closed on its next request.
    with pytest.raises((wire.PeerClosed, ConnectionError)):
        a.request(wire.HEARTBEAT, {})

    c = rig.client(s)
    w = c.hello(2, "second")  # a new process
    assert w.header["incarnation"] == 2 and w.header["rejoin"] is True
    assert s.members.members[2].incarnation == 2

    beat = c.request(wire.HEARTBEAT, {})
    assert beat.type == wire.BEAT and beat.header["versions"] == [0]


def test_hello_with_params_sends_the_global_model(rig: Rig) -> None:
    s = rig.start()
    c = rig.client(s)
    w = c.request(wire.HELLO, {"learner": 1, "nonce": "x", "mode": "decoupled", "want_params": True})
    got = w.tensors()
    for n, t in initial_params().items():
        assert torch.equal(got[n], t)


def test_a_seeded_learner_gets_a_digest_of_the_initial_model_until_the_first_merge(rig: Rig) -> None:
    """The initial Θ is the model built from the run's seed: a learner that can build it
    gets its digest instead of 4 bytes per parameter; once a merge moved Θ, the tensors."""
    s = rig.start(quorum=1, grace=0.0)
    c = rig.client(s)
    hello = {"learner": 1, "nonce": "x", "mode": "decoupled", "want_params": True, "seeded": True}
    w = c.request(wire.HELLO, hello)
    assert w.tensors() is None or w.tensors() == {}
    assert w.header["params_digest"] == param_digest(initial_params())
    assert c.send(push_frame(1, 1, 1, rig.delta(s, 1))).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 1, "the merge")
    again = rig.client(s).request(wire.HELLO, hello)
    assert "params_digest" not in again.header
    for n, t in again.tensors().items():
        assert torch.equal(t, s.frags[0].params[n])


@pytest.mark.parametrize("header,reason", [
    ({"learner": 1, "nonce": "x", "mode": "sync"}, "mode_mismatch"),
    ({"learner": 4, "nonce": "x", "mode": "decoupled"}, "bad_learner"),
    ({"learner": 1, "mode": "decoupled"}, "bad_header"),
])
def test_hello_refused(rig: Rig, header: dict, reason: str) -> None:
    s = rig.start()
    c = rig.client(s)
    reply = c.request(wire.HELLO, header)
    assert reply.type == wire.ERROR and reply.header["reason"] == reason
    c.expect_closed()
    assert s.counters[f"rejected_{reason}"] == 1
    assert s.members.members.get(header["learner"]) is None


def test_push_before_hello_is_refused(rig: Rig) -> None:
    s = rig.start()
    c = rig.client(s)
    reply = c.request(wire.HEARTBEAT, {})
    assert reply.type == wire.ERROR and reply.header["reason"] == "protocol"
    c.expect_closed()
    # A first frame with a payload is refused from its prefix alone: nobody unauthenticated
    # gets the syncer to read (or allocate) a payload.
    c2 = rig.client(s)
    try:
        reply = c2.send(push_frame(1, 1, 1, rig.delta(s, 1)))
        assert reply.type == wire.ERROR and reply.header["reason"] == "oversized", reply.header
    except ConnectionError:
        pass  # the syncer closed before the payload was sent: a reset, not a reply
    poll_until(lambda: s.counters["rejected_oversized"] == 1, "the payload before HELLO to be counted")
    assert s.frags[0].pending == [] and s.counters["accepted"] == 0


def test_push_from_wrong_incarnation_is_refused(rig: Rig) -> None:
    s = rig.start()
    c = rig.client(s)
    c.hello(1, "n")
    reply = c.send(push_frame(1, 2, 1, rig.delta(s, 1)))
    assert reply.type == wire.ERROR and reply.header["reason"] == "bad_incarnation"
    assert s.frags[0].pending == [] and s.store.pending_files(0) == []


def test_push_with_wrong_tensors_is_refused(rig: Rig) -> None:
    s = rig.start()
    c = rig.client(s)
    c.hello(1, "n")
    delta = rig.delta(s, 1)
    name = next(iter(delta))
    delta[name] = torch.zeros(3, 3, 3)
    reply = c.send(push_frame(1, 1, 1, delta))
    assert reply.type == wire.ERROR and reply.header["reason"] == "bad_tensor"
    assert name in reply.header["detail"]
    assert s.frags[0].pending == [] and s.counters["accepted"] == 0


def test_int8_push_is_merged_within_its_bound(rig: Rig) -> None:
    s = rig.start()
    c = rig.client(s)
    c.hello(1, "n")
    delta = rig.delta(s, 9)
    assert c.send(push_frame(1, 1, 1, delta, encoding="int8")).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 1, "the int8 push to be merged")
    p0 = initial_params()
    for n, d in delta.items():
        # p = p0 - lr(1+mu) Δ̂ with |Δ - Δ̂| <= max|Δ|/254 elementwise.
        bound = LR * (1 + MU) * float(d.abs().max()) / 254 * 1.001 + 1e-6
        err = (s.frags[0].params[n] - (p0[n] - LR * (1 + MU) * d)).abs().max()
        assert float(err) <= bound, n


# ----------------------------------------------------------------------------- bugs

def test_retry_in_the_accept_window_is_a_duplicate(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    s = rig.make(quorum=1, grace=0.0)
    first: dict = {}
    at_gate, release = threading.Event(), threading.Event()
    real_write = syncer_mod.write_staged

    def write(path, *parts, **kw):
        staged = real_write(path, *parts, **kw)
        first.setdefault("thread", threading.current_thread())
        first.setdefault("entries", 0)
        return staged

    class GatedCondition(threading.Condition):
        """Holds the first pushing thread before its second lock acquisition after the write."""

        def __enter__(self):
            if first.get("thread") is threading.current_thread():
                first["entries"] += 1
                if first["entries"] == 2:
                    at_gate.set()
                    release.wait(TIMEOUT)
            return super().__enter__()

    monkeypatch.setattr(syncer_mod, "write_staged", write)
    s.cond = GatedCondition()
    s.start()
    c1 = rig.client(s)
    c1.hello(1, "n")
    frame = push_frame(1, 1, 1, rig.delta(s, 1))
    c1.channel.send(frame, time.monotonic() + 10)
    try:
        assert at_gate.wait(TIMEOUT), "the first push never reached the end of its pending write"
        c2 = rig.client(s)
        assert c2.hello(1, "n").header["incarnation"] == 1  # the learner reconnects and retries
        status = c2.send(frame).header["status"]
    finally:
        release.set()
    assert c1.channel.recv(time.monotonic() + 10).header["status"] == "accepted"
    wait_until(s, lambda: not s.frags[0].pending and not s.frags[0].merging and s.frags[0].version >= 1,
               "the pending pushes to be merged")
    assert status == "duplicate"
    assert s.frags[0].applied.count("1:1:1") == 1


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_merging_continues_after_a_failed_state_write(rig: Rig) -> None:
    s = rig.make(quorum=1, grace=0.0)
    real = s.store.write_fragment
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    s.store.write_fragment = flaky
    s.start()
    merge_thread = next(t for t in s._threads if t.name == "syncer-merge")
    c = rig.client(s)
    c.hello(1, "n")
    assert c.send(push_frame(1, 1, 1, rig.delta(s, 1))).header["status"] == "accepted"
    poll_until(lambda: s.frags[0].version >= 1 or not merge_thread.is_alive(),
               "a merge, or the merge thread to end")
    assert s.frags[0].version == 1, "one failed write stopped all merging"


# ----------------------------------------------------------------------------- long poll

def test_a_heartbeat_long_poll_answers_when_a_merge_passes_the_known_versions(rig: Rig) -> None:
    """A learner awaiting the merge of its push sends HEARTBEAT with `wait_ms` and the
    versions it knows: the syncer answers as soon as a merge passes one of them, not when
    the wait runs out; with nothing merged it answers after the wait. Bad fields are
    refused by name."""
    s = rig.start(quorum=1, grace=0.0)
    poller, pusher = rig.client(s), rig.client(s)
    poller.hello(1, "a")
    pusher.hello(2, "b")
    started = time.monotonic()
    quiet = poller.request(wire.HEARTBEAT, {"wait_ms": 300, "versions": [0]})
    assert quiet.type == wire.BEAT and quiet.header["versions"] == [0] and time.monotonic() - started >= 0.29
    answers: dict = {}

    def poll() -> None:
        answers["reply"] = poller.request(wire.HEARTBEAT, {"wait_ms": 1000, "versions": [0]})
        answers["at"] = time.monotonic()

    waiter = threading.Thread(target=poll)
    waiter.start()
    time.sleep(0.1)
    pushed = time.monotonic()
    assert pusher.send(push_frame(2, 1, 1, rig.delta(s, 2))).header["status"] == "accepted"
    waiter.join(timeout=5)
    assert answers["reply"].header["versions"] == [1]
    # Measured from the merge (the syncer's clock is this process's monotonic one): the push's
    # own way to its merge (a group commit's fsync) is not the poll's to answer for.
    merged_at = rig.events("merge")[0]["t"]
    assert merged_at >= pushed and answers["at"] - merged_at < 0.5, \
        f"the poll answered {answers['at'] - merged_at:.2f} s after the merge: it waited out its time"
    started = time.monotonic()
    capped = poller.request(wire.HEARTBEAT, {"wait_ms": 60_000, "versions": [1]})  # asks a minute: waits the cap
    assert capped.type == wire.BEAT and 0.9 <= time.monotonic() - started < 5
    for bad in ({"wait_ms": -1, "versions": [0]}, {"wait_ms": 100, "versions": [0, 0]},
                {"wait_ms": 100, "versions": ["x"]}):
        reply = rig.client(s)
        reply.hello(3, f"bad-{bad['wait_ms']}-{len(bad['versions'])}-{bad['versions'][0]}")
        answer = reply.request(wire.HEARTBEAT, bad)
        assert answer.type == wire.ERROR and answer.header["reason"] == "bad_header", (bad, answer.header)
