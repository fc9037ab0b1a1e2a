"""A Toxiproxy 2.12-compatible server in pure Python.

Any Toxiproxy client (HTTP, toxiproxy-python, the Go client) works unchanged.
Without active toxics, bytes move with zero-copy ``os.splice``.

    srv = ToxiproxyServer(host="127.0.0.1", port=0)
    srv.start()
    ...  # talk to srv.url
    srv.stop()
"""

from __future__ import annotations

from .cli import main
from .server import ToxiproxyServer

__all__ = ["ToxiproxyServer", "main"]
