"""JSON the way Go's encoding/json reads and writes it.

Toxiproxy is written in Go, so what it accepts (first value only, trailing
bytes ignored, case-insensitive field names, null as "leave alone", strict
integer types) and the bytes it prints (compact, HTML-escaped, float32 in
shortest form) are part of its observable contract.
"""

from __future__ import annotations

import json
import math
import re
import struct
from decimal import Decimal
from typing import Any, Mapping

from . import goparse

_INT_RANGES = {"int64": (-(2**63), 2**63 - 1), "int": (-(2**63), 2**63 - 1)}
_SURROGATE = re.compile("[\ud800-\udfff]")
_WS = " \t\r\n"


class DecodeError(Exception):
    """A Go-style decode failure; ``str(err)`` is the text Go would print."""


class FloatLit(float):
    """A JSON number written with a fraction or exponent; keeps its literal."""

    literal: str

    def __new__(cls, text: str) -> "FloatLit":
        obj = super().__new__(cls, text)
        obj.literal = text
        return obj


class IntLit(int):
    """A JSON integer; keeps its literal, which Go quotes in errors ("-0", not "0")."""

    literal: str

    def __new__(cls, value: int, text: str) -> "IntLit":
        obj = super().__new__(cls, value)
        obj.literal = text
        return obj


class BigLit:
    """A JSON integer too long for int(): Go reads it, and it fits no Go type."""

    def __init__(self, text: str) -> None:
        self.literal = text


def _parse_int(text: str) -> IntLit | BigLit:
    value = goparse.json_int(text)
    return BigLit(text) if value is None else IntLit(value, text)


class Obj(list):
    """A JSON object as ordered (key, value) pairs, so duplicates behave as in Go."""


def _reject_constant(name: str) -> Any:
    raise DecodeError(f"invalid character '{name[0]}' looking for beginning of value")


def _pairs(pairs: list[tuple[str, Any]]) -> Obj:
    return Obj((_clean(k), _clean(v)) for k, v in pairs)


def _clean(value: Any) -> Any:
    """Go turns a lone UTF-16 surrogate escape, and each invalid UTF-8 byte, into U+FFFD.

    The body is decoded with surrogateescape, so an invalid byte arrives here as
    one surrogate (U+DC80-U+DCFF) and becomes one U+FFFD, as in Go. A string
    that kept a surrogate could never be encoded again: every later response
    naming it would fail.
    """
    if isinstance(value, str) and _SURROGATE.search(value):
        return _SURROGATE.sub("\ufffd", value)
    return value


def _clean_arrays(value: Any) -> Any:
    """Clean strings held directly in arrays (the object hook saw all the others).

    Iterative, so a deeply nested body cannot exhaust the stack here; every
    container is visited once.
    """
    if not isinstance(value, list):
        return _clean(value)
    stack: list[list] = [value]
    while stack:
        items = stack.pop()
        if isinstance(items, Obj):
            stack.extend(v for _, v in items if isinstance(v, list))
            continue
        for index, item in enumerate(items):
            if isinstance(item, str):
                items[index] = _clean(item)
            elif isinstance(item, list):
                stack.append(item)
    return value


_DECODER = json.JSONDecoder(
    object_pairs_hook=_pairs, parse_float=FloatLit, parse_int=_parse_int,
    parse_constant=_reject_constant,
)


def decode_first(body: bytes) -> Any:
    """Decode the first JSON value in ``body``, ignoring what follows (json.Decoder.Decode)."""
    text = body.decode("utf-8", errors="surrogateescape")
    start = 0
    while start < len(text) and text[start] in _WS:
        start += 1
    if start == len(text):
        raise DecodeError("EOF")
    try:
        value, _end = _DECODER.raw_decode(text, start)
    except json.JSONDecodeError as exc:
        if exc.pos >= len(text.rstrip(_WS)):
            raise DecodeError("unexpected EOF") from None
        char = text[exc.pos]
        raise DecodeError(f"invalid character {_quote_char(char)} looking for beginning of value") from None
    except RecursionError:
        raise DecodeError("exceeded max depth") from None
    return _clean_arrays(value)


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
               "\t": "\\t", "\v": "\\v", "\\": "\\\\"}


def _quote_char(char: str) -> str:
    """Go's quoteChar: the offending byte as a rune in strconv.Quote's spelling."""
    if "\udc80" <= char <= "\udcff":
        char = chr(ord(char) - 0xDC00)  # a raw invalid byte: Go quotes the byte's value
    if char == "'":
        return "'\\''"
    if char == '"':
        return "'\"'"
    if char in _GO_ESCAPES:
        return f"'{_GO_ESCAPES[char]}'"
    code = ord(char)
    if code < 0x20 or code == 0x7F:
        return f"'\\x{code:02x}'"
    if not char.isprintable():
        return f"'\\u{code:04x}'" if code < 0x10000 else f"'\\U{code:08x}'"
    return f"'{char}'"


