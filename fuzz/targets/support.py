"""What the targets share: a socket made of bytes, and a fixed session."""
from __future__ import annotations

from trainer import wire

SECRET = b"fuzz-secret-0123456789abcdef"
CLIENT_RANDOM, SERVER_RANDOM = b"c" * wire.RANDOM_BYTES, b"s" * wire.RANDOM_BYTES
KEY = wire.derive_key(SECRET, CLIENT_RANDOM, SERVER_RANDOM)
FAR = 1e18  # a deadline that never passes: a BytesSocket never blocks


class BytesSocket:
    """The part of a socket wire.py uses, reading from `data` and recording what is sent;
    at the end of the data, recv returns b"" as a closed peer does."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.sent = bytearray()

    def settimeout(self, timeout: float | None) -> None:
        pass

    def recv(self, n: int) -> bytes:
        chunk = self.data[self.pos:self.pos + n]
        self.pos += len(chunk)
        return chunk

    def send(self, data) -> int:
        self.sent += bytes(data)
        return len(data)


def sealed(head: bytes, payload: bytes, counter: int = 0, key: bytes = KEY) -> bytes:
    """A client frame around any header bytes and payload, with a correct MAC: so the
    fuzzer reaches the parser behind the MAC, which it could never forge."""
    prefix = wire.PREFIX.pack(wire.MAGIC, wire.VERSION, len(head), len(payload))
    mac = wire.Session(key, client=True)._mac(b"C", counter)
    for part in (prefix, head, payload):
        mac.update(part)
    return prefix + head + payload + mac.digest()
