"""Length-prefixed frames over one TCP connection, authenticated per connection.

Handshake (TLS-PSK style: the learner names its PSK identity, both sides contribute a
random, the key binds all three):

    learner → syncer   magic "ISLD" | version u8 | learner id u24 | client random (32 B)   (40 bytes)
    syncer → learner   magic "ISLD" | version u8 | 3 pad | server random (32 B)            (40 bytes)
    key_N = HKDF-SHA256(run secret, "islands/3 learner N")        (keys.py; learner N holds only this)
    session key K = HMAC-SHA256(key_N, "islands/3 session" | N u24 | client random | server random)

Every frame after it (network byte order):

    magic "ISLD" | version u8 | 3 pad | header_len u32 | payload_len u64   (20 bytes)
    header: UTF-8 JSON object (type, learner, incarnation, seq, ..., crc32)
    payload: safetensors bytes (or empty)
    mac: HMAC-SHA256(K, direction | counter u64 | prefix + header + payload)  (32 bytes)

Why this shape. Lengths come first, so caps are enforced before anything is read; the
first frame of a connection (HELLO) may carry no payload and at most HELLO_MAX_HEADER
bytes of header, so a peer that has not proven the secret gets a few KiB of memory at
most; later frames are read as they arrive, so memory follows the bytes sent, not the
length claimed. The MAC key is fresh per connection and each direction counts its frames
(as TLS records and SSH packets do), so a captured frame is worthless anywhere else: a
replayed HELLO on a new connection, or a PUSH replayed on its own connection, fails the
MAC. We chose the TLS shape over SSH's (key exchange + signatures) because both ends
already share a secret: a PSK handshake needs no public-key machinery, one round trip,
and no state beyond the two randoms. Tensors travel as safetensors, which cannot execute
code (no pickle, ever); the crc32 in the header catches corruption independently of the
MAC and names it precisely.

Identity. Learner N holds key_N, never the run secret; the syncer derives key_N from the
id in the opening. So every frame of a connection, HELLO included, verifies only under the
key of the learner the connection was opened as, and the syncer refuses a HELLO whose
`learner` is not that id (bad_identity): holding learner 2's key, a process can speak only
as learner 2. Headers are parsed with bounded depth, length and numbers.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import socket
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load as st_load

from . import tensor_bytes
from .compact_json import compact_strict
from .keys import is_key_file_text, learner_key
from .protocol import REPLY_TYPES, REQUEST_TYPES, FrameFault, FrameType, Reason

MAGIC = b"ISLD"
VERSION = 3
PREFIX = struct.Struct("!4sB3xIQ")
HANDSHAKE = struct.Struct("!4sB3x32s")          # the syncer's answer
OPENING = struct.Struct("!4sB3s32s")            # the learner's: its id in the 3 bytes
MAX_IDENTITY = (1 << 24) - 1
RANDOM_BYTES = 32
MAC_LEN = 32
COUNTER = struct.Struct("!Q")
MAX_HEADER_BYTES = 64 * 1024
HELLO_MAX_HEADER = 4 * 1024      # the first frame, read before the peer is authenticated
MAX_HEADER_DEPTH = 8             # nesting of JSON arrays/objects in a header
MAX_NUMBER_CHARS = 32            # a JSON number literal (ints in headers are < 2^53)
MAX_SAFE_INT = 2 ** 53 - 1       # what every count in a header must stay under (JSON-safe)
RECV_CHUNK = 1 << 20
DEFAULT_MAX_PAYLOAD = 64 * 1024 * 1024
SECRET_ENV = "ISLANDS_SECRET"
SECRET_FILE_ENV = "ISLANDS_SECRET_FILE"
MIN_SECRET_BYTES = 16
_KEY_LABEL = b"islands/3 session"

# Frame types, under their old names (the enum is the one list).
HELLO, WELCOME = FrameType.HELLO, FrameType.WELCOME
PUSH, ACK = FrameType.PUSH, FrameType.ACK
HEARTBEAT, BEAT = FrameType.HEARTBEAT, FrameType.BEAT
PULL, FRAGMENT = FrameType.PULL, FrameType.FRAGMENT
GRAD, MEAN = FrameType.GRAD, FrameType.MEAN
BYE = FrameType.BYE
ERROR = FrameType.ERROR
FrameError = FrameFault  # the name wire errors had before protocol.py


class PeerClosed(ConnectionError):
    """The other side closed the connection cleanly between frames."""


class DeadlineExceeded(TimeoutError):
    pass


@dataclass
class Frame:
    type: FrameType
    header: dict
    payload: bytes = b""
    wire_bytes: int = 0
    _tensors: dict[str, torch.Tensor] | None = field(default=None, repr=False)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Decode the safetensors payload; refuses anything malformed."""
        if self._tensors is None:
            if not self.payload:
                self._tensors = {}
            else:
                try:
                    self._tensors = st_load(self.payload)
                except Exception as exc:  # safetensors raises its own error types
                    raise FrameFault(Reason.BAD_PAYLOAD, f"payload is not valid safetensors: {exc}") from exc
        return self._tensors


