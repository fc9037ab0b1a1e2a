"""Write the seed corpora (fuzz/corpus/<target>/seed-*) from well-formed inputs, so each run
starts from frames, handshakes and pushes that get deep into the code. Deterministic:
`python -m fuzz.seeds` rewrites the same files."""
from __future__ import annotations

import hashlib
import json
import random
import zlib
from pathlib import Path

import torch

from fuzz.targets.support import CLIENT_RANDOM, SECRET, SERVER_RANDOM, sealed
from trainer import wire
from trainer.keys import learner_key
from trainer.codec import ENCODINGS, encode

CORPUS = Path(__file__).resolve().parent / "corpus"


def _write(target: str, inputs: list[bytes]) -> None:
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    for data in inputs:
        (folder / f"seed-{hashlib.sha1(data).hexdigest()[:12]}").write_bytes(data)


def _header(fields: dict, payload: bytes) -> bytes:
    return json.dumps({**fields, "crc32": zlib.crc32(payload)}, separators=(",", ":")).encode()


def frame_decoder() -> list[bytes]:
    g = torch.Generator().manual_seed(0)
    out = []
    for enc in ENCODINGS:
        payload = wire.pack_tensors(encode({"w": torch.randn(3, 4, generator=g), "b": torch.randn(5, generator=g)}, enc))
        head = _header({"type": "PUSH", "encoding": enc, "seq": 1, "tokens": 64, "steps": 4}, payload)
        body = bytes([len(head) // 4 + 1]) + head.ljust((len(head) // 4 + 1) * 4) + payload
        out += [bytes([0]) + sealed(head, payload), bytes([1]) + body, bytes([2]) + body]
    out.append(bytes([0]) + wire.PREFIX.pack(wire.MAGIC, wire.VERSION, 10, 1 << 40))
    return out


def handshake() -> list[bytes]:
    hello = _header({"type": "HELLO", "learner": 1, "nonce": "abcd", "mode": "decoupled", "want_params": True}, b"")
    opening = wire.HANDSHAKE.pack(wire.MAGIC, wire.VERSION, CLIENT_RANDOM)
    key = wire.derive_key(learner_key(SECRET, 0), CLIENT_RANDOM, SERVER_RANDOM)  # the opening names learner 0
    return [bytes([1]) + hello, bytes([0]) + opening + sealed(hello, b"", key=key), bytes([0]) + opening,
            bytes([1]) + b'{"type":"HELLO","crc32":0,"learner":' + b"9" * 40 + b"}"]


def push_validation() -> list[bytes]:
    rng = random.Random(0)
    return [bytes(rng.randrange(256) for _ in range(n)) for n in (16, 64, 128, 256, 512, 1024)]


def main() -> None:
    for target, make in (("frame_decoder", frame_decoder), ("handshake", handshake),
                         ("push_validation", push_validation)):
        _write(target, make())


if __name__ == "__main__":
    main()
