"""Round-trip bounds and refusals of trainer.codec (pseudo-gradient wire encodings).

The bounds are the ones stated in codec.py's docstring; they are derived from the
number formats (bf16: 8 significant bits, round to nearest; int8: 255 levels spread over
[-max|x|, max|x|]; int4: 15 levels over [-max|x|, max|x|] of each block of 64 values;
e3m0: magnitudes s * 2^-6 .. s * 2^0 and 0, rounded to nearest in the linear domain), not
from the implementation's output.
"""
from __future__ import annotations

import math
import zlib

import pytest
import torch

from safetensors.torch import save as st_save

from trainer.codec import ENCODINGS, SCALE_SUFFIX, check_encoding, decode, encode

BF16_MAX = torch.finfo(torch.bfloat16).max
FP32_TINY = torch.finfo(torch.float32).tiny  # smallest normal; bf16 shares fp32's exponent range

# Odd sizes, sizes that are not a multiple of 64 (int4's block), and a multiple of 64.
SHAPES = [(1,), (7,), (3, 5), (2, 3, 4), (129,), (3, 333), (64, 33)]  # 0-dim: see the scalar tests below
PACKED = ("int4", "e3m0")  # 4-bit encodings: two values per byte, flat on the wire
BLOCK = 64
WIRE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.int8,
               "int4": torch.uint8, "e3m0": torch.uint8}
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
    elif encoding == "int8":
        amax = float(x64.abs().max()) if x.numel() else 0.0
        # s/2 = max|x|/254, plus a few fp32 roundings of the scale and of q*s.
        bound = amax / 254.0 + amax * 4 * 2.0**-24 + 1e-45
        worst = float(err.max()) if x.numel() else 0.0
        assert worst <= bound, f"int8 error {worst} over max|x|/254 = {amax / 254.0}"
    elif encoding == "int4":
        bound = _int4_bound(x64)
        assert bool((err <= bound).all()), f"int4 error {float((err - bound).max())} over max_block|x|/14"
    else:
        assert encoding == "e3m0"
        bound = _e3m0_bound(x64)
        assert bool((err <= bound).all()), f"e3m0 error {float((err - bound).max())} over max(|x|/3, s/128)"


