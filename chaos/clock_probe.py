"""Clock probes: a responder on each host, and the controller's prober that asks each one
for its clock about once a second during a run (Cristian's exchange, chaos/timeline.py).

The responder reads the host's clock as the host's processes do (trainer.clock: the
monotonic clock that stamps every event) and answers one UDP datagram with one datagram.
UDP because a probe that is lost or late is simply dropped (the next comes a second
later) and a TCP handshake would only lengthen the round trip that bounds the error. An
answer must echo the probe's random nonce and fit in MAX_DATAGRAM bytes; anything else is
ignored, so a stray or forged packet cannot move an estimate.

    python -m chaos.clock_probe serve --host-name node-2 --port 7123
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Callable

from trainer import clock
from trainer.argtypes import Parser, non_negative_int, positive_float

from .timeline import ClockSample, append_sample

MAX_DATAGRAM = 512
PROBE_EVERY = 1.0        # seconds between rounds of probes
PROBE_DEADLINE = 0.5     # an answer later than this is dropped: its round trip bounds nothing useful
SERVE_FOR = 24 * 3600.0  # a responder outlives no run by more than a day, even if nobody stops it


def answer(request: bytes, host: str, now: Callable[[], float] = clock.monotonic) -> bytes | None:
    """The reply to one probe, or None for a datagram that is not one."""
    if len(request) > MAX_DATAGRAM:
        return None
    try:
        probe = json.loads(request)
    except ValueError:
        return None
    if not isinstance(probe, dict) or not isinstance(probe.get("n"), str) or len(probe["n"]) > 64:
        return None
    return json.dumps({"n": probe["n"], "host": host, "t": now()}).encode()


def serve(sock: socket.socket, host: str, stop: threading.Event | None = None, serve_for: float = SERVE_FOR) -> int:
    """Answer probes on `sock` until `stop` is set or `serve_for` seconds pass; the count answered."""
    sock.settimeout(0.5)
    deadline = time.monotonic() + serve_for
    answered = 0
    while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
        try:
            request, peer = sock.recvfrom(MAX_DATAGRAM + 1)
        except socket.timeout:
            continue
        reply = answer(request, host)
        if reply is not None:
            sock.sendto(reply, peer)
            answered += 1
    return answered


def probe(address: tuple[str, int], host: str, deadline: float = PROBE_DEADLINE,
          now: Callable[[], float] = time.monotonic) -> ClockSample | None:
    """One exchange with the responder at `address`; None if no valid answer came in time."""
    nonce = secrets.token_hex(8)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(deadline)
        sent = now()
        try:
            sock.sendto(json.dumps({"n": nonce}).encode(), address)
            while True:  # bounded by the deadline: each wait is the time left
                data, _ = sock.recvfrom(MAX_DATAGRAM + 1)
                received = now()
                try:
                    reply = json.loads(data)
                except ValueError:
                    reply = None
                if isinstance(reply, dict) and reply.get("n") == nonce and isinstance(reply.get("t"), (int, float)):
                    return ClockSample(host=host, sent=sent, received=received, remote=float(reply["t"]))
                left = deadline - (now() - sent)
                if left <= 0:
                    return None
                sock.settimeout(left)
        except OSError:  # refused, unreachable, or the deadline passed
            return None


class Prober:
    """The controller's side: a thread that probes every host each PROBE_EVERY seconds and
    appends each answer to the run directory, until stopped (or `max_seconds` pass)."""

    def __init__(self, run_dir: str | os.PathLike, hosts: Callable[[], dict[str, tuple[str, int]]],
                 every: float = PROBE_EVERY, max_seconds: float = SERVE_FOR) -> None:
        self.run_dir = Path(run_dir)
        self.hosts = hosts  # asked each round: a host that moved or came back is probed where it is now
        self.every = every
        self.max_seconds = max_seconds
        self.sent = 0
        self.answered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="clock-prober", daemon=True)

    def start(self) -> "Prober":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.every + 2 * PROBE_DEADLINE * max(1, len(self.hosts())))

    def round(self) -> None:
        for host, address in sorted(self.hosts().items()):
            self.sent += 1
            sample = probe(address, host)
            if sample is not None:
                self.answered += 1
                append_sample(self.run_dir, sample)

    def _run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        while not self._stop.is_set() and time.monotonic() < deadline:
            self.round()
            self._stop.wait(self.every)


def port_number(text: str) -> int:
    port = non_negative_int(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"must be a port, 0 to 65535, got {port}")
    return port


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m chaos.clock_probe", description="answer clock probes for this host")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="answer probes until killed (or --serve-for seconds)")
    s.add_argument("--host-name", default=clock.host() or socket.gethostname(),
                   help="the host's name in answers ($ISLANDS_HOST, else the machine's name)")
    s.add_argument("--bind", default="127.0.0.1", help="the address to listen on")
    s.add_argument("--port", type=port_number, default=0, help="the UDP port (0: any free one)")
    s.add_argument("--port-file", default=None, help="write the port bound here once listening (default: none)")
    s.add_argument("--serve-for", type=positive_float, default=SERVE_FOR, help="seconds to serve at most")
    args = p.parse_args(argv)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((args.bind, args.port))
    if args.port_file:
        tmp = Path(f"{args.port_file}.tmp")
        tmp.write_text(str(sock.getsockname()[1]))
        os.replace(tmp, args.port_file)
    try:
        serve(sock, args.host_name, serve_for=args.serve_for)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
