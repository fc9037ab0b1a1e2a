"""A plain TCP relay: `python -m chaos forward --listen HOST:PORT --to HOST:PORT`.

Why: a Swarm service publishes its ports on every interface of every node (the routing
mesh, or `mode: host`), never on 127.0.0.1 alone. The swarm backend therefore publishes
no port from the stack. It runs this relay in a plain container on the stack's attachable
`control` network instead, published on 127.0.0.1 only, and the controller reaches the
proxy's HTTP API through it (what `kubectl port-forward` does for a pod). Bytes are
relayed as they are: the relay neither reads nor changes the HTTP it carries.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys

from trainer.argtypes import Parser

MAX_CONNECTIONS = 64
CONNECT_TIMEOUT = 10.0
IDLE_TIMEOUT = 300.0
CHUNK = 64 * 1024


def address(text: str) -> tuple[str, int]:
    """HOST:PORT, for argparse: the error names what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT with a port in 1..65535, got {text!r}")
    return host, int(port)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await asyncio.wait_for(reader.read(CHUNK), IDLE_TIMEOUT):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.TimeoutError):
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()


class Relay:
    """Accepts on `listen`, opens one upstream connection per client, pipes both ways."""

    def __init__(self, upstream: tuple[str, int], max_connections: int = MAX_CONNECTIONS) -> None:
        self.upstream = upstream
        self.slots = asyncio.Semaphore(max_connections)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.slots.locked():  # full: refuse at once rather than queue a client without a deadline
            writer.close()
            return
        async with self.slots:
            try:
                up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*self.upstream),
                                                              CONNECT_TIMEOUT)
            except (OSError, asyncio.TimeoutError) as exc:
                print(f"forward: cannot reach {self.upstream[0]}:{self.upstream[1]}: {exc}", file=sys.stderr)
                writer.close()
                return
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def serve(listen: tuple[str, int], upstream: tuple[str, int]) -> None:
    relay = Relay(upstream)
    server = await asyncio.start_server(relay.handle, *listen)
    print(f"forward: {listen[0]}:{listen[1]} -> {upstream[0]}:{upstream[1]}", file=sys.stderr, flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m chaos forward", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", type=address, required=True, help="HOST:PORT to accept on")
    parser.add_argument("--to", type=address, required=True, help="HOST:PORT to relay each connection to")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.listen, args.to))
    return 0