def _block_amax(x64: torch.Tensor) -> torch.Tensor:
    """max|x| of the 64-value block each element belongs to (flattened order), shaped like x."""
    flat = x64.reshape(-1)
    n = flat.numel()
    padded = torch.nn.functional.pad(flat.abs(), (0, -(-n // BLOCK) * BLOCK - n)).reshape(-1, BLOCK)
    return padded.amax(dim=1, keepdim=True).expand(-1, BLOCK).reshape(-1)[:n].reshape(x64.shape)


def _int4_bound(x64: torch.Tensor) -> torch.Tensor:
    # s_b/2 = max_b|x|/14, plus a few fp32 roundings of the scale, of x/s and of q*s.
    amax = _block_amax(x64)
    return amax / 14.0 + amax * 4 * 2.0**-24 + 1e-45


def _e3m0_bound(x64: torch.Tensor) -> torch.Tensor:
    # Nearest of {0, s/64, ..., s/2, s}: |x|/3 when rounding between two powers of two, s/128 near zero.
    s = float(x64.abs().max()) if x64.numel() else 0.0
    return torch.maximum(x64.abs() / 3.0, torch.full_like(x64, s / 128.0)) + s * 4 * 2.0**-24 + 1e-45


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale", SCALES)
def test_round_trip_within_documented_bound(encoding: str, shape: tuple[int, ...], scale: float) -> None:
    x = _random(shape, scale, seed=zlib.crc32(repr((encoding, shape, scale)).encode()))
    _check_bound(x, _round_trip(x, encoding), encoding)


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("shape", [(1,), (5,), (4, 4), (130,), (64,)])
def test_zeros_round_trip_exactly(encoding: str, shape: tuple[int, ...]) -> None:
    x = torch.zeros(shape)
    assert torch.equal(_round_trip(x, encoding), x)


@pytest.mark.parametrize("encoding", ["fp32", "bf16"])
@pytest.mark.parametrize("value", [0.0, 1.25, -3e20])
def test_scalar_tensor_round_trips(encoding: str, value: float) -> None:
    x = torch.tensor(value)
    _check_bound(x, _round_trip(x, encoding), encoding)


@pytest.mark.parametrize("encoding", ["int8", *PACKED])
@pytest.mark.parametrize("value", [0.0, 1.25, -7e-4])
def test_scaled_scalar_tensor_keeps_its_shape(encoding: str, value: float) -> None:
    x = torch.tensor(value)
    out = decode(encode({"t": x}, encoding), encoding, {"t": x.shape})
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
    if encoding in ("int8", *PACKED):
        # A lone element is its own max: int8 maps it to ±127 levels of s = |x|/127, int4 to ±7
        # levels of s = |x|/7, e3m0 to the top code (magnitude s = |x|): back to x.
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
    expected = WIRE_DTYPES[encoding]
    assert parts["a"].dtype == expected and parts["b"].dtype == expected
    scaled = encoding in ("int8", *PACKED)
    names = {"a", "b"} | ({"a" + SCALE_SUFFIX, "b" + SCALE_SUFFIX} if scaled else set())
    assert set(parts) == names
    if scaled:
        assert parts["a" + SCALE_SUFFIX].dtype == torch.float32


# ----------------------------------------------------------------------------- refusals

@pytest.mark.parametrize(("encoding", "wrong"), [
    (e, w) for e in ENCODINGS for w in [(4, 3), (4, 4), (3, 5), (2, 4)]
    if not (e in PACKED and w == (4, 3))])  # packed encodings carry the element count: see the test below
def test_decode_refuses_wrong_shape(encoding: str, wrong: tuple[int, ...]) -> None:
    parts = encode({"layer.w": torch.randn(3, 4)}, encoding)
    with pytest.raises(ValueError, match=r"layer\.w.*shape"):
        decode(parts, encoding, {"layer.w": torch.Size(wrong)})


@pytest.mark.parametrize("encoding", PACKED)
def test_packed_encodings_carry_the_element_count_not_the_shape(encoding: str) -> None:
    # Documented limitation: a flat packed tensor cannot tell (3, 4) from (4, 3); the receiver
    # reshapes to the shape it expects. Element counts are still checked exactly.
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    out = decode(encode({"w": x}, encoding), encoding, {"w": torch.Size([4, 3])})["w"]
    assert out.shape == (4, 3)


@pytest.mark.parametrize(("encoding", "wrong"), [
    (e, d) for e in ENCODINGS for d in [torch.float64, torch.float16, torch.int8, torch.uint8]
    if d != WIRE_DTYPES[e]])
def test_decode_refuses_wrong_dtype(encoding: str, wrong: torch.dtype) -> None:
    parts = encode({"layer.w": torch.randn(3)}, encoding)
    parts["layer.w"] = torch.zeros(parts["layer.w"].shape, dtype=wrong)  # right wire shape, wrong dtype
    with pytest.raises(ValueError, match=r"layer\.w.*dtype"):
        decode(parts, encoding, {"layer.w": torch.Size([3])})


@pytest.mark.parametrize("encoding", ["int8", *PACKED])
@pytest.mark.parametrize("wrong", [torch.float64, torch.bfloat16, torch.float16])
def test_decode_refuses_wrong_scale_dtype(encoding: str, wrong: torch.dtype) -> None:
    parts = encode({"layer.w": torch.randn(3)}, encoding)
    parts["layer.w" + SCALE_SUFFIX] = parts["layer.w" + SCALE_SUFFIX].to(wrong)
    with pytest.raises(ValueError, match=r"'layer\.w::scale'.*dtype"):
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


@pytest.mark.parametrize("encoding", ["int8", *PACKED])
def test_inf_input_is_refused_at_decode(encoding: str) -> None:
    x = torch.tensor([1.0, float("inf")])
    with pytest.raises(ValueError, match=r"'emb'.*NaN or Inf"):
        decode(encode({"emb": x}, encoding), encoding, {"emb": x.shape})


@pytest.mark.parametrize("encoding", ["int8", *PACKED])
@pytest.mark.parametrize("at", [0, 2, 70, 199])
def test_nan_input_is_not_laundered_into_finite_values(encoding: str, at: int) -> None:
    # One NaN anywhere (including in a block other than the first, for int4) poisons the tensor.
    x = torch.randn(200) * 1e-3
    x[at] = float("nan")
    with pytest.raises(ValueError, match=r"'emb'.*NaN or Inf"):
        decode(encode({"emb": x}, encoding), encoding, {"emb": x.shape})


@pytest.mark.parametrize("encoding", PACKED)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_decode_refuses_non_finite_packed_scale(encoding: str, bad: float) -> None:
    parts = encode({"emb": torch.randn(130)}, encoding)
    parts["emb" + SCALE_SUFFIX][-1] = bad
    with pytest.raises(ValueError, match=r"'emb'.*NaN or Inf"):
        decode(parts, encoding, {"emb": torch.Size([130])})


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


# ----------------------------------------------------------------------------- 4-bit encodings

def _packed_len(n: int) -> int:
    return (n + 1) // 2


def _n_scales(encoding: str, n: int) -> int:
    return -(-n // BLOCK) if encoding == "int4" else 1


def test_int4_nibble_layout_is_offset_binary_low_nibble_first() -> None:
    # One block with max|x| = 7: scale 1, q = x. Codes q + 8: [15, 1, 9, 8, 7] (+ pad code 8).
    x = torch.tensor([7.0, -7.0, 1.0, 0.0, -1.0])
    parts = encode({"w": x}, "int4")
    assert parts["w"].tolist() == [15 | 1 << 4, 9 | 8 << 4, 7 | 8 << 4]
    assert parts["w" + SCALE_SUFFIX].tolist() == [1.0]
    assert torch.equal(decode(parts, "int4", {"w": x.shape})["w"], x)


def test_e3m0_nibble_layout_sign_in_top_bit() -> None:
    # s = 1: code 7 = 1, code 6 = 0.5 (sign bit 8 -> 14), code 0 = zero; pad code 0.
    x = torch.tensor([1.0, -0.5, 0.0])
    parts = encode({"w": x}, "e3m0")
    assert parts["w"].tolist() == [7 | 14 << 4, 0]
    assert parts["w" + SCALE_SUFFIX].tolist() == [1.0]
    assert torch.equal(decode(parts, "e3m0", {"w": x.shape})["w"], x)


def test_int4_representable_values_round_trip_exactly() -> None:
    # Each block holds multiples of its own scale: q * s_b with max|q| = 7 are exact.
    g = torch.Generator().manual_seed(3)
    q = torch.randint(-7, 8, (3, BLOCK), generator=g).float()
    q[:, 0] = 7.0
    scales = torch.tensor([[0.25], [2.0**-20], [1024.0]])
    x = (q * scales).reshape(-1)[:150]
    assert torch.equal(_round_trip(x, "int4"), x)


def test_e3m0_representable_values_round_trip_exactly() -> None:
    s = 3.0
    mags = [s * 2.0**-k for k in range(7)]
    x = torch.tensor(mags + [-m for m in mags] + [0.0])
    assert torch.equal(_round_trip(x, "e3m0"), x)


def test_e3m0_rounds_to_nearest_in_the_linear_domain() -> None:
    # s = 1. Cuts at 0.75 * 2^k between 2^(k-1) and 2^k (ties up), and at 2^-7 between 0 and 2^-6.
    x = torch.tensor([1.0, 0.75, 0.74, -0.375, 0.37, 2.0**-7, 0.99 * 2.0**-7, -0.75 * 2.0**-5])
    want = torch.tensor([1.0, 1.0, 0.5, -0.5, 0.25, 2.0**-6, 0.0, -2.0**-5])
    assert torch.equal(_round_trip(x, "e3m0"), want)


def test_e3m0_bound_is_attained() -> None:
    # The documented bound is tight: 0.75 rounds to 1 (error |x|/3), 2^-7 to 2^-6 (error s/128).
    x = torch.tensor([1.0, 0.75, 2.0**-7])
    err = (_round_trip(x, "e3m0") - x).abs()
    assert math.isclose(float(err[1]), 0.75 / 3) and math.isclose(float(err[2]), 1 / 128)


@pytest.mark.parametrize("encoding", PACKED)
def test_one_huge_outlier(encoding: str) -> None:
    g = torch.Generator().manual_seed(11)
    x = torch.randn(4 * BLOCK + 5, generator=g) * 1e-3
    x[70] = 1e3  # in int4's second block
    xhat = _round_trip(x, encoding)
    _check_bound(x, xhat, encoding)
    assert math.isclose(float(xhat[70]), 1e3, rel_tol=1e-6)
    small = torch.ones_like(x, dtype=torch.bool)
    small[70] = False
    if encoding == "int4":
        # Only the outlier's block is flattened to zero; the other blocks keep their own scale.
        in_block = torch.zeros_like(small)
        in_block[BLOCK:2 * BLOCK] = True
        assert bool((xhat[small & in_block] == 0).all())
        others = ~in_block
        rel = float((xhat[others] - x[others]).norm() / x[others].norm())
        assert rel < 0.2, rel
    else:
        # One per-tensor scale: everything under 1e3/128 is lost.
        assert bool((xhat[small] == 0).all())


@pytest.mark.parametrize("encoding", PACKED)
def test_scale_extremes(encoding: str) -> None:
    # Subnormal and near-fp32-max magnitudes: the scale neither underflows to 0 nor overflows on decode.
    fmax = torch.finfo(torch.float32).max
    cases = (torch.tensor([2.0**-149, 0.0, -2.0**-149]),  # max|x| / 7 underflows to 0 in fp32
             torch.tensor([2.0**-149, -2.0**-148, 0.0]),
             torch.tensor([fmax, -fmax, fmax / 3, 1.0]))
    for x in cases:
        xhat = _round_trip(x, encoding)
        assert bool(torch.isfinite(xhat).all())
        _check_bound(x, xhat, encoding)


@pytest.mark.parametrize("encoding", PACKED)
@pytest.mark.parametrize("n", [0, 1, 2, 63, 64, 65, 1000, 64 * 1024 + 1])
def test_packed_wire_size(encoding: str, n: int) -> None:
    parts = encode({"w": torch.randn(n)}, encoding)
    assert parts["w"].shape == (_packed_len(n),) and parts["w"].dtype == torch.uint8
    assert parts["w" + SCALE_SUFFIX].shape == (_n_scales(encoding, n),)
    data = _packed_len(n) + 4 * _n_scales(encoding, n)
    payload = len(st_save(parts))
    assert data <= payload <= data + 256, (payload, data)  # + the safetensors JSON header only


def test_bytes_per_value_on_a_large_tensor() -> None:
    n = 1 << 20
    x = {"w": torch.randn(n)}
    per_value = {e: len(st_save(encode(x, e))) / n for e in ENCODINGS}
    print("bytes/value:", {e: round(v, 4) for e, v in per_value.items()})
    assert per_value["int4"] == pytest.approx(0.5 + 4 / BLOCK, rel=1e-3)  # 0.5625
    assert per_value["e3m0"] == pytest.approx(0.5, rel=1e-3)
    assert per_value["int8"] == pytest.approx(1.0, rel=1e-3)
    assert per_value["fp32"] == pytest.approx(4.0, rel=1e-3)


@pytest.mark.parametrize("encoding", PACKED)
@pytest.mark.parametrize("delta", [-1, 1])
def test_decode_refuses_wrong_packed_length(encoding: str, delta: int) -> None:
    parts = encode({"blk.w": torch.randn(130)}, encoding)
    good = parts["blk.w"]
    parts["blk.w"] = torch.zeros(good.numel() + delta, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"tensor 'blk\.w': shape \(6[46],\), expected \(65,\)"):
        decode(parts, encoding, {"blk.w": torch.Size([130])})


@pytest.mark.parametrize("encoding", PACKED)
@pytest.mark.parametrize("delta", [-1, 1])
def test_decode_refuses_wrong_number_of_scales(encoding: str, delta: int) -> None:
    parts = encode({"blk.w": torch.randn(130)}, encoding)
    want = _n_scales(encoding, 130)
    parts["blk.w" + SCALE_SUFFIX] = torch.ones(want + delta)
    with pytest.raises(ValueError, match=rf"tensor 'blk\.w::scale': shape \({want + delta},\), expected \({want},\)"):
        decode(parts, encoding, {"blk.w": torch.Size([130])})


@pytest.mark.parametrize("encoding", PACKED)
def test_decode_refuses_scale_of_wrong_rank(encoding: str) -> None:
    parts = encode({"blk.w": torch.randn(10)}, encoding)
    parts["blk.w" + SCALE_SUFFIX] = parts["blk.w" + SCALE_SUFFIX].reshape(())
    with pytest.raises(ValueError, match=r"'blk\.w::scale'.*shape"):
        decode(parts, encoding, {"blk.w": torch.Size([10])})


@pytest.mark.parametrize("encoding", ["int8", *PACKED])
def test_decode_refuses_missing_scale(encoding: str) -> None:
    parts = encode({"blk.w": torch.randn(3)}, encoding)
    del parts["blk.w" + SCALE_SUFFIX]
    with pytest.raises(ValueError, match=r"missing tensor 'blk\.w::scale'"):
        decode(parts, encoding, {"blk.w": torch.Size([3])})


@pytest.mark.parametrize("encoding", PACKED)
def test_decode_refuses_extra_tensors(encoding: str) -> None:
    parts = encode({"a": torch.randn(3)}, encoding)
    for intruder in ("a::zero", "ghost" + SCALE_SUFFIX, "b"):
        bad = dict(parts, **{intruder: torch.zeros(2, dtype=torch.uint8)})
        with pytest.raises(ValueError, match=rf"unexpected tensor '{intruder}'"):
            decode(bad, encoding, {"a": torch.Size([3])})


@pytest.mark.parametrize("encoding", ["fp32", "bf16"])
def test_plain_encodings_refuse_a_scale(encoding: str) -> None:
    parts = encode({"a": torch.randn(3)}, encoding)
    parts["a" + SCALE_SUFFIX] = torch.ones(1)
    with pytest.raises(ValueError, match=r"unexpected tensor 'a::scale'"):
        decode(parts, encoding, {"a": torch.Size([3])})


@pytest.mark.parametrize("encoding", PACKED)
@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_decode_refuses_non_positive_scale(encoding: str, bad: float) -> None:
    parts = encode({"blk.w": torch.randn(100)}, encoding)
    parts["blk.w" + SCALE_SUFFIX][0] = bad
    with pytest.raises(ValueError, match=r"'blk\.w::scale'.*positive"):
        decode(parts, encoding, {"blk.w": torch.Size([100])})


def test_int4_decode_refuses_code_zero() -> None:
    parts = encode({"blk.w": torch.randn(6)}, "int4")
    parts["blk.w"][1] &= 0xF0  # element 2's nibble := 0, i.e. q = -8
    with pytest.raises(ValueError, match=r"'blk\.w'.*code 0.*element 2"):
        decode(parts, "int4", {"blk.w": torch.Size([6])})


@pytest.mark.parametrize("encoding", PACKED)
def test_decode_refuses_a_stray_padding_nibble(encoding: str) -> None:
    parts = encode({"blk.w": torch.randn(5)}, encoding)
    parts["blk.w"][-1] ^= 0x30  # the unused high nibble of the last byte
    with pytest.raises(ValueError, match=r"'blk\.w'.*padding"):
        decode(parts, encoding, {"blk.w": torch.Size([5])})


def test_e3m0_reads_negative_zero_as_zero() -> None:
    parts = encode({"w": torch.tensor([1.0, 0.0])}, "e3m0")
    parts["w"][0] |= 0x80  # element 1: sign bit set on code 0
    assert decode(parts, "e3m0", {"w": torch.Size([2])})["w"].tolist() == [1.0, 0.0]


def test_relative_error_on_a_realistic_pseudo_gradient() -> None:
    # A pseudo-gradient after H inner steps is roughly Gaussian with a small scale.
    g = torch.Generator().manual_seed(2024)
    x = (torch.randn(256, 1024, generator=g, dtype=torch.float64) * 1e-3).float()
    x64 = x.double()
    rel = {}
    for enc in ENCODINGS:
        err = _round_trip(x, enc).double() - x64
        rel[enc] = float(err.norm() / x64.norm())
    print("relative L2 error vs fp32:", {e: f"{v:.4f}" for e, v in rel.items()})
    # Worst case from the per-element bounds (holds for any data):
    assert rel["int4"] <= float(_int4_bound(x64).norm() / x64.norm())
    assert rel["e3m0"] <= float(_e3m0_bound(x64).norm() / x64.norm())
    # Expected for Gaussian data: int4 has step s_b = max_b|x|/7 ~ 2.4 sigma/7 per 64 values, so an rms
    # error of step/sqrt(12) ~ 0.1 sigma; e3m0 loses up to 1/3 of each value, ~0.2 in rms.
    assert rel["fp32"] == 0.0
    assert rel["int8"] < 0.02
    assert 0.07 < rel["int4"] < 0.13
    assert 0.15 < rel["e3m0"] < 0.25
