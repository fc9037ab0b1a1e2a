"""Toxic registry: type name -> class, one small module per toxic."""

from __future__ import annotations

from .bandwidth import Bandwidth
from .base import Attr, Chunk, Stub, Toxic
from .latency import Latency
from .limit_data import LimitData
from .noop import Noop
from .reset_peer import ResetPeer
from .slicer import Slicer
from .slow_close import SlowClose
from .timeout import Timeout

REGISTRY: dict[str, type[Toxic]] = {
    cls.type_name: cls
    for cls in (Latency, Bandwidth, SlowClose, Timeout, ResetPeer, Slicer, LimitData, Noop)
}


def new_toxic(type_name: str) -> Toxic | None:
    """A fresh toxic of that type with zeroed attributes, or None if the type is unknown."""
    cls = REGISTRY.get(type_name)
    return cls() if cls is not None else None


__all__ = ["REGISTRY", "Attr", "Chunk", "Stub", "Toxic", "new_toxic"]
