"""Toxic effects measured on real sockets through our proxy (127.0.0.1 only).

Lower bounds on time are tight (they are what a toxic promises); upper bounds
are loose because the machine is small and shared.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time

import pytest
import requests

from chaos.toxiproxy import ToxiproxyServer
from chaos.toxiproxy.testing import (
    CLOSE_MARKER,
    EchoServer,
    SinkServer,
    connect,
    port_of,
    read_until_closed,
    recv_exact,
    round_trip,
    wait_until,
)

pytestmark = pytest.mark.integration


class Api:
    def __init__(self, url: str) -> None:
        self.url = url
        self.session = requests.Session()

    def call(self, method: str, path: str, body=None, expect: int = 200):
        resp = self.session.request(method, self.url + path, json=body, timeout=10)
        assert resp.status_code == expect, resp.text
        return resp.json() if resp.content else None

    def proxy(self, upstream: str, name: str = "p") -> str:
        body = {"name": name, "listen": "127.0.0.1:0", "upstream": upstream}
        return self.call("POST", "/proxies", body, expect=201)["listen"]

    def toxic(self, type_name: str, proxy: str = "p", **fields):
        return self.call("POST", f"/proxies/{proxy}/toxics", {"type": type_name, **fields})

    def update(self, toxic: str, proxy: str = "p", **fields):
        return self.call("PATCH", f"/proxies/{proxy}/toxics/{toxic}", fields)

    def remove(self, toxic: str, proxy: str = "p") -> None:
        self.call("DELETE", f"/proxies/{proxy}/toxics/{toxic}", expect=204)


@pytest.fixture
def api(srv):
    client = Api(srv.url)
    yield client
    client.session.close()


@pytest.fixture
def listen(api, echo):
    return api.proxy(echo.address)


# --- latency ----------------------------------------------------------------------


@pytest.mark.parametrize("stream", ["downstream", "upstream"])
def test_latency_adds_at_least_the_configured_delay(api, listen, stream):
    with connect(listen) as sock:
        assert round_trip(sock) < 0.25
        api.toxic("latency", stream=stream, attributes={"latency": 300})  # live connection
        delays = [round_trip(sock) for _ in range(3)]
    assert min(delays) >= 0.295
    assert max(delays) < 3.0


def test_latency_in_both_directions_adds_up(api, listen):
    api.toxic("latency", stream="upstream", attributes={"latency": 150})
    api.toxic("latency", stream="downstream", attributes={"latency": 150})
    with connect(listen) as sock:
        assert 0.295 <= round_trip(sock) < 3.0


def test_latency_keeps_throughput_of_a_stream(api, listen):
    # Each chunk waits 200 ms from its own arrival, so 20 back-to-back sends take about
    # 200 ms in total, not 20 x 200 ms.
    api.toxic("latency", attributes={"latency": 200})
    with connect(listen) as sock:
        start = time.monotonic()
        for i in range(20):
            sock.sendall(b"x" * 1000)
            time.sleep(0.005)
        recv_exact(sock, 20_000, timeout=10)
        elapsed = time.monotonic() - start
    assert 0.295 <= elapsed < 2.0


def test_latency_update_applies_to_live_connection(api, listen):
    api.toxic("latency", attributes={"latency": 100})
    with connect(listen) as sock:
        assert round_trip(sock) >= 0.095
        api.update("latency_downstream", attributes={"latency": 400})
        assert round_trip(sock) >= 0.395


def test_latency_jitter_stays_in_range(api, listen):
    api.toxic("latency", attributes={"latency": 200, "jitter": 100})
    with connect(listen) as sock:
        delays = [round_trip(sock) for _ in range(5)]
    assert min(delays) >= 0.095 and max(delays) < 3.0


def test_removing_latency_flushes_buffered_data(api, listen):
    api.toxic("latency", attributes={"latency": 5000})
    with connect(listen) as sock:
        sock.sendall(b"held")
        assert read_until_closed(sock, 0.3) == (b"", "timeout")  # held behind the 5 s latency
        start = time.monotonic()
        api.remove("latency_downstream")
        assert recv_exact(sock, 4, timeout=5) == b"held"
        assert time.monotonic() - start < 2.0
        assert round_trip(sock) < 0.5


# --- bandwidth ----------------------------------------------------------------------


@pytest.mark.parametrize("stream", ["upstream", "downstream"])
def test_bandwidth_caps_throughput_within_20_percent(api, stream):
    rate_kb = 400  # KB/s, 1 KB = 1000 bytes
    size = 600_000  # 1.5 s at the cap
    if stream == "upstream":
        server = SinkServer(expect=size)
    else:
        server = EchoServer()
    with server:
        listen = api.proxy(server.address)
        api.toxic("bandwidth", stream=stream, attributes={"rate": rate_kb})
        payload = os.urandom(size)
        with connect(listen) as sock:
            start = time.monotonic()
            if stream == "upstream":
                sock.sendall(payload)
                assert recv_exact(sock, 2, timeout=20) == b"ok"
            else:
                sender = threading.Thread(target=sock.sendall, args=(payload,))
                sender.start()
                assert recv_exact(sock, size, timeout=20) == payload
                sender.join()
            elapsed = time.monotonic() - start
    rate = size / elapsed / 1000
    assert rate <= rate_kb * 1.2, f"{rate:.0f} KB/s exceeds the {rate_kb} KB/s cap"
    assert rate >= rate_kb * 0.8, f"{rate:.0f} KB/s is far below the {rate_kb} KB/s cap"


def test_bandwidth_zero_rate_is_unlimited(api, listen):
    api.toxic("bandwidth", attributes={"rate": 0})
    payload = os.urandom(2_000_000)
    with connect(listen) as sock:
        start = time.monotonic()
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        assert recv_exact(sock, len(payload), timeout=20) == payload
        sender.join()
    assert time.monotonic() - start < 5.0


# --- timeout --------------------------------------------------------------------------


def test_timeout_zero_blackholes_until_removed(api, listen):
    with connect(listen) as sock:
        round_trip(sock)
        api.toxic("timeout", attributes={"timeout": 0})
        sock.sendall(b"into the void")
        data, how = read_until_closed(sock, timeout=0.8)
        assert (data, how) == (b"", "timeout")  # nothing back, and still open
        api.remove("timeout_downstream")  # removing it closes the affected connection
        data, how = read_until_closed(sock, timeout=3)
        assert data == b"" and how in ("eof", "reset")
    with connect(listen) as sock:
        round_trip(sock)  # new connections flow again


def test_timeout_closes_after_the_timeout(api, listen):
    api.toxic("timeout", attributes={"timeout": 400})
    with connect(listen) as sock:
        start = time.monotonic()
        sock.sendall(b"dropped")
        data, how = read_until_closed(sock, timeout=5)
        elapsed = time.monotonic() - start
    assert data == b"" and how in ("eof", "reset")
    assert 0.38 <= elapsed < 4.0


def test_timeout_upstream_drops_client_data(api, echo):
    listen = api.proxy(echo.address)
    api.toxic("timeout", stream="upstream", attributes={"timeout": 0})
    with connect(listen) as sock:
        sock.sendall(b"never arrives")
        assert read_until_closed(sock, timeout=0.6) == (b"", "timeout")


# --- reset_peer ------------------------------------------------------------------------


def test_reset_peer_gives_connection_reset(api, listen):
    api.toxic("reset_peer", attributes={"timeout": 0})
    with connect(listen) as sock:
        sock.sendall(b"trigger")
        with pytest.raises(ConnectionResetError):
            sock.settimeout(5)
            sock.recv(10)


def test_reset_peer_waits_for_its_timeout(api, listen):
    api.toxic("reset_peer", stream="upstream", attributes={"timeout": 300})
    with connect(listen) as sock:
        start = time.monotonic()
        sock.sendall(b"trigger")
        sock.settimeout(5)
        with pytest.raises(ConnectionResetError):
            sock.recv(10)
        assert 0.29 <= time.monotonic() - start < 4.0


# --- slicer ---------------------------------------------------------------------------------


def test_slicer_delivers_all_bytes_in_pieces(api, listen):
    api.toxic("slicer", attributes={"average_size": 100, "size_variation": 20, "delay": 20_000})
    payload = os.urandom(1000)
    with connect(listen) as sock:
        sock.sendall(payload)
        sock.settimeout(5)
        pieces = []
        while sum(map(len, pieces)) < len(payload):
            piece = sock.recv(65536)
            assert piece, "closed early"
            pieces.append(piece)
    assert b"".join(pieces) == payload
    assert len(pieces) >= 3  # ~10 slices 20 ms apart cannot all land in one read


def test_slicer_split_points_cover_the_chunk():
    from chaos.toxiproxy.toxics.slicer import split_points

    for size, avg, var in [(1000, 100, 20), (32768, 1, 0), (7, 0, 0), (500, 600, 0)]:
        points = split_points(size, avg, var)
        assert points[0] == 0 and points[-1] == size
        assert all(b > a for a, b in zip(points, points[1:]))


# --- limit_data ----------------------------------------------------------------------------


def test_limit_data_passes_exactly_n_bytes_then_closes(api, listen):
    api.toxic("limit_data", attributes={"bytes": 1000})
    payload = os.urandom(3000)
    with connect(listen) as sock:
        sock.sendall(payload)
        data, how = read_until_closed(sock, timeout=5)
    assert data == payload[:1000]
    assert how in ("eof", "reset")


def test_limit_data_upstream(api):
    with SinkServer(expect=10**9) as sink:
        listen = api.proxy(sink.address)
        api.toxic("limit_data", stream="upstream", attributes={"bytes": 500})
        with connect(listen) as sock:
            sock.sendall(b"a" * 400)
            sock.sendall(b"b" * 400)
            _, how = read_until_closed(sock, timeout=5)
        assert how in ("eof", "reset")
        assert wait_until(lambda: sink.received >= 500, 3)
        assert not wait_until(lambda: sink.received > 500, 0.2)
        assert sink.received == 500


# --- slow_close -------------------------------------------------------------------------------


def test_slow_close_delays_the_close(api, listen):
    with connect(listen) as sock:  # without the toxic the close is prompt
        start = time.monotonic()
        sock.sendall(CLOSE_MARKER)
        assert read_until_closed(sock, 5)[1] in ("eof", "reset")
        prompt = time.monotonic() - start
    api.toxic("slow_close", attributes={"delay": 500})
    with connect(listen) as sock:
        round_trip(sock, b"data still flows")
        start = time.monotonic()
        sock.sendall(CLOSE_MARKER)
        data, how = read_until_closed(sock, 5)
        slow = time.monotonic() - start
    assert how in ("eof", "reset") and data == b""
    assert slow >= 0.49
    assert prompt < 0.45


# --- enable / disable ------------------------------------------------------------------------


def test_disabled_proxy_refuses_and_kills_live_connections(api, listen):
    port = port_of(listen)
    with connect(listen) as live:
        round_trip(live)
        api.call("PATCH", "/proxies/p", {"enabled": False})
        start = time.monotonic()
        data, how = read_until_closed(live, 3)
        assert how == "eof" and time.monotonic() - start < 1.0
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)
    api.call("PATCH", "/proxies/p", {"enabled": True})
    with connect(listen) as sock:
        round_trip(sock)


def test_disable_kills_connections_stuck_in_toxics(api, listen):
    with connect(listen) as live:
        round_trip(live)
        api.toxic("latency", attributes={"latency": 10_000})
        api.toxic("timeout", stream="upstream", attributes={"timeout": 0})
        live.sendall(b"stuck")
        assert read_until_closed(live, 0.2) == (b"", "timeout")
        api.call("PATCH", "/proxies/p", {"enabled": False})
        _, how = read_until_closed(live, 3)
        assert how == "eof"


def test_upstream_dial_failure_closes_client(api):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]  # nothing listens here once closed
    listen = api.proxy(f"127.0.0.1:{dead}")
    with connect(listen) as sock:
        _, how = read_until_closed(sock, 3)
    assert how in ("eof", "reset")


def test_deleting_proxy_closes_live_connections(api, listen):
    with connect(listen) as live:
        round_trip(live)
        api.call("DELETE", "/proxies/p", expect=204)
        assert read_until_closed(live, 3)[1] == "eof"


# --- removal, toxicity, noop --------------------------------------------------------------


def test_removing_toxics_restores_the_flow(api, listen):
    api.toxic("latency", attributes={"latency": 400})
    api.toxic("bandwidth", stream="upstream", attributes={"rate": 1})
    with connect(listen) as sock:
        assert round_trip(sock) >= 0.395
        api.remove("latency_downstream")
        api.remove("bandwidth_upstream")
        assert round_trip(sock) < 0.3
        payload = os.urandom(1_000_000)
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        assert recv_exact(sock, len(payload), timeout=20) == payload
        sender.join()


def test_toxicity_zero_never_applies(api, listen):
    api.toxic("latency", attributes={"latency": 1000}, toxicity=0)
    api.toxic("timeout", stream="upstream", attributes={"timeout": 0}, toxicity=0)
    for _ in range(5):
        with connect(listen) as sock:
            assert round_trip(sock) < 0.5
    with connect(listen) as sock:
        api.remove("timeout_upstream")  # was never active here: nothing to close
        assert round_trip(sock) < 0.5


def test_toxicity_is_decided_per_connection(api, listen):
    # toxicity 1 always applies; raising it on a live connection re-rolls it there.
    api.toxic("latency", attributes={"latency": 300}, toxicity=0)
    with connect(listen) as sock:
        assert round_trip(sock) < 0.25
        api.update("latency_downstream", toxicity=1)
        assert round_trip(sock) >= 0.295


def test_noop_passes_everything(api, listen):
    api.toxic("noop", stream="upstream")
    api.toxic("noop")
    payload = os.urandom(100_000)
    with connect(listen) as sock:
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        assert recv_exact(sock, len(payload), timeout=10) == payload
        sender.join()


# --- integrity across fast/slow path switches --------------------------------------------


def test_stream_stays_ordered_while_toxics_come_and_go(api, listen):
    """Bytes keep their order and count while the link switches splice <-> toxic chain."""
    blocks = [i.to_bytes(4, "big") * 2048 for i in range(400)]  # 8 KiB each, 3.2 MiB
    expected = hashlib.sha256(b"".join(blocks)).hexdigest()
    received = hashlib.sha256()
    count = 0
    with connect(listen, timeout=30) as sock:

        def send() -> None:
            for block in blocks:
                sock.sendall(block)
                time.sleep(0.0005)

        sender = threading.Thread(target=send)
        sender.start()
        total = sum(map(len, blocks))
        sock.settimeout(30)
        toggles = 0
        while count < total:
            data = sock.recv(65536)
            assert data, "connection closed early"
            received.update(data)
            count += len(data)
            if toggles < 12 and count > (toggles + 1) * total // 14:
                if toggles % 2 == 0:
                    api.toxic("latency", stream=("upstream" if toggles % 4 else "downstream"),
                              attributes={"latency": 5, "jitter": 5})
                else:
                    api.remove("latency_" + ("upstream" if (toggles - 1) % 4 else "downstream"))
                toggles += 1
        sender.join()
    assert count == total
    assert received.hexdigest() == expected


def test_large_transfer_integrity_on_zero_copy_path(api, listen):
    payload = os.urandom(16 << 20)
    with connect(listen, timeout=30) as sock:
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        assert hashlib.sha256(recv_exact(sock, len(payload), timeout=60)).digest() == \
            hashlib.sha256(payload).digest()
        sender.join()


# --- server lifecycle ------------------------------------------------------------------------


def test_stop_closes_everything_quickly(echo):
    before = {t.ident for t in threading.enumerate()}
    server = ToxiproxyServer(port=0).start()
    api = Api(server.url)
    listen = api.proxy(echo.address)
    api.toxic("latency", attributes={"latency": 10_000})
    socks = [connect(listen) for _ in range(3)]
    for sock in socks:
        sock.sendall(b"pending")
        assert read_until_closed(sock, 0.1) == (b"", "timeout")  # held by the latency toxic
    api.session.close()
    start = time.monotonic()
    server.stop()
    assert time.monotonic() - start < 1.5
    for sock in socks:
        assert read_until_closed(sock, 2)[1] in ("eof", "reset")
        sock.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port_of(listen)), timeout=2)
    assert wait_until(lambda: {t.ident for t in threading.enumerate()} <= before, 3)
