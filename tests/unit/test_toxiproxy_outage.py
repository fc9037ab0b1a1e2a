"""A proxy whose upstream is down says so once, counts the failed connections, and sums
them up when the upstream answers again, instead of one unlabelled warning per connection."""
from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

from chaos.toxiproxy.outage import UpstreamOutages
from chaos.toxiproxy.proxy import Proxy
from chaos.toxiproxy.testing import wait_until

LOGGER = "chaos.toxiproxy.outage"


class Clock:
    now = 50.0

    def __call__(self) -> float:
        return self.now


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


def test_one_line_when_an_outage_begins_and_one_when_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    clock = Clock()
    outages = UpstreamOutages("learner-2", clock=clock)
    outages.answered()  # no outage: nothing to say
    for _ in range(30):
        outages.failed("127.0.0.1:7000", "unable to open a connection: Connection refused")
    assert outages.down and outages.failures == 30 and outages.outages == 1
    clock.now = 54.25
    outages.answered()
    said = warnings(caplog)
    assert said == [
        "proxy learner-2: upstream 127.0.0.1:7000 is down (unable to open a connection: Connection refused): its "
        "client connection was closed; further failed connections are counted until the upstream answers again",
        "proxy learner-2: upstream 127.0.0.1:7000 answers again after 4.2 s down: 30 client connection(s) failed "
        "to reach it",
    ]
    assert not outages.down and outages.failures == 0 and outages.total_failures == 30
    outages.failed("127.0.0.1:7000", "x")
    outages.stopped()
    assert outages.outages == 2
    assert warnings(caplog)[-1].endswith("was still down when the proxy stopped after 0.0 s down: 1 client "
                                         "connection(s) failed to reach it")


def test_an_outage_seen_to_end_has_its_line_written() -> None:
    """A slow log handler: whoever sees the outage end (the suite's proxy tests poll `down`)
    already finds the line that sums it up, not a moment later."""
    lines: list[str] = []

    class Slow(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            time.sleep(0.2)
            lines.append(record.getMessage())

    logger = logging.Logger("test.outage.slow", level=logging.INFO)  # not registered: nothing to undo
    logger.addHandler(Slow())
    outages = UpstreamOutages("learner-1", logger=logger)
    outages.failed("127.0.0.1:7000", "refused")
    assert len(lines) == 1
    ender = threading.Thread(target=outages.answered)
    ender.start()
    try:
        assert wait_until(lambda: not outages.down, timeout=5.0), "the outage did not end"
        assert len(lines) == 2 and "came up after" in lines[1], lines
    finally:
        ender.join(timeout=5.0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _connect_and_wait_for_close(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
        assert client.recv(1) == b"", "the proxy should close a client whose upstream cannot be reached"


def _listen(port: int) -> socket.socket:
    upstream = socket.socket()
    upstream.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    upstream.bind(("127.0.0.1", port))
    upstream.listen(4)
    return upstream


def _dial_through(port: int, proxy: Proxy) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        assert wait_until(lambda: not proxy.outages.down), "a successful dial should end the outage"


def test_a_real_proxy_reports_a_down_upstream_once(caplog: pytest.LogCaptureFixture) -> None:
    """Not up yet (a cluster's learners start beside the syncer) is said at info level;
    an outage after the upstream answered once is one warning, and one when it ends."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    upstream_port = _free_port()  # nothing listens there: connections are refused
    proxy = Proxy("learner-1", "127.0.0.1:0", f"127.0.0.1:{upstream_port}")
    proxy.start()
    try:
        port = int(proxy.listen.rsplit(":", 1)[1])
        for _ in range(3):
            _connect_and_wait_for_close(port)
        assert wait_until(lambda: proxy.outages.failures == 3), \
            f"3 failed dials should be counted, saw {proxy.outages.failures}"
        assert warnings(caplog) == [], "an upstream that never answered yet is starting, not down"
        with _listen(upstream_port):
            _dial_through(port, proxy)
        infos = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.INFO]
        assert len(infos) == 2 and "is not up yet" in infos[0] and "came up after" in infos[1] \
            and "3 client connection(s)" in infos[1], infos

        for _ in range(5):
            _connect_and_wait_for_close(port)
        assert wait_until(lambda: proxy.outages.failures == 5), \
            f"5 failed dials should be counted, saw {proxy.outages.failures}"
        assert len(warnings(caplog)) == 1 and "upstream 127.0.0.1" in warnings(caplog)[0]
        assert "is down" in warnings(caplog)[0] and "Connection refused" in warnings(caplog)[0]
        with _listen(upstream_port):
            _dial_through(port, proxy)
    finally:
        proxy.stop()
    said = warnings(caplog)
    assert len(said) == 2 and "answers again" in said[1] and "5 client connection(s)" in said[1]
