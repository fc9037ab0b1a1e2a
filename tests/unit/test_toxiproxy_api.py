"""HTTP contract of our Toxiproxy server: codes, bodies, content types, semantics.

Every expectation comes from Toxiproxy 2.12 (api.go and observed behaviour);
see /work/shared/reference/toxiproxy-api.md.
"""

from __future__ import annotations

import http.client
import json
import socket

import pytest
import requests

from chaos.toxiproxy.testing import EchoServer, connect, port_of, round_trip, wait_until

TEXT = "text/plain; charset=utf-8"


@pytest.fixture
def api(srv):
    session = requests.Session()
    session.headers["User-Agent"] = "pytest-toxiproxy"

    def call(method: str, path: str, body=None, raw: bytes | None = None, **kw):
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        return session.request(method, srv.url + path, data=data, timeout=10, **kw)

    yield call
    session.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def assert_error(resp, status: int, message: str) -> None:
    assert resp.status_code == status
    assert resp.headers["Content-Type"] == TEXT
    assert resp.text == json.dumps({"error": message, "status": status}, separators=(",", ":")) + "\n"


def create(api, echo, name="p", **extra):
    body = {"name": name, "listen": "127.0.0.1:0", "upstream": echo.address, **extra}
    resp = api("POST", "/proxies", body)
    assert resp.status_code == 201, resp.text
    return resp.json()


# --- routing and middleware -------------------------------------------------------


def test_version_exact_bytes_and_content_type(api):
    resp = api("GET", "/version")
    assert resp.status_code == 200
    assert resp.content == b'{"version": "2.12.0"}\n'
    assert resp.headers["Content-Type"] == "application/json;charset=utf-8"


@pytest.mark.parametrize("path", ["/nope", "/proxies/a/b", "/proxies/", "/version/x", "/"])
def test_unknown_path_is_404_plain(api, path):
    resp = api("GET", path)
    assert resp.status_code == 404
    assert resp.text == "404 page not found\n"
    assert resp.headers["Content-Type"] == TEXT


@pytest.mark.parametrize("method,path", [
    ("PUT", "/proxies"), ("DELETE", "/proxies"), ("GET", "/reset"), ("GET", "/populate"),
    ("POST", "/version"), ("PUT", "/proxies/p"), ("DELETE", "/proxies/p/toxics"),
    ("PUT", "/proxies/p/toxics/t"), ("HEAD", "/version"),
])
def test_wrong_method_is_405_with_empty_body(api, method, path):
    resp = api(method, path)
    assert resp.status_code == 405
    assert resp.content == b""


def test_browsers_are_refused_with_403(api):
    resp = api("GET", "/proxies", headers={"User-Agent": "Mozilla/5.0 (X11; Linux x86_64)"})
    assert resp.status_code == 403
    assert resp.text == "User agent not allowed\n"
    assert api("GET", "/proxies", headers={"User-Agent": "curl/8.0 Mozilla/5.0"}).status_code == 200


@pytest.mark.parametrize("path,location", [("//proxies", "/proxies"),
                                           ("/proxies/../version", "/version")])
def test_unclean_path_redirects_like_mux(srv, path, location):
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        conn.request("GET", path)  # http.client sends the path as is (requests would clean it)
        resp = conn.getresponse()
        assert resp.status == 301
        assert resp.getheader("Location") == location
        assert resp.read() == b""
    finally:
        conn.close()


def test_request_id_header_on_routed_requests(api):
    assert len(api("GET", "/proxies").headers["X-Toxiproxy-Request-Id"]) == 20
    assert "X-Toxiproxy-Request-Id" not in api("GET", "/nope").headers


# --- proxies --------------------------------------------------------------------------


def test_list_is_empty_object(api):
    resp = api("GET", "/proxies")
    assert resp.status_code == 200
    assert resp.headers["Content-Type"] == "application/json"
    assert resp.content == b"{}"


