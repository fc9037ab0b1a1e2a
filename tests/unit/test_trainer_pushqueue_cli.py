"""The learner's push queue, run configuration, and the command line's refusals."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import trainer.push_protocol as push_protocol_mod
from trainer import wire
from trainer.adoption import VersionBook
from trainer.__main__ import build_parser
from trainer.cli_args import syncer_config
from trainer.codec import decode
from trainer.config import SyncerConfig, TrainConfig
from trainer.learner import Learner, LearnerOptions
from trainer.link import Address
from trainer.model import ModelConfig
from trainer.push_protocol import PushProtocol
from trainer.pushes import OutgoingPush, PushQueue

REPO = Path(__file__).resolve().parents[2]


def _push(fragment: int, seq: int, value: float = 1.0, tokens: int = 100, steps: int = 4, position: int = 0,
          base: int = 0) -> OutgoingPush:
    return OutgoingPush(fragment, seq, base, tokens, steps, position,
                        {"w": torch.full((3,), value), "b": torch.full((2,), 10 * value)})


# ----------------------------------------------------------------------------- PushQueue

def test_unsent_pushes_of_one_fragment_coalesce() -> None:
    q = PushQueue(4)
    q.put(_push(0, seq=1, value=1.0, tokens=100, steps=4, position=4, base=3))
    q.put(_push(0, seq=2, value=2.0, tokens=50, steps=2, position=6, base=4))
    q.put(_push(0, seq=3, value=4.0, tokens=25, steps=1, position=7, base=5))
    assert len(q) == 1
    item = q.peek()
    assert torch.equal(item.delta["w"], torch.full((3,), 7.0))
    assert torch.equal(item.delta["b"], torch.full((2,), 70.0))
    assert (item.tokens, item.steps, item.position) == (175, 7, 7)
    # The coalesced push keeps the identity and base of the oldest one.
    assert (item.seq, item.base_version) == (1, 3)
    assert item.coalesced == 2 and q.coalesced == 2


def test_different_fragments_do_not_coalesce() -> None:
    q = PushQueue(4)
    q.put(_push(0, 1))
    q.put(_push(1, 2))
    assert len(q) == 2 and [q.peek().fragment] == [0]


def test_never_coalesces_into_an_attempted_push() -> None:
    q = PushQueue(4)
    first = _push(0, 1, value=1.0)
    q.put(first)
    assert q.claim() is first  # the sender took it: it must be resent byte for byte
    first.attempts = 1
    q.put(_push(0, 2, value=5.0))
    assert len(q) == 2
    assert torch.equal(first.delta["w"], torch.full((3,), 1.0)) and first.tokens == 100
    q.put(_push(0, 3, value=1.0))  # coalesces into the unsent seq 2, not into seq 1
    assert len(q) == 2
    assert q.peek() is first
    q.pop(first)  # acknowledged
    second = q.peek()
    assert second.seq == 2 and torch.equal(second.delta["w"], torch.full((3,), 6.0))


def test_capacity_is_enforced_and_validated() -> None:
    with pytest.raises(ValueError, match=">= 2"):
        PushQueue(1)
    q = PushQueue(2)
    q.put(_push(0, 1))
    q.put(_push(1, 2))
    with pytest.raises(OverflowError, match="full"):
        q.put(_push(2, 3))
    q.put(_push(1, 4))  # coalescing needs no room
    assert len(q) == 2


def test_queue_stays_bounded_by_fragments_plus_one() -> None:
    """The learner's pattern: appends for P fragments; the sender attempts and pops the head."""
    rng = random.Random(7)
    p = 4
    q = PushQueue(p + 1)
    seq = 0
    total_in = {f: 0.0 for f in range(p)}
    total_out = {f: 0.0 for f in range(p)}
    for _ in range(2000):
        op = rng.random()
        if op < 0.6:
            seq += 1
            f = rng.randrange(p)
            value = float(rng.randint(1, 9))
            total_in[f] += value
            q.put(_push(f, seq, value=value))  # must never overflow
        else:
            head = q.peek()
            if head is None:
                continue
            if not head.claimed:
                assert q.claim() is head  # the sender takes it
            elif op < 0.9:
                total_out[head.fragment] += float(head.delta["w"][0])
                q.pop(head)  # acknowledged
        assert len(q) <= p + 1
        assert sum(1 for i in q._items if not i.claimed) <= p
    while (head := q.peek()) is not None:
        total_out[head.fragment] += float(head.delta["w"][0])
        q.pop(head)
    assert total_out == total_in, "coalescing must neither lose nor duplicate progress"


