"""Authenticated frames over a real socketpair, and the shared-secret loader."""
from __future__ import annotations

import hashlib
import hmac
import json
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterator

import pytest
import torch

from trainer import wire
from trainer.keys import learner_key
from trainer.wire import (DEFAULT_MAX_PAYLOAD, MAC_LEN, MAGIC, MAX_HEADER_BYTES, PREFIX, VERSION, DeadlineExceeded,
                          Frame, FrameError, PeerClosed, load_secret)

SECRET = b"s3cret-s3cret-s3cret-0123"
OTHER = b"another-secret-entirely-xx"
CLIENT_RANDOM, SERVER_RANDOM = b"c" * 32, b"s" * 32
_sessions: dict[tuple[bytes, bool], wire.Session] = {}


@pytest.fixture(autouse=True)
def _fresh_sessions() -> Iterator[None]:
    """Each test starts a new connection: both sides' frame counters at 0."""
    _sessions.clear()
    yield
    _sessions.clear()


def _session(secret: bytes, client: bool) -> wire.Session:
    key = (secret, client)
    if key not in _sessions:
        _sessions[key] = wire.Session(wire.derive_key(secret, CLIENT_RANDOM, SERVER_RANDOM), client=client)
    return _sessions[key]


def encode_frame(secret: bytes, ftype: str, header: dict | None = None, tensors=None, payload: bytes | None = None) -> bytes:
    """A learner's next frame on this test's connection."""
    return _session(secret, True).seal(wire.message(ftype, header, tensors, payload))


def read_frame(sock: socket.socket, secret: bytes, deadline: float, max_payload: int = DEFAULT_MAX_PAYLOAD,
               max_header: int = MAX_HEADER_BYTES) -> Frame:
    """The syncer's read of the next frame on this test's connection."""
    return wire.read_frame(sock, _session(secret, False), deadline, max_payload, max_header)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _deadline(seconds: float = 5.0) -> float:
    return time.monotonic() + seconds


def _send_in_thread(sock: socket.socket, data: bytes, close_after: bool = False) -> threading.Thread:
    """Frames bigger than the socket buffer must be written while the other side reads."""
    def run() -> None:
        try:
            sock.sendall(data)
        except OSError:
            pass
        if close_after:
            sock.shutdown(socket.SHUT_WR)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _raw_frame(secret: bytes, header_bytes: bytes, payload: bytes = b"", version: int = VERSION,
               magic: bytes = MAGIC, counter: int = 0) -> bytes:
    """A learner's frame number `counter`, assembled by hand from the documented layout,
    with a correct MAC."""
    key = hmac.new(secret, b"islands/3 session" + bytes(3) + CLIENT_RANDOM + SERVER_RANDOM, hashlib.sha256).digest()
    prefix = struct.pack("!4sB3xIQ", magic, version, len(header_bytes), len(payload))
    mac = hmac.new(key, b"C" + struct.pack("!Q", counter) + prefix + header_bytes + payload, hashlib.sha256).digest()
    return prefix + header_bytes + payload + mac


def _reason(exc_info: pytest.ExceptionInfo) -> str:
    return exc_info.value.reason


# ----------------------------------------------------------------------------- round trips

def test_prefix_is_twenty_bytes() -> None:
    assert PREFIX.size == 20 and MAC_LEN == 32


def test_round_trip_header_and_tensors(pair) -> None:
    a, b = pair
    tensors = {"w": torch.randn(3, 4), "b": torch.arange(5, dtype=torch.int8), "h": torch.randn(2).bfloat16()}
    header = {"learner": 2, "seq": 9, "note": "héllo", "nested": {"x": [1, 2]}}
    data = encode_frame(SECRET, wire.PUSH, header, tensors)
    a.sendall(data)
    frame = read_frame(b, SECRET, _deadline())
    assert frame.type == wire.PUSH
    for k, v in header.items():
        assert frame.header[k] == v
    assert frame.header["type"] == wire.PUSH
    assert frame.header["crc32"] == zlib.crc32(frame.payload)
    assert frame.wire_bytes == len(data)
    got = frame.tensors()
    assert set(got) == set(tensors)
    for k, v in tensors.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v)


def test_round_trip_empty_payload(pair) -> None:
    a, b = pair
    a.sendall(encode_frame(SECRET, wire.HEARTBEAT, {}))
    frame = read_frame(b, SECRET, _deadline())
    assert frame.type == wire.HEARTBEAT and frame.payload == b"" and frame.tensors() == {}