def test_create_rewrites_port_zero_and_proxies_traffic(api, echo):
    proxy = create(api, echo, "echo")
    assert list(proxy) == ["name", "listen", "upstream", "enabled", "toxics"]
    assert proxy["enabled"] is True and proxy["toxics"] == []
    assert proxy["upstream"] == echo.address
    host, port = proxy["listen"].rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    with connect(proxy["listen"]) as sock:
        round_trip(sock, b"hello")
    listed = api("GET", "/proxies").json()
    assert listed == {"echo": proxy}
    assert api("GET", "/proxies/echo").json() == proxy


def test_create_localhost_is_resolved_in_listen(api, echo):
    proxy = create(api, echo, listen="localhost:0")
    assert proxy["listen"].startswith("127.0.0.1:")


def test_list_sorted_by_name(api, echo):
    for name in ("b", "c", "a"):
        create(api, echo, name)
    assert list(api("GET", "/proxies").json()) == ["a", "b", "c"]


def test_create_duplicate_is_409(api, echo):
    create(api, echo, "dup")
    resp = api("POST", "/proxies", {"name": "dup", "listen": "127.0.0.1:0", "upstream": echo.address})
    assert_error(resp, 409, "proxy already exists")


@pytest.mark.parametrize("body,message", [
    ({"listen": "127.0.0.1:0", "upstream": "127.0.0.1:1"}, "missing required field: name"),
    ({"name": "", "upstream": "127.0.0.1:1"}, "missing required field: name"),
    ({"name": "x", "listen": "127.0.0.1:0"}, "missing required field: upstream"),
])
def test_create_missing_fields_is_400(api, body, message):
    assert_error(api("POST", "/proxies", body), 400, message)


@pytest.mark.parametrize("raw,message", [
    (b"", "bad request body: EOF"),
    (b"{", "bad request body: unexpected EOF"),
    (b"nope", "bad request body: invalid character 'n' looking for beginning of value"),
    (b'{"name": 5, "upstream": "x"}', "bad request body: json: cannot unmarshal number 5 "
                                      "into Go struct field Proxy.name of type string"),
    (b'{"name": "x", "upstream": "y", "enabled": "yes"}',
     "bad request body: json: cannot unmarshal string into Go struct field Proxy.enabled of type bool"),
    (b"[]", "bad request body: json: cannot unmarshal array into Go value of type toxiproxy.Proxy"),
])
def test_create_bad_body_is_400(api, raw, message):
    assert_error(api("POST", "/proxies", raw=raw), 400, message)


def test_create_ignores_trailing_data_and_toxics_and_is_case_insensitive(api, echo):
    raw = json.dumps({"Name": "ci", "LISTEN": "127.0.0.1:0", "upstream": echo.address,
                      "toxics": [{"type": "latency"}]}).encode() + b" trailing garbage"
    resp = api("POST", "/proxies", raw=raw)
    assert resp.status_code == 201, resp.text
    assert resp.json()["name"] == "ci" and resp.json()["toxics"] == []


def test_create_disabled_does_not_listen(api, echo):
    port = free_port()
    proxy = create(api, echo, "off", listen=f"127.0.0.1:{port}", enabled=False)
    assert proxy["enabled"] is False and proxy["listen"] == f"127.0.0.1:{port}"
    assert refused(port)


def test_create_bind_error_is_500(api, echo):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        resp = api("POST", "/proxies", {"name": "busy", "listen": f"127.0.0.1:{port}",
                                        "upstream": echo.address})
    assert_error(resp, 500, f"listen tcp 127.0.0.1:{port}: bind: address already in use")
    assert api("GET", "/proxies/busy").status_code == 404


def test_create_bad_listen_is_500(api):
    resp = api("POST", "/proxies", {"name": "bad", "listen": "nocolon", "upstream": "127.0.0.1:1"})
    assert_error(resp, 500, "listen tcp: address nocolon: missing port in address")


def test_show_missing_is_404(api):
    assert_error(api("GET", "/proxies/ghost"), 404, "proxy not found")


