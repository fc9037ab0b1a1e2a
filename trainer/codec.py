"""Encodings of pseudo-gradients for the wire, and their decoding back to fp32.

Each encoding maps one fp32 tensor to a few named tensors that safetensors can carry
(no pickle), and back. The syncer always merges in fp32.

Round-trip error bounds (x̂ = decode(encode(x))), asserted by the unit tests:
- fp32: exact.
- bf16: |x - x̂| <= 2^-8 * |x| (round to nearest, 8 significant bits).
- int8: per-tensor scale s = max|x| / 127; |x - x̂| <= s / 2.
"""
from __future__ import annotations

from typing import Callable

import torch

ENCODINGS = ("fp32", "bf16", "int8")
SCALE_SUFFIX = "::scale"


def _encode_fp32(name: str, x: torch.Tensor) -> dict[str, torch.Tensor]:
    return {name: x.detach().to(torch.float32).contiguous()}


def _encode_bf16(name: str, x: torch.Tensor) -> dict[str, torch.Tensor]:
    return {name: x.detach().to(torch.bfloat16).contiguous()}


def _encode_int8(name: str, x: torch.Tensor) -> dict[str, torch.Tensor]:
    x = x.detach().to(torch.float32)
    if not torch.isfinite(x).all():
        # int8 has no NaN: carry it in the scale, so the receiver refuses the tensor
        # instead of reading a diverged learner's update as plausible numbers.
        return {name: torch.zeros_like(x, dtype=torch.int8), name + SCALE_SUFFIX: torch.tensor([float("nan")])}
    amax = x.abs().max() if x.numel() else torch.tensor(0.0)
    scale = (amax / 127.0) if amax > 0 else torch.tensor(1.0)
    q = torch.clamp(torch.round(x / scale), -127, 127).to(torch.int8)
    return {name: q.contiguous(), name + SCALE_SUFFIX: scale.reshape(1).to(torch.float32)}


def _decode_plain(name: str, parts: dict[str, torch.Tensor]) -> torch.Tensor:
    return parts[name].to(torch.float32)


def _decode_int8(name: str, parts: dict[str, torch.Tensor]) -> torch.Tensor:
    scale = parts[name + SCALE_SUFFIX]
    if scale.numel() != 1:
        raise ValueError(f"{name}{SCALE_SUFFIX}: expected one scale, got shape {tuple(scale.shape)}")
    return parts[name].to(torch.float32) * scale.to(torch.float32).reshape(())


_ENCODERS: dict[str, Callable[[str, torch.Tensor], dict[str, torch.Tensor]]] = {
    "fp32": _encode_fp32,
    "bf16": _encode_bf16,
    "int8": _encode_int8,
}
_DECODERS: dict[str, Callable[[str, dict[str, torch.Tensor]], torch.Tensor]] = {
    "fp32": _decode_plain,
    "bf16": _decode_plain,
    "int8": _decode_int8,
}
_WIRE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.int8}


def check_encoding(encoding: str) -> str:
    if encoding not in _ENCODERS:
        raise ValueError(f"encoding: unknown {encoding!r} (known: {', '.join(ENCODINGS)})")
    return encoding


def encode(tensors: dict[str, torch.Tensor], encoding: str) -> dict[str, torch.Tensor]:
    """Encode every named fp32 tensor; the result is ready for safetensors."""
    enc = _ENCODERS[check_encoding(encoding)]
    out: dict[str, torch.Tensor] = {}
    for name, x in tensors.items():
        out.update(enc(name, x))
    return out


def decode(parts: dict[str, torch.Tensor], encoding: str,
           expected: dict[str, torch.Size]) -> dict[str, torch.Tensor]:
    """Decode to fp32, checking names, shapes and dtypes against `expected`.

    Raises ValueError naming the offending tensor: a frame that does not match the
    fragment it claims to carry is refused, never partially applied.
    """
    dec = _DECODERS[check_encoding(encoding)]
    wire_dtype = _WIRE_DTYPES[encoding]
    allowed = set(expected)
    if encoding == "int8":
        allowed |= {n + SCALE_SUFFIX for n in expected}
    extra = sorted(set(parts) - allowed)
    if extra:
        raise ValueError(f"unexpected tensor {extra[0]!r}")
    out: dict[str, torch.Tensor] = {}
    for name, shape in expected.items():
        if name not in parts:
            raise ValueError(f"missing tensor {name!r}")
        t = parts[name]
        if t.shape != shape:
            raise ValueError(f"tensor {name!r}: shape {tuple(t.shape)}, expected {tuple(shape)}")
        if t.dtype != wire_dtype:
            raise ValueError(f"tensor {name!r}: dtype {t.dtype}, expected {wire_dtype} for {encoding}")
        if encoding == "int8" and name + SCALE_SUFFIX not in parts:
            raise ValueError(f"missing tensor {name + SCALE_SUFFIX!r}")
        value = dec(name, parts)
        if not torch.isfinite(value).all():
            raise ValueError(f"tensor {name!r}: contains NaN or Inf")
        out[name] = value
    return out
