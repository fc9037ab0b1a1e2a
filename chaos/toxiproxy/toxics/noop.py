"""noop: passes everything; useful to test that toxics can be listed and removed."""

from __future__ import annotations

from .base import Toxic


class Noop(Toxic):
    type_name = "noop"
    go_name = "NoopToxic"
    passthrough = True
