"""The HTTP API, answering byte-for-byte like Toxiproxy 2.12's gorilla/mux server.

Routing order matters and follows mux: unclean paths get a 301, an unknown
path 404 ("404 page not found"), a known path with the wrong method 405 with
an empty body, and only then do the middlewares run (403 for browsers).
Errors are JSON text sent as text/plain (Go's http.Error), successes are
compact JSON as application/json.
"""

from __future__ import annotations

import logging
import posixpath
import secrets
import socket
import socketserver
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from . import addr, httpreq, jsonio
from .collection import PROXY_FIELDS, PopulateError, ProxyCollection, proxy_list_json
from .errors import (
    ERR_BAD_REQUEST_BODY,
    ERR_MISSING_FIELD,
    AlreadyStarted,
    ApiError,
    ListenError,
    internal,
)

log = logging.getLogger(__name__)

VERSION = "2.12.0"
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
MAX_BODY = httpreq.MAX_BODY
_XID_ALPHABET = "0123456789abcdefghijklmnopqrstuv"


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)


def json_response(status: int, value: Any) -> Response:
    return Response(status, jsonio.dumps(value).encode(), JSON)


def error_response(err: ApiError) -> Response:
    """Go's apiError: JSON body, but http.Error makes it text/plain with a newline."""
    body = (jsonio.dumps(err.to_json()) + "\n").encode()
    return Response(err.status, body, TEXT, [("X-Content-Type-Options", "nosniff")])


