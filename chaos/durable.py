"""What a syncer's state directory holds durably, read from its files alone.

A syncer SIGKILLed at the very end writes no `final_state` event, yet its state directory
says everything `no_lost_acks` needs (README, "Durability"; trainer/state.py):

    fragment-<f>.safetensors      metadata `applied`: the ledger of every merged push id
    pending/<f>/<id>.safetensors  accepted pushes not merged yet; a restart merges them
    quarantine/<f>-<id>.json      a push moved aside as unmergeable, and why

The files are read as data (a safetensors header is 8 bytes of length and a JSON object),
never through the trainer's classes: the checks judge what the trainer wrote, not what
its code believes. Pending files are read before the ledgers and the quarantine notes
after them, so a live syncer that merges (ledger first, then the pending file goes) or
quarantines (note first, then the move) meanwhile is never caught with a push in neither.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

MAX_HEADER_BYTES = 256 * 1024 * 1024  # a ledger of millions of ids; beyond that the file is not one
FILE_ID = re.compile(r"^(\d+)-(\d+)-(\d+)$")  # a push id as a file name writes it (`:` -> `-`)


@dataclass(frozen=True)
class DurableState:
    """A state directory's ledgers, pending pushes and quarantined ones, by push id."""

    root: Path
    applied: dict[str, list[str]] = field(default_factory=dict)  # fragment -> ledger, in merge order
    pending: dict[str, str] = field(default_factory=dict)        # push id -> fragment
    unreadable: list[str] = field(default_factory=list)          # pending files a restart could not load
    quarantined: dict[str, dict] = field(default_factory=dict)   # push id -> its note (reason, detail)

    def applied_ids(self) -> set[str]:
        return {i for ids in self.applied.values() for i in ids}


def canonical_id(name: str) -> str:
    """`1:2:3` for `1:2:3` or `1-2-3` (how a file name spells a push id)."""
    m = FILE_ID.match(name)
    return ":".join(m.groups()) if m else name


def safetensors_metadata(path: Path) -> dict[str, str]:
    """The `__metadata__` of a safetensors file, from its header alone."""
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise ValueError(f"{path}: shorter than a safetensors header")
        size = int.from_bytes(head, "little")
        if size > MAX_HEADER_BYTES:
            raise ValueError(f"{path}: a header of {size} bytes")
        header = json.loads(fh.read(size))
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) else {}


def _meta_value(meta: dict[str, str], key: str):
    """trainer/state.py stores each metadata value JSON-encoded."""
    return json.loads(meta[key])


def _pending_id(path: Path) -> str:
    meta = safetensors_metadata(path)
    return ":".join(str(int(_meta_value(meta, k))) for k in ("learner", "incarnation", "seq"))


def _read_pending(root: Path) -> tuple[dict[str, str], list[str]]:
    pending, unreadable = {}, []
    for path in sorted(root.glob("pending/*/*.safetensors")):
        try:
            pending[_pending_id(path)] = path.parent.name
        except (OSError, ValueError, KeyError, TypeError):
            unreadable.append(str(path.relative_to(root)))
    return pending, unreadable


def _read_ledgers(root: Path) -> dict[str, list[str]]:
    applied = {}
    for path in sorted(root.glob("fragment-*.safetensors")):
        fragment = path.name[len("fragment-"):-len(".safetensors")]
        applied[fragment] = [str(i) for i in _meta_value(safetensors_metadata(path), "applied")]
    return applied


def _read_quarantine(root: Path) -> dict[str, dict]:
    notes = {}
    for path in sorted(root.glob("quarantine/*.json")):
        try:
            note = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(note, dict) and note.get("id") is not None:
            notes[canonical_id(str(note["id"]))] = note
    return notes


def read_durable_state(root: Path | None) -> DurableState | None:
    """The decoupled syncer's durable state in `root`, or None when there is none to read
    (no directory, sync mode's single file, or a fragment file that cannot be read)."""
    if root is None or not root.is_dir() or not any(root.glob("fragment-*.safetensors")):
        return None
    try:
        pending, unreadable = _read_pending(root)
        applied = _read_ledgers(root)
        quarantined = {i: n for i, n in _read_quarantine(root).items() if i not in pending}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return DurableState(root, applied, pending, unreadable, quarantined)
