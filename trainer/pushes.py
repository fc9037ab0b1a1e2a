"""The learner's bounded queue of unsent pushes.

The inner loop only ever appends; a background thread sends. A push not yet attempted
is coalesced with a newer push of the same fragment (their pseudo-gradients are
consecutive increments, so their sum is the learner's total progress), which bounds the
queue at one unsent push per fragment plus the one in flight. A push that was sent but
not acknowledged keeps its identity (the same header and payload, sealed anew for each
connection), so the syncer's ledger recognises the retry.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from .wire import Message


@dataclass
class OutgoingPush:
    fragment: int
    seq: int
    base_version: int
    tokens: int
    steps: int
    position: int
    delta: dict[str, torch.Tensor] = field(repr=False)
    created_step: int = 0
    residual: bool = False  # the progress left at a clean stop, pushed whatever --push-window says
    final: bool = False     # ... and marked as this learner's last push of the fragment (the final round)
    attempts: int = 0
    message: Message | None = field(default=None, repr=False)  # fixed at the first attempt
    coalesced: int = 0
    claimed: bool = False  # the sender took it: from now on it is never coalesced into


class PushQueue:
    def __init__(self, capacity: int) -> None:
        if capacity < 2:
            raise ValueError(f"push queue capacity must be >= 2, got {capacity}")
        self.capacity = capacity
        self._items: list[OutgoingPush] = []
        self._cond = threading.Condition()
        self.coalesced = 0

    def put(self, push: OutgoingPush) -> None:
        """Never blocks: coalesces into an unsent push of the same fragment if there is one."""
        with self._cond:
            for item in self._items:
                if item.fragment == push.fragment and not item.claimed:
                    for name, d in push.delta.items():
                        item.delta[name].add_(d)
                    item.tokens += push.tokens
                    item.steps += push.steps
                    item.position = push.position
                    item.residual = item.residual or push.residual
                    item.final = item.final or push.final
                    item.coalesced += 1 + push.coalesced
                    self.coalesced += 1
                    self._cond.notify_all()
                    return
            if len(self._items) >= self.capacity:
                raise OverflowError(f"push queue is full ({self.capacity}); fragments exceed capacity")
            self._items.append(push)
            self._cond.notify_all()

    def peek(self) -> OutgoingPush | None:
        with self._cond:
            return self._items[0] if self._items else None

    def claim(self, item: OutgoingPush | None = None) -> OutgoingPush | None:
        """Mark `item` (default: the head) as taken by the sender, under the lock, so a push
        queued while it is being encoded starts a new item instead of changing this one."""
        with self._cond:
            if item is None:
                item = self._items[0] if self._items else None
            if item is not None:
                item.claimed = True
            return item

    def rebase(self, fragment: int, version: int) -> list[OutgoingPush]:
        """The syncer went back to `version` of `fragment`: its queued pushes made on a newer
        (lost) version are said to be made on `version`, which the syncer has; a built
        message is built again, under the same seq (their progress is their delta, whatever
        version it was made on). Returns the pushes changed."""
        changed = []
        with self._cond:
            for item in self._items:
                if item.fragment == fragment and item.base_version > version:
                    item.base_version = version
                    item.message = None
                    changed.append(item)
        return changed

    def pop(self, push: OutgoingPush) -> None:
        with self._cond:
            self._items.remove(push)
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    def wait(self, timeout: float) -> None:
        """Sleep until something is queued, or `timeout` passes."""
        with self._cond:
            if not self._items:
                self._cond.wait(timeout)

    def wait_empty(self, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: not self._items, timeout)

    def notify(self) -> None:
        with self._cond:
            self._cond.notify_all()
