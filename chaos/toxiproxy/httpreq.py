"""Reading a request the way Go's net/http does, so framing can't disagree with it.

http.server leaves the body to us. Go decides a body's length from exactly one
Transfer-Encoding ("chunked", HTTP/1.1 only) or one Content-Length value, and
reads chunked bodies with strict sizes and bounded overhead; anything else is
refused before a handler runs. Disagreeing about where a body ends means
disagreeing about where the next request starts, so this is followed closely.
"""

from __future__ import annotations

from email.message import Message
from typing import BinaryIO

from . import goparse

# Toxiproxy streams a body into json.Decoder with no limit of its own (its
# http.Server sets only timeouts), so there is no Go answer to copy for "too
# big". We read bodies whole before routing, so we must cap them: past the cap
# we answer 413 Request Entity Too Large, the status HTTP defines for it, in the
# plain-text shape Go's server uses for requests it refuses itself, and close.
MAX_BODY = 16 << 20
MAX_CHUNK_LINE = 4096  # net/http's maxLineLength for a chunk-size line
MAX_TRAILER = 4096  # Go only looks this far (one bufio buffer) for a trailer's end
MAX_CHUNK_EXCESS = 16 * 1024  # "chunked encoding contains too much non-data"
_CRLF = b"\r\n"

GO_REASONS = {
    400: "Bad Request",
    413: "Request Entity Too Large",
    414: "Request URI Too Long",
    431: "Request Header Fields Too Large",
    501: "Not Implemented",
    505: "HTTP Version Not Supported",
}


class BadRequest(Exception):
    """A request Go's server refuses itself: status line reason plus a plain-text body."""

    def __init__(self, status: int, body: str | None = None) -> None:
        reason = GO_REASONS.get(status, "Error")
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.body = body if body is not None else f"{status} {reason}"

    def wire(self) -> bytes:
        """Go's bytes for it: no length, the connection closes after the body."""
        return (f"HTTP/1.1 {self.status} {self.reason}\r\n"
                "Content-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
                f"{self.body}").encode("latin-1")


def _trim(value: str) -> str:
    """textproto.TrimString: ASCII whitespace only."""
    return value.strip(" \t\r\n")


def is_chunked(headers: Message, http11: bool) -> bool:
    """parseTransferEncoding: one value, exactly "chunked", else 501; ignored before HTTP/1.1."""
    values = headers.get_all("Transfer-Encoding") or []
    if not values or not http11:
        return False
    if len(values) != 1 or _trim(values[0]).encode("latin-1").lower() != b"chunked":
        raise BadRequest(501, "Unsupported transfer encoding")
    return True


def _content_length_text(headers: Message) -> str | None:
    """fixLength: repeats of one value collapse, differing values are refused (smuggling)."""
    values = [_trim(value) for value in headers.get_all("Content-Length") or []]
    if any(value != values[0] for value in values[1:]):
        raise BadRequest(400)
    return values[0] if values else None


def content_length(text: str) -> int:
    """parseContentLength: ParseUint(text, 10, 63), so "" "+5" "5_0" "-0" are 400; over the cap 413."""
    try:
        length = goparse.parse_uint(text, bits=63)
    except goparse.NumberError:
        raise BadRequest(400) from None
    if length > MAX_BODY:
        raise BadRequest(413)
    return length


def read_body(rfile: BinaryIO, headers: Message, http11: bool) -> bytes:
    """The whole body, at most MAX_BODY bytes, framed as Go frames it; raises BadRequest.

    Go checks Transfer-Encoding, then conflicting Content-Lengths (refused even
    beside chunked), and ignores Content-Length for a chunked body. A request
    with neither has no body.
    """
    chunked = is_chunked(headers, http11)
    text = _content_length_text(headers)
    if chunked:
        return read_chunked(rfile)
    length = 0 if text is None else content_length(text)
    body = rfile.read(length) if length else b""
    if len(body) != length:
        raise BadRequest(400)  # the client closed mid-body
    return body


def _chunk_line(rfile: BinaryIO) -> bytes:
    """One chunk-size line, CRLF included: must end in CRLF with no other CR (CVE-2025-22871)."""
    line = rfile.readline(MAX_CHUNK_LINE)
    if len(line) >= MAX_CHUNK_LINE or not line.endswith(_CRLF) or line.find(b"\r") != len(line) - 2:
        raise BadRequest(400)
    return line


def _chunk_size(line: bytes) -> int:
    """Trailing whitespace trimmed, the extension cut at ';', then strict hex."""
    text = line.rstrip(b" \t\r\n").split(b";", 1)[0]
    try:
        return goparse.parse_chunk_size(text)
    except goparse.NumberError:
        raise BadRequest(400) from None


def read_chunked(rfile: BinaryIO) -> bytes:
    """net/http's chunkedReader, eagerly: sizes, CRLFs, overhead budget, trailer, cap.

    Every chunk but the last carries at least one byte, so MAX_BODY + 1 rounds
    always end in the last chunk, an error or the cap.
    """
    chunks: list[bytes] = []
    total = excess = 0
    for _ in range(MAX_BODY + 1):
        line = _chunk_line(rfile)
        size = _chunk_size(line)
        excess = max(0, excess + len(line) + 2 - 16 - 2 * size)
        if excess > MAX_CHUNK_EXCESS:
            raise BadRequest(400)
        if size == 0:
            _read_trailer(rfile)
            return b"".join(chunks)
        total += size
        if total > MAX_BODY:
            raise BadRequest(413)
        data = rfile.read(size)
        if len(data) != size or rfile.read(2) != _CRLF:
            raise BadRequest(400)
        chunks.append(data)
    raise BadRequest(413)


def _read_trailer(rfile: BinaryIO) -> None:
    """Skip the trailer: header lines ending within MAX_TRAILER bytes at a blank CRLF line."""
    used = 0
    for _ in range(MAX_TRAILER):  # every line is at least one byte
        line = rfile.readline(MAX_TRAILER - used + 1)
        used += len(line)
        if line == _CRLF:
            return
        if (used > MAX_TRAILER or not line.endswith(_CRLF) or b":" not in line
                or line[:1] in (b" ", b"\t")):
            raise BadRequest(400)
    raise BadRequest(400)
