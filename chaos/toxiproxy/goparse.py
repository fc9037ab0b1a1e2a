"""Numbers read from requests, parsed with Go's rules and nothing looser.

Python's ``int()`` accepts what Go refuses (Unicode digits such as ``٣``,
``_`` separators, signs, surrounding spaces) and refuses what Go accepts (a
literal over 4,300 digits). Toxiproxy reads ports with ``net``'s parsePort,
Content-Length with ``strconv.ParseUint``, chunk sizes with net/http's
parseHexUint and JSON numbers with encoding/json, so every number the server
takes from a request goes through one of these functions instead.
"""

from __future__ import annotations

_DECIMAL = frozenset("0123456789")
_HEX_BYTES = frozenset(b"0123456789abcdefABCDEF")
_MAX_UINT64_DIGITS = 20  # len(str(2**64 - 1))
_MAX_CHUNK_DIGITS = 16  # parseHexUint: "http chunk length too large" past 16 hex digits
_PORT_CUTOFF = 1 << 30  # net.parsePort clamps anything this large
_INT_DIGITS = 4000  # under CPython's int()/str() limit of 4,300 digits


class NumberError(ValueError):
    """Text Go would not read as a number; the message is Go's reason."""


def is_decimal(text: str) -> bool:
    """Only ASCII 0-9, at least one: str.isdigit() also passes '٣' and '²'."""
    return bool(text) and _DECIMAL.issuperset(text)


def parse_uint(text: str, bits: int = 64) -> int:
    """strconv.ParseUint(text, 10, bits): no sign, no '_', no space, no '0x'."""
    if not is_decimal(text):
        raise NumberError(f"invalid syntax: {text[:32]!r}")
    digits = text.lstrip("0") or "0"
    if len(digits) > _MAX_UINT64_DIGITS or int(digits) >= 1 << bits:
        raise NumberError(f"value out of range: {text[:32]!r}")
    return int(digits)


def parse_chunk_size(text: bytes) -> int:
    """net/http's parseHexUint: 1 to 16 ASCII hex digits, nothing else."""
    if not text:
        raise NumberError("empty hex number for chunk length")
    if not _HEX_BYTES.issuperset(text):
        raise NumberError("invalid byte in chunk length")
    if len(text) > _MAX_CHUNK_DIGITS:
        raise NumberError("http chunk length too large")
    return int(text, 16)


def parse_port(service: str) -> int | None:
    """net.parsePort: the number, possibly out of range, or None when Go looks the name up.

    One leading sign is allowed, then ASCII digits only; huge values clamp to
    +-2**30 (so they fail the range check later) instead of growing without bound.
    """
    if service == "":
        return 0
    sign = 1
    if service[0] in "+-":
        sign = -1 if service[0] == "-" else 1
        service = service[1:]
    if service and not is_decimal(service):
        return None
    digits = service.lstrip("0") or "0"
    if len(digits) > 10 or int(digits) >= _PORT_CUTOFF:
        return sign * _PORT_CUTOFF if sign < 0 else _PORT_CUTOFF - 1
    return sign * int(digits)


def json_int(literal: str) -> int | None:
    """A JSON integer literal's value, or None when it is too long for CPython to convert.

    Go reads any length; such a number can only fail a typed field's range
    check or be ignored, so the caller keeps the literal instead.
    """
    if len(literal) > _INT_DIGITS:
        return None
    return int(literal)