@pytest.mark.parametrize("method", ["POST", "PATCH"])
def test_update_keeps_omitted_fields_and_toggles_enabled(api, echo, method):
    proxy = create(api, echo, "u")
    port = port_of(proxy["listen"])
    with connect(proxy["listen"]) as live:
        round_trip(live)
        resp = api(method, "/proxies/u", {"enabled": False})
        assert resp.status_code == 200
        assert resp.json() == {**proxy, "enabled": False}
        live.settimeout(2)
        assert live.recv(10) == b""  # disabling closes live connections at once
    assert refused(port)
    resp = api(method, "/proxies/u", {"enabled": True})
    assert resp.json() == proxy  # same address again
    with connect(proxy["listen"]) as sock:
        round_trip(sock)


def test_update_changed_listen_restarts_listener(api, echo):
    proxy = create(api, echo, "mv")
    old_port = port_of(proxy["listen"])
    new_port = free_port()
    resp = api("PATCH", "/proxies/mv", {"listen": f"127.0.0.1:{new_port}"})
    assert resp.status_code == 200
    assert resp.json()["listen"] == f"127.0.0.1:{new_port}" and resp.json()["enabled"] is True
    assert refused(old_port)
    with connect(resp.json()["listen"]) as sock:
        round_trip(sock)


def test_update_changed_upstream_applies_to_new_connections(api, echo):
    proxy = create(api, echo, "up", upstream="127.0.0.1:1")
    resp = api("PATCH", "/proxies/up", {"upstream": echo.address})
    assert resp.json()["upstream"] == echo.address and resp.json()["listen"] == proxy["listen"]
    with connect(proxy["listen"]) as sock:
        round_trip(sock)


def test_update_errors(api, echo):
    assert_error(api("PATCH", "/proxies/ghost", {"enabled": False}), 404, "proxy not found")
    create(api, echo, "e")
    assert_error(api("PATCH", "/proxies/e", raw=b"{bad"), 400,
                 "bad request body: invalid character 'b' looking for beginning of value")


def test_delete_is_204_then_404(api, echo):
    proxy = create(api, echo, "d")
    with connect(proxy["listen"]) as live:
        round_trip(live)  # accepted and linked, not just queued in the listen backlog
        resp = api("DELETE", "/proxies/d")
        assert resp.status_code == 204 and resp.content == b""
        live.settimeout(2)
        assert live.recv(10) == b""
    assert refused(port_of(proxy["listen"]))
    assert_error(api("DELETE", "/proxies/d"), 404, "proxy not found")


# --- toxics ------------------------------------------------------------------------------


def test_toxic_list_is_empty_array(api, echo):
    create(api, echo, "t")
    resp = api("GET", "/proxies/t/toxics")
    assert resp.status_code == 200 and resp.content == b"[]"
    assert_error(api("GET", "/proxies/ghost/toxics"), 404, "proxy not found")


def test_toxic_create_defaults_and_200(api, echo):
    create(api, echo, "t")
    resp = api("POST", "/proxies/t/toxics", {"type": "latency", "attributes": {"latency": 10}})
    assert resp.status_code == 200  # not 201
    assert resp.headers["Content-Type"] == "application/json"
    assert resp.content == (b'{"attributes":{"latency":10,"jitter":0},"name":"latency_downstream",'
                            b'"type":"latency","stream":"downstream","toxicity":1}')
    assert api("GET", "/proxies/t/toxics/latency_downstream").json() == resp.json()
    assert api("GET", "/proxies/t").json()["toxics"] == [resp.json()]


@pytest.mark.parametrize("type_name,attributes", [
    ("latency", {"latency": 0, "jitter": 0}), ("bandwidth", {"rate": 0}),
    ("slow_close", {"delay": 0}), ("timeout", {"timeout": 0}), ("reset_peer", {"timeout": 0}),
    ("slicer", {"average_size": 0, "size_variation": 0, "delay": 0}),
    ("limit_data", {"bytes": 0}), ("noop", {}),
])
def test_every_toxic_type_with_default_attributes(api, echo, type_name, attributes):
    create(api, echo, "t")
    resp = api("POST", "/proxies/t/toxics", {"type": type_name, "stream": "upstream",
                                             "toxicity": 0.5})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"attributes": attributes, "name": f"{type_name}_upstream",
                           "type": type_name, "stream": "upstream", "toxicity": 0.5}


