"""A character-level language model (byte embedding + 1-layer GRU) on a folder of text.

The text is every file under $CHARLM_DATA, as bytes (binary files, those holding a NUL byte,
are skipped); by default the folder of Python's own `pydoc_data`, whose topics.py is 750 kB
of English, so nothing is downloaded. The last 5% is held out; the rest is cut into one
contiguous slice per learner.

Run it:  python -m trainer run --task examples/tasks/charlm.py:task --duration 40 --learners 2
Your text:  CHARLM_DATA=~/books python -m trainer run --task examples/tasks/charlm.py:task
Under faults:  python -m chaos run examples/schedules/kill-partition-latency.yaml --task examples/tasks/charlm.py:task
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import pydoc_data
import torch
import torch.nn.functional as F

BATCH, CONTEXT = 16, 64  # 16 windows of 64 predicted characters per step
HELD_OUT = 0.05


class CharRNN(torch.nn.Module):
    def __init__(self, hidden: int = 128) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(256, 64)
        self.rnn = torch.nn.GRU(64, hidden, batch_first=True)
        self.head = torch.nn.Linear(hidden, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T) bytes -> (B, T, 256) logits
        return self.head(self.rnn(self.embed(x))[0])


class CharLM:
    def __init__(self) -> None:
        self.folder = Path(os.environ.get("CHARLM_DATA") or os.path.dirname(pydoc_data.__file__)).expanduser()
        files = sorted(p for p in self.folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        text = b"".join(d for d in (p.read_bytes() for p in files) if b"\0" not in d)
        if len(text) < 100 * (CONTEXT + 1):
            raise ValueError(f"{self.folder}: {len(text)} bytes of text, need at least {100 * (CONTEXT + 1)}")
        data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
        cut = int(len(data) * (1 - HELD_OUT))
        self.train, self.test = data[:cut], data[cut:]

    def model(self) -> torch.nn.Module:
        return CharRNN()

    def batches(self, shard: int, shards: int, seed: int):
        size = len(self.train) // shards
        part = self.train[shard * size:(shard + 1) * size]  # this learner's contiguous slice
        g = torch.Generator().manual_seed(seed * 1000 + shard)
        while True:  # endless, and the same sequence for the same (shard, shards, seed)
            starts = torch.randint(0, len(part) - CONTEXT - 1, (BATCH,), generator=g)
            yield torch.stack([part[s:s + CONTEXT + 1] for s in starts.tolist()])

    def loss(self, model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
        logits = model(batch[:, :-1])  # predict each next character
        return F.cross_entropy(logits.reshape(-1, 256).float(), batch[:, 1:].reshape(-1))

    def tokens(self, batch: torch.Tensor) -> int:
        return batch[:, 1:].numel()  # predicted characters

    def eval_batches(self):
        windows = self.test[:len(self.test) // (CONTEXT + 1) * (CONTEXT + 1)].view(-1, CONTEXT + 1)
        return list(windows[:256].split(64))  # at most 4 fixed batches of 64 windows: a cheap eval

    def metrics(self, model: torch.nn.Module, batch: torch.Tensor) -> dict[str, float]:
        return {"bits_per_char": self.loss(model, batch).item() / math.log(2)}

    def describe(self) -> dict:
        p = torch.bincount(self.train, minlength=256).float() / len(self.train)
        return {"data": str(self.folder), "train_bytes": len(self.train), "held_out_bytes": len(self.test),
                "unigram_entropy": float(-(p[p > 0] * p[p > 0].log()).sum())}


task = CharLM
