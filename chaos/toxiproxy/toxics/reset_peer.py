"""reset_peer: on the first data (or the close), wait ``timeout`` ms, then reset.

The reset closes both sockets with SO_LINGER 0, so both peers get a TCP RST
("connection reset by peer") instead of a clean FIN. The data is dropped.
"""

from __future__ import annotations

from typing import Iterator

from .base import Attr, Chunk, Stub, Toxic


class ResetPeer(Toxic):
    type_name = "reset_peer"
    go_name = "ResetToxic"
    attrs = (Attr("timeout"),)

    def process(self, chunk: Chunk, stub: Stub) -> Iterator[Chunk]:
        if not stub.sleep(self.values["timeout"] / 1000.0):
            # Removed or updated while waiting: let the data through instead.
            yield chunk
            return
        stub.reset()

    def on_eof(self, stub: Stub) -> None:
        if stub.sleep(self.values["timeout"] / 1000.0):
            stub.reset()
