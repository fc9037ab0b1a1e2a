"""A learner's connection finds a peer whose kernel is gone (TCP_USER_TIMEOUT for bytes it
sent, keepalive while it waits) within seconds, not at the end of a reply deadline sized for
64 MiB."""
from __future__ import annotations

import socket
import threading

import pytest

from trainer import link as link_module
from trainer.events import EventLog
from trainer.link import KEEPALIVE_COUNT, KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, Address, Link


def liveness_of(sock: socket.socket) -> tuple[int, int, int, int, int]:
    return (sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT))


@pytest.mark.skipif(not hasattr(socket, "TCP_KEEPIDLE"), reason="TCP_KEEPIDLE is Linux's")
def test_the_learners_socket_probes_a_silent_peer(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    seen: list[tuple[int, int, int, int, int]] = []

    class Stop(Exception):
        pass

    def capture(sock, secret, deadline, identity):  # the handshake's first step: look at the socket, go no further
        seen.append(liveness_of(sock))
        raise Stop()

    monkeypatch.setattr(link_module.wire.Channel, "connect", classmethod(lambda cls, *a: capture(*a)))
    accepted = threading.Thread(target=lambda: server.accept()[0].close(), daemon=True)
    accepted.start()
    link = Link(Address("127.0.0.1", server.getsockname()[1]), b"s" * 32, 1, "decoupled",
                EventLog(str(tmp_path), "learner-1"), 5.0, threading.Event())
    with pytest.raises(Stop):
        link._handshake(want_params=False)
    server.close()
    # Bytes unacknowledged for the request timeout (5 s here) fail the connection; so does an
    # idle connection whose probes go unanswered.
    assert seen == [(1, KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT, 5000)]
    # Found dead well before the 5 s request deadline plus a 64 MiB frame's transfer time.
    assert KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * KEEPALIVE_COUNT < 5.0 + link_module.wire.DEFAULT_MAX_PAYLOAD / \
        link_module.MIN_WIRE_RATE
