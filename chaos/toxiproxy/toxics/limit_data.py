"""limit_data: let exactly ``bytes`` bytes through in this direction, then close.

The count is per connection and survives updates of the toxic, so raising the
limit on a live connection lets more data through (as in Go).
"""

from __future__ import annotations

from typing import Any, Iterator

from .base import Attr, Chunk, Stub, Toxic


class LimitData(Toxic):
    type_name = "limit_data"
    go_name = "LimitDataToxic"
    attrs = (Attr("bytes"),)

    def new_state(self) -> Any:
        return {"sent": 0}

    def process(self, chunk: Chunk, stub: Stub) -> Iterator[Chunk]:
        limit = self.values["bytes"]
        state = stub.state
        remaining = max(0, limit - state["sent"])
        data = chunk.data[:remaining] if remaining < len(chunk.data) else chunk.data
        if data:
            state["sent"] += len(data)
            yield Chunk(data, chunk.ts)
        if limit - state["sent"] <= 0:
            stub.close()
