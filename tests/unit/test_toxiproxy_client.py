"""The unmodified toxiproxy-python client drives our server.

The client keeps its API address in class attributes of ``APIConsumer``;
``Toxiproxy().update_api_consumer(host, port)`` points it at our port, and the
fixture restores the defaults afterwards.
"""

from __future__ import annotations

import socket

import pytest
from toxiproxy import Toxiproxy
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from chaos.toxiproxy.testing import connect, port_of, round_trip


@pytest.fixture
def tp(srv):
    saved = (APIConsumer.host, APIConsumer.port)
    client = Toxiproxy()
    client.update_api_consumer("127.0.0.1", srv.port)
    yield client
    APIConsumer.host, APIConsumer.port = saved


def refused(listen: str) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port_of(listen)), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_running_and_version(tp):
    assert tp.running() is True
    assert tp.version() == b'{"version": "2.12.0"}\n'


def test_create_list_get_destroy(tp, echo):
    proxy = tp.create(upstream=echo.address, name="db")
    assert proxy.name == "db" and proxy.enabled is True and port_of(proxy.listen) > 0
    with connect(proxy.listen) as sock:
        round_trip(sock, b"through the client")
    assert set(tp.proxies()) == {"db"}
    fetched = tp.get_proxy("db")
    assert (fetched.listen, fetched.upstream) == (proxy.listen, echo.address)
    assert tp.get_proxy("missing") is None
    assert tp.destroy(proxy) is True
    assert tp.proxies() == {}
    assert refused(proxy.listen)
    with pytest.raises(NotFound):
        proxy.destroy()


def test_duplicate_create_raises(tp, echo):
    tp.create(upstream=echo.address, name="dup")
    with pytest.raises(ProxyExists):
        tp.create(upstream=echo.address, name="dup")


def test_add_list_remove_toxics(tp, echo):
    proxy = tp.create(upstream=echo.address, name="tox")
    proxy.add_toxic(type="latency", attributes={"latency": 300})
    proxy.add_toxic(name="cap", type="bandwidth", stream="upstream", toxicity=0.5,
                    attributes={"rate": 1000})
    toxics = proxy.toxics()
    assert set(toxics) == {"latency_downstream", "cap"}
    cap = proxy.get_toxic("cap")
    assert (cap.type, cap.stream, cap.toxicity, cap.attributes) == (
        "bandwidth", "upstream", 0.5, {"rate": 1000})
    with connect(proxy.listen) as sock:
        assert round_trip(sock) >= 0.28
        assert proxy.destroy_toxic("latency_downstream") is True
        assert round_trip(sock) < 0.25
    assert set(proxy.toxics()) == {"cap"}
    assert proxy.get_toxic("latency_downstream") is None
    with pytest.raises(NotFound):
        proxy.destroy_toxic("latency_downstream")


def test_invalid_toxic_raises(tp, echo):
    proxy = tp.create(upstream=echo.address, name="bad")
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="does_not_exist")
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="latency", attributes={"latency": -1})
    with pytest.raises(ProxyExists):  # the client maps every 409 to ProxyExists
        proxy.add_toxic(type="noop")
        proxy.add_toxic(type="noop")


def test_disable_enable_and_down(tp, echo):
    proxy = tp.create(upstream=echo.address, name="flappy")
    with connect(proxy.listen) as live:
        round_trip(live)  # accepted and linked, not just queued in the listen backlog
        proxy.disable()
        live.settimeout(2)
        assert live.recv(1) == b""
    assert proxy.enabled is False and tp.get_proxy("flappy").enabled is False
    assert refused(proxy.listen)
    proxy.enable()
    with connect(proxy.listen) as sock:
        round_trip(sock)
    with proxy.down():
        assert refused(proxy.listen)
    with connect(proxy.listen) as sock:
        round_trip(sock)


def test_reset(tp, echo):
    proxy = tp.create(upstream=echo.address, name="r")
    proxy.add_toxic(type="timeout", attributes={"timeout": 0})
    proxy.disable()
    assert tp.reset() is True
    assert proxy.toxics() == {}
    assert tp.get_proxy("r").enabled is True
    with connect(proxy.listen) as sock:
        round_trip(sock)


def test_populate_and_destroy_all(tp, echo):
    created = tp.populate([
        {"name": "one", "upstream": echo.address, "listen": "127.0.0.1:0"},
        {"name": "two", "upstream": echo.address, "listen": "127.0.0.1:0"},
    ])
    assert sorted(p.name for p in created) == ["one", "two"]
    two = tp.get_proxy("two")
    # Same name and addresses: the client leaves the proxy alone.
    again = tp.populate([{"name": "two", "upstream": two.upstream, "listen": two.listen}])
    assert again == [] and tp.get_proxy("two").listen == two.listen
    with connect(two.listen) as sock:
        round_trip(sock)
    tp.destroy_all()
    assert tp.proxies() == {}


def test_create_with_explicit_listen_and_disabled(tp, echo):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proxy = tp.create(upstream=echo.address, name="fixed", listen=f"127.0.0.1:{port}",
                      enabled=False)
    assert proxy.listen == f"127.0.0.1:{port}" and proxy.enabled is False
    assert refused(proxy.listen)
    proxy.enable()
    with connect(proxy.listen) as sock:
        round_trip(sock)