@dataclass(frozen=True)
class Message:
    """A frame's content, serialised once and sealed per connection: a retried push is the
    same header and payload (the syncer's ledger knows it by id), signed for the
    connection it goes out on."""

    type: FrameType
    head: bytes
    payload: bytes

    @property
    def wire_size(self) -> int:
        return PREFIX.size + len(self.head) + len(self.payload) + MAC_LEN


def load_secret(secret_file: str | None = None) -> bytes:
    """The shared HMAC secret: --secret-file, else $ISLANDS_SECRET_FILE, else $ISLANDS_SECRET."""
    path = secret_file or os.environ.get(SECRET_FILE_ENV)
    if path:
        origin = "--secret-file" if secret_file else f"${SECRET_FILE_ENV}"
        try:
            secret = Path(path).read_bytes().strip()
        except OSError as exc:
            raise ValueError(f"{origin}: cannot read {path}: {exc.strerror}") from exc
        source = f"secret file {path}"
        if is_key_file_text(secret):
            raise ValueError(f"{origin}: {path} is a learner's key file, not the run secret "
                             "(a learner takes its key with --key-file)")
    else:
        secret = os.environ.get(SECRET_ENV, "").encode()
        source = f"${SECRET_ENV}"
        if not secret:
            raise ValueError(f"no shared secret: set ${SECRET_ENV} or ${SECRET_FILE_ENV}, or pass --secret-file")
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"{source}: the shared secret must be at least {MIN_SECRET_BYTES} bytes")
    return secret


def pack_tensors(tensors: dict[str, torch.Tensor]) -> bytes:
    return tensor_bytes.dumps(tensors) if tensors else b""


def message(ftype: FrameType | str, header: dict | None = None, tensors: dict[str, torch.Tensor] | None = None,
            payload: bytes | None = None) -> Message:
    """Serialise a frame's header and payload (not yet signed: see Session.seal)."""
    if payload is None:
        payload = pack_tensors(tensors or {})
    head = dict(header or {})
    head["type"] = str(ftype)
    head["crc32"] = zlib.crc32(payload)
    head_bytes = compact_strict(head).encode()
    if len(head_bytes) > MAX_HEADER_BYTES:
        raise ValueError(f"frame header is {len(head_bytes)} bytes, over the {MAX_HEADER_BYTES} cap")
    return Message(FrameType(ftype), head_bytes, payload)


# ----------------------------------------------------------------------------- sessions

def derive_key(key: bytes, client_random: bytes, server_random: bytes, identity: int = 0) -> bytes:
    """The session key of one connection opened as learner `identity` with its key."""
    return hmac.new(key, _KEY_LABEL + identity.to_bytes(3, "big") + client_random + server_random,
                    hashlib.sha256).digest()


