"""trainer.compact_json writes exactly what the json.dumps calls it replaces wrote."""
from __future__ import annotations

import json

import pytest

from trainer import compact_json

VALUES = [
    {"type": "push", "crc32": 0, "versions": [4, 5], "norm": 1.25e-7, "ok": True, "none": None},
    {"b": {"z": [1, 2.5, "é\n\"x\""], "a": -0.0}, "a": [[], {}], "big": 10 ** 30, "tiny": 5e-324},
    [1, "two", 3.0, False],
    "just a string",
    7,
    None,
]


@pytest.mark.parametrize("value", VALUES)
def test_each_encoder_writes_what_json_dumps_wrote(value: object) -> None:
    assert compact_json.compact(value) == json.dumps(value, separators=(",", ":"))
    assert compact_json.compact_strict(value) == json.dumps(value, separators=(",", ":"), allow_nan=False)
    assert compact_json.sorted_keys(value) == json.dumps(value, sort_keys=True)
    assert compact_json.plain(value) == json.dumps(value)


def test_nan_and_inf_are_refused_where_json_dumps_refused_them() -> None:
    for bad in (float("nan"), {"a": [float("inf")]}, [float("-inf")]):
        with pytest.raises(ValueError, match="not JSON compliant"):
            compact_json.compact_strict(bad)
    assert compact_json.compact({"a": float("nan")}) == '{"a":NaN}'


def test_a_value_json_cannot_write_raises_type_error() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        compact_json.compact({"a": object()})
