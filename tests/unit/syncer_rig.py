"""An in-process syncer on 127.0.0.1 (port 0) with a tiny model, and a client that speaks
the wire protocol to it from plain sockets, the way a learner would. Shared by the ledger
tests and the hardening tests."""
from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
import torch

from trainer import wire
from trainer.codec import encode
from trainer.config import SyncerConfig, TrainConfig
from trainer.events import iter_file
from trainer.keys import learner_key
from trainer.model import ModelConfig, build_model
from trainer.storage import FILES, Storage
from trainer.syncer import Syncer

SECRET = b"ledger-test-secret-0123456789"
MODEL = ModelConfig(n_layer=1, n_embd=16, n_head=2, block_size=8)
SEED = 11
LR, MU = 0.7, 0.9
H, BATCH = 4, 16
# One full round of one learner: H steps x batch x block tokens. With L live learners the
# syncer normalises by max(Σ T, L x TOKENS), so such a push from the only live learner has
# weight 1, and two such pushes from two live learners have 1/2 each (outer.py's rule).
TOKENS = H * BATCH * MODEL.block_size
TIMEOUT = 15.0


def train_config(fragments: int = 1) -> TrainConfig:
    # A long heartbeat timeout: connected test clients stay alive without heartbeats.
    return TrainConfig(model=MODEL, num_learners=3, sync_every=H, fragments=fragments, seed=SEED,
                       batch_size=BATCH, heartbeat_interval=0.2, heartbeat_timeout=600.0)


def initial_params() -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in build_model(MODEL, SEED).named_parameters()}