def test_several_frames_back_to_back(pair) -> None:
    a, b = pair
    a.sendall(b"".join(encode_frame(SECRET, wire.ACK, {"seq": i}) for i in range(5)))
    assert [read_frame(b, SECRET, _deadline()).header["seq"] for _ in range(5)] == list(range(5))


def test_large_frame_round_trip(pair) -> None:
    a, b = pair
    big = {"w": torch.randn(512, 1024)}  # 2 MiB, larger than the socket buffer
    t = _send_in_thread(a, encode_frame(SECRET, wire.PUSH, {}, big))
    frame = read_frame(b, SECRET, _deadline(20))
    t.join(timeout=10)
    assert torch.equal(frame.tensors()["w"], big["w"])


def test_encode_frame_refuses_oversized_header() -> None:
    with pytest.raises(ValueError, match="header"):
        wire.message(wire.HELLO, {"pad": "x" * (MAX_HEADER_BYTES + 1)})


def test_header_type_and_crc_are_set_by_encoder(pair) -> None:
    a, b = pair
    a.sendall(encode_frame(SECRET, wire.ACK, {"type": "FORGED", "crc32": 1}, payload=b"abc"))
    frame = read_frame(b, SECRET, _deadline())
    assert frame.type == wire.ACK and frame.header["crc32"] == zlib.crc32(b"abc")


# ----------------------------------------------------------------------------- refusals

def test_wrong_secret_is_bad_mac(pair) -> None:
    a, b = pair
    a.sendall(encode_frame(OTHER, wire.HELLO, {"learner": 1}))
    with pytest.raises(FrameError) as ei:
        read_frame(b, SECRET, _deadline())
    assert _reason(ei) == "bad_mac"


@pytest.mark.parametrize("where", ["payload", "header", "mac"])
def test_flipped_byte_is_bad_mac(pair, where: str) -> None:
    a, b = pair
    data = bytearray(encode_frame(SECRET, wire.PUSH, {"seq": 1}, {"w": torch.randn(16)}))
    head_len = struct.unpack("!I", data[8:12])[0]
    index = {"payload": PREFIX.size + head_len + 40, "header": PREFIX.size + 3, "mac": len(data) - 1}[where]
    data[index] ^= 0x01
    a.sendall(bytes(data))
    with pytest.raises(FrameError) as ei:
        read_frame(b, SECRET, _deadline())
    assert _reason(ei) == "bad_mac"


def test_bad_magic(pair) -> None:
    a, b = pair
    a.sendall(_raw_frame(SECRET, b'{"type":"HELLO","crc32":0}', magic=b"HTTP"))
    with pytest.raises(FrameError) as ei:
        read_frame(b, SECRET, _deadline())
    assert _reason(ei) == "bad_magic"


def test_wrong_version(pair) -> None:
    a, b = pair
    a.sendall(_raw_frame(SECRET, b'{"type":"HELLO","crc32":0}', version=VERSION + 1))
    with pytest.raises(FrameError) as ei:
        read_frame(b, SECRET, _deadline())
    assert _reason(ei) == "bad_version"


def test_oversized_header_detected_from_prefix_alone(pair) -> None:
    a, b = pair
    # Only the 20-byte prefix is sent; the body never comes. If read_frame tried to read
    # it, it would block until the deadline and raise DeadlineExceeded instead.
    a.sendall(struct.pack("!4sB3xIQ", MAGIC, VERSION, MAX_HEADER_BYTES + 1, 0))
    started = time.monotonic()
    with pytest.raises(FrameError) as ei:
        read_frame(b, SECRET, _deadline(3.0))
    assert _reason(ei) == "oversized"
    assert time.monotonic() - started < 2.0, "the cap should be enforced without waiting for the body"


def test_oversized_payload_detected_from_prefix_alone(pair) -> None:
    a, b = pair
    a.sendall(struct.pack("!4sB3xIQ", MAGIC, VERSION, 10, 1 << 40))  # claims a terabyte
    started = time.monotonic()
    with pytest.raises(FrameError) as ei:
        read_frame(b, SECRET, _deadline(3.0), max_payload=4096)
    assert _reason(ei) == "oversized"
    assert "payload" in str(ei.value)
    assert time.monotonic() - started < 2.0


