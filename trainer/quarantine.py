"""Pending pushes that cannot be merged, moved aside with the reason.

A push file that makes a merge raise or turn Θ non-finite, or that cannot even be read
back at recovery, would otherwise fail every merge of its fragment, and again after each
restart. It is moved from `pending/<f>/` to `quarantine/` (a rename on the same disk,
then both directories fsynced) beside a JSON note of why, counted, and reported as a
`push_quarantined` event. The note is written first: a crash between the two leaves the
push pending, to be judged again. Nothing is deleted: an operator can read what a learner
sent.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from .events import EventLog
from .protocol import Reason
from .storage import FILES, Storage


class Quarantine:
    def __init__(self, root: Path, events: EventLog, counters: Counter, storage: Storage = FILES) -> None:
        self.root = root
        self.events = events
        self.counters = counters
        self.storage = storage

    def path_for(self, fragment: int, ident: str) -> Path:
        return self.root / f"{fragment}-{ident.replace(':', '-')}.safetensors"

    def put(self, pending: Path | None, ident: str, fragment: int, learner: int | None, reason: Reason,
            detail: str, acknowledged: bool) -> None:
        store = self.storage
        store.mkdir(self.root)
        target = self.path_for(fragment, ident)
        store.atomic_write_json(target.with_suffix(".json"), {"id": ident, "fragment": fragment, "learner": learner,
                                                              "reason": str(reason), "detail": detail,
                                                              "acknowledged": acknowledged})
        if pending is not None and store.exists(pending):
            store.rename(pending, target)
            store.fsync_dir(self.root)
            store.fsync_dir(pending.parent)
        self.counters["quarantined"] += 1
        self.counters[f"quarantined_{reason}"] += 1
        self.events.emit("push_quarantined", id=ident, fragment=fragment, learner=learner, reason=str(reason),
                         detail=detail, acknowledged=acknowledged, path=str(target))