def test_wait_returns_when_something_is_queued() -> None:
    q = PushQueue(2)
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (q.wait(30.0), done.set()), daemon=True)
    waiter.start()
    q.put(_push(0, 1))
    assert done.wait(5.0), "wait() did not return after a push was queued"


def test_wait_times_out_when_empty() -> None:
    q = PushQueue(2)
    started = time.monotonic()
    q.wait(0.2)
    assert 0.15 <= time.monotonic() - started < 5.0


def test_wait_returns_at_once_when_not_empty() -> None:
    q = PushQueue(2)
    q.put(_push(0, 1))
    started = time.monotonic()
    q.wait(30.0)
    assert time.monotonic() - started < 5.0


def test_wait_empty() -> None:
    q = PushQueue(2)
    assert q.wait_empty(0.01) is True
    item = _push(0, 1)
    q.put(item)
    started = time.monotonic()
    assert q.wait_empty(0.2) is False
    assert time.monotonic() - started >= 0.15
    popper = threading.Thread(target=lambda: q.pop(item), daemon=True)
    popper.start()
    assert q.wait_empty(10.0) is True


# ----------------------------------------------------------------------------- learner/queue race

SECRET = b"pushqueue-test-secret-0123"


def _bare_learner(encoding: str) -> Learner:
    opts = LearnerOptions(learner=1, address=Address("127.0.0.1", 9), run_dir=None, device="cpu")
    lrn = Learner(opts, secret=SECRET, mode="decoupled")  # no task loaded: the test sends pushes only
    lrn.cfg = TrainConfig(model=ModelConfig(n_layer=1, n_embd=16, n_head=2, block_size=8), sync_every=4,
                          encoding=encoding)
    lrn.incarnation = 1
    lrn.queue = PushQueue(4)
    lrn.book = VersionBook.starting_at([0])
    lrn.pushes = PushProtocol(1, 1, lrn.book, lrn.queue, lrn.events, encoding, time.monotonic)
    return lrn


def _parse(msg: wire.Message) -> wire.Frame:
    """What the syncer reads of a message the learner sent (its header and payload)."""
    return wire.Frame(msg.type, wire.parse_header(msg.head), msg.payload)


@pytest.mark.parametrize("encoding", ["fp32", "bf16"])
def test_push_queued_while_the_head_is_being_encoded_is_not_lost(
        encoding: str, monkeypatch: pytest.MonkeyPatch) -> None:
    lrn = _bare_learner(encoding)
    sent: list[wire.Message] = []

    def request(data: wire.Message) -> wire.Frame:
        sent.append(data)
        return wire.Frame(wire.ACK, {"status": "accepted", "version": 0, "versions": [0]})

    lrn.link.request = request  # type: ignore[method-assign]
    real_encode = push_protocol_mod.encode
    injected = []

    def encode_then_inner_loop_pushes(tensors, enc):
        out = real_encode(tensors, enc)
        if not injected:  # the inner loop's next push of this fragment lands right now
            injected.append(True)
            lrn.queue.put(_push(0, seq=2, value=2.0, tokens=100, steps=4))
        return out

    monkeypatch.setattr(push_protocol_mod, "encode", encode_then_inner_loop_pushes)
    lrn.queue.put(_push(0, seq=1, value=1.0, tokens=100, steps=4))
    lrn._send_push(lrn.queue.peek())
    while (head := lrn.queue.peek()) is not None:
        lrn._send_push(head)

    frames = [_parse(d) for d in sent]
    shapes = {"w": torch.Size([3]), "b": torch.Size([2])}
    total_w = sum(decode(f.tensors(), encoding, shapes)["w"] for f in frames)
    assert torch.allclose(total_w, torch.full((3,), 3.0)), "the second push's progress was lost"
    assert sum(f.header["tokens"] for f in frames) == 200
    assert sum(f.header["steps"] for f in frames) == 8