def test_payload_over_max_payload_refused(pair) -> None:
    a, b = pair
    a.sendall(encode_frame(SECRET, wire.PUSH, {}, payload=b"x" * 2000))
    with pytest.raises(FrameError) as ei:
        read_frame(b, SECRET, _deadline(), max_payload=1999)
    assert _reason(ei) == "oversized"


def test_payload_at_max_payload_accepted(pair) -> None:
    a, b = pair
    a.sendall(encode_frame(SECRET, wire.PUSH, {}, payload=b"x" * 2000))
    assert read_frame(b, SECRET, _deadline(), max_payload=2000).payload == b"x" * 2000


def test_crc_mismatch_with_valid_mac(pair) -> None:
    a, b = pair
    payload = b"some payload bytes"
    header = json.dumps({"type": "PUSH", "crc32": (zlib.crc32(payload) + 1) & 0xFFFFFFFF}).encode()
    a.sendall(_raw_frame(SECRET, header, payload))
    with pytest.raises(FrameError) as ei:
        read_frame(b, SECRET, _deadline())
    assert _reason(ei) == "bad_crc"


def test_missing_crc_is_refused(pair) -> None:
    a, b = pair
    a.sendall(_raw_frame(SECRET, b'{"type":"PUSH"}', b"abc"))
    with pytest.raises(FrameError) as ei:
        read_frame(b, SECRET, _deadline())
    assert _reason(ei) == "bad_crc"


def test_hand_built_frame_matching_layout_is_accepted(pair) -> None:
    # Guards the helpers above: the same construction with a right crc is a valid frame.
    a, b = pair
    payload = b"p" * 7
    a.sendall(_raw_frame(SECRET, json.dumps({"type": "ACK", "crc32": zlib.crc32(payload)}).encode(), payload))
    assert read_frame(b, SECRET, _deadline()).payload == payload


@pytest.mark.parametrize("header", [b"not json at all", b"\xff\xfe\x00", b""])
def test_non_json_header(pair, header: bytes) -> None:
    a, b = pair
    a.sendall(_raw_frame(SECRET, header))
    with pytest.raises(FrameError) as ei:
        read_frame(b, SECRET, _deadline())
    assert _reason(ei) == "bad_header"


@pytest.mark.parametrize("header", [b'{"crc32":0}', b'{"type":7,"crc32":0}', b'[1,2]', b'"HELLO"'])
def test_header_without_string_type(pair, header: bytes) -> None:
    a, b = pair
    a.sendall(_raw_frame(SECRET, header))
    with pytest.raises(FrameError) as ei:
        read_frame(b, SECRET, _deadline())
    assert _reason(ei) == "bad_header"


@pytest.mark.parametrize("cut", [5, PREFIX.size, PREFIX.size + 4, -1])
def test_peer_closes_mid_frame_is_truncated(pair, cut: int) -> None:
    a, b = pair
    data = encode_frame(SECRET, wire.PUSH, {"seq": 1}, {"w": torch.randn(8)})
    a.sendall(data[:cut])
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(FrameError) as ei:
        read_frame(b, SECRET, _deadline())
    assert _reason(ei) == "truncated"


def test_clean_close_at_boundary_is_peer_closed(pair) -> None:
    a, b = pair
    a.sendall(encode_frame(SECRET, wire.ACK, {"seq": 1}))
    a.shutdown(socket.SHUT_WR)
    assert read_frame(b, SECRET, _deadline()).header["seq"] == 1
    with pytest.raises(PeerClosed):
        read_frame(b, SECRET, _deadline())


def test_deadline_exceeded_when_nothing_arrives(pair) -> None:
    _, b = pair
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        read_frame(b, SECRET, time.monotonic() + 0.2)
    assert time.monotonic() - started < 3.0


def test_deadline_exceeded_mid_frame(pair) -> None:
    a, b = pair
    a.sendall(encode_frame(SECRET, wire.ACK, {"seq": 1})[:PREFIX.size + 2])
    with pytest.raises(DeadlineExceeded):
        read_frame(b, SECRET, time.monotonic() + 0.2)


def test_deadline_in_the_past(pair) -> None:
    a, b = pair
    a.sendall(encode_frame(SECRET, wire.ACK, {}))
    with pytest.raises(DeadlineExceeded):
        read_frame(b, SECRET, time.monotonic() - 1.0)


def test_send_all_deadline(pair) -> None:
    a, _ = pair
    # Nobody reads b: the socket buffers fill and sending 64 MiB cannot finish.
    with pytest.raises(DeadlineExceeded):
        wire.send_all(a, b"\0" * (64 << 20), time.monotonic() + 0.3)