class Api:
    """The endpoint handlers; transport-free so they are easy to reason about."""

    def __init__(self, proxies: ProxyCollection) -> None:
        self.proxies = proxies
        self.routes: list[tuple[tuple[str, ...], dict[str, Callable[..., Response]]]] = [
            (("reset",), {"POST": self.reset}),
            (("proxies",), {"GET": self.proxy_index, "POST": self.proxy_create}),
            (("populate",), {"POST": self.populate}),
            (("proxies", "{proxy}"), {"GET": self.proxy_show, "POST": self.proxy_update,
                                      "PATCH": self.proxy_update, "DELETE": self.proxy_delete}),
            (("proxies", "{proxy}", "toxics"), {"GET": self.toxic_index,
                                                "POST": self.toxic_create}),
            (("proxies", "{proxy}", "toxics", "{toxic}"), {
                "GET": self.toxic_show, "POST": self.toxic_update,
                "PATCH": self.toxic_update, "DELETE": self.toxic_delete}),
            (("version",), {"GET": self.version}),
        ]

    def match(self, method: str, path: str) -> tuple[Callable[..., Response] | None, dict, bool]:
        """(handler, path vars, path_known): handler None + known path means 405."""
        if not path.startswith("/"):
            return None, {}, False
        parts = tuple(path[1:].split("/"))
        known = False
        for pattern, methods in self.routes:
            if len(pattern) != len(parts):
                continue
            params: dict[str, str] = {}
            for want, got in zip(pattern, parts):
                if want.startswith("{"):
                    if not got:
                        break
                    params[want[1:-1]] = got
                elif want != got:
                    break
            else:
                known = True
                handler = methods.get(method)
                if handler is not None:
                    return handler, params, True
        return None, {}, known

    # --- endpoints ---------------------------------------------------------------

    def version(self, body: bytes) -> Response:
        return Response(200, f'{{"version": "{VERSION}"}}\n'.encode(),
                        "application/json;charset=utf-8")

    def proxy_index(self, body: bytes) -> Response:
        proxies = self.proxies.proxies()
        return json_response(200, {name: proxies[name].to_json() for name in sorted(proxies)})

    def proxy_create(self, body: bytes) -> Response:
        try:
            value = jsonio.decode_first(body)
            fields = jsonio.decode_struct(value, PROXY_FIELDS, "Proxy", "toxiproxy.Proxy")
        except jsonio.DecodeError as exc:
            raise ERR_BAD_REQUEST_BODY.joined(str(exc)) from None
        for required in ("name", "upstream"):
            if not fields.get(required):
                raise ERR_MISSING_FIELD.joined(required)
        proxy = self.proxies.new_proxy(fields["name"], fields.get("listen", ""), fields["upstream"])
        self.proxies.add(proxy, fields.get("enabled", True))
        return json_response(201, proxy.to_json())

    def populate(self, body: bytes) -> Response:
        try:
            applied = self.proxies.populate_json(body)
        except PopulateError as err:
            payload = {**err.to_json(), "proxies": proxy_list_json(err.applied)}
            return Response(err.status, jsonio.dumps(payload).encode(), JSON)
        return json_response(201, {"proxies": proxy_list_json(applied)})

    def proxy_show(self, body: bytes, proxy: str) -> Response:
        return json_response(200, self.proxies.get(proxy).to_json())

    def proxy_update(self, body: bytes, proxy: str) -> Response:
        target = self.proxies.get(proxy)
        try:
            value = jsonio.decode_first(body)
            fields = jsonio.decode_struct(value, PROXY_FIELDS, "Proxy", "toxiproxy.Proxy")
        except jsonio.DecodeError as exc:
            raise ERR_BAD_REQUEST_BODY.joined(str(exc)) from None
        try:
            target.update(fields.get("listen", target.listen),
                          fields.get("upstream", target.upstream),
                          fields.get("enabled", target.enabled))
        except ListenError as exc:
            raise internal(str(exc)) from None
        return json_response(200, target.to_json())

    def proxy_delete(self, body: bytes, proxy: str) -> Response:
        self.proxies.remove(proxy)
        return Response(204)

    def toxic_index(self, body: bytes, proxy: str) -> Response:
        return json_response(200, self.proxies.get(proxy).toxics.array())

    def toxic_create(self, body: bytes, proxy: str) -> Response:
        return json_response(200, self.proxies.get(proxy).toxics.add_json(body))

    def toxic_show(self, body: bytes, proxy: str, toxic: str) -> Response:
        return json_response(200, self.proxies.get(proxy).toxics.get(toxic))

    def toxic_update(self, body: bytes, proxy: str, toxic: str) -> Response:
        return json_response(200, self.proxies.get(proxy).toxics.update_json(toxic, body))

    def toxic_delete(self, body: bytes, proxy: str, toxic: str) -> Response:
        self.proxies.get(proxy).toxics.remove(toxic)
        return Response(204)

    def reset(self, body: bytes) -> Response:
        for proxy in self.proxies.proxies().values():
            try:
                proxy.start()
            except AlreadyStarted:
                pass
            except ListenError as exc:
                raise internal(str(exc)) from None
            proxy.toxics.reset()
        return Response(204)


def clean_path(path: str) -> str:
    """gorilla/mux cleanPath: path.Clean, keeping one trailing slash."""
    if path == "":
        return "/"
    if not path.startswith("/"):
        path = "/" + path
    cleaned = posixpath.normpath(path)
    if cleaned.startswith("//"):
        cleaned = "/" + cleaned.lstrip("/")
    if path.endswith("/") and cleaned != "/":
        cleaned += "/"
    return cleaned


def _request_id() -> str:
    """20 characters of xid's alphabet from one urandom call (32 divides 256, so uniform)."""
    return "".join(_XID_ALPHABET[byte & 31] for byte in secrets.token_bytes(20))