# ----------------------------------------------------------------------------- config

def test_train_config_round_trip_and_unknown_field() -> None:
    cfg = TrainConfig(model=ModelConfig(n_layer=2, n_embd=32, n_head=4), fragments=2, sync_every=10)
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    data = cfg.to_dict()
    data["learning_rate_typo"] = 1.0
    with pytest.raises(ValueError, match="config: unknown field 'learning_rate_typo'"):
        TrainConfig.from_dict(data)


@pytest.mark.parametrize("kwargs,match", [
    ({"mode": "async"}, "^mode:"), ({"num_learners": 0}, "^learners:"),
    ({"sync_every": 10, "fragments": 3}, r"fragments \(P\)"), ({"alpha": 1.0}, "^alpha:"),
    ({"encoding": "int3"}, "^encoding:"), ({"inner_lr": 0.0}, "^inner-lr:"), ({"inner_warmup": -1}, "^inner-warmup:"),
    ({"heartbeat_interval": 1.0, "heartbeat_timeout": 0.5}, "^heartbeat-timeout:"),
    ({"batch_size": 0}, "^batch-size:"), ({"fragments": 4, "sync_every": 8, "max_unsent_pushes": 4},
                                          "^max-unsent-pushes:"),
])
def test_train_config_validation_names_the_field(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kwargs)


@pytest.mark.parametrize("fragments", [0, -1])
def test_train_config_refuses_non_positive_fragments(fragments: int) -> None:
    with pytest.raises(ValueError, match="fragments"):
        TrainConfig(fragments=fragments)