def test_invalid_safetensors_payload_is_bad_payload(pair) -> None:
    a, b = pair
    a.sendall(encode_frame(SECRET, wire.PUSH, {}, payload=b"\x10\x00\x00\x00\x00\x00\x00\x00garbage!"))
    frame = read_frame(b, SECRET, _deadline())  # authenticated fine ...
    with pytest.raises(FrameError) as ei:
        frame.tensors()  # ... but refused when decoded
    assert _reason(ei) == "bad_payload"


def test_frame_tensors_bad_payload_direct() -> None:
    with pytest.raises(FrameError) as ei:
        Frame("PUSH", {}, b"definitely not safetensors").tensors()
    assert _reason(ei) == "bad_payload"


def test_header_helpers_name_the_field() -> None:
    assert wire.header_int({"seq": 3}, "seq", 1) == 3
    for bad in ({"seq": 0}, {"seq": "3"}, {"seq": True}, {}, {"seq": 1.5}):
        with pytest.raises(FrameError, match="'seq'") as ei:
            wire.header_int(bad, "seq", 1)
        assert ei.value.reason == "bad_header"
    assert wire.header_str({"mode": "sync"}, "mode", ("sync", "decoupled")) == "sync"
    with pytest.raises(FrameError, match="'mode'"):
        wire.header_str({"mode": "other"}, "mode", ("sync", "decoupled"))
    with pytest.raises(FrameError, match="'mode'"):
        wire.header_str({"mode": 3}, "mode")


# ----------------------------------------------------------------------------- secrets

@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv(wire.SECRET_ENV, raising=False)
    monkeypatch.delenv(wire.SECRET_FILE_ENV, raising=False)
    return monkeypatch


def test_secret_from_env(clean_env) -> None:
    clean_env.setenv(wire.SECRET_ENV, "x" * 16)
    assert load_secret() == b"x" * 16


def test_secret_from_file_argument(clean_env, tmp_path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"file-secret-0123456789\n")
    clean_env.setenv(wire.SECRET_ENV, "env-secret-should-lose")
    assert load_secret(str(path)) == b"file-secret-0123456789"


def test_secret_from_file_env(clean_env, tmp_path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"  env-file-secret-0123456789  ")
    clean_env.setenv(wire.SECRET_FILE_ENV, str(path))
    assert load_secret() == b"env-file-secret-0123456789"


def test_secret_too_short_from_env(clean_env) -> None:
    clean_env.setenv(wire.SECRET_ENV, "short")
    with pytest.raises(ValueError, match=r"\$ISLANDS_SECRET.*at least 16 bytes"):
        load_secret()


def test_secret_too_short_from_file(clean_env, tmp_path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"tiny\n")
    with pytest.raises(ValueError, match="secret file .*at least 16"):
        load_secret(str(path))


def test_secret_missing(clean_env) -> None:
    with pytest.raises(ValueError, match=r"ISLANDS_SECRET.*ISLANDS_SECRET_FILE.*--secret-file"):
        load_secret()


def test_secret_file_unreadable(clean_env, tmp_path) -> None:
    with pytest.raises(ValueError, match="--secret-file: cannot read"):
        load_secret(str(tmp_path / "does-not-exist"))


# ----------------------------------------------------------------------------- sessions (issue 15)

def _handshake(pair, secret_client: bytes = SECRET, secret_server: bytes = SECRET, identity: int = 1,
               key: bytes | None = None) -> tuple[wire.Session, wire.Session]:
    """A connection opened as learner `identity`, with key_identity of `secret_client` (or `key`)."""
    a, b = pair
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("server", wire.server_handshake(b, secret_server, _deadline())))
    t.start()
    client = wire.client_handshake(a, key if key is not None else learner_key(secret_client, identity), _deadline(),
                                   identity)
    t.join(timeout=10)
    return client, out["server"]


def test_handshake_gives_both_sides_one_key(pair) -> None:
    client, server = _handshake(pair)
    a, b = pair
    a.sendall(client.seal(wire.message(wire.HELLO, {"learner": 1})))
    assert wire.read_frame(b, server, _deadline()).header["learner"] == 1
    b.sendall(server.seal(wire.message(wire.WELCOME, {"incarnation": 1})))
    assert wire.read_frame(a, client, _deadline()).header["incarnation"] == 1