def test_toxic_create_errors(api, echo):
    assert_error(api("POST", "/proxies/ghost/toxics", {"type": "latency"}), 404, "proxy not found")
    create(api, echo, "t")
    assert_error(api("POST", "/proxies/t/toxics", {"type": "nope"}), 400, "invalid toxic type")
    assert_error(api("POST", "/proxies/t/toxics", {}), 400, "invalid toxic type")
    assert_error(api("POST", "/proxies/t/toxics", {"type": "latency", "stream": "sideways"}), 400,
                 "stream was invalid, can be either upstream or downstream")
    assert_error(api("POST", "/proxies/t/toxics", raw=b""), 400, "bad request body: EOF")
    api("POST", "/proxies/t/toxics", {"type": "latency"})
    assert_error(api("POST", "/proxies/t/toxics", {"type": "latency"}), 409, "toxic already exists")
    # Names are unique across both streams.
    assert_error(api("POST", "/proxies/t/toxics", {"name": "latency_downstream", "type": "noop",
                                                   "stream": "upstream"}), 409, "toxic already exists")


@pytest.mark.parametrize("attributes,fragment", [
    ({"latency": -5}, "attribute latency must be at least 0, got -5"),
    ({"latency": "100"}, "json: cannot unmarshal string into Go struct field "
                         "LatencyToxic.attributes.latency of type int64"),
    ({"latency": 1.5}, "json: cannot unmarshal number 1.5 into Go struct field "
                       "LatencyToxic.attributes.latency of type int64"),
    ({"jitter": True}, "json: cannot unmarshal bool into Go struct field "
                       "LatencyToxic.attributes.jitter of type int64"),
])
def test_toxic_attribute_validation(api, echo, attributes, fragment):
    create(api, echo, "t")
    resp = api("POST", "/proxies/t/toxics", {"type": "latency", "attributes": attributes})
    assert_error(resp, 400, f"bad request body: {fragment}")
    assert api("GET", "/proxies/t/toxics").json() == []


def test_toxic_attributes_must_be_object(api, echo):
    create(api, echo, "t")
    resp = api("POST", "/proxies/t/toxics", {"type": "latency", "attributes": [1]})
    assert resp.status_code == 400 and "bad request body: json: cannot unmarshal array" in resp.text


def test_negative_bandwidth_rate_is_allowed_as_unlimited(api, echo):
    create(api, echo, "t")
    resp = api("POST", "/proxies/t/toxics", {"type": "bandwidth", "attributes": {"rate": -1}})
    assert resp.status_code == 200 and resp.json()["attributes"] == {"rate": -1}


def test_toxic_order_is_upstream_then_downstream(api, echo):
    create(api, echo, "t")
    for name, stream in (("d1", "downstream"), ("u1", "upstream"), ("d2", "downstream")):
        api("POST", "/proxies/t/toxics", {"name": name, "type": "noop", "stream": stream})
    assert [t["name"] for t in api("GET", "/proxies/t/toxics").json()] == ["u1", "d1", "d2"]


@pytest.mark.parametrize("method", ["POST", "PATCH"])
def test_toxic_update_merges_and_keeps_identity(api, echo, method):
    create(api, echo, "t")
    api("POST", "/proxies/t/toxics", {"name": "lat", "type": "latency", "stream": "upstream",
                                      "attributes": {"latency": 100, "jitter": 5}})
    resp = api(method, "/proxies/t/toxics/lat", {
        "name": "renamed", "type": "bandwidth", "stream": "downstream", "toxicity": 0.25,
        "attributes": {"jitter": 7}})
    assert resp.status_code == 200
    assert resp.json() == {"attributes": {"latency": 100, "jitter": 7}, "name": "lat",
                           "type": "latency", "stream": "upstream", "toxicity": 0.25}
    assert api("GET", "/proxies/t/toxics/lat").json() == resp.json()


