"""Reading a request the way Go's net/http does, so framing can't disagree with it.

http.server leaves the body to us. Go decides a body's length from exactly one
Transfer-Encoding ("chunked", HTTP/1.1 only) or one Content-Length value, and
reads chunked bodies with strict sizes and bounded overhead; anything else is
refused before a handler runs. Disagreeing about where a body ends means
disagreeing about where the next request starts, so this is followed closely.
"""

from __future__ import annotations

import re
import string
from email.message import Message
from typing import BinaryIO
from urllib.parse import unquote_to_bytes

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
_ALNUM = (string.ascii_letters + string.digits).encode()
_TOKEN = frozenset(_ALNUM + b"!#$%&'*+-.^_`|~")  # validMethod
_PATH_SAFE = frozenset(_ALNUM + b"-_.~$&+,/:;=@")  # url.shouldEscape(c, encodePath) is false
_SCHEME_LATER = frozenset(string.digits + "+-.")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_UNSAFE_IN_HEADER = re.compile(r"[\x00-\x1f\x7f]|[^\x00-\xff]")

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

    def __init__(self, status: int, body: str | None = None, detail: str = "") -> None:
        reason = GO_REASONS.get(status, "Error") + (f": {detail}" if detail else "")
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


# --- request line and target ---------------------------------------------------------


def parse_request_line(raw: bytes) -> tuple[str, str, str]:
    """(method, target, proto) by Go's parseRequestLine; raises BadRequest.

    Stricter than http.server where Go is: exactly two single spaces, a token
    method, "HTTP/d.d", and no control byte in the target (Go's "invalid
    control character in URL"), so no CR, LF or NUL can ever be echoed.
    """
    line = raw[:-1] if raw.endswith(b"\n") else raw
    line = line[:-1] if line.endswith(b"\r") else line
    method, sep1, rest = line.partition(b" ")
    target, sep2, proto = rest.partition(b" ")
    if not sep1 or not sep2 or not method or not _TOKEN.issuperset(method):
        raise BadRequest(400)
    major = _http_major(proto)
    if major is None:
        raise BadRequest(400)
    if major != 1:
        raise BadRequest(505, detail="unsupported protocol version")
    if any(byte < 0x20 or byte == 0x7F for byte in target):
        raise BadRequest(400)
    return method.decode("ascii"), target.decode("latin-1"), proto.decode("ascii")


def _http_major(proto: bytes) -> int | None:
    """ParseHTTPVersion: "HTTP/" and one ASCII digit each side of the dot, else None."""
    if len(proto) != 8 or not proto.startswith(b"HTTP/") or proto[6:7] != b".":
        return None
    if not (proto[5:6].isdigit() and proto[7:8].isdigit()):  # bytes.isdigit: ASCII only
        return None
    return proto[5] - ord("0")


def _scheme_end(target: str) -> int:
    """url.getScheme: index of the ':' ending a scheme, or -1; a leading ':' is 400."""
    for index, char in enumerate(target):
        if char.isascii() and char.isalpha():
            continue
        if char in _SCHEME_LATER and index > 0:
            continue
        if char == ":":
            if index == 0:
                raise BadRequest(400)  # "missing protocol scheme"
            return index
        return -1
    return -1


def split_target(target: str) -> tuple[str, str]:
    """url.ParseRequestURI as far as routing needs: (decoded path, "?query" or "").

    The path is percent-decoded to bytes as Go keeps it, then read as UTF-8 with
    surrogateescape: a valid name matches as in Go, an invalid byte matches no
    name and is re-encoded exactly by escape_path. For an absolute target
    ("http://host/p") only the path is kept; Go would echo scheme and host in a
    redirect, we never echo them.
    """
    if target == "*":
        return "*", ""
    scheme = _scheme_end(target)
    path, sep, query = target[scheme + 1:].partition("?")
    if scheme < 0 and not path.startswith("/"):
        raise BadRequest(400)  # "invalid URI for request"
    if scheme >= 0 and path.startswith("//"):
        slash = path.find("/", 2)
        path = path[slash:] if slash >= 0 else ""
    elif scheme >= 0 and not path.startswith("/"):
        path = ""  # opaque: Go routes an empty path
    if _BAD_ESCAPE.search(path):
        raise BadRequest(400)  # "invalid URL escape"
    decoded = unquote_to_bytes(path.encode("latin-1"))
    return decoded.decode("utf-8", "surrogateescape"), sep + query


def escape_path(path: str) -> str:
    """url.escape(path, encodePath), as mux's redirect writes Location: CR/LF become %0D%0A."""
    raw = path.encode("utf-8", "surrogateescape")
    return "".join(chr(byte) if byte in _PATH_SAFE else f"%{byte:02X}" for byte in raw)


def header_value(value: str) -> str:
    """Last guard before a header is written: percent-encode controls and non-Latin-1.

    Every value we write is ours or escaped already; this makes an injected
    CR/LF impossible even if a future caller forgets.
    """
    return _UNSAFE_IN_HEADER.sub(
        lambda m: "".join(f"%{b:02X}" for b in m.group().encode("utf-8", "surrogatepass")), value)
