"""The trainer as real processes on 127.0.0.1: training, learner and syncer crashes, bad frames."""
from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest
import torch

from trainer import wire
from trainer.keys import learner_key
from trainer.codec import encode
from trainer.config import TrainConfig
from trainer.data import load_corpus
from trainer.launch import evaluate, final_parameters

from .cluster_helpers import contributed, make_cluster, merges, wait_for

pytestmark = pytest.mark.integration
SMALL_MODEL = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8"]


# Relative distance one inner step of the default model moves a learner from Θ: 0.006-0.008
# measured (0.10 after 16 unmerged steps, 0.038 after 5, 0.024 after 3), with a margin.
DRIFT_PER_STEP = 0.012


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


def test_three_learners_train_below_unigram_entropy(run_dir: Path) -> None:
    cluster = make_cluster(run_dir)
    try:
        wait_for(run_dir, "every learner to make 100 inner steps",
                 lambda ev: all(sum(1 for e in ev if e["kind"] == "inner_step" and e["learner"] == i) >= 100
                                for i in (1, 2, 3)), timeout=150, cluster=cluster)
    finally:
        cluster.stop()
    events = wait_for(run_dir, "the syncer's final state", lambda ev: any(e["kind"] == "final_state" for e in ev), 10)
    corpus = load_corpus("markov")
    train = TrainConfig(num_learners=3)
    loss = evaluate(final_parameters(run_dir, train), train, corpus)
    assert loss < corpus.unigram_entropy - 0.3, f"held-out loss {loss:.3f} not clearly below unigram {corpus.unigram_entropy:.3f}"
    contributors = {c["learner"] for e in merges(events) for c in e["contributors"]}
    assert contributors == {1, 2, 3}, f"merges had contributions from {contributors} only"
    # A clean stop pushes the residual progress before leaving (the network thread once quit
    # as soon as the stop was signalled, racing the loop that queues that last push).
    stops = {e["learner"]: e for e in events if e["kind"] == "process_stop" and e.get("role") == "learner"}
    assert sorted(stops) == [1, 2, 3], f"learners that stopped cleanly: {sorted(stops)}"
    undrained = {i: (e["drained"], e["unsent"]) for i, e in stops.items() if not e["drained"] or e["unsent"]}
    assert not undrained, f"residual pushes left unsent at stop (drained, unsent): {undrained}"


def test_killed_learner_rejoins_and_contributes_again(run_dir: Path) -> None:
    cluster = make_cluster(run_dir, extra=SMALL_MODEL)  # the model is beside the point
    try:
        wait_for(run_dir, "learner-2 to contribute to a merge", lambda ev: contributed(ev, 2, 1), 120, cluster)
        cluster.learners[2].popen.send_signal(signal.SIGKILL)
        cluster.learners[2].popen.wait(timeout=10)
        killed_at = time.monotonic()
        wait_for(run_dir, "the syncer to notice learner-2 is gone",
                 lambda ev: any(e["kind"] in ("leave", "heartbeat_lost") and e["learner"] == 2 and e["t"] > killed_at - 0.5
                                for e in ev), 15, cluster)
        events = wait_for(run_dir, "merges to go on without learner-2",
                          lambda ev: any(e["t"] > killed_at for e in merges(ev)), 30, cluster)
        cluster.start_learner(2)
        events = wait_for(run_dir, "learner-2 to rejoin as incarnation 2",
                          lambda ev: any(e["kind"] == "join" and e["learner"] == 2 and e.get("rejoin")
                                         and e["incarnation"] == 2 for e in ev), 60, cluster)
        events = wait_for(run_dir, "learner-2 incarnation 2 to contribute a merged update",
                          lambda ev: contributed(ev, 2, 2), 60, cluster)
    finally:
        cluster.stop()
    start = [e for e in events if e["kind"] == "process_start" and e.get("role") == "learner" and e["learner"] == 2]
    assert start[-1]["position"] > 0, "the restarted learner did not resume its data position"