def json_kind(value: Any) -> str:
    """The JSON kind Go names in "cannot unmarshal <kind>" messages."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float, BigLit)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Obj):
        return "object"
    if isinstance(value, list):
        return "array"
    return "null"


def lookup(obj: Obj, name: str) -> tuple[bool, Any]:
    """Find a field as Go does: exact or case-insensitive key, last occurrence wins."""
    found, result = False, None
    folded = name.casefold()
    for key, value in obj:
        if key == name or key.casefold() == folded:
            found, result = True, value
    return found, result


def type_error(value: Any, struct_name: str, field: str, go_type: str) -> DecodeError:
    kind = json_kind(value)
    if kind == "number":
        kind = f"number {getattr(value, 'literal', value)}"
    return DecodeError(
        f"json: cannot unmarshal {kind} into Go struct field {struct_name}.{field} of type {go_type}"
    )


def value_error(value: Any, go_type: str) -> DecodeError:
    return DecodeError(f"json: cannot unmarshal {json_kind(value)} into Go value of type {go_type}")


def convert(value: Any, go_type: str) -> Any:
    """Check ``value`` against a Go scalar type; raise ``TypeError`` if Go would refuse it."""
    if go_type == "string":
        if isinstance(value, str):
            return value
    elif go_type == "bool":
        if isinstance(value, bool):
            return value
    elif go_type in _INT_RANGES:
        low, high = _INT_RANGES[go_type]
        if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
            return int(value)
    elif go_type == "float32":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return _float32(value)
    raise TypeError(go_type)


def _float32(value: float) -> float:
    """ParseFloat(s, 32): a value beyond float32's range (even beyond float64's) is refused."""
    try:
        number = float(value)  # an int past 1e308 raises OverflowError
        if math.isinf(number):
            raise OverflowError
        return to_float32(number)  # rounds like Go; raises OverflowError past MaxFloat32
    except OverflowError:
        raise TypeError("float32") from None


def decode_struct(
    value: Any,
    fields: Mapping[str, str],
    struct_name: str,
    go_value_type: str,
    prefix: str = "",
) -> dict[str, Any]:
    """Decode an object into named, typed fields; null and absent fields are omitted.

    ``fields`` maps JSON name to Go type. Unknown keys are ignored, as Go does.
    """
    if value is None:
        return {}
    if not isinstance(value, Obj):
        raise value_error(value, go_value_type)
    out: dict[str, Any] = {}
    for name, go_type in fields.items():
        found, raw = lookup(value, name)
        if not found or raw is None:
            continue
        try:
            out[name] = convert(raw, go_type)
        except TypeError:
            raise type_error(raw, struct_name, prefix + name, go_type) from None
    return out


def to_float32(value: float) -> float:
    """Round a float to the nearest float32, as Go stores toxicity."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


class Float32(float):
    """A float that Go would print with float32 precision."""


def format_float32(value: float) -> str:
    """Shortest text that reads back as the same float32, in Go's 'f'/'e' choice."""
    if value == 0:
        return "0"
    digits = "0"
    for precision in range(1, 10):
        digits = f"{value:.{precision}g}"
        if to_float32(float(digits)) == value:
            break
    magnitude = abs(value)
    if magnitude < 1e-6 or magnitude >= 1e21:
        mantissa, _, exponent = f"{Decimal(digits):e}".partition("e")
        if "." in mantissa:
            mantissa = mantissa.rstrip("0").rstrip(".")
        sign = "-" if exponent.startswith("-") else "+"
        return f"{mantissa}e{sign}{int(exponent.lstrip('+-'))}"
    text = format(Decimal(digits), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def _go_string(text: str) -> str:
    """json.Marshal of a string; invalid UTF-8 (here: a lone surrogate) becomes U+FFFD as in Go."""
    encoded = json.dumps(_clean(text), ensure_ascii=False)
    return (
        encoded.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def dumps(value: Any) -> str:
    """Encode like Go's json.Marshal: compact, HTML-safe, map keys sorted by the caller."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, Float32):
        return format_float32(float(value))
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return json.dumps(value)
    if isinstance(value, str):
        return _go_string(value)
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{_go_string(str(k))}:{dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    raise TypeError(f"cannot encode {type(value).__name__}")