def sgd_reference(params0: dict[str, torch.Tensor], deltas: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """What the outer optimizer must produce: torch's Nesterov SGD with p.grad = Δ."""
    names = list(deltas[0])
    ps = {n: torch.nn.Parameter(params0[n].clone()) for n in names}
    opt = torch.optim.SGD(list(ps.values()), lr=LR, momentum=MU, nesterov=True)
    for d in deltas:
        for n, p in ps.items():
            p.grad = d[n].clone()
        opt.step()
    return {n: p.detach() for n, p in ps.items()}


def wait_until(s: Syncer, predicate, what: str, timeout: float = TIMEOUT) -> None:
    """Wait on the syncer's own condition variable (every merge notifies it)."""
    with s.cond:
        ok = s.cond.wait_for(predicate, timeout)
    assert ok, f"timed out after {timeout}s waiting for {what}"


def poll_until(predicate, what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        pause.wait(0.01)


class Client:
    """A learner's side of the wire, from a plain socket: handshake, then sealed frames.

    The handshake names the learner and uses its key (trainer/keys.py), so it waits for
    the first request: `hello(N)` opens as learner N (with key_N, or `key` if given: an
    impostor's), anything else first as `learner` (default 1)."""

    def __init__(self, address: tuple[str, int], learner: int | None = None, key: bytes | None = None) -> None:
        self.sock = socket.create_connection(address, timeout=10)
        self.learner = learner
        self.key = key
        self._channel: wire.Channel | None = None

    @property
    def channel(self) -> wire.Channel:
        if self._channel is None:
            learner = self.learner if self.learner is not None else 1
            key = self.key if self.key is not None else learner_key(SECRET, learner)
            self._channel = wire.Channel.connect(self.sock, key, time.monotonic() + 10, learner)
        return self._channel

    def send(self, msg: wire.Message) -> wire.Frame:
        return self.channel.request(msg, time.monotonic() + 10)

    def request(self, ftype: str, header: dict | None = None, tensors=None) -> wire.Frame:
        if ftype == wire.HELLO and self._channel is None and self.learner is None and header:
            self.learner = header.get("learner") if isinstance(header.get("learner"), int) else None
        return self.send(wire.message(ftype, header, tensors))

    def hello(self, learner: int, nonce: str, mode: str = "decoupled") -> wire.Frame:
        return self.request(wire.HELLO, {"learner": learner, "nonce": nonce, "mode": mode, "want_params": False})

    def expect_closed(self) -> None:
        with pytest.raises((wire.PeerClosed, ConnectionError)):
            self.channel.recv(time.monotonic() + 10)

    def close(self) -> None:
        self.sock.close()


def push_frame(learner: int, incarnation: int, seq: int, delta: dict[str, torch.Tensor], base_version: int = 0,
               fragment: int = 0, tokens: int = TOKENS, position: int = 0, encoding: str = "fp32",
               **extra: object) -> wire.Message:
    """`extra`: more header fields (`final=1` for a learner's last push)."""
    header = {"learner": learner, "incarnation": incarnation, "seq": seq, "fragment": fragment,
              "base_version": base_version, "tokens": tokens, "steps": H, "position": position,
              "encoding": encoding, **extra}
    return wire.message(wire.PUSH, header, encode(delta, encoding))


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        self.state_dir = tmp_path / "state"
        self.run_dir = tmp_path / "run"
        self.syncers: list[Syncer] = []
        self.clients: list[Client] = []

    def make(self, quorum: int = 1, grace: float = 0.0, max_staleness: int = 4, fragments: int = 1,
             storage: Storage = FILES, **syncer: object) -> Syncer:
        """`storage`: the state dir's disk (a SimDisk to inject faults or power losses);
        `syncer`: any other SyncerConfig field (limits, timeouts, bounds)."""
        # No momentum warm-up: these tests check the arithmetic against torch's Nesterov step.
        cfg = SyncerConfig(host="127.0.0.1", port=0, state_dir=str(self.state_dir), outer_lr=LR,
                           outer_momentum=MU, quorum=quorum, grace=grace, max_staleness=max_staleness,
                           momentum_warmup=0.0, **syncer)  # type: ignore[arg-type]
        s = Syncer(cfg, train_config(fragments), SECRET, str(self.run_dir), storage=storage)
        self.syncers.append(s)
        return s

    def start(self, **kw) -> Syncer:
        s = self.make(**kw)
        s.start()
        return s

    def client(self, s: Syncer, learner: int | None = None, key: bytes | None = None) -> Client:
        """`learner`, `key`: open as that learner with that key (default: the learner of
        the first HELLO, with its own key)."""
        assert s.address is not None
        c = Client(s.address, learner, key)
        self.clients.append(c)
        return c

    def delta(self, s: Syncer, seed: int, fragment: int = 0) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return {n: torch.randn(s.shapes[n], generator=g) * 0.01 for n in s.specs[fragment].names}

    def admitted(self, s: Syncer, seq: int, learner: int = 1):
        """`learner`'s push `seq` (incarnation 1), admitted by the core as the service would
        (under the lock), with no socket: its ticket, the id reserved."""
        msg = push_frame(learner, 1, seq, self.delta(s, seq))
        request = s.core.parse_push(wire.Frame(msg.type, wire.parse_header(msg.head), msg.payload), learner)
        with s.cond:
            return s.core.admit_push(request)

    def crash(self, s: Syncer) -> None:
        """Halt a syncer as SIGKILL would: its threads stop; no final merge, no final state write."""
        s._running = False
        if s._listener is not None:
            s._listener.close()
        with s.cond:
            for sock in list(s._conns.values()):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            s.cond.notify_all()
        for t in s._threads:
            t.join(timeout=5)
        wait_until(s, lambda: not s._conns, "the crashed syncer's connection threads to end")
        s.events.close()

    def events(self, kind: str | None = None) -> list[dict]:
        path = self.run_dir / "events" / "syncer.jsonl"
        return [e for e in iter_file(path) if kind is None or e["kind"] == kind]

    def close(self) -> None:
        for c in self.clients:
            c.close()
        for s in self.syncers:
            if s._running:
                s.stop(reason="test teardown")
            s.events.close()  # also for syncers never started (stop() is a no-op for those)


@pytest.fixture
def rig(tmp_path: Path):
    torch.set_num_threads(1)
    r = Rig(tmp_path)
    try:
        yield r
    finally:
        r.close()


def merged_ids(events: list[dict]) -> list[str]:
    return [c["id"] for e in events if e["kind"] == "merge" for c in e["contributors"]]
