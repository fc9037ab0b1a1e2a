"""slow_close: data passes untouched, but the close is delayed by ``delay`` ms."""

from __future__ import annotations

from .base import Attr, Stub, Toxic


class SlowClose(Toxic):
    type_name = "slow_close"
    go_name = "SlowCloseToxic"
    attrs = (Attr("delay"),)

    def on_eof(self, stub: Stub) -> None:
        stub.sleep(self.values["delay"] / 1000.0)