class Handler(BaseHTTPRequestHandler):
    """Transport: parse, route like mux, and write Go-shaped responses."""

    protocol_version = "HTTP/1.1"
    timeout = 60  # Go's IdleTimeout
    server: "ApiHTTPServer"
    route_path = "/"  # the request's percent-decoded path, set by parse_request
    query = ""  # "?" and the raw query when the target had one, for redirects

    def __getattr__(self, name: str) -> Any:
        # Any method reaches the router, which answers 404/405 as mux does.
        if name.startswith("do_"):
            return self._dispatch
        raise AttributeError(name)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s %s", self.address_string(), format % args)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (431, 414, 505...) in Go's plain shape."""
        self._refuse(httpreq.BadRequest(code))

    def _refuse(self, err: httpreq.BadRequest) -> None:
        """Go answers a request it cannot read with plain text and closes, even for HEAD."""
        log.debug("%s refused: %s", self.address_string(), err)
        try:
            self.wfile.write(err.wire())
        except OSError:
            pass
        self.close_connection = True

    def _read_body(self) -> bytes:
        """The body as Go frames it; raises BadRequest, or OSError if the client went away.

        A header line http.server could not parse (no colon, a space in the name)
        hides the lines after it, Content-Length included: Go refuses those.
        """
        if self.headers.defects or self.headers.get_payload():
            raise httpreq.BadRequest(400)
        return httpreq.read_body(self.rfile, self.headers, self.request_version != "HTTP/1.0")

    def parse_request(self) -> bool:
        """Go's request-line rules first (http.server's are looser), then http.server's."""
        try:
            _method, target, _proto = httpreq.parse_request_line(self.raw_requestline)
            self.route_path, self.query = httpreq.split_target(target)
        except httpreq.BadRequest as err:
            self._refuse(err)
            return False
        return super().parse_request()

    def _dispatch(self) -> None:
        try:
            body = self._read_body()
        except httpreq.BadRequest as err:
            self._refuse(err)
            return
        except OSError as exc:  # reset or timed out mid-body: Go closes without a reply
            log.debug("%s went away mid-body: %s", self.address_string(), exc)
            self.close_connection = True
            return
        path = self.route_path
        cleaned = clean_path(path)
        if cleaned != path:
            location = httpreq.escape_path(cleaned) + self.query
            self._send(Response(301, b"", None, [("Location", location)]))
            return
        handler, params, known = self.server.api.match(self.command, path)
        if handler is None and not known:
            self._send(Response(404, b"404 page not found\n", TEXT,
                                [("X-Content-Type-Options", "nosniff")]))
            return
        if handler is None:
            self._send(Response(405))
            return
        request_id = ("X-Toxiproxy-Request-Id", _request_id())
        if self.headers.get("User-Agent", "").startswith("Mozilla/"):
            response = Response(403, b"User agent not allowed\n", TEXT,
                                [("X-Content-Type-Options", "nosniff")])
        else:
            try:
                response = handler(body, **params)
            except ApiError as err:
                response = error_response(err)
            except Exception as exc:  # pragma: no cover - surfaced as Go would: a 500
                log.exception("handler failed")
                response = error_response(internal(str(exc)))
        response.headers.append(request_id)
        self._send(response)

    def _send(self, response: Response) -> None:
        self.log_request(response.status)
        self.send_response_only(response.status)
        self.send_header("Date", self.date_time_string())
        if response.content_type:
            self.send_header("Content-Type", response.content_type)
        for name, value in response.headers:
            self.send_header(name, httpreq.header_value(value))
        if response.status != 204 and response.status >= 200:
            self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        if self.command != "HEAD" and response.body:
            self.wfile.write(response.body)


class ApiHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that skips reverse DNS at bind and can cut idle keep-alives."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = addr.LISTEN_BACKLOG  # Go's backlog, not socketserver's 5

    def __init__(self, address: tuple[str, int], api: Api) -> None:
        self.api = api
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)
        host, port = self.socket.getsockname()[:2]
        self.server_name = host
        self.server_port = port

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away is routine (Go stays silent); anything else is logged, not printed.

        socketserver's default prints a traceback to stderr for both.
        """
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            log.debug("client %s went away: %r", client_address, exc)
            return
        log.error("error serving %s", client_address, exc_info=exc)

    def close_open_connections(self) -> None:
        """Wake handler threads blocked on idle keep-alive sockets so they exit."""
        with self._open_lock:
            sockets = list(self._open)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
