"""Round-trip bounds and refusals of trainer.codec (pseudo-gradient wire encodings).

The bounds are the ones stated in codec.py's docstring; they are derived from the
number formats (bf16: 8 significant bits, round to nearest; int8: 255 levels spread over
[-max|x|, max|x|]), not from the implementation's output.
"""
from __future__ import annotations

import math
import zlib

import pytest
import torch

from trainer.codec import ENCODINGS, SCALE_SUFFIX, check_encoding, decode, encode

BF16_MAX = torch.finfo(torch.bfloat16).max
FP32_TINY = torch.finfo(torch.float32).tiny  # smallest normal; bf16 shares fp32's exponent range

SHAPES = [(1,), (7,), (3, 5), (2, 3, 4), (64, 33)]  # 0-dim: see the scalar tests below
SCALES = [1e-30, 1e-6, 1e-2, 1.0, 3.0, 1e4, 1e20, 1e37]


def _random(shape: tuple[int, ...], scale: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(torch.float32)


def _round_trip(x: torch.Tensor, encoding: str) -> torch.Tensor:
    parts = encode({"w": x}, encoding)
    out = decode(parts, encoding, {"w": x.shape})
    assert set(out) == {"w"}
    assert out["w"].dtype == torch.float32
    assert out["w"].shape == x.shape
    return out["w"]


def _check_bound(x: torch.Tensor, xhat: torch.Tensor, encoding: str) -> None:
    x64, xhat64 = x.double(), xhat.double()
    err = (x64 - xhat64).abs()
    if encoding == "fp32":
        assert torch.equal(x, xhat), "fp32 must round-trip exactly"
    elif encoding == "bf16":
        bound = x64.abs() * 2.0**-8
        assert bool((err <= bound).all()), f"bf16 error {float((err - bound).max())} over 2^-8|x|"
    else:
        amax = float(x64.abs().max()) if x.numel() else 0.0
        # s/2 = max|x|/254, plus a few fp32 roundings of the scale and of q*s.
        bound = amax / 254.0 + amax * 4 * 2.0**-24 + 1e-45
        worst = float(err.max()) if x.numel() else 0.0
        assert worst <= bound, f"int8 error {worst} over max|x|/254 = {amax / 254.0}"


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale", SCALES)
def test_round_trip_within_documented_bound(encoding: str, shape: tuple[int, ...], scale: float) -> None:
    x = _random(shape, scale, seed=zlib.crc32(repr((encoding, shape, scale)).encode()))
    _check_bound(x, _round_trip(x, encoding), encoding)


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("shape", [(1,), (5,), (4, 4)])
def test_zeros_round_trip_exactly(encoding: str, shape: tuple[int, ...]) -> None:
    x = torch.zeros(shape)
    assert torch.equal(_round_trip(x, encoding), x)


@pytest.mark.parametrize("encoding", ["fp32", "bf16"])
@pytest.mark.parametrize("value", [0.0, 1.25, -3e20])
def test_scalar_tensor_round_trips(encoding: str, value: float) -> None:
    x = torch.tensor(value)
    _check_bound(x, _round_trip(x, encoding), encoding)


@pytest.mark.parametrize("value", [0.0, 1.25])
def test_int8_scalar_tensor_keeps_its_shape(value: float) -> None:
    x = torch.tensor(value)
    out = decode(encode({"t": x}, "int8"), "int8", {"t": x.shape})
    assert out["t"].shape == x.shape
    assert math.isclose(float(out["t"]), value, rel_tol=1e-6)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_empty_tensor_round_trips(encoding: str) -> None:
    x = torch.zeros((0, 3))
    assert _round_trip(x, encoding).shape == (0, 3)


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("value", [1.0, -2.5, 1e-20, 123456.789, -3e30])
def test_single_element(encoding: str, value: float) -> None:
    x = torch.tensor([value], dtype=torch.float32)
    xhat = _round_trip(x, encoding)
    _check_bound(x, xhat, encoding)
    if encoding == "int8":
        # A lone element is its own max: it maps to ±127 levels of s = |x|/127, i.e. back to x.
        assert math.isclose(float(xhat), float(x), rel_tol=1e-6)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_large_magnitudes_mixed_with_small(encoding: str) -> None:
    # Values spread over many decades in one tensor (the int8 bound is relative to max|x|).
    g = torch.Generator().manual_seed(7)
    exps = torch.randint(-30, 37, (200,), generator=g).double()
    signs = torch.where(torch.rand(200, generator=g) < 0.5, -1.0, 1.0).double()
    x = (signs * torch.rand(200, generator=g).double().add(1.0) * 10.0**exps).float()
    assert float(x.abs().max()) < BF16_MAX and float(x.abs().min()) > FP32_TINY
    _check_bound(x, _round_trip(x, encoding), encoding)


def test_int8_extremes_map_to_plus_minus_127() -> None:
    x = torch.tensor([-4.0, 0.5, 4.0, 1.0])
    parts = encode({"w": x}, "int8")
    q = parts["w"]
    assert q.dtype == torch.int8
    assert int(q.max()) == 127 and int(q.min()) == -127
    assert parts["w" + SCALE_SUFFIX].numel() == 1
    assert math.isclose(float(parts["w" + SCALE_SUFFIX]), 4.0 / 127, rel_tol=1e-6)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_wire_dtypes(encoding: str) -> None:
    parts = encode({"a": torch.randn(3), "b": torch.randn(2, 2)}, encoding)
    expected = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.int8}[encoding]
    assert parts["a"].dtype == expected and parts["b"].dtype == expected
    names = {"a", "b"} | ({"a" + SCALE_SUFFIX, "b" + SCALE_SUFFIX} if encoding == "int8" else set())
    assert set(parts) == names