@pytest.mark.parametrize("kwargs,match", [
    ({"port": 70000}, "^port:"), ({"quorum": -1}, "^quorum:"), ({"grace": -1.0}, "^grace:"),
    ({"max_staleness": -1}, "^max-staleness:"), ({"max_payload": 10}, "^max-payload:"),
])
def test_syncer_config_validation_names_the_field(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SyncerConfig(**kwargs)


def test_outer_momentum_is_refused_before_anything_starts() -> None:
    parser = build_parser()
    args = parser.parse_args(["run", "--outer-momentum", "1.5"])
    run_parser = parser._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    with pytest.raises(SystemExit):
        syncer_config(args, run_parser, "unused")


# ----------------------------------------------------------------------------- CLI

# The refusals. `run`'s are parsed and refused in this process: one that failed to refuse
# would run a bounded cluster and fail here. The long-running roles' (a syncer or learner
# that failed to refuse would serve forever) run as real subprocesses with a deadline, which
# also proves `python -m trainer` itself exits 2 with a usage line and no traceback.
RUN_CASES = {
    "learners0": (["run", "--learners", "0"], "--learners"),
    "schedule": (["run", "--sync-every", "10", "--fragments", "3"], "fragments (P): 3 must divide"),
    "encoding": (["run", "--encoding", "int3"], "--encoding"),
    "final_round": (["run", "--final-round", "maybe"], "--final-round: expected on or off, got 'maybe'"),
    "final_wait": (["run", "--final-wait", "-1"], "--final-wait"),
    "strided": (["run", "--n-layer", "2", "--fragments", "4", "--sync-every", "40", "--fragment-layout", "strided"],
                "fragment-layout: strided puts layer i in fragment i mod P, so it needs at least P layers; "
                "the model has 2 (--n-layer) for 4 fragments"),
}
ROLE_CASES = {
    "connect": (["learner", "--learner", "1", "--connect", "nohost"], "--connect"),
    "state_dir": (["syncer"], "--state-dir"),
    "secret": (["syncer", "--state-dir", "{tmp}/state"], "ISLANDS_SECRET"),
}


def _secret_names() -> list[str]:
    """The secret's variables in this environment: every refusal runs without them."""
    return [k for k in os.environ if k.startswith("ISLANDS_SECRET")]


@pytest.fixture(scope="module")
def cli_results(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    tmp = tmp_path_factory.mktemp("cli")
    secrets = _secret_names()
    env = {k: v for k, v in os.environ.items() if k not in secrets}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["ISLANDS_CACHE_DIR"] = str(tmp / "cache")
    env["OMP_NUM_THREADS"] = "1"
    procs = {}
    for name, (argv, _) in ROLE_CASES.items():
        argv = [a.replace("{tmp}", str(tmp)) for a in argv]
        procs[name] = subprocess.Popen([sys.executable, "-m", "trainer", *argv], cwd=tmp, env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = {}
    try:
        for name, p in procs.items():
            out, err = p.communicate(timeout=60)
            results[name] = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    results["_tmp"] = tmp  # type: ignore[assignment]
    return results


def _assert_refused(code: int | str | None, stderr: str, needle: str) -> None:
    assert code == 2, (code, stderr[-2000:])
    assert needle in stderr, stderr[-2000:]
    assert "usage:" in stderr and "Traceback" not in stderr


@pytest.mark.parametrize("case", list(ROLE_CASES))
def test_role_refuses_bad_flags_with_exit_2(cli_results, case: str) -> None:
    r = cli_results[case]
    _assert_refused(r.returncode, r.stderr, ROLE_CASES[case][1])


def test_role_refusal_starts_nothing(cli_results) -> None:
    tmp = cli_results["_tmp"]
    assert not (tmp / "state").exists(), "a refused syncer must not create its state dir"


@pytest.mark.parametrize("case", list(RUN_CASES))
def test_run_refuses_bad_flags_with_exit_2(case: str, tmp_path: Path, monkeypatch,
                                           capsys: pytest.CaptureFixture) -> None:
    from trainer.__main__ import main
    argv, needle = RUN_CASES[case]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ISLANDS_CACHE_DIR", str(tmp_path / "cache"))
    for name in _secret_names():
        monkeypatch.delenv(name)
    with pytest.raises(SystemExit) as ei:
        main(argv)
    _assert_refused(ei.value.code, capsys.readouterr().err, needle)
    assert list(tmp_path.iterdir()) == [], "a refused run must create nothing (no run dir, no cache)"


@pytest.mark.parametrize("argv,needles", [
    (["--help"], ["syncer", "learner", "run"]), (["syncer", "--help"], ["--state-dir", "--quorum"]),
    (["learner", "--help"], ["--connect", "--learner"]), (["run", "--help"], ["--duration", "--learners"]),
])
def test_help_exits_0(argv: list[str], needles: list[str], capsys: pytest.CaptureFixture) -> None:
    # In-process: argparse's --help path is the same; the subprocesses above already
    # prove that `python -m trainer` starts.
    from trainer.__main__ import main
    with pytest.raises(SystemExit) as ei:
        main(argv)
    assert ei.value.code == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("usage:") and captured.err == ""
    assert all(n in captured.out for n in needles)


def test_learner_speed_out_of_range_exits_2(capsys: pytest.CaptureFixture, monkeypatch) -> None:
    from trainer.__main__ import main
    monkeypatch.delenv("ISLANDS_SECRET", raising=False)
    monkeypatch.delenv("ISLANDS_SECRET_FILE", raising=False)
    with pytest.raises(SystemExit) as ei:
        main(["learner", "--learner", "1", "--connect", "127.0.0.1:9", "--speed", "2"])
    assert ei.value.code == 2
    assert "--speed" in capsys.readouterr().err