def test_toxic_update_errors_leave_toxic_unchanged(api, echo):
    create(api, echo, "t")
    assert_error(api("PATCH", "/proxies/ghost/toxics/x", {}), 404, "proxy not found")
    assert_error(api("PATCH", "/proxies/t/toxics/x", {}), 404, "toxic not found")
    original = api("POST", "/proxies/t/toxics", {"type": "latency", "attributes": {"latency": 9}}).json()
    assert_error(api("PATCH", "/proxies/t/toxics/latency_downstream",
                     {"attributes": {"latency": -1, "jitter": 3}}),
                 400, "bad request body: attribute latency must be at least 0, got -1")
    assert api("GET", "/proxies/t/toxics/latency_downstream").json() == original


def test_toxic_show_and_delete(api, echo):
    create(api, echo, "t")
    assert_error(api("GET", "/proxies/t/toxics/x"), 404, "toxic not found")
    assert_error(api("GET", "/proxies/ghost/toxics/x"), 404, "proxy not found")
    api("POST", "/proxies/t/toxics", {"type": "noop"})
    resp = api("DELETE", "/proxies/t/toxics/noop_downstream")
    assert resp.status_code == 204 and resp.content == b""
    assert_error(api("DELETE", "/proxies/t/toxics/noop_downstream"), 404, "toxic not found")
    assert api("GET", "/proxies/t/toxics").json() == []


def test_toxicity_prints_like_go_float32(api, echo):
    create(api, echo, "t")
    resp = api("POST", "/proxies/t/toxics", {"type": "noop", "toxicity": 0.1})
    assert b'"toxicity":0.1}' in resp.content
    resp = api("PATCH", "/proxies/t/toxics/noop_downstream", {"toxicity": 0})
    assert b'"toxicity":0}' in resp.content


# --- reset --------------------------------------------------------------------------------


def test_reset_enables_proxies_and_removes_toxics(api, echo):
    a = create(api, echo, "a")
    create(api, echo, "b")
    api("POST", "/proxies/a/toxics", {"type": "latency", "attributes": {"latency": 5000}})
    api("PATCH", "/proxies/b", {"enabled": False})
    resp = api("POST", "/reset")
    assert resp.status_code == 204 and resp.content == b""
    proxies = api("GET", "/proxies").json()
    assert all(p["enabled"] and p["toxics"] == [] for p in proxies.values())
    with connect(a["listen"]) as sock:
        assert round_trip(sock) < 2.0  # the 5 s latency is gone
    with connect(proxies["b"]["listen"]) as sock:
        round_trip(sock)


# --- populate ---------------------------------------------------------------------------


def test_populate_creates_and_returns_201(api, echo):
    body = [{"name": "p1", "listen": "127.0.0.1:0", "upstream": echo.address},
            {"name": "p2", "listen": "127.0.0.1:0", "upstream": echo.address, "enabled": False}]
    resp = api("POST", "/populate", body)
    assert resp.status_code == 201
    assert resp.headers["Content-Type"] == "application/json"
    proxies = resp.json()["proxies"]
    assert [p["name"] for p in proxies] == ["p1", "p2"]
    assert proxies[0]["enabled"] is True and port_of(proxies[0]["listen"]) > 0
    assert proxies[1]["enabled"] is False
    with connect(proxies[0]["listen"]) as sock:
        round_trip(sock)


def test_populate_is_idempotent_and_keeps_identical_proxies(api, echo):
    port = free_port()
    body = [{"name": "p", "listen": f"127.0.0.1:{port}", "upstream": echo.address}]
    first = api("POST", "/populate", body).json()["proxies"][0]
    api("POST", "/proxies/p/toxics", {"type": "noop"})
    with connect(first["listen"]) as live:
        second = api("POST", "/populate", body)
        assert second.status_code == 201
        assert second.json()["proxies"][0]["listen"] == first["listen"]
        assert [t["name"] for t in second.json()["proxies"][0]["toxics"]] == ["noop_downstream"]
        round_trip(live)  # the live connection survived