def test_syncer_crash_loses_no_acknowledged_push(run_dir: Path) -> None:
    cluster = make_cluster(run_dir, extra=SMALL_MODEL)  # the model is beside the point
    try:
        wait_for(run_dir, "three merges", lambda ev: len(merges(ev)) >= 3, 120, cluster)
        cluster.syncer.popen.send_signal(signal.SIGKILL)
        cluster.syncer.popen.wait(timeout=10)
        killed_at = time.monotonic()
        time.sleep(1.0)  # a real outage: learners keep training and queue their pushes
        cluster.start_syncer()  # same port, same state dir
        wait_for(run_dir, "every learner to reconnect to the restarted syncer",
                 lambda ev: {e["learner"] for e in ev if e["kind"] == "connect" and e["t"] > killed_at} == {1, 2, 3},
                 60, cluster)
        wait_for(run_dir, "three merges after the restart",
                 lambda ev: sum(1 for e in merges(ev) if e["t"] > killed_at) >= 3, 90, cluster)
    finally:
        cluster.stop()
    events = wait_for(run_dir, "the final state", lambda ev: any(e["kind"] == "final_state" for e in ev), 10)
    versions = [e["version"] for e in merges(events)]
    assert versions == sorted(versions) and len(set(versions)) == len(versions), f"versions went back: {versions}"
    acked = {e["id"] for e in events if e["kind"] == "push" and e.get("status") == "accepted"}
    applied = set(events[-1]["applied"]["0"]) if events[-1]["kind"] == "final_state" else set(
        next(e for e in reversed(events) if e["kind"] == "final_state")["applied"]["0"])
    assert acked, "no push was acknowledged"
    lost = acked - applied
    assert not lost, f"acknowledged pushes lost across the syncer restart: {sorted(lost)}"
    merged_ids = [c["id"] for e in merges(events) for c in e["contributors"]]
    assert len(merged_ids) == len(set(merged_ids)), "a push was applied twice"
    loads = [e for e in events if e["kind"] == "state_loaded"]
    assert len(loads) == 2 and loads[1]["versions"][0] >= 3, f"the restarted syncer did not resume: {loads}"


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        s.settimeout(5)
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except (ConnectionResetError, socket.timeout):
            pass
        return b"".join(chunks)


def _handshake_bytes() -> bytes:
    """A client's opening 40 bytes, as wire.client_handshake sends them."""
    return wire.HANDSHAKE.pack(wire.MAGIC, wire.VERSION, os.urandom(wire.RANDOM_BYTES))


def test_bad_frames_are_refused_while_training_goes_on(run_dir: Path) -> None:
    cluster = make_cluster(run_dir, learners=3, start_learners=2, extra=SMALL_MODEL)
    try:
        wait_for(run_dir, "a merge", lambda ev: len(merges(ev)) >= 1, 120, cluster)
        secret = cluster.secret_file.read_bytes().strip()
        port = cluster.port
        _raw(port, os.urandom(4096))                                             # garbage
        _raw(port, _handshake_bytes() + wire.Session(os.urandom(32), client=True).seal(   # wrong key
            wire.message(wire.HELLO, {"learner": 3, "nonce": "x", "mode": "decoupled"})))
        _raw(port, _handshake_bytes() + wire.PREFIX.pack(wire.MAGIC, wire.VERSION, 10, 1 << 40))  # oversized
        # An authenticated learner-3 that sends a NaN and a wrong-shape pseudo-gradient.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            deadline = time.monotonic() + 10
            channel = wire.Channel.connect(s, learner_key(secret, 3), deadline, 3)
            welcome = channel.request(wire.message(wire.HELLO, {"learner": 3, "nonce": "test", "mode": "decoupled",
                                                                "want_params": True}), deadline)
            names = welcome.header["fragments"][0]
            params = welcome.tensors()
            delta = {n: torch.zeros_like(params[n]) for n in names}
            delta[names[0]][0] = float("nan")
            header = {"learner": 3, "incarnation": welcome.header["incarnation"], "seq": 1, "fragment": 0,
                      "base_version": 0, "tokens": 1, "steps": 1, "position": 0, "encoding": "fp32"}
            reply = channel.request(wire.message(wire.PUSH, header, encode(delta, "fp32")), deadline)
            assert reply.type == wire.ERROR and reply.header["reason"] == "bad_tensor", reply.header
            # A refused push leaves the connection in step: the next request is served.
            wrong = {n: torch.zeros(3) for n in names}
            reply = channel.request(wire.message(wire.PUSH, header, encode(wrong, "fp32")), deadline)
            assert reply.type == wire.ERROR and reply.header["reason"] == "bad_tensor", reply.header
        refused_at = time.monotonic()
        wait_for(run_dir, "two merges after the bad frames",
                 lambda ev: sum(1 for e in merges(ev) if e["t"] > refused_at) >= 2, 90, cluster)
    finally:
        cluster.stop()
    events = wait_for(run_dir, "the final state", lambda ev: any(e["kind"] == "final_state" for e in ev), 10)
    reasons = sorted(e["reason"] for e in events if e["kind"] == "frame_rejected")
    for reason in ("bad_magic", "bad_mac", "oversized", "bad_tensor"):
        assert reason in reasons, f"no {reason} rejection among {reasons}"
    assert not any(c["learner"] == 3 for e in merges(events) for c in e["contributors"]), "a bad push was merged"
    final = [e for e in events if e["kind"] == "final_state"]
    assert final and final[-1]["finite"], "global parameters are not finite"