def test_a_frame_is_valid_once_in_one_place(pair) -> None:
    """Replayed on its own connection, reflected back to its sender, or sent on another
    connection: each is bad_mac."""
    client, server = _handshake(pair)
    a, b = pair
    frame = client.seal(wire.message(wire.PUSH, {"seq": 1}))
    a.sendall(frame + frame)
    assert wire.read_frame(b, server, _deadline()).header["seq"] == 1
    with pytest.raises(FrameError) as replayed:
        wire.read_frame(b, server, _deadline())
    assert _reason(replayed) == "bad_mac"
    b.sendall(frame)  # reflected: a client frame read by the client
    with pytest.raises(FrameError) as reflected:
        wire.read_frame(a, client, _deadline())
    assert _reason(reflected) == "bad_mac"
    c, d = socket.socketpair()
    try:
        _, other_server = _handshake((c, d))
        c.sendall(frame)
        with pytest.raises(FrameError) as elsewhere:
            wire.read_frame(d, other_server, _deadline())
        assert _reason(elsewhere) == "bad_mac"
    finally:
        c.close()
        d.close()


def test_a_wrong_secret_makes_another_key(pair) -> None:
    client, server = _handshake(pair, secret_client=OTHER)
    a, b = pair
    a.sendall(client.seal(wire.message(wire.HELLO, {})))
    with pytest.raises(FrameError) as ei:
        wire.read_frame(b, server, _deadline())
    assert _reason(ei) == "bad_mac"


def test_the_opening_names_the_learner_and_keys_the_session_with_its_own_key(pair) -> None:
    """Issue 27: the server keys the session with key_N of the id the opening names."""
    client, server = _handshake(pair, identity=7)
    assert server.identity == client.identity == 7
    a, b = pair
    a.sendall(client.seal(wire.message(wire.HELLO, {"learner": 7})))
    assert wire.read_frame(b, server, _deadline()).header["learner"] == 7


def test_another_learners_key_cannot_open_as_this_learner(pair) -> None:
    """Issue 27: holding learner 2's key, a connection opened as learner 1 verifies nothing."""
    client, server = _handshake(pair, identity=1, key=learner_key(SECRET, 2))
    assert server.identity == 1
    a, b = pair
    a.sendall(client.seal(wire.message(wire.HELLO, {"learner": 1})))
    with pytest.raises(FrameError) as ei:
        wire.read_frame(b, server, _deadline())
    assert _reason(ei) == "bad_mac"


def test_a_foreign_opening_is_refused_from_its_first_bytes(pair) -> None:
    a, b = pair
    a.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\0" * 20)
    with pytest.raises(FrameError) as ei:
        wire.server_handshake(b, SECRET, _deadline())
    assert _reason(ei) == "bad_magic"


def test_memory_follows_the_bytes_sent_not_the_length_claimed(pair) -> None:
    """A prefix claiming 64 MiB, then 1 KiB and silence: read_frame waits with ~1 KiB held
    (it used to allocate and zero the whole claimed buffer first)."""
    import tracemalloc

    a, b = pair
    a.sendall(struct.pack("!4sB3xIQ", MAGIC, VERSION, 2, 64 << 20) + b"{}" + b"x" * 1024)
    tracemalloc.start()
    try:
        with pytest.raises(DeadlineExceeded):
            read_frame(b, SECRET, time.monotonic() + 0.3)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"peak {peak >> 20} MiB while a 64 MiB payload was only claimed"


@pytest.mark.parametrize("header", [b'{"type":"ACK","crc32":0,"x":' + b"[" * 9 + b"]" * 9 + b"}",
                                    b'{"type":"ACK","crc32":0,"x":' + b"9" * 33 + b"}",
                                    b'{"type":"ACK","crc32":0,"x":NaN}',
                                    b'{"type":"NOT_A_TYPE","crc32":0}'],
                         ids=["too-deep", "long-number", "nan", "unknown-type"])
def test_headers_are_parsed_within_bounds(pair, header: bytes) -> None:
    a, b = pair
    a.sendall(_raw_frame(SECRET, header))
    with pytest.raises(FrameError) as ei:
        read_frame(b, SECRET, _deadline())
    assert _reason(ei) == "bad_header"


def test_strings_do_not_count_as_nesting() -> None:
    header = wire.parse_header(b'{"type":"ACK","s":"[[[[[[[[[[[[[[[[[[[[\\"{{{{{{{{{{{"}')
    assert header["s"].startswith("[[[")
