"""bandwidth: cap throughput at ``rate`` KB/s (1 KB = 1000 bytes); rate <= 0 is unlimited.

Each chunk sleeps len/rate; chunks bigger than 100 ms worth of data are cut
into 100 ms slices so the receiver sees a steady trickle. Sleep overshoot is
carried into the next chunk so the average rate stays exact.
"""

from __future__ import annotations

from typing import Iterator

from .base import Attr, Chunk, Stub, Toxic


class Bandwidth(Toxic):
    type_name = "bandwidth"
    go_name = "BandwidthToxic"
    attrs = (Attr("rate", minimum=None),)

    def process(self, chunk: Chunk, stub: Stub) -> Iterator[Chunk]:
        rate = self.values["rate"]
        scratch = stub.scratch
        if rate <= 0:
            scratch["sleep"] = 0.0
            yield chunk
            return
        data = chunk.data
        sleep = scratch.get("sleep", 0.0) + len(data) / (rate * 1000.0)
        slice_len = rate * 100
        while len(data) > slice_len:
            if not stub.sleep(0.1):
                scratch["sleep"] = 0.0
                yield Chunk(data, chunk.ts)
                return
            yield Chunk(data[:slice_len], chunk.ts)
            data = data[slice_len:]
            sleep -= 0.1
        start = stub.now()
        if not stub.sleep(sleep):
            scratch["sleep"] = 0.0
            yield Chunk(data, chunk.ts)
            return
        scratch["sleep"] = sleep - (stub.now() - start)
        yield Chunk(data, chunk.ts)