class Session:
    """One connection's key and frame counters, for one side of it.

    Each direction numbers its frames from 0; a frame's MAC covers its direction and
    number, so frames cannot be replayed, reordered or reflected back to their sender."""

    def __init__(self, key: bytes, client: bool, identity: int = 0) -> None:
        self._key = key
        self.identity = identity  # the learner this connection was opened as (its key's owner)
        self._out, self._in = (b"C", b"S") if client else (b"S", b"C")
        self.sent = 0
        self.received = 0

    def _mac(self, direction: bytes, counter: int) -> "hmac.HMAC":
        return hmac.new(self._key, direction + COUNTER.pack(counter), hashlib.sha256)

    def seal(self, msg: Message) -> bytes:
        prefix = PREFIX.pack(MAGIC, VERSION, len(msg.head), len(msg.payload))
        mac = self._mac(self._out, self.sent)
        for part in (prefix, msg.head, msg.payload):
            mac.update(part)
        self.sent += 1
        return b"".join((prefix, msg.head, msg.payload, mac.digest()))

    def inbound_mac(self) -> "hmac.HMAC":
        return self._mac(self._in, self.received)


def _check_lead(data: bytes, what: str) -> None:
    """The 8 bytes every opening and frame starts with: magic, version, 3 reserved zeros."""
    if data[:4] != MAGIC:
        raise FrameFault(Reason.BAD_MAGIC, f"{what} starts with {data[:4]!r}, expected {MAGIC!r}")
    if data[5:8] != b"\0\0\0":
        raise FrameFault(Reason.BAD_MAGIC, f"{what}'s reserved bytes are {data[5:8]!r}, must be zero")
    if data[4] != VERSION:
        raise FrameFault(Reason.BAD_VERSION, f"{what} speaks wire version {data[4]}, expected {VERSION}")


def client_handshake(sock: socket.socket, key: bytes, deadline: float, identity: int) -> Session:
    """Name ourselves (learner `identity`, holding `key` = key_N), send our random, read
    the server's: the session for this connection."""
    if not 0 <= identity <= MAX_IDENTITY:
        raise ValueError(f"learner id {identity} does not fit the opening (0..{MAX_IDENTITY})")
    client_random = os.urandom(RANDOM_BYTES)
    send_all(sock, OPENING.pack(MAGIC, VERSION, identity.to_bytes(3, "big"), client_random), deadline)
    reply = _recv_exact(sock, HANDSHAKE.size, deadline, at_boundary=True)
    _check_lead(reply, "the server's handshake")
    server_random = HANDSHAKE.unpack(reply)[2]
    return Session(derive_key(key, client_random, server_random, identity), client=True, identity=identity)


def server_handshake(sock: socket.socket, secret: bytes, deadline: float) -> Session:
    """Read the client's opening (40 fixed bytes: all an unauthenticated peer can make us
    read before its HELLO), answer with ours. The session is keyed with key_N of the id
    the opening names, so nothing on it verifies unless the peer holds that key."""
    opening = _recv_exact(sock, HANDSHAKE.size, deadline, at_boundary=True)
    if opening[:4] != MAGIC:
        raise FrameFault(Reason.BAD_MAGIC, f"the client's handshake starts with {opening[:4]!r}, expected {MAGIC!r}")
    if opening[4] != VERSION:
        raise FrameFault(Reason.BAD_VERSION, f"the client's handshake speaks wire version {opening[4]}, "
                                             f"expected {VERSION}")
    _, _, ident, client_random = OPENING.unpack(opening)
    identity = int.from_bytes(ident, "big")
    server_random = os.urandom(RANDOM_BYTES)
    send_all(sock, HANDSHAKE.pack(MAGIC, VERSION, server_random), deadline)
    key = _learner_key_cached(secret, identity)
    return Session(derive_key(key, client_random, server_random, identity), client=False, identity=identity)


_KEY_CACHE: dict[tuple[bytes, int], bytes] = {}


