"""A client for a diskfs daemon's control socket, and its command line.

    python -m chaos.diskfs.client SOCKET [--wait S] mode full|eio|slow|none [--latency-ms 50]
    python -m chaos.diskfs.client SOCKET [--wait S] status

prints the daemon's JSON reply and exits 1 if the daemon refused or did not answer (so a
harness can run it inside a container with `docker exec`). Every call has a deadline.
--wait covers a daemon that is starting again (its container restarted after a failed
disk): the socket is missing or refuses until the daemon answers, and the call retries.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential_jitter

from .control import MAX_LINE
from .modes import DEFAULT_LATENCY_MS, MODES
from .sockpath import connect


class DiskControlError(RuntimeError):
    """The daemon did not answer in time, or refused the request; the message names the socket."""


class DaemonNotUp(DiskControlError):
    """No daemon listens on the socket (yet): it is missing or refuses connections."""


class DiskControl:
    """One diskfs daemon's control socket; each call connects, asks, and is bounded by `timeout`.

    `wait` seconds (0: none) are spent retrying, with backoff, while no daemon listens: one
    that is starting again has not made its socket yet."""

    def __init__(self, socket_path: str | os.PathLike, timeout: float = 5.0, wait: float = 0.0) -> None:
        self.socket_path = os.fspath(socket_path)
        self.timeout = timeout
        self.wait = wait

    def set_mode(self, mode: str, latency_ms: float = DEFAULT_LATENCY_MS) -> dict[str, Any]:
        return self.request({"op": "mode", "mode": mode, "latency_ms": latency_ms})

    def status(self) -> dict[str, Any]:
        return self.request({"op": "status"})

    def request(self, request: dict[str, Any]) -> dict[str, Any]:
        """The reply to `request`; DiskControlError if it is not ok."""
        reply = self.raw(json.dumps(request).encode() + b"\n")
        if not reply.get("ok"):
            raise DiskControlError(f"diskfs control {self.socket_path}: {reply.get('error', reply)}")
        return reply

    def raw(self, line: bytes) -> dict[str, Any]:
        """The parsed reply to one raw request line, whether ok or not."""
        if self.wait <= 0:
            return self._ask(line)
        retrying = Retrying(retry=retry_if_exception_type(DaemonNotUp), stop=stop_after_delay(self.wait),
                            wait=wait_exponential_jitter(multiplier=0.05, max=1.0, jitter=0.05), reraise=True)
        return retrying(self._ask, line)

    def _ask(self, line: bytes) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        where = f"diskfs control {self.socket_path}"
        try:
            with connect(self.socket_path, self.timeout) as sock:
                sock.sendall(line)
                buf = b""
                while b"\n" not in buf:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise socket.timeout()
                    sock.settimeout(left)
                    chunk = sock.recv(65536)
                    if not chunk:  # a daemon stopping (its container restarting) closes what it accepted
                        raise DaemonNotUp(f"{where}: the daemon closed the connection without a reply"
                                          f"{self._waited()}")
                    buf += chunk
                    if len(buf) > 16 * MAX_LINE:
                        raise DiskControlError(f"{where}: a reply longer than {16 * MAX_LINE} bytes")
        except socket.timeout:
            raise DiskControlError(f"{where}: no answer within {self.timeout:g} s (is the daemon running, or stopped?)") from None
        except FileNotFoundError:
            raise DaemonNotUp(f"{where}: no such socket{self._waited()} (is the daemon running?)") from None
        except ConnectionRefusedError:
            raise DaemonNotUp(f"{where}: connection refused{self._waited()} (the daemon is gone)") from None
        except (BrokenPipeError, ConnectionResetError) as exc:
            # Connected to a daemon on its way out (the syncer's container restarting after a
            # failed sync, compose CI): the next one answers once it is up.
            raise DaemonNotUp(f"{where}: {exc.strerror or exc}{self._waited()} (the daemon went away mid-request)") \
                from None
        except OSError as exc:
            raise DiskControlError(f"{where}: {exc}") from None
        try:
            return json.loads(buf.partition(b"\n")[0])
        except ValueError:
            raise DiskControlError(f"{where}: a reply that is not JSON: {buf[:200]!r}") from None

    def _waited(self) -> str:
        return f" after waiting {self.wait:g} s" if self.wait > 0 else ""


def main(argv: list[str] | None = None, prog: str = "python -m chaos.diskfs.client") -> int:
    from trainer.argtypes import Parser, non_negative_float

    parser = Parser(prog=prog, description="Set a diskfs daemon's fault mode or read its counters.")
    parser.add_argument("socket", help="the daemon's control socket (its --control)")
    parser.add_argument("--timeout", type=non_negative_float, default=5.0,
                        help="seconds to wait for the daemon's reply (default: %(default)s)")
    parser.add_argument("--wait", type=non_negative_float, default=0.0,
                        help="seconds to keep retrying while no daemon listens on the socket, as while "
                             "its container starts again (default: %(default)s: fail at once)")
    sub = parser.add_subparsers(dest="command", required=True)
    mode = sub.add_parser("mode", help="set the fault mode")
    mode.add_argument("mode", choices=MODES, help="none, full (ENOSPC), eio (EIO) or slow (latency)")
    mode.add_argument("--latency-ms", type=non_negative_float, default=DEFAULT_LATENCY_MS,
                      help="the delay of every operation under slow, in milliseconds")
    sub.add_parser("status", help="print the mode, the counters, unsynced bytes and files")
    args = parser.parse_args(argv)
    control = DiskControl(args.socket, timeout=args.timeout, wait=args.wait)
    if args.command == "mode":
        request = {"op": "mode", "mode": args.mode, "latency_ms": args.latency_ms}
    else:
        request = {"op": "status"}
    try:
        reply = control.raw(json.dumps(request).encode() + b"\n")
    except DiskControlError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    print(json.dumps(reply, sort_keys=True))
    return 0 if reply.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