# ----------------------------------------------------------------------------- refusals

@pytest.mark.parametrize("encoding", ENCODINGS)
def test_decode_refuses_wrong_shape(encoding: str) -> None:
    parts = encode({"layer.w": torch.randn(3, 4)}, encoding)
    with pytest.raises(ValueError, match=r"layer\.w.*shape"):
        decode(parts, encoding, {"layer.w": torch.Size([4, 3])})


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_decode_refuses_wrong_dtype(encoding: str) -> None:
    wrong = torch.float64 if encoding != "fp32" else torch.float16
    parts = encode({"layer.w": torch.randn(3)}, encoding)
    parts["layer.w"] = torch.randn(3).to(wrong)
    with pytest.raises(ValueError, match=r"layer\.w.*dtype"):
        decode(parts, encoding, {"layer.w": torch.Size([3])})


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_decode_refuses_missing_tensor(encoding: str) -> None:
    parts = encode({"a": torch.randn(3)}, encoding)
    with pytest.raises(ValueError, match=r"missing tensor 'b'"):
        decode(parts, encoding, {"a": torch.Size([3]), "b": torch.Size([2])})


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_decode_refuses_unexpected_tensor(encoding: str) -> None:
    parts = encode({"a": torch.randn(3), "intruder": torch.randn(2)}, encoding)
    with pytest.raises(ValueError, match=r"unexpected tensor 'intruder"):
        decode(parts, encoding, {"a": torch.Size([3])})


def test_decode_refuses_scale_of_a_tensor_not_expected() -> None:
    parts = encode({"a": torch.randn(3)}, "int8")
    parts["ghost" + SCALE_SUFFIX] = torch.ones(1)
    with pytest.raises(ValueError, match="ghost"):
        decode(parts, "int8", {"a": torch.Size([3])})


def test_decode_refuses_missing_int8_scale() -> None:
    parts = encode({"blk.w": torch.randn(3)}, "int8")
    del parts["blk.w" + SCALE_SUFFIX]
    with pytest.raises(ValueError, match=r"blk\.w::scale"):
        decode(parts, "int8", {"blk.w": torch.Size([3])})


def test_decode_refuses_int8_scale_with_several_values() -> None:
    parts = encode({"blk.w": torch.randn(3)}, "int8")
    parts["blk.w" + SCALE_SUFFIX] = torch.ones(2)
    with pytest.raises(ValueError, match=r"blk\.w"):
        decode(parts, "int8", {"blk.w": torch.Size([3])})


@pytest.mark.parametrize("encoding", ["fp32", "bf16"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_decode_refuses_non_finite_values(encoding: str, bad: float) -> None:
    x = torch.tensor([1.0, bad, 2.0])
    parts = encode({"emb": x}, encoding)
    with pytest.raises(ValueError, match=r"'emb'.*NaN or Inf"):
        decode(parts, encoding, {"emb": x.shape})


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_decode_refuses_non_finite_int8_scale(bad: float) -> None:
    parts = encode({"emb": torch.tensor([1.0, -1.0])}, "int8")
    parts["emb" + SCALE_SUFFIX] = torch.tensor([bad])
    with pytest.raises(ValueError, match=r"'emb'.*NaN or Inf"):
        decode(parts, "int8", {"emb": torch.Size([2])})


def test_int8_inf_input_is_refused_at_decode() -> None:
    x = torch.tensor([1.0, float("inf")])
    with pytest.raises(ValueError, match="emb"):
        decode(encode({"emb": x}, "int8"), "int8", {"emb": x.shape})


def test_int8_nan_input_is_not_laundered_into_finite_values() -> None:
    x = torch.tensor([0.001, 1.5, float("nan")])
    with pytest.raises(ValueError, match="emb"):
        decode(encode({"emb": x}, "int8"), "int8", {"emb": x.shape})


@pytest.mark.parametrize("bad", ["int3", "fp16", "", "FP32"])
def test_unknown_encoding_names_the_field(bad: str) -> None:
    with pytest.raises(ValueError, match=r"^encoding: unknown"):
        check_encoding(bad)
    with pytest.raises(ValueError, match=r"^encoding: unknown"):
        encode({"a": torch.zeros(1)}, bad)
    with pytest.raises(ValueError, match=r"^encoding: unknown"):
        decode({"a": torch.zeros(1)}, bad, {"a": torch.Size([1])})


def test_known_encodings_pass_check() -> None:
    for e in ENCODINGS:
        assert check_encoding(e) == e