def _learner_key_cached(secret: bytes, identity: int) -> bytes:
    """key_N, derived once per (secret, id) seen: two HMACs per connection saved, and the
    cache stays small (ids are u24, but only real ones recur; it is cleared past 4096)."""
    got = _KEY_CACHE.get((secret, identity))
    if got is None:
        if len(_KEY_CACHE) > 4096:
            _KEY_CACHE.clear()
        got = _KEY_CACHE[(secret, identity)] = learner_key(secret, identity)
    return got


# ----------------------------------------------------------------------------- reading

def _recv_exact(sock: socket.socket, n: int, deadline: float, at_boundary: bool = False,
                mac: "hmac.HMAC | None" = None) -> bytes:
    """n bytes, read as they arrive (at most RECV_CHUNK at a time, so memory follows what
    was sent, not what a prefix claimed), fed to `mac` on the way."""
    chunks: list[bytes] = []
    got = 0
    while got < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded(f"timed out reading a frame ({got}/{n} bytes)")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(min(n - got, RECV_CHUNK))
        except socket.timeout as exc:
            raise DeadlineExceeded(f"timed out reading a frame ({got}/{n} bytes)") from exc
        if not chunk:
            if got == 0 and at_boundary:
                raise PeerClosed("connection closed by peer")
            raise FrameFault(Reason.TRUNCATED, f"connection closed after {got} of {n} bytes")
        if mac is not None:
            mac.update(chunk)
        chunks.append(chunk)
        got += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def read_frame(sock: socket.socket, session: Session, deadline: float, max_payload: int = DEFAULT_MAX_PAYLOAD,
               max_header: int = MAX_HEADER_BYTES) -> Frame:
    """Read and verify one frame. Raises ProtocolError (refuse), PeerClosed or DeadlineExceeded."""
    prefix = _recv_exact(sock, PREFIX.size, deadline, at_boundary=True)
    _check_lead(prefix, "the frame")
    _, _, head_len, payload_len = PREFIX.unpack(prefix)
    if head_len > max_header:
        raise FrameFault(Reason.OVERSIZED, f"header of {head_len} bytes exceeds the {max_header} cap")
    if payload_len > max_payload:
        raise FrameFault(Reason.OVERSIZED, f"payload of {payload_len} bytes exceeds the {max_payload} cap")
    mac = session.inbound_mac()
    mac.update(prefix)
    head_bytes = _recv_exact(sock, head_len, deadline, mac=mac) if head_len else b""
    payload = _recv_exact(sock, payload_len, deadline, mac=mac) if payload_len else b""
    got_mac = _recv_exact(sock, MAC_LEN, deadline)
    if not hmac.compare_digest(got_mac, mac.digest()):
        raise FrameFault(Reason.BAD_MAC, "HMAC does not match: wrong secret, tampered, or replayed frame")
    session.received += 1
    header = parse_header(head_bytes)
    try:
        ftype = FrameType(header.get("type"))
    except ValueError:
        raise FrameFault(Reason.BAD_HEADER, f"unknown frame type {header.get('type')!r}") from None
    if header.get("crc32") != zlib.crc32(payload):
        raise FrameFault(Reason.BAD_CRC,
                            f"payload crc32 {zlib.crc32(payload)} != header crc32 {header.get('crc32')}")
    return Frame(ftype, header, payload, PREFIX.size + head_len + payload_len + MAC_LEN)


_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(rb"[\[\]{}]")


def _nesting(raw: bytes) -> int:
    depth = deepest = 0
    for b in _BRACKETS.findall(_STRINGS.sub(b'""', raw)):
        depth += 1 if b in (b"[", b"{") else -1
        deepest = max(deepest, depth)
    return deepest


def _bounded_number(text: str, kind: type) -> object:
    if len(text) > MAX_NUMBER_CHARS:
        raise FrameFault(Reason.BAD_HEADER, f"a number of {len(text)} characters (at most {MAX_NUMBER_CHARS})")
    return kind(text)


def _no_constant(name: str) -> object:
    raise FrameFault(Reason.BAD_HEADER, f"{name} is not a number")


