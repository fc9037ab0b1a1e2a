"""Regressions from the security probe (items 8-11) and the HTTP fuzz target's corpus.

Each expectation is what Toxiproxy 2.12 does with the same bytes: Go's net/http
reads the request, gorilla/mux routes it and encoding/json decodes the body.
See /work/shared/reference/toxiproxy-api.md.
"""

from __future__ import annotations

import importlib.util
import json
import random
import socket
import threading
import struct
import time
from pathlib import Path

import pytest
import requests

from chaos.toxiproxy import addr, jsonio
from chaos.toxiproxy.testing import port_of, wait_until

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "fuzz" / "corpus" / "toxiproxy_http"
TARGET = REPO / "fuzz" / "targets" / "toxiproxy_http.py"
TEXT = "text/plain; charset=utf-8"
IO_TIMEOUT_S = 10.0
MAX_REPLY = 1 << 20
MAX_BODY = 16 << 20


@pytest.fixture
def api(srv):
    session = requests.Session()
    session.headers["User-Agent"] = "pytest-toxiproxy"

    def call(method: str, path: str, body=None, raw: bytes | None = None, **kw):
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        return session.request(method, srv.url + path, data=data, timeout=10, **kw)

    yield call
    session.close()


def exchange(srv, data: bytes) -> bytes:
    """Send raw bytes, half-close, and read until the server closes (bounded in time and size)."""
    deadline = time.monotonic() + IO_TIMEOUT_S
    reply = b""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=IO_TIMEOUT_S) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        while len(reply) < MAX_REPLY and time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:  # refused with our bytes unread: the reply came first
                break
            if not chunk:
                break
            reply += chunk
    return reply


def head_of(reply: bytes) -> tuple[int, dict[str, str], list[bytes], bytes]:
    """(status, headers by lower-case name, raw header lines, body) of the first response."""
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, lines, body


def assert_go_transport_error(reply: bytes, status: int, text: str) -> None:
    """Go's own answer to a request it cannot read: plain text, no length, connection closed."""
    code, headers, _, body = head_of(reply)
    assert code == status, reply[:200]
    assert headers["content-type"] == TEXT
    assert headers["connection"] == "close"
    assert body == text.encode()


