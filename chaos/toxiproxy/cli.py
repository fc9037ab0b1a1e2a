"""``python -m chaos.toxiproxy`` / ``python -m chaos toxiproxy``: run the server until a signal."""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import sys
import threading
from typing import Sequence

from trainer.argtypes import Parser

from trainer.atomic import atomic_write_json
from trainer.signals import set_on_signal

from .config import ConfigError
from .server import ToxiproxyServer

log = logging.getLogger("chaos.toxiproxy")


def build_parser(prog: str = "python -m chaos toxiproxy") -> argparse.ArgumentParser:
    parser = Parser(
        prog=prog,
        description="Toxiproxy 2.12-compatible TCP proxy server with a chaos HTTP API.",
    )
    # Go's flag package also accepts -host, -port, -config: keep those spellings working.
    parser.add_argument("--host", "-host", default="127.0.0.1",
                        help="API host to listen on (default 127.0.0.1, not all interfaces)")
    parser.add_argument("--port", "-port", type=int, default=8474,
                        help="API port to listen on (default 8474)")
    parser.add_argument("--config", "-config", default=None, metavar="FILE",
                        help="JSON file with an array of proxies to create at start")
    parser.add_argument("--seed", "-seed", type=int, default=None,
                        help="random seed for toxicity and jitter (default: random)")
    parser.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="log level (default INFO)")
    parser.add_argument("--address-file", default=None, metavar="FILE",
                        help="once listening, write {\"url\", \"host\", \"port\", \"pid\"} to FILE atomically "
                             "(with --port 0: how a launcher learns the port; default: none)")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "python -m chaos toxiproxy") -> int:
    """Run until SIGTERM/SIGINT; returns the exit code (argparse exits 2 on bad flags)."""
    args = build_parser(prog).parse_args(list(sys.argv[1:] if argv is None else argv))
    if not 0 <= args.port <= 65535:
        build_parser(prog).error(f"argument --port: {args.port} is not a TCP port")
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.seed is not None:
        random.seed(args.seed)
    server = ToxiproxyServer(host=args.host, port=args.port, config=args.config)
    try:
        server.start()
    except ConfigError as exc:
        log.error("%s", exc)
        return 1
    except OSError as exc:
        log.error("cannot listen on %s:%s: %s", args.host, args.port, exc)
        return 1
    print(f"toxiproxy listening on {server.url}", file=sys.stderr, flush=True)
    if args.address_file:
        atomic_write_json(args.address_file, {"url": server.url, "host": args.host, "port": server.port,
                                              "pid": os.getpid()})
    stop = threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, set_on_signal(stop))  # no lock inside the handler
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    log.info("stopped")
    return 0
