"""Tensors as safetensors bytes, written directly.

The library's `save` spends most of its time looking for tensors that share memory, to
refuse them; ours are parameters or fresh encodings, written many times a second (every
push, pull and merged fragment). The format is small: an 8-byte little-endian header
length, a JSON header (each tensor's dtype, shape and byte range; `__metadata__`),
padded with spaces to 8 bytes, then the data. Reading stays with the library, which
checks every range and dtype, so nothing read from the network or a disk is trusted."""
from __future__ import annotations

import struct

import torch

from .compact_json import compact

DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}
NUMPY_DTYPES = frozenset(d for d in DTYPES if d is not torch.bfloat16)
ALIGNMENT = 8
LENGTH = struct.Struct("<Q")


def dumps(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """The safetensors encoding of `tensors` (sorted by name) with string `metadata`."""
    header: dict[str, object] = {}
    if metadata:
        bad = [k for k, v in metadata.items() if not isinstance(v, str)]
        if bad:
            raise ValueError(f"metadata[{bad[0]!r}]: must be a string")
        header["__metadata__"] = metadata
    blobs: list[bytes] = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach()
        dtype = DTYPES.get(t.dtype)
        if dtype is None:
            raise ValueError(f"tensor {name!r}: dtype {t.dtype} has no safetensors name")
        # The machine's byte order is little-endian on every platform torch ships for, as
        # safetensors requires. numpy writes a CPU tensor's bytes in C order whatever its
        # strides; bfloat16 (no numpy dtype) and other devices go through a uint8 view.
        if t.dtype in NUMPY_DTYPES and t.device.type == "cpu":
            data = t.numpy().tobytes()
        else:
            data = t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = compact(header).encode()
    head += b" " * (-len(head) % ALIGNMENT)
    return b"".join([LENGTH.pack(len(head)), head, *blobs])
