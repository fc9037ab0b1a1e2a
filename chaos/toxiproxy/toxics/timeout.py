"""timeout: drop all data; close after ``timeout`` ms without data (0 = hold forever).

The timer starts when the toxic starts on a connection and restarts with
every dropped chunk, as in Go. Removing the toxic closes the connections it
was blackholing, because their data is already lost.
"""

from __future__ import annotations

from typing import Iterator

from .base import Attr, Chunk, Stub, Toxic


class Timeout(Toxic):
    type_name = "timeout"
    go_name = "TimeoutToxic"
    attrs = (Attr("timeout"),)

    def _arm(self, stub: Stub) -> None:
        timeout = self.values["timeout"]
        stub.timer = stub.now() + timeout / 1000.0 if timeout > 0 else None

    def start(self, stub: Stub) -> None:
        self._arm(stub)

    def process(self, chunk: Chunk, stub: Stub) -> Iterator[Chunk]:
        self._arm(stub)
        return iter(())

    def on_timer(self, stub: Stub) -> None:
        stub.close()

    def on_remove(self, stub: Stub) -> None:
        stub.close()