def parse_header(raw: bytes) -> dict:
    """A JSON object of bounded depth and number size; anything else is BAD_HEADER (never
    a RecursionError or the 4,300-digit ValueError escaping to the connection thread)."""
    if _nesting(raw) > MAX_HEADER_DEPTH:
        raise FrameFault(Reason.BAD_HEADER, f"header nests deeper than {MAX_HEADER_DEPTH} levels")
    try:
        header = json.loads(raw, parse_int=lambda s: _bounded_number(s, int),
                            parse_float=lambda s: _bounded_number(s, float), parse_constant=_no_constant)
    except FrameFault:
        raise
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise FrameFault(Reason.BAD_HEADER, f"header is not JSON: {exc}") from exc
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise FrameFault(Reason.BAD_HEADER, "header must be a JSON object with a string 'type'")
    return header


# ----------------------------------------------------------------------------- writing

def send_all(sock: socket.socket, data: bytes, deadline: float) -> None:
    view = memoryview(data)
    sent = 0
    while sent < len(data):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded(f"timed out sending a frame ({sent}/{len(data)} bytes)")
        sock.settimeout(remaining)
        try:
            sent += sock.send(view[sent:])
        except socket.timeout as exc:
            raise DeadlineExceeded(f"timed out sending a frame ({sent}/{len(data)} bytes)") from exc


class Channel:
    """A connected socket and its session: what both ends send and read frames through."""

    def __init__(self, sock: socket.socket, session: Session) -> None:
        self.sock = sock
        self.session = session

    @classmethod
    def connect(cls, sock: socket.socket, key: bytes, deadline: float, identity: int) -> "Channel":
        """A learner's connection: `key` is key_N of learner `identity` (keys.learner_key)."""
        return cls(sock, client_handshake(sock, key, deadline, identity))

    def send(self, msg: Message, deadline: float) -> int:
        data = self.session.seal(msg)
        send_all(self.sock, data, deadline)
        return len(data)

    def recv(self, deadline: float, max_payload: int = DEFAULT_MAX_PAYLOAD,
             max_header: int = MAX_HEADER_BYTES) -> Frame:
        return read_frame(self.sock, self.session, deadline, max_payload, max_header)

    def request(self, msg: Message, deadline: float, max_payload: int = DEFAULT_MAX_PAYLOAD) -> Frame:
        self.send(msg, deadline)
        return self.recv(deadline, max_payload)

    def close(self) -> None:
        self.sock.close()


# ----------------------------------------------------------------------------- header fields

def header_int(header: dict, key: str, minimum: int = 0, maximum: int = MAX_SAFE_INT) -> int:
    """A required integer header field in [minimum, maximum], or BAD_HEADER naming it."""
    value = header.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
        raise FrameFault(Reason.BAD_HEADER,
                            f"header field {key!r} must be an integer in [{minimum}, {maximum}], got {value!r}")
    return value


def header_str(header: dict, key: str, choices: tuple[str, ...] | None = None, max_len: int = 256) -> str:
    value = header.get(key)
    if not isinstance(value, str) or len(value) > max_len or (choices is not None and value not in choices):
        allowed = f" (one of {', '.join(choices)})" if choices else f" of at most {max_len} characters"
        raise FrameFault(Reason.BAD_HEADER, f"header field {key!r} must be a string{allowed}, got {value!r:.80}")
    return value


__all__ = ["ACK", "BEAT", "BYE", "ERROR", "FRAGMENT", "GRAD", "HELLO", "HEARTBEAT", "MEAN", "PULL", "PUSH",
           "REPLY_TYPES", "REQUEST_TYPES", "WELCOME", "Channel", "DeadlineExceeded", "Frame", "FrameError",
           "Message", "OPENING", "PeerClosed", "Session", "client_handshake", "header_int", "header_str", "load_secret",
           "message", "parse_header", "read_frame", "send_all", "server_handshake"]
