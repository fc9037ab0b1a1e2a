"""Issue 15's probe, items 1-7, against an in-process syncer: what an outsider without the
secret, and a learner holding it, can no longer do. Each test reproduces one finding."""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
import torch

from tests.unit.syncer_rig import H, SECRET, TOKENS, Client, Rig, merged_ids, poll_until, push_frame, wait_until
from trainer import wire
from trainer.keys import learner_key
from trainer.codec import encode
from trainer.state import save_tensors

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def opening() -> bytes:
    """A client's 40-byte handshake, as wire.client_handshake sends it."""
    return wire.HANDSHAKE.pack(wire.MAGIC, wire.VERSION, os.urandom(wire.RANDOM_BYTES))


def events_of(rig: Rig, kind: str, **match: object) -> list[dict]:
    return [e for e in rig.events(kind) if all(e.get(k) == v for k, v in match.items())]


def read_until_closed(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except (ConnectionResetError, socket.timeout):
        pass
    return b"".join(chunks)


# ----------------------------------------------------------------------------- without the secret

def test_1_a_claimed_payload_is_never_allocated_before_the_secret_is_proven(rig: Rig) -> None:
    """16 connections each claim a 64 MiB payload in their first frame: every one is refused
    from its 20-byte prefix (no HELLO may carry a payload), and the syncer's memory stays put."""
    s = rig.start()
    assert s.address is not None
    before = rss_bytes()
    socks = []
    for _ in range(16):
        sock = socket.create_connection(s.address, timeout=5)
        sock.sendall(opening() + wire.PREFIX.pack(wire.MAGIC, wire.VERSION, 16, s.cfg.max_payload))
        socks.append(sock)
    try:
        poll_until(lambda: s.counters["rejected_oversized"] == 16, "16 oversized first frames to be refused")
        for sock in socks:
            read_until_closed(sock, 5)  # the syncer closed it: recv ends
        grown = rss_bytes() - before
        assert grown < 64 << 20, f"the syncer grew by {grown >> 20} MiB for 16 unauthenticated connections"
        # The syncer closes a socket, then frees its slot: the client sees the close first.
        poll_until(lambda: not s.admission.slots, "the refused connections to give back their slots")
    finally:
        for sock in socks:
            sock.close()


def test_2_idle_connections_never_keep_a_learner_out(rig: Rig) -> None:
    """300 idle connections that sent 2 bytes each: the pool of handshakes is capped, the
    oldest of the busiest peer is evicted, each eviction is an event, and a learner joins."""
    s = rig.start(max_unauthenticated=32)
    assert s.address is not None
    idle = []
    try:
        for _ in range(300):
            sock = socket.create_connection(s.address, timeout=5)
            sock.sendall(b"IS")
            idle.append(sock)
        poll_until(lambda: s.counters["refused_unauthenticated_limit"] >= 300 - 32,
                   "the idle connections beyond the cap to be evicted")
        c = Client(s.address)
        rig.clients.append(c)
        welcome = c.hello(1, "legit")  # Client's own deadline bounds this at 10 s
        assert welcome.type == wire.WELCOME and welcome.header["incarnation"] == 1
        with s.cond:
            assert s.admission.count(False) <= 32
        refused = events_of(rig, "connection_refused", reason="unauthenticated_limit")
        assert refused and "evicted" in refused[0]["detail"]
    finally:
        for sock in idle:
            sock.close()


def test_2_a_silent_handshake_times_out_as_an_event(rig: Rig) -> None:
    s = rig.start(handshake_timeout=0.3)
    assert s.address is not None
    with socket.create_connection(s.address, timeout=5) as sock:
        sock.sendall(opening())  # the handshake, then no HELLO
        read_until_closed(sock, 10)
    poll_until(lambda: s.counters["refused_handshake_timeout"] == 1, "the handshake timeout to be counted")
    s.stop()
    assert events_of(rig, "connection_refused", reason="handshake_timeout")


class Recorder:
    """A socket that keeps a copy of every byte sent: what an eavesdropper on the link sees."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sent = bytearray()

    def send(self, data) -> int:
        n = self.sock.send(data)
        self.sent += bytes(data[:n])
        return n

    def __getattr__(self, name: str):
        return getattr(self.sock, name)


def test_3_a_captured_hello_or_push_is_worthless_elsewhere(rig: Rig) -> None:
    s = rig.start(quorum=2, grace=3600.0)
    assert s.address is not None
    rec = Recorder(socket.create_connection(s.address, timeout=5))
    channel = wire.Channel.connect(rec, learner_key(SECRET, 1), time.monotonic() + 10, 1)  # type: ignore[arg-type]
    hello = wire.message(wire.HELLO, {"learner": 1, "nonce": "real", "mode": "decoupled", "want_params": False})
    assert channel.request(hello, time.monotonic() + 10).header["incarnation"] == 1
    captured_hello = bytes(rec.sent)
    push = push_frame(1, 1, 1, rig.delta(s, 1))
    mark = len(rec.sent)
    assert channel.request(push, time.monotonic() + 10).header["status"] == "accepted"
    captured_push = bytes(rec.sent[mark:])
    # Replayed byte for byte on a new connection: the server's random differs, so the MAC does.
    with socket.create_connection(s.address, timeout=5) as replay:
        replay.sendall(captured_hello)
        read_until_closed(replay, 10)
    # Replayed on its own connection: frame 1 again where frame 2 is due.
    rec.sock.sendall(captured_push)
    with pytest.raises((wire.PeerClosed, ConnectionError, wire.FrameError)):
        reply = channel.recv(time.monotonic() + 10)
        assert reply.type == wire.ERROR  # answered, then closed
        channel.recv(time.monotonic() + 10)
    poll_until(lambda: s.counters["rejected_bad_mac"] == 2, "both replays to be refused as bad_mac")
    with s.cond:
        assert s.members.members[1].incarnation == 1, "a replayed HELLO must not make or bump an incarnation"
        assert s.counters["accepted"] == 1 and s.counters["duplicates"] == 0, "the replayed push was read"
    rec.sock.close()


# ----------------------------------------------------------------------------- with the secret

def raw_push(client: Client, header_text: str, payload: bytes = b"") -> wire.Frame:
    """A signed PUSH whose header JSON is written by hand (numbers JSON allows, Python too)."""
    import zlib

    head = header_text.replace("CRC", str(zlib.crc32(payload))).encode()
    return client.send(wire.Message(wire.PUSH, head, payload))


def test_4_out_of_bounds_counts_are_refused_before_any_ack(rig: Rig) -> None:
    s = rig.start(quorum=2, grace=3600.0)
    good, bad = rig.client(s), rig.client(s)
    good.hello(1, "good")
    bad.hello(2, "bad")
    payload = wire.pack_tensors(encode(rig.delta(s, 2), "fp32"))
    fields = '"learner":2,"incarnation":1,"fragment":0,"base_version":0,"position":0,"encoding":"fp32"'
    for seq, tokens, steps, reason in ((1, 10 ** 309, H, "bad_header"), (2, 2 ** 60, H, "bad_header"),
                                       (3, 10 ** 12, H, "out_of_bounds"), (4, TOKENS, 10 ** 9, "out_of_bounds")):
        reply = raw_push(bad, f'{{"type":"PUSH","crc32":CRC,"seq":{seq},"tokens":{tokens},"steps":{steps},{fields}}}',
                         payload)
        assert reply.type == wire.ERROR and reply.header["reason"] == reason, (seq, reply.header)
        if reason == "bad_header":  # the byte stream is no longer trusted: reconnect
            bad = rig.client(s)
            bad.hello(2, "bad")
    assert good.send(push_frame(1, 1, 1, rig.delta(s, 1))).header["status"] == "accepted"
    assert bad.send(push_frame(2, 1, 9, rig.delta(s, 3))).header["status"] == "accepted"
    wait_until(s, lambda: s.frags[0].version >= 1, "the good pushes to merge")
    s.stop()
    assert sorted(merged_ids(rig.events())) == ["1:1:1", "2:1:9"]
    assert all(torch.isfinite(t).all() for t in s.frags[0].params.values())


def test_4_a_poisoned_pending_file_is_quarantined_and_the_others_merge(rig: Rig) -> None:
    """A pending push whose file holds tokens=10**309 (accepted before bounds existed) failed
    every merge, after every restart, and took the others' acknowledged pushes with it."""
    s = rig.make(quorum=2, grace=3600.0)
    s.stop()
    pending = s.store.pending_path(0, "1:1:1")
    meta = {"fragment": 0, "learner": 1, "incarnation": 1, "seq": 1, "tokens": 10 ** 309, "steps": H,
            "base_version": 0, "encoding": "fp32"}
    save_tensors(pending, encode(rig.delta(s, 1), "fp32"), meta)
    save_tensors(s.store.pending_path(0, "2:1:1"), encode(rig.delta(s, 2), "fp32"), {**meta, "learner": 2,
                                                                                     "tokens": TOKENS})
    s2 = rig.start(quorum=1, grace=0.0)
    wait_until(s2, lambda: s2.frags[0].version >= 1, "the good recovered push to merge")
    s2.stop()
    assert merged_ids(rig.events()) == ["2:1:1"]
    quarantined = rig.events("push_quarantined")
    assert [(e["id"], e["reason"]) for e in quarantined] == [("1-1-1", "bad_pending")]
    note = json.loads(Path(quarantined[0]["path"]).with_suffix(".json").read_text())
    assert note["reason"] == "bad_pending" and "tokens" in note["detail"]
    assert not pending.exists() and Path(quarantined[0]["path"]).exists(), "the file must be moved aside, not deleted"


def test_5_a_huge_token_total_cannot_lock_the_syncer(rig: Rig) -> None:
    s = rig.start()
    c = rig.client(s)
    c.hello(1, "n")
    payload = wire.pack_tensors(encode(rig.delta(s, 1), "fp32"))
    fields = '"learner":1,"incarnation":1,"fragment":0,"base_version":0,"position":0,"encoding":"fp32","steps":4'
    reply = raw_push(c, f'{{"type":"PUSH","crc32":CRC,"seq":1,"tokens":{10 ** 4299},{fields}}}', payload)
    assert reply.type == wire.ERROR and reply.header["reason"] == "bad_header"
    again = rig.client(s)
    assert again.hello(1, "n").type == wire.WELCOME, "HELLO must still be served"
    assert again.send(push_frame(1, 1, 2, rig.delta(s, 2))).header["status"] == "accepted"
    s.stop()
    finals = rig.events("final_state")
    assert finals and finals[-1]["finite"] and finals[-1]["counters"]["accepted"] == 1


def test_6_a_finite_but_huge_pseudo_gradient_is_refused(rig: Rig) -> None:
    s = rig.start()
    c = rig.client(s)
    c.hello(1, "n")
    huge = {n: torch.full_like(t, 3.4e38) for n, t in rig.delta(s, 1).items()}
    reply = c.send(push_frame(1, 1, 1, huge))
    assert reply.type == wire.ERROR and reply.header["reason"] == "implausible_norm", reply.header
    assert c.send(push_frame(1, 1, 2, rig.delta(s, 2))).header["status"] == "accepted", \
        "a refused push leaves the connection usable"
    wait_until(s, lambda: s.frags[0].version >= 1, "the good push to merge")
    assert all(torch.isfinite(t).all() for t in s.frags[0].params.values())


def test_6_a_merge_that_would_be_non_finite_is_never_committed(rig: Rig) -> None:
    """Past validation (a pending file from before it): the push that would make Θ Inf is
    quarantined, the other merges, and Θ stays finite."""
    s = rig.make(quorum=2, grace=3600.0)
    s.stop()
    meta = {"fragment": 0, "learner": 1, "incarnation": 1, "seq": 1, "tokens": TOKENS, "steps": H,
            "base_version": 0, "encoding": "fp32"}
    huge = {n: torch.full_like(t, 3.4e38) for n, t in rig.delta(s, 1).items()}
    # Nearly all the merge's weight (tokens): (1 + μ)·lr·3.4e38 overflows fp32.
    save_tensors(s.store.pending_path(0, "1:1:1"), encode(huge, "fp32"), {**meta, "tokens": 1000 * TOKENS})
    save_tensors(s.store.pending_path(0, "2:1:1"), encode(rig.delta(s, 2), "fp32"), {**meta, "learner": 2})
    s2 = rig.start(quorum=1, grace=0.0)
    wait_until(s2, lambda: s2.frags[0].version >= 1, "the good push to merge")
    s2.stop()
    assert merged_ids(rig.events()) == ["2:1:1"]
    assert [(e["id"], e["reason"]) for e in rig.events("push_quarantined")] == [("1:1:1", "nonfinite_merge")]
    assert all(e["finite"] for e in rig.events("merge"))
    assert all(torch.isfinite(t).all() for t in s2.frags[0].params.values())


@pytest.mark.parametrize("header", ['{"type":"HEARTBEAT","crc32":0,"x":' + "[" * 30_000 + "]" * 30_000 + "}",
                                    '{"type":"HEARTBEAT","crc32":0,"x":' + "7" * 5000 + "}"],
                         ids=["nested-30000-deep", "int-of-5000-digits"])
def test_7_a_hostile_header_is_answered_and_counted(rig: Rig, header: str) -> None:
    s = rig.start()
    c = rig.client(s)
    c.hello(1, "n")
    reply = c.send(wire.Message(wire.HEARTBEAT, header.encode(), b""))
    assert reply.type == wire.ERROR and reply.header["reason"] == "bad_header", reply.header
    poll_until(lambda: s.counters["rejected_bad_header"] == 1, "the frame to be counted")
    s.stop()
    assert events_of(rig, "frame_rejected", reason="bad_header")
