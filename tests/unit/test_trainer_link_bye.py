"""A learner's stop says BYE without waiting on a syncer gone silent: the BYE's answer is
awaited for the request timeout, not a deadline sized for a 64 MiB frame (37 s), and a link
still held by the network thread (waiting on that syncer) is shut down, not waited for."""
from __future__ import annotations

import socket
import threading
import time

from trainer import wire
from trainer.events import EventLog
from trainer.keys import learner_key
from trainer.link import Address, Link

SECRET = b"s" * 32
REQUEST_TIMEOUT = 0.5


def _silent_syncer_link(tmp_path) -> tuple[Link, socket.socket, list[bytes]]:
    """A link connected to a peer that does the handshake, then reads and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []

    def serve() -> None:
        conn, _ = server.accept()
        wire.server_handshake(conn, SECRET, time.monotonic() + 5)
        conn.settimeout(10)
        try:
            while chunk := conn.recv(65536):
                received.append(chunk)
        except OSError:
            pass
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    link = Link(Address("127.0.0.1", server.getsockname()[1]), learner_key(SECRET, 1), 1, "decoupled",
                EventLog(str(tmp_path), "learner-1"), REQUEST_TIMEOUT, threading.Event())
    sock = socket.create_connection(("127.0.0.1", server.getsockname()[1]), timeout=5)
    link.channel = wire.Channel.connect(sock, learner_key(SECRET, 1), time.monotonic() + 5, 1)
    return link, server, received


def test_bye_to_a_silent_syncer_waits_the_request_timeout_not_a_large_frames(tmp_path) -> None:
    link, server, received = _silent_syncer_link(tmp_path)
    started = time.monotonic()
    assert link.bye(wait=1.0) is False, "no answer came, yet BYE counted as said"
    took = time.monotonic() - started
    assert took < REQUEST_TIMEOUT + 2.0, f"the stop waited {took:.1f} s for BYE's answer"
    assert not link.connected
    server.close()


def test_bye_does_not_wait_for_a_network_thread_stuck_on_a_silent_syncer(tmp_path) -> None:
    link, server, _ = _silent_syncer_link(tmp_path)
    ended: list[str] = []

    def network_thread() -> None:  # a heartbeat whose answer never comes (a paused syncer)
        try:
            link.request(wire.message(wire.HEARTBEAT, {}))
            ended.append("answered")
        except Exception as exc:  # noqa: BLE001 - what ends the wait is the test
            ended.append(type(exc).__name__)

    worker = threading.Thread(target=network_thread, daemon=True)
    worker.start()
    deadline = time.monotonic() + 5
    while link.lock.acquire(blocking=False):  # bounded: until the network thread holds the link
        link.lock.release()
        assert time.monotonic() < deadline, "the network thread never took the link"
        time.sleep(0.01)
    started = time.monotonic()
    assert link.bye(wait=0.2) is False
    worker.join(timeout=5)
    took = time.monotonic() - started
    assert not worker.is_alive() and ended and ended[0] != "answered", ended
    assert took < 3.0, f"the stop and the network thread's wait ended {took:.1f} s after BYE"
    server.close()
