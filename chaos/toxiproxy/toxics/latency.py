"""latency: delay every chunk by ``latency`` ms plus a uniform jitter in [-jitter, +jitter).

The delay counts from when the chunk was read, not from when it reaches this
toxic, so a stream keeps its throughput and only gains latency (as in Go).
"""

from __future__ import annotations

import random
from typing import Iterator

from .base import Attr, Chunk, Stub, Toxic


class Latency(Toxic):
    type_name = "latency"
    go_name = "LatencyToxic"
    attrs = (Attr("latency"), Attr("jitter"))

    def delay_s(self) -> float:
        values = self.values
        delay = values["latency"]
        jitter = values["jitter"]
        if jitter > 0:
            delay += random.randrange(-jitter, jitter)
        return delay / 1000.0

    def process(self, chunk: Chunk, stub: Stub) -> Iterator[Chunk]:
        target = chunk.ts + self.delay_s()
        if stub.sleep_until(target):
            # Later latency toxics add their delay on top of this one.
            chunk = Chunk(chunk.data, max(target, chunk.ts))
        yield chunk
