"""The syncer's files: their layout, and typed reads and writes through the Storage seam.

Every write goes to a temporary file in the same directory, is fsynced, renamed over the
target and the directory is fsynced (storage.py). A SIGKILL or a power loss at any
instant leaves either the previous complete file or the new complete file, never a torn
one.

Layout of a syncer state directory:

    meta.json                      members (nonce, incarnation, data position), counters
    fragment-<f>.safetensors       Θ_f, momentum_f, delayed-Nesterov accumulator_f (only
                                   while it holds something); metadata: version, applied
                                   ledger, merged tokens and rounds, accum_count (only with the
                                   accumulator)
    pending/<f>/<id>.safetensors   accepted pushes not merged yet (the write-ahead log)
    sync.safetensors               sync mode: parameters, AdamW state and round

The commit point of a merge is the rename of its fragment file, which carries the
ledger of every applied push id, and with Θ_f the whole outer-optimizer state of the
fragment (momentum, accumulator and its count), so they can never disagree. Recovery drops pending files already in that ledger,
so an acknowledged push is applied exactly once whatever instant the process died.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load as st_load

from . import tensor_bytes
from .compact_json import compact, plain
from .atomic import atomic_write_bytes, atomic_write_json, fsync_dir  # noqa: F401 (re-exported)
from .storage import FILES, Storage

PARAM_PREFIX = "param/"
MOMENTUM_PREFIX = "momentum/"
ACCUM_PREFIX = "accum/"


@dataclass
class FragmentFile:
    """Everything a fragment file holds. A file written before the accumulator existed
    (or with an empty one) reads back with accum == {} and accum_count == 0."""

    params: dict[str, torch.Tensor]
    momentum: dict[str, torch.Tensor]
    version: int
    applied: list[str]
    accum: dict[str, torch.Tensor] = field(default_factory=dict)
    accum_count: int = 0
    tokens: int = 0  # raw tokens of every push merged into this fragment, committed with Θ_f
    rounds: float = 0.0  # outer rounds merged so far, a partial merge counting its fraction


def read_json(path: str | os.PathLike, storage: Storage = FILES) -> dict | None:
    return storage.read_json(Path(path))


def with_metadata(payload: bytes, metadata: dict[str, object]) -> tuple[bytes, memoryview]:
    """A safetensors file's bytes as two parts: a new header carrying `metadata` and the
    data section of `payload` (a safetensors buffer already parsed, hence valid), not
    copied. A push's pending file is its wire payload under a header that names the push:
    serialising its tensors again cost two copies of every pushed byte."""
    size = int.from_bytes(payload[:8], "little")
    header = json.loads(payload[8:8 + size])
    header["__metadata__"] = {k: plain(v) for k, v in metadata.items()}
    raw = compact(header).encode()
    raw += b" " * (-len(raw) % 8)  # the data section stays 8-byte aligned
    return len(raw).to_bytes(8, "little") + raw, memoryview(payload)[8 + size:]


def save_tensors(path: str | os.PathLike, tensors: dict[str, torch.Tensor], metadata: dict[str, object],
                 storage: Storage = FILES) -> int:
    """Atomically write tensors with JSON-encoded metadata values."""
    meta = {k: plain(v) for k, v in metadata.items()}
    return storage.atomic_write(Path(path), tensor_bytes.dumps(tensors, metadata=meta))


def safetensors_metadata(data: bytes) -> dict[str, str]:
    """The `__metadata__` of a safetensors buffer (st_load has parsed the header already)."""
    size = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + size]).get("__metadata__") or {}


def load_tensors(path: str | os.PathLike, storage: Storage = FILES) -> tuple[dict[str, torch.Tensor], dict[str, object]]:
    data = storage.read_bytes(Path(path))
    tensors = st_load(data)
    return tensors, {k: json.loads(v) for k, v in safetensors_metadata(data).items()}


def remove_stale_temporaries(directory: Path, storage: Storage = FILES) -> int:
    """Temporary files left by a process killed mid-write; they are never valid state."""
    return storage.remove_temporaries(Path(directory))


class StateDir:
    """Paths and typed reads/writes of one syncer state directory."""

    def __init__(self, root: str | os.PathLike, storage: Storage = FILES) -> None:
        self.root = Path(root)
        self.storage = storage
        storage.mkdir(self.root)

    @property
    def meta_path(self) -> Path:
        return self.root / "meta.json"

    def fragment_path(self, index: int) -> Path:
        return self.root / f"fragment-{index}.safetensors"

    def pending_dir(self, index: int) -> Path:
        return self.root / "pending" / str(index)

    def pending_path(self, index: int, ident: str) -> Path:
        return self.pending_dir(index) / (ident.replace(":", "-") + ".safetensors")

    @property
    def sync_path(self) -> Path:
        return self.root / "sync.safetensors"

    def write_fragment(self, index: int, params: dict[str, torch.Tensor],
                       momentum: dict[str, torch.Tensor], version: int, applied: list[str],
                       accum: dict[str, torch.Tensor] | None = None, accum_count: int = 0,
                       tokens: int = 0, rounds: float = 0.0) -> int:
        """One atomic file: the accumulator and its count commit together with Θ_f and the
        momentum. An empty accumulator (count 0) is not written, so such a file is the
        same as one written before the accumulator existed."""
        tensors = {PARAM_PREFIX + n: t for n, t in params.items()}
        tensors.update({MOMENTUM_PREFIX + n: t for n, t in momentum.items()})
        meta: dict[str, object] = {"version": version, "applied": applied, "tokens": tokens, "rounds": rounds}
        if accum_count > 0:
            tensors.update({ACCUM_PREFIX + n: t for n, t in (accum or {}).items()})
            meta["accum_count"] = accum_count
        return save_tensors(self.fragment_path(index), tensors, meta, self.storage)

    def read_fragment_file(self, index: int) -> FragmentFile | None:
        """The whole fragment file, or None when this fragment was never written."""
        path = self.fragment_path(index)
        if not self.storage.exists(path):
            return None
        tensors, meta = load_tensors(path, self.storage)

        def part(prefix: str) -> dict[str, torch.Tensor]:
            return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}

        count = int(meta.get("accum_count", 0))
        return FragmentFile(part(PARAM_PREFIX), part(MOMENTUM_PREFIX), int(meta["version"]),
                            list(meta["applied"]), part(ACCUM_PREFIX) if count > 0 else {}, count,
                            int(meta.get("tokens", 0)), float(meta.get("rounds", 0.0)))

    def read_fragment(self, index: int):
        """(params, momentum, version, applied) or None when this fragment was never written."""
        f = self.read_fragment_file(index)
        return None if f is None else (f.params, f.momentum, f.version, f.applied)

    def pending_files(self, index: int) -> list[Path]:
        return self.storage.glob(self.pending_dir(index), ".safetensors")

    def read_params(self, num_fragments: int) -> dict[str, torch.Tensor]:
        """The global parameters, assembled from every fragment file (for evaluation)."""
        params: dict[str, torch.Tensor] = {}
        for f in range(num_fragments):
            frag = self.read_fragment(f)
            if frag is None:
                raise FileNotFoundError(f"{self.fragment_path(f)}: no state written for fragment {f}")
            params.update(frag[0])
        return params