def assert_api_error(resp, status: int, message: str) -> None:
    assert resp.status_code == status, resp.text
    assert resp.headers["Content-Type"] == TEXT
    assert resp.text == json.dumps({"error": message, "status": status}, separators=(",", ":"),
                                   ensure_ascii=False) + "\n"


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def request(method: str, path: str, headers: dict[str, str] | None = None,
            version: str = "HTTP/1.1") -> bytes:
    lines = [f"{method} {path} {version}", "Host: 127.0.0.1", "User-Agent: pytest"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunked(method: str, path: str, body: bytes) -> bytes:
    return request(method, path, {"Transfer-Encoding": "chunked"}) + body


# --- item 8: strings Go cannot hold are replaced, never stored ------------------------------
# Go's encoding/json turns a lone UTF-16 surrogate escape, and each byte of invalid
# UTF-8, into U+FFFD; Toxiproxy therefore creates the proxy (201) under the replaced
# name, and no later call can fail on it.


def test_lone_surrogate_in_proxy_name_is_replaced_like_go(api, echo):
    raw = ('{"name":"sur\\ud800x","listen":"127.0.0.1:0","upstream":"%s"}' % echo.address).encode()
    resp = api("POST", "/proxies", raw=raw)
    assert resp.status_code == 201, resp.text
    assert resp.json()["name"] == "sur\ufffdx"
    port = port_of(resp.json()["listen"])
    listing = api("GET", "/proxies")
    assert listing.status_code == 200
    assert list(listing.json()) == ["sur\ufffdx"]
    assert api("POST", "/reset").status_code == 204
    assert api("DELETE", "/proxies/sur%EF%BF%BDx").status_code == 204
    assert api("GET", "/proxies").json() == {}
    assert refused(port)


def test_lone_surrogates_in_every_string_field_are_replaced(api, echo):
    raw = (b'{"name":"\\udfff","listen":"127.0.0.1:0","upstream":"%s\\udc00"}'
           % echo.address.encode())
    resp = api("POST", "/proxies", raw=raw)
    assert resp.status_code == 201, resp.text
    assert resp.json()["upstream"] == echo.address + "\ufffd"
    toxic = api("POST", "/proxies/%EF%BF%BD/toxics",
                raw=b'{"name":"t\\ud83dy","type":"latency","stream":"up\\udbffstream"}')
    assert_api_error(toxic, 400, "stream was invalid, can be either upstream or downstream")
    toxic = api("POST", "/proxies/%EF%BF%BD/toxics", raw=b'{"name":"t\\ud83dy","type":"latency"}')
    assert toxic.status_code == 200, toxic.text
    assert toxic.json()["name"] == "t\ufffdy"
    assert api("GET", "/proxies").status_code == 200
    assert api("GET", "/proxies/%EF%BF%BD/toxics").status_code == 200
    assert api("DELETE", "/proxies/%EF%BF%BD/toxics/t%EF%BF%BDy").status_code == 204


def test_lone_surrogate_in_populate_is_replaced(api, echo):
    raw = b'[{"name":"p\\ud800","listen":"127.0.0.1:0","upstream":"%s"}]' % echo.address.encode()
    resp = api("POST", "/populate", raw=raw)
    assert resp.status_code == 201, resp.text
    assert [p["name"] for p in resp.json()["proxies"]] == ["p\ufffd"]
    assert api("GET", "/proxies").status_code == 200


def test_invalid_utf8_is_one_replacement_per_byte_like_go(api, echo):
    raw = b'{"name":"a\xe2\x82b\xffc","listen":"127.0.0.1:0","upstream":"%s"}' % echo.address.encode()
    resp = api("POST", "/proxies", raw=raw)
    assert resp.status_code == 201, resp.text
    assert resp.json()["name"] == "a\ufffd\ufffdb\ufffdc"


def test_go_marshal_never_emits_a_surrogate():
    assert jsonio.dumps({"a\udc80": ["x\ud800"]}) == '{"a\ufffd":["x\ufffd"]}'
    assert jsonio.dumps("ok\U0001F600") == '"ok\U0001F600"'


# --- item 9: bodies are capped however they are framed ------------------------------------


@pytest.mark.parametrize("size_line", [
    b"-1", b"+5", b" 5", b"5 ;ext", b"0x5", b"5_0", "\u0665".encode(), b"", b"g",
    b"1" * 17, b"5\x00", b"-0",
])
def test_malformed_chunk_size_is_400(srv, size_line):
    reply = exchange(srv, chunked("GET", "/version", size_line + b"\r\n"))
    assert_go_transport_error(reply, 400, "400 Bad Request")


@pytest.mark.parametrize("body", [
    b"5\r\nhelloXX0\r\n\r\n",                        # chunk data not followed by CRLF
    b"5\r\nhello\r\n0\r\n" + b"X-T: v\r\n" * 600,  # trailer never ends within 4 KiB
    b"1;" + b"e" * 5000 + b"\r\nx\r\n",              # one chunk line over Go's 4 KiB limit
    b"".join(b"1;" + b"e" * 4000 + b"\r\nx\r\n" for _ in range(5)),  # Go: too much non-data
])
def test_malformed_chunked_framing_is_400(srv, body):
    reply = exchange(srv, chunked("GET", "/version", body))
    assert_go_transport_error(reply, 400, "400 Bad Request")


@pytest.mark.parametrize("size_line", [b"5", b"05", b"5;name=val", b'5;q="a b"', b"5 \t", b"00005"])
def test_valid_chunk_sizes_are_read(srv, size_line):
    body = b'{"a":'
    data = chunked("POST", "/populate", size_line + b"\r\n" + body + b"\r\n2\r\n1}\r\n0\r\n\r\n")
    code, _, _, payload = head_of(exchange(srv, data))
    assert code == 400
    assert b"cannot unmarshal object into Go value of type []toxiproxy.Proxy" in payload


def test_chunked_body_with_trailer_is_read(srv):
    data = chunked("POST", "/populate", b"2\r\n[]\r\n0\r\nX-Trailer: 1\r\n\r\n")
    code, _, _, payload = head_of(exchange(srv, data))
    assert code == 201
    assert payload == b'{"proxies":null}'


def test_content_length_over_cap_is_413(srv):
    reply = exchange(srv, request("POST", "/proxies", {"Content-Length": str(MAX_BODY + 1)}))
    assert_go_transport_error(reply, 413, "413 Request Entity Too Large")


def test_chunk_declared_over_cap_is_413(srv):
    reply = exchange(srv, chunked("POST", "/proxies", b"%x\r\n" % (MAX_BODY + 1)))
    assert_go_transport_error(reply, 413, "413 Request Entity Too Large")


def test_chunks_summing_over_cap_are_413(srv):
    half = MAX_BODY // 2
    body = (b"%x\r\n" % half + b"x" * half + b"\r\n") * 2 + b"1\r\n"
    reply = exchange(srv, chunked("POST", "/proxies", body))
    assert_go_transport_error(reply, 413, "413 Request Entity Too Large")


def test_body_at_cap_is_accepted(srv):
    body = b"[]" + b" " * (MAX_BODY - 2)
    data = request("POST", "/populate", {"Content-Length": str(len(body))}) + body
    code, _, _, payload = head_of(exchange(srv, data))
    assert code == 201 and payload == b'{"proxies":null}'


@pytest.mark.parametrize("line", [b"GARBAGE", b"Bad Name: 1", b"Content-Length : 2"])
def test_malformed_header_line_is_400_like_go(srv, line):
    # http.server would drop every header after such a line, Content-Length included,
    # and read the body as the next request.
    data = b"POST /populate HTTP/1.1\r\nHost: x\r\n" + line + b"\r\nContent-Length: 2\r\n\r\n[]"
    assert_go_transport_error(exchange(srv, data), 400, "400 Bad Request")


@pytest.mark.parametrize("encoding", ["gzip", "chunked, chunked", "identity"])
def test_unsupported_transfer_encoding_is_501_like_go(srv, encoding):
    reply = exchange(srv, request("POST", "/populate", {"Transfer-Encoding": encoding}))
    assert_go_transport_error(reply, 501, "Unsupported transfer encoding")


def test_body_without_framing_is_empty(srv):
    code, _, _, payload = head_of(exchange(srv, request("POST", "/populate")))
    assert code == 400
    assert json.loads(payload)["error"] == "bad request body: EOF"


# --- item 10: nothing from a request reaches a response header unescaped -----------------


@pytest.mark.parametrize("target,location", [
    ("//x%0d%0aInjected:%20yes", "/x%0D%0AInjected:%20yes"),
    ("//%E2%98%83", "/%E2%98%83"),
    ("//caf%C3%A9", "/caf%C3%A9"),
    ("//%FF", "/%FF"),
    ("//a%3Fb?q=1", "/a%3Fb?q=1"),
    ("//a?", "/a?"),
    ("/a/../b%20c*", "/b%20c%2A"),
    ("/p/../a://b", "/a:/b"),
])
def test_redirect_location_is_escaped_like_go(srv, target, location):
    reply = exchange(srv, request("GET", target))
    code, headers, lines, body = head_of(reply)
    assert code == 301
    assert headers["location"] == location
    assert not any(line.lower().startswith(b"injected") for line in lines)
    assert all(b"\r" not in line and b"\n" not in line for line in lines)


def test_absolute_target_routes_its_path_and_never_echoes_the_host(srv):
    code, headers, _, _ = head_of(exchange(srv, request("GET", "http://evil%0d%0a//version")))
    assert code == 301 and headers["location"] == "/version"
    code, _, _, body = head_of(exchange(srv, request("GET", "http://h/version")))
    assert code == 200 and body == b'{"version": "2.12.0"}\n'


def test_header_values_never_carry_controls():
    from chaos.toxiproxy import httpreq

    assert httpreq.header_value("a\r\nb\x00\x7f\u00fc\u2603") == "a%0D%0Ab%00%7F\u00fc%E2%98%83"


@pytest.mark.parametrize("target", [b"//a\x01", b"//a\x7f", b"/version\x0b", b"/a%zz", b"/a%4",
                                    b"", b"version", b":x"])
def test_bad_request_target_is_400_like_go(srv, target):
    reply = exchange(srv, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_go_transport_error(reply, 400, "400 Bad Request")


@pytest.mark.parametrize("line", [b"GET /version", b"GET  /version HTTP/1.1", b"G\x00T /version HTTP/1.1",
                                  b"GET /version HTTP/1.10"])
def test_malformed_request_line_is_400_like_go(srv, line):
    reply = exchange(srv, line + b"\r\nHost: x\r\n\r\n")
    assert_go_transport_error(reply, 400, "400 Bad Request")


# --- item 11: numbers are parsed as Go parses them ---------------------------------------


@pytest.mark.parametrize("port,message", [
    ("\u0663", "listen tcp: lookup tcp/\u0663: unknown port"),
    ("\u00b2", "listen tcp: lookup tcp/\u00b2: unknown port"),
    ("1_0", "listen tcp: lookup tcp/1_0: unknown port"),
    (" 80", "listen tcp: lookup tcp/ 80: unknown port"),
    ("a\x00", "listen tcp: lookup tcp/a\x00: unknown port"),
    ("70000", "listen tcp: address 70000: invalid port"),
    ("-1", "listen tcp: address -1: invalid port"),
    ("9" * 30, f"listen tcp: address {'9' * 30}: invalid port"),
])
def test_listen_port_is_parsed_like_go(api, port, message):
    resp = api("POST", "/proxies", {"name": "p", "listen": f"127.0.0.1:{port}",
                                    "upstream": "127.0.0.1:1"})
    assert_api_error(resp, 500, message)
    assert api("GET", "/proxies").json() == {}


@pytest.mark.parametrize("port", ["+0", "-0", "00", "+"])
def test_listen_port_signs_go_accepts(api, port):
    resp = api("POST", "/proxies", {"name": "p", "listen": f"127.0.0.1:{port}",
                                    "upstream": "127.0.0.1:1"})
    assert resp.status_code == 201, resp.text
    assert port_of(resp.json()["listen"]) > 0


@pytest.mark.parametrize("host", ["a..b", "." , "a" * 64])
def test_listen_host_the_resolver_cannot_encode_is_no_such_host(api, host):
    resp = api("POST", "/proxies", {"name": "p", "listen": f"{host}:0", "upstream": "127.0.0.1:1"})
    assert_api_error(resp, 500, f"listen tcp: lookup {host}: no such host")


@pytest.mark.parametrize("upstream", ["127.0.0.1:\u0663", "127.0.0.1:70000", "a..b:80", "127.0.0.1:a\x00"])
def test_upstream_dial_refuses_what_go_refuses(upstream):
    with pytest.raises(OSError):
        addr.resolve_dial(upstream)


@pytest.mark.parametrize("value", ["5_0", "+50", "-0", "\u0665\u0660", "0x32", "", "50, 50",
                                   "9" * 25])
def test_content_length_is_parsed_like_go(srv, value):
    reply = exchange(srv, request("GET", "/version", {"Content-Length": value}))
    assert_go_transport_error(reply, 400, "400 Bad Request")


def test_conflicting_content_lengths_are_400(srv):
    data = request("POST", "/populate", {"Content-Length": "2"})
    data = data.replace(b"\r\n\r\n", b"\r\nContent-Length: 3\r\n\r\n") + b"[] "
    assert_go_transport_error(exchange(srv, data), 400, "400 Bad Request")


def test_padded_and_repeated_equal_content_length_is_fine(srv):
    data = request("POST", "/populate", {"Content-Length": " 2\t"})
    data = data.replace(b"\r\n\r\n", b"\r\nContent-Length: 2\r\n\r\n") + b"[]"
    code, _, _, payload = head_of(exchange(srv, data))
    assert code == 201 and payload == b'{"proxies":null}'


HUGE = "1" + "0" * 5000


def test_huge_number_in_unknown_field_is_ignored_like_go(api, echo):
    raw = ('{"name":"p","listen":"127.0.0.1:0","upstream":"%s","junk":%s}'
           % (echo.address, HUGE)).encode()
    resp = api("POST", "/proxies", raw=raw)
    assert resp.status_code == 201, resp.text


@pytest.mark.parametrize("literal", [HUGE, "1" + "0" * 400, "-" + HUGE])
def test_huge_toxicity_is_400_like_go(api, echo, literal):
    api("POST", "/proxies", {"name": "p", "listen": "127.0.0.1:0", "upstream": echo.address})
    resp = api("POST", "/proxies/p/toxics", raw=('{"type":"latency","toxicity":%s}' % literal).encode())
    assert_api_error(resp, 400, f"bad request body: json: cannot unmarshal number {literal} "
                                "into Go struct field ToxicWrapper.toxicity of type float32")


def test_huge_attribute_is_400_like_go(api, echo):
    api("POST", "/proxies", {"name": "p", "listen": "127.0.0.1:0", "upstream": echo.address})
    resp = api("POST", "/proxies/p/toxics",
               raw=('{"type":"latency","attributes":{"latency":%s}}' % HUGE).encode())
    assert_api_error(resp, 400, f"bad request body: json: cannot unmarshal number {HUGE} "
                                "into Go struct field LatencyToxic.attributes.latency of type int64")


def test_number_literal_is_quoted_as_sent(api):
    resp = api("POST", "/proxies", raw=b'{"name":-0,"upstream":"x"}')
    assert_api_error(resp, 400, "bad request body: json: cannot unmarshal number -0 "
                                "into Go struct field Proxy.name of type string")


def _reset_close(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_client_reset_is_silent(srv, capfd):
    for partial in (b"GET /ver", b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n"):
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=IO_TIMEOUT_S)
        sock.sendall(partial)
        time.sleep(0.05)  # let the server block in its read before the reset arrives
        _reset_close(sock)
    assert wait_until(lambda: not srv._httpd._open, timeout=IO_TIMEOUT_S)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Error" not in err, err


@pytest.mark.parametrize("exc", [BrokenPipeError, ConnectionResetError, ConnectionAbortedError,
                                 TimeoutError])
def test_disconnect_errors_never_print(srv, capfd, exc):
    try:
        raise exc()
    except OSError:
        srv._httpd.handle_error(None, ("127.0.0.1", 1))
    assert capfd.readouterr().err == ""


def test_unexpected_handler_errors_are_logged_with_traceback(srv, caplog):
    try:
        raise ValueError("boom")
    except ValueError:
        srv._httpd.handle_error(None, ("127.0.0.1", 1))
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.exc_info and "boom" in caplog.text


# --- the HTTP fuzz target and its corpus ----------------------------------------------


@pytest.fixture(scope="module")
def fuzz_target():
    """fuzz/targets/toxiproxy_http.py, loaded by path as the driver does (fuzz/ is no package)."""
    spec = importlib.util.spec_from_file_location("fuzz_target_toxiproxy_http", TARGET)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.setup()
    return module


def test_fuzz_target_interface(fuzz_target):
    assert fuzz_target.NAME == "toxiproxy_http"
    assert callable(fuzz_target.setup) and callable(fuzz_target.test_one_input)


def test_every_corpus_seed_runs_clean_through_the_fuzz_target(fuzz_target):
    seeds = sorted(CORPUS.glob("*.http"))
    assert 10 <= len(seeds) <= 30
    for seed in seeds:
        fuzz_target.test_one_input(seed.read_bytes())


@pytest.mark.parametrize("seed,expected", [
    ("14_item8_surrogate_name.http", '"name":"sur\ufffdx"'.encode()),
    ("16_item9_chunk_minus_one.http", b"HTTP/1.1 400 Bad Request\r\n"),
    ("18_item9_over_cap.http", b"HTTP/1.1 413 Request Entity Too Large\r\n"),
    ("20_item10_crlf_redirect.http", b"\r\nLocation: /x%0D%0AInjected:%20yes?q=%0d\r\n"),
    ("23_item11_unicode_port.http", "lookup tcp/\u0663: unknown port".encode()),
    ("24_item11_content_length_underscore.http", b"HTTP/1.1 400 Bad Request\r\n"),
])
def test_probe_seeds_get_go_answers(fuzz_target, seed, expected):
    assert expected in fuzz_target.serve((CORPUS / seed).read_bytes())


@pytest.mark.parametrize("out", [
    b"HTTP/1.1 301 Moved Permanently\r\nLocation: /x\r\nInjected: yes\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nLocation: /\x01\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab",
    b"HTTP/1.1 200 OK\r\nDate: x\r\n\r\n{}",
])
def test_fuzz_oracle_flags_broken_responses(fuzz_target, out):
    with pytest.raises(AssertionError):
        fuzz_target.check_responses(out)


def test_fuzz_target_survives_a_thousand_fixed_mutations(fuzz_target):
    """Speed is the fuzz driver's figure (BENCHMARKS.md), not a test's: this only checks
    that a fixed stream of mutations raises nothing."""
    rng = random.Random(8)  # fixed, so a failure here reproduces
    seeds = [path.read_bytes() for path in sorted(CORPUS.glob("*.http"))]
    for _ in range(1000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 6)):
            pos = rng.randint(0, len(data))
            data[pos:pos + rng.randint(0, 3)] = bytes(rng.randrange(256) for _ in range(rng.randint(0, 3)))
        fuzz_target.test_one_input(bytes(data))


def test_shared_api_errors_keep_no_traceback(api):
    # Raising a shared ERR_* object chained every raise's traceback onto it: each
    # 404 kept its request's frames alive for the life of the server.
    from chaos.toxiproxy import errors

    for _ in range(3):
        assert api("GET", "/proxies/ghost").status_code == 404
        assert api("DELETE", "/proxies/ghost/toxics/t").status_code == 404
    shared = [value for name, value in vars(errors).items() if name.startswith("ERR_")]
    assert shared and all(err.__traceback__ is None for err in shared)


def test_the_api_listens_with_the_systems_backlog_not_socketservers_five(srv) -> None:
    """Issue 27: 200 concurrent API clients got 386 connection resets with a backlog of 5.
    Go listens with the kernel's somaxconn; so does our API, and a burst sees no reset."""
    assert addr.system_backlog() >= 128
    clients = 200
    barrier = threading.Barrier(clients)
    errors: list[str] = []
    answered: list[int] = []

    def client() -> None:
        try:
            barrier.wait(timeout=30)
            with socket.create_connection(("127.0.0.1", srv.port), timeout=IO_TIMEOUT_S) as sock:
                sock.sendall(b"GET /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                reply = b""
                while chunk := sock.recv(4096):
                    reply += chunk
                answered.append(int(reply.split(b" ", 2)[1]))
        except Exception as exc:  # noqa: BLE001 - every failure is reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, f"{len(errors)} of {clients} clients failed, e.g. {errors[:3]}"
    assert answered.count(200) == clients, answered


def test_the_backlog_falls_back_when_somaxconn_cannot_be_read(tmp_path: Path) -> None:
    assert addr.system_backlog(str(tmp_path / "missing")) == socket.SOMAXCONN
    (tmp_path / "bad").write_text("many\n")
    assert addr.system_backlog(str(tmp_path / "bad")) == socket.SOMAXCONN
    (tmp_path / "good").write_text("4096\n")
    assert addr.system_backlog(str(tmp_path / "good")) == 4096
