"""One-line JSON encoders, built once. `json.dumps` builds a new C encoder on every call (a
microsecond or two), and the hottest paths (every frame's header, every pushed file's header,
every event written) call it hundreds of times per simulated second; these write exactly the
text those calls wrote, checked here at import."""
from __future__ import annotations

import json
import json.encoder
from typing import Any, Callable

Encode = Callable[[Any], str]


def _one_line(separators: tuple[str, str], *, allow_nan: bool = True, sort_keys: bool = False) -> Encode:
    """json.dumps(obj, separators=…, allow_nan=…, sort_keys=…), with its encoder made once.
    Cycles are not looked for (our values are trees): a cyclic value raises RecursionError
    instead of ValueError. Where the C encoder is missing or differs, json's own encoder."""
    encoder = json.JSONEncoder(separators=separators, allow_nan=allow_nan, sort_keys=sort_keys)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return encoder.encode
    try:
        c_encode = make(None, encoder.default, json.encoder.encode_basestring_ascii, None,
                        encoder.key_separator, encoder.item_separator, sort_keys, False, allow_nan)
    except TypeError:  # another Python's signature
        return encoder.encode

    def encode(obj: Any) -> str:
        return "".join(c_encode(obj, 0))

    probe = {"b": [1, 2.5, "é\n", None, True], "a": {"x": -0.0}}
    if encode(probe) != encoder.encode(probe):
        return encoder.encode
    return encode


#: json.dumps(obj, separators=(",", ":"))
compact = _one_line((",", ":"))
#: json.dumps(obj, separators=(",", ":"), allow_nan=False): NaN and Inf raise ValueError
compact_strict = _one_line((",", ":"), allow_nan=False)
#: json.dumps(obj, sort_keys=True)
sorted_keys = _one_line((", ", ": "), sort_keys=True)
#: json.dumps(obj)
plain = _one_line((", ", ": "))
