"""Our Toxiproxy client against our server: timeouts, error mapping, retries."""
from __future__ import annotations

import socket
import time

import pytest

from chaos.client import BadRequest, Conflict, NotFound, ToxiproxyClient, Unreachable


@pytest.fixture
def client(srv) -> ToxiproxyClient:
    return ToxiproxyClient(srv.url)


def test_round_trip(client: ToxiproxyClient) -> None:
    assert client.version() == "2.12.0"
    proxy = client.create_proxy("p", "127.0.0.1:0", "127.0.0.1:9")
    assert proxy["listen"] != "127.0.0.1:0"
    toxic = client.add_toxic("p", "latency", "upstream", attributes={"latency": 50})
    assert toxic["name"] == "latency_upstream"
    updated = client.update_toxic("p", "latency_upstream", {"jitter": 5})
    assert updated["attributes"] == {"latency": 50, "jitter": 5}
    assert client.disable("p")["enabled"] is False
    assert client.clear("p") == 1
    assert client.proxy("p")["enabled"] is True and client.toxics("p") == []
    client.delete_proxy("p")
    assert client.proxies() == {}


def test_errors_map_to_exceptions(client: ToxiproxyClient) -> None:
    client.create_proxy("p", "127.0.0.1:0", "127.0.0.1:9")
    with pytest.raises(Conflict, match="proxy already exists"):
        client.create_proxy("p", "127.0.0.1:0", "127.0.0.1:9")
    with pytest.raises(NotFound, match="proxy not found"):
        client.proxy("nope")
    with pytest.raises(BadRequest, match="invalid toxic type"):
        client.add_toxic("p", "explode")
    with pytest.raises(NotFound, match="toxic not found"):
        client.remove_toxic("p", "latency_downstream")


def test_unreachable_server_fails_within_budget() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = ToxiproxyClient(f"http://127.0.0.1:{port}", timeout=0.5, attempts=3, retry_budget=3.0)
    started = time.monotonic()
    with pytest.raises(Unreachable, match="did not answer"):
        client.version()
    assert time.monotonic() - started < 6


def test_silent_server_times_out() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # accepts connections, never answers
        client = ToxiproxyClient(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=0.3, attempts=2,
                                 retry_budget=2.0)
        started = time.monotonic()
        with pytest.raises(Unreachable):
            client.proxies()
        assert time.monotonic() - started < 4
