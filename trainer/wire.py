"""Length-prefixed, authenticated frames over one persistent TCP connection.

Layout of one frame (network byte order):

    magic "ISLD" | version u8 | 3 pad | header_len u32 | payload_len u64   (20 bytes)
    header: UTF-8 JSON object (type, learner, incarnation, seq, ..., crc32)
    payload: safetensors bytes (or empty)
    mac: HMAC-SHA256(secret, prefix + header + payload)                    (32 bytes)

Why this shape: lengths come first so caps are enforced before any allocation; the MAC
covers everything, so nothing unauthenticated is parsed beyond the fixed prefix; tensors
travel as safetensors, which cannot execute code (no pickle, ever); the crc32 in the
header catches corruption independently of the MAC and names it precisely.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

MAGIC = b"ISLD"
VERSION = 1
PREFIX = struct.Struct("!4sB3xIQ")
MAC_LEN = 32
MAX_HEADER_BYTES = 64 * 1024
DEFAULT_MAX_PAYLOAD = 64 * 1024 * 1024
SECRET_ENV = "ISLANDS_SECRET"
SECRET_FILE_ENV = "ISLANDS_SECRET_FILE"
MIN_SECRET_BYTES = 16

# Frame types. Requests go learner -> syncer; each gets exactly one reply.
HELLO, WELCOME = "HELLO", "WELCOME"
PUSH, ACK = "PUSH", "ACK"
HEARTBEAT, BEAT = "HEARTBEAT", "BEAT"
PULL, FRAGMENT = "PULL", "FRAGMENT"
GRAD, MEAN = "GRAD", "MEAN"
BYE = "BYE"
ERROR = "ERROR"
REQUEST_TYPES = {HELLO, PUSH, HEARTBEAT, PULL, GRAD, BYE}
REPLY_TYPES = {WELCOME, ACK, BEAT, FRAGMENT, MEAN, ERROR}


class FrameError(Exception):
    """A frame that must be refused. `reason` is a short stable code for counting."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class PeerClosed(ConnectionError):
    """The other side closed the connection cleanly between frames."""


class DeadlineExceeded(TimeoutError):
    pass


@dataclass
class Frame:
    type: str
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
                    raise FrameError("bad_payload", f"payload is not valid safetensors: {exc}") from exc
        return self._tensors


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
    else:
        secret = os.environ.get(SECRET_ENV, "").encode()
        source = f"${SECRET_ENV}"
        if not secret:
            raise ValueError(f"no shared secret: set ${SECRET_ENV} or ${SECRET_FILE_ENV}, or pass --secret-file")
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"{source}: the shared secret must be at least {MIN_SECRET_BYTES} bytes")
    return secret


def pack_tensors(tensors: dict[str, torch.Tensor]) -> bytes:
    return st_save({k: v.contiguous() for k, v in tensors.items()}) if tensors else b""


def encode_frame(secret: bytes, ftype: str, header: dict | None = None,
                 tensors: dict[str, torch.Tensor] | None = None, payload: bytes | None = None) -> bytes:
    if payload is None:
        payload = pack_tensors(tensors or {})
    head = dict(header or {})
    head["type"] = ftype
    head["crc32"] = zlib.crc32(payload)
    head_bytes = json.dumps(head, separators=(",", ":"), allow_nan=False).encode()
    if len(head_bytes) > MAX_HEADER_BYTES:
        raise ValueError(f"frame header is {len(head_bytes)} bytes, over the {MAX_HEADER_BYTES} cap")
    prefix = PREFIX.pack(MAGIC, VERSION, len(head_bytes), len(payload))
    mac = hmac.new(secret, prefix + head_bytes + payload, hashlib.sha256).digest()
    return b"".join((prefix, head_bytes, payload, mac))


def _recv_exact(sock: socket.socket, n: int, deadline: float, at_boundary: bool = False) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded(f"timed out reading a frame ({got}/{n} bytes)")
        sock.settimeout(remaining)
        try:
            k = sock.recv_into(view[got:], n - got)
        except socket.timeout as exc:
            raise DeadlineExceeded(f"timed out reading a frame ({got}/{n} bytes)") from exc
        if k == 0:
            if got == 0 and at_boundary:
                raise PeerClosed("connection closed by peer")
            raise FrameError("truncated", f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def read_frame(sock: socket.socket, secret: bytes, deadline: float,
               max_payload: int = DEFAULT_MAX_PAYLOAD) -> Frame:
    """Read and verify one frame. Raises FrameError (refuse), PeerClosed or DeadlineExceeded."""
    prefix = _recv_exact(sock, PREFIX.size, deadline, at_boundary=True)
    magic, version, head_len, payload_len = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise FrameError("bad_magic", f"frame starts with {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise FrameError("bad_version", f"frame version {version}, expected {VERSION}")
    if head_len > MAX_HEADER_BYTES:
        raise FrameError("oversized", f"header of {head_len} bytes exceeds the {MAX_HEADER_BYTES} cap")
    if payload_len > max_payload:
        raise FrameError("oversized", f"payload of {payload_len} bytes exceeds the {max_payload} cap")
    body = _recv_exact(sock, head_len + payload_len + MAC_LEN, deadline)
    head_bytes, payload, mac = body[:head_len], body[head_len:head_len + payload_len], body[-MAC_LEN:]
    expected = hmac.new(secret, prefix + head_bytes + payload, hashlib.sha256).digest()
    if not hmac.compare_digest(mac, expected):
        raise FrameError("bad_mac", "HMAC does not match: wrong secret or tampered frame")
    try:
        header = json.loads(head_bytes)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FrameError("bad_header", f"header is not JSON: {exc}") from exc
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise FrameError("bad_header", "header must be a JSON object with a string 'type'")
    if header.get("crc32") != zlib.crc32(payload):
        raise FrameError("bad_crc", f"payload crc32 {zlib.crc32(payload)} != header crc32 {header.get('crc32')}")
    wire = PREFIX.size + len(body)
    return Frame(header["type"], header, payload, wire)


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


def header_int(header: dict, key: str, minimum: int = 0) -> int:
    """A required integer header field, or FrameError naming it."""
    value = header.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise FrameError("bad_header", f"header field {key!r} must be an integer >= {minimum}, got {value!r}")
    return value


def header_str(header: dict, key: str, choices: tuple[str, ...] | None = None) -> str:
    value = header.get(key)
    if not isinstance(value, str) or (choices is not None and value not in choices):
        allowed = f" (one of {', '.join(choices)})" if choices else ""
        raise FrameError("bad_header", f"header field {key!r} must be a string{allowed}, got {value!r}")
    return value
