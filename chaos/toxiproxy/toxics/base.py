"""The one interface every toxic implements.

A ``Toxic`` holds the configuration shared by all connections (its
attributes). Per-connection behaviour runs through hooks that receive a
``Stub``: the link's handle for this toxic on one connection and direction.
Links drive the hooks from a single thread per direction, so a toxic never
needs its own locking; it only sleeps through ``stub.sleep_until`` so that
updates, removals and closes interrupt it at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, Protocol

from .. import jsonio


@dataclass
class Chunk:
    """Bytes read from the source, stamped with the monotonic time they arrived."""

    data: bytes
    ts: float


class Stub(Protocol):
    """What a link offers a toxic on one connection and direction."""

    state: Any  # from Toxic.new_state(); lives as long as the toxic on this link
    scratch: dict[str, Any]  # reset whenever the toxic is (re)started by an update
    timer: float | None  # monotonic deadline at which on_timer runs

    def now(self) -> float: ...

    def sleep_until(self, deadline: float) -> bool:
        """Wait; False if the toxic was updated or removed meanwhile (pass data on at once)."""

    def sleep(self, seconds: float) -> bool: ...

    def close(self) -> None:
        """End this direction: the destination is closed after what was already written."""

    def reset(self) -> None:
        """Abort the whole connection with SO_LINGER 0, so peers see RST."""


@dataclass(frozen=True)
class Attr:
    """One attribute: JSON name, Go type (for error texts) and the smallest valid value."""

    name: str
    go_type: str = "int64"
    minimum: int | None = 0


class Toxic:
    """Base class: attributes plus per-link hooks that default to "pass through"."""

    type_name: ClassVar[str] = ""
    go_name: ClassVar[str] = ""
    attrs: ClassVar[tuple[Attr, ...]] = ()
    # True when the toxic never changes the byte stream, so links may keep zero-copy forwarding.
    passthrough: ClassVar[bool] = False

    def __init__(self) -> None:
        self.values: dict[str, int] = {attr.name: 0 for attr in self.attrs}

    # --- configuration -------------------------------------------------

    def attributes(self) -> dict[str, int]:
        """The attributes as JSON, in Go's field order."""
        return dict(self.values)

    def merged(self, raw: Any) -> dict[str, int]:
        """Validate an ``attributes`` JSON value and merge it over the current values.

        Raises ``jsonio.DecodeError`` with the text Toxiproxy's 400 carries.
        """
        fields = {attr.name: attr.go_type for attr in self.attrs}
        decoded = jsonio.decode_struct(
            raw, fields, self.go_name, f"toxics.{self.go_name}", prefix="attributes."
        )
        for attr in self.attrs:
            value = decoded.get(attr.name)
            if value is not None and attr.minimum is not None and value < attr.minimum:
                raise jsonio.DecodeError(
                    f"attribute {attr.name} must be at least {attr.minimum}, got {value}"
                )
        out = dict(self.values)
        out.update(decoded)
        return out

    def apply(self, values: dict[str, int]) -> None:
        """Swap in validated values in one assignment, so readers never see half an update."""
        self.values = values

    # --- per-link behaviour ------------------------------------------

    def new_state(self) -> Any:
        return None

    def start(self, stub: Stub) -> None:
        """Called when the toxic starts (or restarts after an update) on a link."""

    def process(self, chunk: Chunk, stub: Stub) -> Iterator[Chunk]:
        """Yield what goes on down the chain; may sleep, drop, split, close."""
        yield chunk

    def on_eof(self, stub: Stub) -> None:
        """The source closed; return when the close may go on down the chain."""

    def on_timer(self, stub: Stub) -> None:
        """``stub.timer`` passed."""

    def on_remove(self, stub: Stub) -> None:
        """The toxic was removed while active on this link."""


def monotonic() -> float:
    return time.monotonic()
