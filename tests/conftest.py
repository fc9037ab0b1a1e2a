"""Fixtures shared by every suite."""
from __future__ import annotations

import pytest

from chaos.toxiproxy import ToxiproxyServer
from chaos.toxiproxy.testing import EchoServer


@pytest.fixture
def srv():
    """Our Toxiproxy-compatible server on a free port of 127.0.0.1."""
    server = ToxiproxyServer(host="127.0.0.1", port=0).start()
    yield server
    server.stop()


@pytest.fixture
def echo():
    """A TCP echo server on 127.0.0.1."""
    with EchoServer() as server:
        yield server
