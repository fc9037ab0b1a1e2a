"""The frame decoder: wire.read_frame, then the payload's safetensors and codec.decode,
as the syncer reads a learner's frame. Three shapes of input (first byte):
0: raw bytes at the decoder; 1: a signed frame around fuzzed header and payload bytes;
2: as 1, with the header's crc32 fixed up so the payload's decoding is reached."""
from __future__ import annotations

import json
import zlib

import torch

from fuzz.targets.support import FAR, KEY, BytesSocket, sealed
from trainer import wire
from trainer.codec import decode
from trainer.protocol import FrameFault

NAME = "frame_decoder"
SHAPES = {"w": torch.Size([3, 4]), "b": torch.Size([5])}
EXPECTED = (FrameFault, wire.PeerClosed, wire.DeadlineExceeded)


def setup() -> None:
    torch.set_num_threads(1)


def _stream(mode: int, body: bytes) -> bytes:
    if mode == 0 or not body:
        return body
    split = body[0] * 4
    head, payload = body[1:1 + split], body[1 + split:]
    if mode == 2:
        try:
            header = json.loads(head)
        except (ValueError, RecursionError):
            header = None
        if isinstance(header, dict):
            header["crc32"] = zlib.crc32(payload)
            head = json.dumps(header).encode()
    return sealed(head, payload)


def test_one_input(data: bytes) -> None:
    if not data:
        return
    stream = _stream(data[0] % 3, data[1:])
    try:
        frame = wire.read_frame(BytesSocket(stream), wire.Session(KEY, client=False), FAR, max_payload=1 << 16)  # type: ignore[arg-type]
        encoding = frame.header.get("encoding", "fp32")
        decode(frame.tensors(), encoding if isinstance(encoding, str) else "fp32", SHAPES)
    except EXPECTED:
        pass
    except ValueError:  # codec.decode's documented refusal of tensors that do not match
        pass
