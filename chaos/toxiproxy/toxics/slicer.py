"""slicer: split chunks into pieces of about ``average_size`` +/- ``size_variation`` bytes.

Each piece is followed by ``delay`` microseconds. All bytes arrive, in order;
only the packet boundaries the receiver sees change. The split halves a chunk
recursively around its middle (as Go does), so pieces vary evenly.
"""

from __future__ import annotations

import random
from typing import Iterator

from .base import Attr, Chunk, Stub, Toxic


def split_points(size: int, average: int, variation: int) -> list[int]:
    """Boundaries [0, ..., size] of the pieces for a chunk of ``size`` bytes."""
    points = [0]

    def split(start: int, end: int) -> None:
        if (end - start) - average <= variation or end - start <= 1:
            points.append(end)
            return
        mid = start + (end - start) // 2
        if variation > 0:
            mid += random.randrange(-variation, variation)
        mid = min(max(mid, start + 1), end - 1)
        split(start, mid)
        split(mid, end)

    if size > 0:
        split(0, size)
    return points


class Slicer(Toxic):
    type_name = "slicer"
    go_name = "SlicerToxic"
    attrs = (Attr("average_size", "int"), Attr("size_variation", "int"), Attr("delay", "int"))

    def process(self, chunk: Chunk, stub: Stub) -> Iterator[Chunk]:
        values = self.values
        data = chunk.data
        points = split_points(len(data), values["average_size"], values["size_variation"])
        delay = values["delay"] / 1_000_000.0
        for start, end in zip(points, points[1:]):
            yield Chunk(data[start:end], chunk.ts)
            if not stub.sleep(delay) and end < len(data):
                yield Chunk(data[end:], chunk.ts)
                return
