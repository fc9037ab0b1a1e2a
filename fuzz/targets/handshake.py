"""The syncer's side of a connection until a HELLO is verified: the 40-byte opening, then
a payload-less HELLO within its caps, then the HELLO's own field checks. First byte: 0
raw bytes; 1 the opening from the input, then a HELLO header from the input, sealed."""
from __future__ import annotations

import types

from fuzz.targets.support import CLIENT_RANDOM, FAR, SECRET, SERVER_RANDOM, BytesSocket, sealed
from trainer import wire
from trainer.keys import learner_key
from trainer.protocol import FrameFault

NAME = "handshake"
EXPECTED = (FrameFault, wire.PeerClosed, wire.DeadlineExceeded)


def setup() -> None:
    # A fixed server random, so a sealed HELLO can be built for the key the server derives.
    wire.os = types.SimpleNamespace(urandom=lambda n: SERVER_RANDOM[:n], environ={})  # type: ignore[assignment]


def _stream(data: bytes) -> bytes:
    if data[0] % 2 == 0:
        return data[1:]
    opening = wire.HANDSHAKE.pack(wire.MAGIC, wire.VERSION, CLIENT_RANDOM)
    key = wire.derive_key(learner_key(SECRET, 0), CLIENT_RANDOM, SERVER_RANDOM)  # the opening names learner 0
    return opening + sealed(data[1:], b"", key=key)


def test_one_input(data: bytes) -> None:
    if not data:
        return
    sock = BytesSocket(_stream(data))
    try:
        session = wire.server_handshake(sock, SECRET, FAR)  # type: ignore[arg-type]
        hello = wire.read_frame(sock, session, FAR, max_payload=0, max_header=wire.HELLO_MAX_HEADER)  # type: ignore[arg-type]
        wire.header_int(hello.header, "learner")
        wire.header_str(hello.header, "nonce")
        wire.header_str(hello.header, "mode", ("decoupled", "sync"))
    except EXPECTED:
        pass