def test_bf16_pulls_halve_the_download_and_still_train(run_dir: Path) -> None:
    """--pull-encoding bf16: merged fragments come down at 2 bytes a value; learners adopt
    them and the global model still learns."""
    cluster = make_cluster(run_dir, learners=2, extra=["--pull-encoding", "bf16", "--n-layer", "1", "--n-embd",
                                                       "32", "--n-head", "2", "--batch-size", "8"])
    try:
        wait_for(run_dir, "both learners to adopt 5 merged versions and make 1500 steps",
                 lambda ev: all(sum(1 for e in ev if e["kind"] == "apply" and e["learner"] == i) >= 5
                                and sum(1 for e in ev if e["kind"] == "inner_step" and e["learner"] == i) >= 1500
                                for i in (1, 2)),
                 timeout=150, cluster=cluster)
    finally:
        cluster.stop()
    events = wait_for(run_dir, "the syncer's final state", lambda ev: any(e["kind"] == "final_state" for e in ev), 10)
    train = TrainConfig(num_learners=2, model=TrainConfig().model.__class__(n_layer=1, n_embd=32, n_head=2))
    numel = sum(p.numel() for p in final_parameters(run_dir, train).values())
    pulls = [e["wire_bytes"] for e in events if e["kind"] == "pull"]
    assert pulls and max(pulls) < 2 * numel + 16_384, \
        f"a bf16 pull of {numel} values took {max(pulls)} bytes (fp32 would be {4 * numel})"
    corpus = load_corpus("markov")
    loss = evaluate(final_parameters(run_dir, train), train, corpus)
    assert loss < corpus.unigram_entropy - 0.3, f"held-out loss {loss:.3f} not clearly below unigram"


