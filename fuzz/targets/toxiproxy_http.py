"""Fuzz target: one input is the raw bytes a client sends on one connection to our Toxiproxy API.

The bytes go through the real handler in-process (chaos.toxiproxy.api.Handler:
request line, headers, body framing, routing, endpoints) over a socket stand-in,
so no port is used and thousands of inputs run per second. Proxies are made by
a factory that checks the listen address as a bind would but binds nothing:
inputs choose addresses, and nothing may listen beyond 127.0.0.1 or pile up.

A crash is any exception, plus three oracles:
- a handler error the API turned into a 500 (logged as "handler failed");
- a response stream that is not well formed: a status line, only the headers we
  write, no control byte in any header value, every body framed;
- a collection that can no longer be listed (GET /proxies failing for good).
"""

from __future__ import annotations

import io
import logging
import re
import types

from chaos.toxiproxy import addr
from chaos.toxiproxy.api import Api, Handler
from chaos.toxiproxy.collection import ProxyCollection
from chaos.toxiproxy.proxy import Proxy

NAME = "toxiproxy_http"

_HEADERS = frozenset({b"date", b"content-type", b"content-length", b"location", b"connection",
                      b"x-content-type-options", b"x-toxiproxy-request-id"})
_STATUS_LINE = re.compile(rb"HTTP/1\.1 [1-5][0-9][0-9] [^\x00-\x1f\x7f]*\Z")
_STATUS = b"HTTP/1.1 "
_NO_BODY = (100, 204)


class DryProxy(Proxy):
    """A proxy whose start parses the listen address like a bind would, and binds nothing."""

    def _start(self) -> None:
        _host, port = addr.parse_listen(self.listen)  # ListenError (500) as the real one
        self.listen = addr.format_addr("127.0.0.1", port or 1)
        self.enabled = True

    def _stop(self) -> None:
        self.enabled = False


class _Connection:
    """Just enough socket for StreamRequestHandler: reads come from the input, writes collect."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.sent = bytearray()

    def settimeout(self, _timeout: float | None) -> None:
        pass

    def setsockopt(self, *_args: object) -> None:
        pass

    def makefile(self, mode: str, _bufsize: int = -1) -> io.BufferedReader:
        assert "r" in mode, mode  # the handler writes through sendall (wbufsize 0)
        return io.BufferedReader(io.BytesIO(self._data))

    def sendall(self, data: bytes) -> None:
        self.sent += data


class _HandlerFailures(logging.Handler):
    """Collects the API's error logs while an input runs: each is a bug the 500 hid."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.active = False
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if self.active:
            self.messages.append(record.getMessage())


_failures = _HandlerFailures()


def setup() -> None:
    """Watch the API's error log; everything else is built per input."""
    logger = logging.getLogger("chaos.toxiproxy.api")
    if _failures not in logger.handlers:
        logger.addHandler(_failures)


def serve(data: bytes, api: Api | None = None) -> bytes:
    """Everything the server writes back for ``data`` read from one connection."""
    api = api or Api(ProxyCollection(proxy_factory=DryProxy))
    conn = _Connection(data)
    Handler(conn, ("127.0.0.1", 40000), types.SimpleNamespace(api=api))
    return bytes(conn.sent)


def test_one_input(data: bytes) -> None:
    api = Api(ProxyCollection(proxy_factory=DryProxy))
    _failures.messages.clear()
    _failures.active = True
    try:
        out = serve(data, api)
    finally:
        _failures.active = False
    if _failures.messages:
        raise AssertionError(f"handler failed: {_failures.messages}")
    check_responses(out)
    listing = api.proxy_index(b"")
    if listing.status != 200:
        raise AssertionError(f"GET /proxies broke: {listing.status}")
    api.proxies.clear(timeout=0)


def check_responses(out: bytes) -> None:
    """Raise AssertionError unless ``out`` is a sequence of well-formed responses."""
    pos = 0
    for _ in range(len(out) + 1):  # each round consumes at least one status line
        if pos >= len(out):
            return
        end = out.find(b"\r\n\r\n", pos)
        if end < 0:
            raise AssertionError(f"unterminated response head: {out[pos:pos + 120]!r}")
        status, headers = _head(out[pos:end])
        pos = end + 4
        if b"content-length" in headers:
            pos = _after_body(out, pos, int(headers[b"content-length"]))
        elif headers.get(b"connection") == b"close":
            return  # Go's plain refusal: the rest is its body, then the connection closes
        elif status not in _NO_BODY:
            raise AssertionError(f"unframed {status} response")
    raise AssertionError("response parsing did not advance")


def _head(head: bytes) -> tuple[int, dict[bytes, bytes]]:
    lines = head.split(b"\r\n")
    if not _STATUS_LINE.match(lines[0]):
        raise AssertionError(f"bad status line: {lines[0][:120]!r}")
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b": ")
        if not sep or name.lower() not in _HEADERS or any(b < 0x20 or b == 0x7F for b in value):
            raise AssertionError(f"bad header line: {line[:120]!r}")
        headers[name.lower()] = value
    return int(lines[0][9:12]), headers


def _after_body(out: bytes, pos: int, length: int) -> int:
    """Where the next response starts; a HEAD answer declares a length but sends no body."""
    if pos + length == len(out) or out.startswith(_STATUS, pos + length):
        return pos + length
    if pos == len(out) or out.startswith(_STATUS, pos):
        return pos
    raise AssertionError(f"body does not match Content-Length {length}")