def test_populate_replaces_changed_proxy(api, echo):
    with EchoServer() as other:
        port = free_port()
        api("POST", "/populate", [{"name": "p", "listen": f"127.0.0.1:{port}", "upstream": echo.address}])
        api("POST", "/proxies/p/toxics", {"type": "noop"})
        resp = api("POST", "/populate", [{"name": "p", "listen": f"127.0.0.1:{port}",
                                          "upstream": other.address}])
        assert resp.status_code == 201
        replaced = resp.json()["proxies"][0]
        assert replaced["upstream"] == other.address and replaced["toxics"] == []
        with connect(replaced["listen"]) as sock:
            round_trip(sock)
        assert wait_until(lambda: other.accepted == 1, 2)


def test_populate_validates_everything_first(api, echo):
    body = [{"name": "ok", "listen": "127.0.0.1:0", "upstream": echo.address},
            {"name": "bad", "listen": "127.0.0.1:0"}]
    resp = api("POST", "/populate", body)
    assert resp.status_code == 400
    assert resp.headers["Content-Type"] == "application/json"
    assert resp.content == (b'{"error":"missing required field: upstream at proxy 2",'
                            b'"status":400,"proxies":null}')
    assert api("GET", "/proxies").json() == {}  # nothing was created
    resp = api("POST", "/populate", [{"upstream": echo.address}])
    assert resp.json() == {"error": "missing required field: name at proxy 1", "status": 400,
                           "proxies": None}


@pytest.mark.parametrize("raw", [b"", b"{}", b'{"name": "x"}', b"[1]", b"[{"])
def test_populate_bad_body_is_400_with_null_proxies(api, raw):
    resp = api("POST", "/populate", raw=raw)
    assert resp.status_code == 400
    body = resp.json()
    assert body["status"] == 400 and body["proxies"] is None
    assert body["error"].startswith("bad request body: ")


def test_populate_empty_array_returns_null_proxies(api):
    resp = api("POST", "/populate", [])
    assert resp.status_code == 201 and resp.content == b'{"proxies":null}'


def test_populate_bind_error_is_500_with_partial_list(api, echo):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        busy = holder.getsockname()[1]
        resp = api("POST", "/populate", [
            {"name": "first", "listen": "127.0.0.1:0", "upstream": echo.address},
            {"name": "second", "listen": f"127.0.0.1:{busy}", "upstream": echo.address}])
    assert resp.status_code == 500
    body = resp.json()
    assert body["error"] == f"listen tcp 127.0.0.1:{busy}: bind: address already in use"
    assert [p["name"] for p in body["proxies"]] == ["first"]


def test_keep_alive_session_survives_errors(api, echo):
    for _ in range(3):
        assert api("GET", "/nope").status_code == 404
        assert api("POST", "/proxies", raw=b"{").status_code == 400
        assert api("GET", "/version").status_code == 200


# --- Go-compatible JSON helpers ------------------------------------------------------------


@pytest.mark.parametrize("value,text", [
    (1.0, "1"), (0.5, "0.5"), (0.1, "0.1"), (0.0, "0"), (0.3, "0.3"), (1e-7, "1e-7"),
    (123456.789, "123456.79"), (2.5e21, "2.5e+21"),
])
def test_float32_formatting_matches_go(value, text):
    from chaos.toxiproxy import jsonio

    assert jsonio.format_float32(jsonio.to_float32(value)) == text


def test_go_json_encoding_is_compact_and_html_safe():
    from chaos.toxiproxy import jsonio

    assert jsonio.dumps({"a": "<&>", "b": [1, None, True], "c": "é"}) == \
        '{"a":"\\u003c\\u0026\\u003e","b":[1,null,true],"c":"é"}'
