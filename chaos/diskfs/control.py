"""The control socket: set the fault mode and read the counters of a running daemon.

One JSON object per line in, one per line out:

    {"op": "mode", "mode": "full"|"eio"|"slow"|"none", "latency_ms": 50}
        -> {"ok": true, "mode": ..., "latency_ms": ..., "since": <time.monotonic() of the change>}
    {"op": "status"}
        -> {"ok": true, "mode": ..., "latency_ms": ..., "since": ..., "counters": {"ops": {op: n},
            "errors": {mode: {op: n}}}, "unsynced_bytes": N, "files": N}
    anything else -> {"ok": false, "error": "<field>: <what is wrong>"}

A line is at most MAX_LINE bytes (a longer one is answered with an error and the
connection closed). `handle_line` is pure, and the server answers every input with a line
and never dies of one: a harness may aim a fuzzer at it.
"""
from __future__ import annotations

import json
import logging
import math
import os
import socket
import socketserver
import stat
import threading
from typing import Any, Callable

from .modes import DEFAULT_LATENCY_MS, MAX_LATENCY_MS, MODES
from .sockpath import unix_address

log = logging.getLogger("chaos.diskfs")

MAX_LINE = 64 * 1024
MAX_CLIENTS = 16
IDLE_TIMEOUT_S = 60.0
FIELDS = {"mode": ("op", "mode", "latency_ms"), "status": ("op",)}


class RequestError(ValueError):
    """A request the server refuses; the message starts with the field it names."""


def parse_request(line: bytes) -> dict[str, Any]:
    """The validated request in `line`, or RequestError naming the field that is wrong."""
    try:
        request = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        raise RequestError("request: not UTF-8") from None
    except ValueError as exc:
        raise RequestError(f"request: not JSON ({exc})") from None
    if not isinstance(request, dict):
        raise RequestError(f"request: expected a JSON object, got {type(request).__name__}")
    op = request.get("op")
    if op is None:
        raise RequestError(f"op: missing (one of {', '.join(FIELDS)})")
    if not isinstance(op, str) or op not in FIELDS:
        raise RequestError(f"op: unknown {op!r} (one of {', '.join(FIELDS)})")
    for name in request:
        if name not in FIELDS[op]:
            raise RequestError(f"{str(name)[:64]}: unknown field for op {op!r} (known: {', '.join(FIELDS[op])})")
    if op == "mode":
        mode = request.get("mode")
        if mode is None:
            raise RequestError(f"mode: missing (one of {', '.join(MODES)})")
        if not isinstance(mode, str) or mode not in MODES:
            raise RequestError(f"mode: {str(mode)[:64]!r} is not one of {', '.join(MODES)}")
        latency = request.get("latency_ms", DEFAULT_LATENCY_MS)
        if isinstance(latency, bool) or not isinstance(latency, (int, float)) or not math.isfinite(latency) \
                or not 0 <= latency <= MAX_LATENCY_MS:
            raise RequestError(f"latency_ms: a number of milliseconds in [0, {MAX_LATENCY_MS:.0f}], got {str(latency)[:64]}")
        request["latency_ms"] = float(latency)
    return request


def handle_line(line: bytes, set_mode: Callable[[str, float], dict], status: Callable[[], dict]) -> dict[str, Any]:
    """The reply to one request line. Never raises."""
    try:
        request = parse_request(line)
        if request["op"] == "mode":
            reply = set_mode(request["mode"], request["latency_ms"])
            log.warning("diskfs: mode %s (latency %.0f ms)", reply["mode"], reply["latency_ms"])
        else:
            reply = status()
        return {"ok": True, **reply}
    except RequestError as exc:
        return {"ok": False, "error": str(exc)}
    except Exception as exc:  # the server outlives any bug behind it
        log.exception("diskfs control: request failed")
        return {"ok": False, "error": f"internal: {type(exc).__name__}: {exc}"}


class _Handler(socketserver.StreamRequestHandler):
    timeout = IDLE_TIMEOUT_S

    def handle(self) -> None:
        server: ControlServer = self.server  # type: ignore[assignment]
        if not server.slots.acquire(blocking=False):
            self._reply({"ok": False, "error": f"request: too many clients (at most {MAX_CLIENTS})"})
            return
        try:
            while True:
                try:
                    line = self.rfile.readline(MAX_LINE + 1)
                except (OSError, socket.timeout):
                    return
                if not line:
                    return
                if len(line) > MAX_LINE:
                    self._reply({"ok": False, "error": f"request: longer than {MAX_LINE} bytes"})
                    return
                if not line.strip():
                    continue
                if not self._reply(handle_line(line, server.set_mode, server.status)):
                    return
        finally:
            server.slots.release()

    def _reply(self, reply: dict[str, Any]) -> bool:
        try:
            self.wfile.write(json.dumps(reply, sort_keys=True).encode() + b"\n")
            self.wfile.flush()
            return True
        except OSError:
            return False


class ControlServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """Serves `handle_line` on the Unix socket `path`, a thread per client, in the background."""

    daemon_threads = True
    allow_reuse_address = False

    def __init__(self, path: str | os.PathLike, set_mode: Callable[[str, float], dict],
                 status: Callable[[], dict]) -> None:
        self.path = os.fspath(path)
        self.set_mode = set_mode
        self.status = status
        self.slots = threading.Semaphore(MAX_CLIENTS)
        _remove_stale_socket(self.path)
        with unix_address(self.path) as address:
            super().__init__(address, _Handler)
        self._thread: threading.Thread | None = None

    def start(self) -> "ControlServer":
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="diskfs-control", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=5.0)
        self.server_close()
        _remove_stale_socket(self.path)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.exception("diskfs control: a client's connection failed")


def _remove_stale_socket(path: str) -> None:
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass
