"""Encodings of pseudo-gradients for the wire, and their decoding back to fp32.

Each encoding maps one fp32 tensor to a few named tensors that safetensors can carry
(no pickle), and back. The syncer always merges in fp32. Every encoding is described by
a small table of the wire tensors it emits for a parameter `name` (name suffix, dtype,
shape as a function of the parameter's shape); `decode` checks a frame against that
table exactly (no missing, extra, mis-shaped or mis-typed tensor) before decoding.

Wire tensors per parameter of n elements and bytes per value (n large, safetensors
header aside):
- fp32: name (float32, shape)                                             4 B/value
- bf16: name (bfloat16, shape)                                            2 B/value
- int8: name (int8, shape), name::scale (float32, (1,))                   1 B/value
- int4: name (uint8, (ceil(n/2),)), name::scale (float32, (ceil(n/64),))  0.5625 B/value
- e3m0: name (uint8, (ceil(n/2),)), name::scale (float32, (1,))           0.5 B/value

int4: symmetric integer quantization of the flattened tensor in blocks of 64 consecutive
values; block b has scale s_b = max|x| over the block / 7 (an all-zero block: s_b = 1),
q = round(x / s_b) clamped to [-7, 7], x̂ = q * s_b. A nibble holds q in offset binary,
code = q + 8 (1..15; code 0 would be -8 and is refused by decode).

e3m0: a 4-bit float with 1 sign bit, 3 exponent bits and no mantissa, with one per-tensor
scale s = max|x| (an all-zero tensor: s = 1). Nibble = sign << 3 | e, with e = 0 meaning
zero and e = 1..7 meaning magnitude s * 2^(e - 7): s/64, s/32, ..., s/2, s (the largest
magnitude is exactly max|x|). |x| / s is rounded to the nearest representable magnitude in
the linear domain (ties away from zero): values below s/128 become 0, and between 2^(k-1)
and 2^k the cut is at 0.75 * 2^k. The encoder never emits code 8 (negative zero); decode
reads it as zero.

Both 4-bit encodings pack two nibbles per byte: element 2i in the low nibble, element 2i+1
in the high nibble; for an odd n the unused high nibble of the last byte holds the code of
zero (8 for int4, 0 for e3m0) and decode refuses anything else. Because the packed tensor
is flat, a frame carries the parameter's element count, not its shape: decode checks the
packed length and the number of scales exactly and reshapes to the expected shape.

Non-finite input: int8, int4 and e3m0 have no NaN, so an encoder that sees a NaN or Inf
sends zero codes with NaN scale(s); the decoded tensor is then NaN and decode refuses it,
like any NaN/Inf output, with "contains NaN or Inf". A diverged learner's update is never
laundered into plausible numbers.

Round-trip error bounds (x̂ = decode(encode(x))), asserted by the unit tests (up to a few
fp32 roundings of the scale and of the products):
- fp32: exact.
- bf16: |x - x̂| <= 2^-8 * |x| (round to nearest, 8 significant bits).
- int8: per-tensor scale s = max|x| / 127; |x - x̂| <= s / 2.
- int4: per-block scale s_b = max|x over the block| / 7; |x - x̂| <= s_b / 2 = max_b|x| / 14.
- e3m0: per-tensor scale s = max|x|; |x - x̂| <= max(|x| / 3, s / 128). (Relative error at
  most 1/3 for |x| >= 0.75 * s/64; below that the error is at most s/128.)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .finite import finite

SCALE_SUFFIX = "::scale"
INT4_BLOCK = 64

_INT4_ZERO = 8  # offset-binary code of q = 0
_E3M0_MIN_EXP = -6  # e = 1 is s * 2^-6
_FP32_MIN_SUBNORMAL = 2.0 ** -149


@dataclass(frozen=True)
class _WireTensor:
    """One tensor an encoding puts on the wire for a parameter."""
    suffix: str  # appended to the parameter's name
    dtype: torch.dtype
    shape: Callable[[torch.Size], tuple[int, ...]]  # from the parameter's shape


@dataclass(frozen=True)
class _Codec:
    wire: tuple[_WireTensor, ...]
    # x (fp32) -> the wire tensors, in the order of `wire`
    encode: Callable[[torch.Tensor], tuple[torch.Tensor, ...]]
    # (parameter name, wire tensors in the order of `wire`, parameter shape) -> fp32 values
    decode: Callable[[str, tuple[torch.Tensor, ...], torch.Size], torch.Tensor]


def _same_shape(shape: torch.Size) -> tuple[int, ...]:
    return tuple(shape)


def _one(shape: torch.Size) -> tuple[int, ...]:
    return (1,)


def _packed(shape: torch.Size) -> tuple[int, ...]:
    return ((shape.numel() + 1) // 2,)


def _int4_blocks(shape: torch.Size) -> tuple[int, ...]:
    return (-(-shape.numel() // INT4_BLOCK),)


# ----------------------------------------------------------------------------- nibbles

def _pack_nibbles(codes: torch.Tensor, pad: int) -> torch.Tensor:
    """Flat codes in 0..15 -> uint8 of ceil(n/2): element 2i low nibble, 2i+1 high nibble."""
    codes = codes.reshape(-1).to(torch.uint8)
    if codes.numel() % 2:
        codes = torch.cat([codes, codes.new_full((1,), pad)])
    return (codes[0::2] | (codes[1::2] << 4)).contiguous()


def _unpack_nibbles(name: str, packed: torch.Tensor, n: int, pad: int) -> torch.Tensor:
    """uint8 of ceil(n/2) -> n codes (uint8); refuses a padding nibble other than `pad`."""
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=1).reshape(-1)
    if codes.numel() > n and int(codes[n]) != pad:
        raise ValueError(f"tensor {name!r}: padding nibble is {int(codes[n])}, expected {pad}")
    return codes[:n]


def _check_scales(name: str, scale: torch.Tensor) -> torch.Tensor:
    scale = scale.to(torch.float32)
    if (torch.isfinite(scale) & (scale <= 0)).any():
        # Non-finite scales are left to the NaN/Inf check of the decoded values.
        raise ValueError(f"tensor {name + SCALE_SUFFIX!r}: scales must be positive")
    return scale


# ----------------------------------------------------------------------------- fp32, bf16, int8

def _encode_fp32(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (x.contiguous(),)


def _encode_bf16(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (x.to(torch.bfloat16).contiguous(),)


def _decode_plain(name: str, ts: tuple[torch.Tensor, ...], shape: torch.Size) -> torch.Tensor:
    return ts[0].to(torch.float32)


def _encode_int8(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    if not torch.isfinite(x).all():
        # int8 has no NaN: carry it in the scale, so the receiver refuses the tensor
        # instead of reading a diverged learner's update as plausible numbers.
        return torch.zeros_like(x, dtype=torch.int8), torch.full((1,), float("nan"), device=x.device)
    amax = x.abs().max() if x.numel() else torch.tensor(0.0, device=x.device)
    scale = (amax / 127.0) if amax > 0 else torch.tensor(1.0, device=x.device)
    q = torch.clamp(torch.round(x / scale), -127, 127).to(torch.int8)
    return q.contiguous(), scale.reshape(1).to(torch.float32)


def _decode_int8(name: str, ts: tuple[torch.Tensor, ...], shape: torch.Size) -> torch.Tensor:
    q, scale = ts
    return q.to(torch.float32) * scale.to(torch.float32).reshape(())


# ----------------------------------------------------------------------------- int4

def _encode_int4(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    flat = x.reshape(-1)
    n = flat.numel()
    nblocks = -(-n // INT4_BLOCK)
    if not torch.isfinite(flat).all():
        return (_pack_nibbles(torch.full((n,), _INT4_ZERO, dtype=torch.uint8, device=x.device), _INT4_ZERO),
                torch.full((nblocks,), float("nan"), device=x.device))
    blocks = torch.nn.functional.pad(flat, (0, nblocks * INT4_BLOCK - n)).reshape(nblocks, INT4_BLOCK)
    amax = blocks.abs().amax(dim=1) if nblocks else blocks.new_zeros(0)
    # amax / 7 underflows to 0 for amax below ~3.5 * 2^-149; the smallest subnormal still encodes those
    # values (q <= 3) exactly. (7 * fl(amax / 7) never overflows: checked for every fp32 in [2^127, max].)
    scale = torch.clamp(amax / 7.0, min=_FP32_MIN_SUBNORMAL)
    scale = torch.where(amax > 0, scale, torch.ones_like(scale))
    q = torch.clamp(torch.round(blocks / scale[:, None]), -7, 7).to(torch.int16).reshape(-1)[:n]
    return _pack_nibbles(q + _INT4_ZERO, _INT4_ZERO), scale.contiguous()


def _decode_int4(name: str, ts: tuple[torch.Tensor, ...], shape: torch.Size) -> torch.Tensor:
    packed, scale = ts
    scale = _check_scales(name, scale)
    n = shape.numel()
    codes = _unpack_nibbles(name, packed, n, _INT4_ZERO)
    if (codes == 0).any():
        at = int(torch.nonzero(codes == 0)[0])
        raise ValueError(f"tensor {name!r}: int4 code 0 (q = -8) at element {at} is outside [-7, 7]")
    q = codes.to(torch.float32) - _INT4_ZERO
    q = torch.nn.functional.pad(q, (0, scale.numel() * INT4_BLOCK - n)).reshape(-1, INT4_BLOCK)
    return (q * scale[:, None]).reshape(-1)[:n].reshape(shape)


# ----------------------------------------------------------------------------- e3m0

def _encode_e3m0(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    flat = x.reshape(-1)
    if not torch.isfinite(flat).all():
        return (_pack_nibbles(torch.zeros(flat.numel(), dtype=torch.uint8, device=x.device), 0),
                torch.full((1,), float("nan"), device=x.device))
    amax = flat.abs().max() if flat.numel() else flat.new_zeros(())
    scale = amax if amax > 0 else flat.new_ones(())
    r = flat.abs() / scale  # in [0, 1]
    mant, exp = torch.frexp(r)  # r = mant * 2^exp, mant in [0.5, 1): r lies in [2^(exp-1), 2^exp)
    k = torch.where(mant >= 0.75, exp, exp - 1)  # nearest of 2^(exp-1), 2^exp; ties up
    e = torch.clamp(k - _E3M0_MIN_EXP + 1, 1, 7)
    e = torch.where(r >= 2.0 ** (_E3M0_MIN_EXP - 1), e, torch.zeros_like(e))  # below s/128: zero
    sign = (flat < 0) & (e > 0)  # never a negative zero
    return _pack_nibbles(e | (sign.to(e.dtype) << 3), 0), scale.reshape(1).to(torch.float32)


def _decode_e3m0(name: str, ts: tuple[torch.Tensor, ...], shape: torch.Size) -> torch.Tensor:
    packed, scale = ts
    scale = _check_scales(name, scale).reshape(())
    codes = _unpack_nibbles(name, packed, shape.numel(), 0)
    levels = torch.tensor([0.0] + [2.0 ** (e + _E3M0_MIN_EXP - 1) for e in range(1, 8)],
                          dtype=torch.float32, device=scale.device) * scale
    mag = levels[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -mag, mag).reshape(shape)


_CODECS: dict[str, _Codec] = {
    "fp32": _Codec((_WireTensor("", torch.float32, _same_shape),), _encode_fp32, _decode_plain),
    "bf16": _Codec((_WireTensor("", torch.bfloat16, _same_shape),), _encode_bf16, _decode_plain),
    "int8": _Codec((_WireTensor("", torch.int8, _same_shape), _WireTensor(SCALE_SUFFIX, torch.float32, _one)),
                   _encode_int8, _decode_int8),
    "int4": _Codec((_WireTensor("", torch.uint8, _packed), _WireTensor(SCALE_SUFFIX, torch.float32, _int4_blocks)),
                   _encode_int4, _decode_int4),
    "e3m0": _Codec((_WireTensor("", torch.uint8, _packed), _WireTensor(SCALE_SUFFIX, torch.float32, _one)),
                   _encode_e3m0, _decode_e3m0),
}
ENCODINGS = tuple(_CODECS)


def check_encoding(encoding: str) -> str:
    if encoding not in _CODECS:
        raise ValueError(f"encoding: unknown {encoding!r} (known: {', '.join(ENCODINGS)})")
    return encoding


def encode(tensors: dict[str, torch.Tensor], encoding: str) -> dict[str, torch.Tensor]:
    """Encode every named fp32 tensor; the result is ready for safetensors."""
    codec = _CODECS[check_encoding(encoding)]
    out: dict[str, torch.Tensor] = {}
    for name, x in tensors.items():
        parts = codec.encode(x.detach().to(torch.float32))
        out.update({name + w.suffix: t for w, t in zip(codec.wire, parts)})
    return out


def decode(parts: dict[str, torch.Tensor], encoding: str,
           expected: dict[str, torch.Size]) -> dict[str, torch.Tensor]:
    """Decode to fp32, checking names, shapes and dtypes against `expected`.

    Raises ValueError naming the offending tensor: a frame that does not match the
    fragment it claims to carry is refused, never partially applied.
    """
    codec = _CODECS[check_encoding(encoding)]
    allowed = {name + w.suffix for name in expected for w in codec.wire}
    extra = sorted(set(parts) - allowed)
    if extra:
        raise ValueError(f"unexpected tensor {extra[0]!r}")
    out: dict[str, torch.Tensor] = {}
    for name, shape in expected.items():
        shape = torch.Size(shape)
        wire_tensors = []
        for w in codec.wire:
            wname = name + w.suffix
            if wname not in parts:
                raise ValueError(f"missing tensor {wname!r}")
            t = parts[wname]
            want = w.shape(shape)
            if tuple(t.shape) != want:
                of = "" if want == tuple(shape) else f" ({encoding} of a {tuple(shape)} tensor)"
                raise ValueError(f"tensor {wname!r}: shape {tuple(t.shape)}, expected {want}{of}")
            if t.dtype != w.dtype:
                raise ValueError(f"tensor {wname!r}: dtype {t.dtype}, expected {w.dtype} for {encoding}")
            wire_tensors.append(t)
        value = codec.decode(name, tuple(wire_tensors), shape)
        if not finite(value):
            raise ValueError(f"tensor {name!r}: contains NaN or Inf")
        out[name] = value
    return out