def test_rebase_adoption_keeps_every_step_and_still_converges(run_dir: Path) -> None:
    """--adopt rebase: θ ← Θ + the steps since the push. Nothing is thrown away (every
    processed token reaches a push), and the learners still train and agree."""
    cluster = make_cluster(run_dir, learners=2, extra=["--adopt", "rebase"])
    try:
        wait_for(run_dir, "both learners to adopt 10 merged versions",
                 lambda ev: all(sum(1 for e in ev if e["kind"] == "apply" and e["learner"] == i) >= 10
                                for i in (1, 2)), timeout=150, cluster=cluster)
    finally:
        cluster.stop()
    events = wait_for(run_dir, "the syncer's final state", lambda ev: any(e["kind"] == "final_state" for e in ev), 10)
    applies = [e for e in events if e["kind"] == "apply" and e.get("learner") in (1, 2)]
    assert {e["adopt"] for e in applies} == {"rebase"}
    assert sum(e["discarded_tokens"] for e in applies) == 0, "a rebase threw steps away"
    for i in (1, 2):
        processed = sum(e["tokens"] for e in events if e["kind"] == "inner_step" and e["learner"] == i)
        pushed = sum(e["tokens"] for e in events if e["kind"] == "push" and e["learner"] == i)
        assert pushed == processed, f"learner {i}: pushed {pushed} tokens of {processed} processed"
    corpus = load_corpus("markov")
    train = TrainConfig(num_learners=2)
    loss = evaluate(final_parameters(run_dir, train), train, corpus)
    assert loss < corpus.unigram_entropy - 0.3, f"held-out loss {loss:.3f} not clearly below unigram {corpus.unigram_entropy:.3f}"
    # A learner's distance from Θ at stop is the progress Θ does not hold yet (rebase keeps
    # it): its steps since its last push, plus that push's own steps when it came after the
    # version the learner last adopted. Judged per such step, not as a fixed distance, which
    # depends on how many steps a loaded machine let it take before its stop; a rebase that
    # added progress twice would grow the distance with every round instead.
    for i in (1, 2):
        final = [e for e in events if e["kind"] == "final_params" and e["learner"] == i]
        assert len(final) == 1, f"learner {i}: {len(final)} final_params events"
        stop = final[0]["t"]
        adopted = max((e["t"] for e in events if e["kind"] == "apply" and e["learner"] == i and e["t"] < stop),
                      default=0.0)
        pushes = [e for e in events if e["kind"] == "push" and e["learner"] == i and e["t"] < stop]
        last_push = pushes[-1]["t"] if pushes else 0.0
        unmerged = sum(1 for e in events if e["kind"] == "inner_step" and e["learner"] == i
                       and last_push < e["t"] <= stop)
        if pushes and last_push > adopted:
            unmerged += pushes[-1]["steps"]
        drift = max(row["drift"] for row in final[0]["fragments"])
        assert drift <= DRIFT_PER_STEP * max(unmerged, 1), \
            f"learner {i} drifted {drift:.3f} from Θ with {unmerged} step(s) of progress Θ did not hold yet " \
            f"(allowed {DRIFT_PER_STEP} per step)"


def test_rebase_with_alpha_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="alpha: mixes only with --adopt mix"):
        TrainConfig(adopt="rebase", alpha=0.5)
    with pytest.raises(ValueError, match="adopt: must be one of mix, rebase"):
        TrainConfig(adopt="merge")


def test_step_time_paces_every_step_and_sets_the_fault_free_rate(run_dir: Path) -> None:
    """--step-time T: an emulated accelerator. No step starts sooner than T after the one
    before, and goodput's capacity takes tokens per step / T as the learner's rate."""
    from trainer.launch import ClusterSpec, LocalCluster
    from trainer.runspec import RunSpec
    from trainer.metrics import learner_rates

    step_time = 0.05  # the small model's step computes in ~6 ms: the pacing, not the CPU, sets the rate
    run = RunSpec(learners=2, trainer_args=["--sync-every", "10", "--grace", "0.5", *SMALL_MODEL])
    cluster = LocalCluster(ClusterSpec(run_dir, run.with_learner_flags(["--step-time", str(step_time)])))
    cluster.start()
    try:
        events = wait_for(run_dir, "both learners to make 40 inner steps",
                          lambda ev: all(sum(1 for e in ev if e["kind"] == "inner_step" and e["learner"] == i) >= 40
                                         for i in (1, 2)), timeout=120, cluster=cluster)
    finally:
        cluster.stop()
    starts = [e for e in events if e["kind"] == "process_start" and e.get("role") == "learner"]
    assert sorted(e["step_time"] for e in starts) == [step_time, step_time]
    for i in (1, 2):
        # Slots are T apart; an event lands after its step's compute, so one gap between
        # events can be short by the jitter of two computes, never a whole slot.
        times = [e["t"] for e in events if e["kind"] == "inner_step" and e["learner"] == i][:40]
        gaps = sorted(b - a for a, b in zip(times, times[1:]))
        span = times[-1] - times[0]
        assert span >= (len(times) - 2) * step_time, \
            f"learner {i}: {len(times)} steps in {span:.3f}s under --step-time {step_time}"
        assert gaps[len(gaps) // 2] >= 0.9 * step_time, f"learner {i}: median gap {gaps[len(gaps) // 2]:.4f}s"
    tokens = next(e["tokens"] for e in events if e["kind"] == "inner_step")
    rates = learner_rates(events)
    assert rates == {1: pytest.approx(tokens / step_time), 2: pytest.approx(tokens / step_time)}
