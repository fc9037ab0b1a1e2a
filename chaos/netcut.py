"""Take a container's network interfaces down and up again: the swarm
backend's node partition runs this in a helper container that shares the target's
network namespace (`--network container:ID`, CAP_NET_ADMIN).

Why links down and not `docker network disconnect`: a task disconnected from a Swarm
overlay and connected again loses its service-discovery record, so a server reached by
name (the syncer, the proxy) is never found again after the partition heals; measured on
this machine: `getent hosts syncer` fails after the reconnect. A link taken down keeps the
attachment, its address and its record; while down, nothing passes (as on a cut cable),
and when it is up again the kernel restores the address's own route.

Pure standard library (the image has no iproute2): SIOCGIFADDR and SIOCGIFFLAGS /
SIOCSIFFLAGS ioctls on a UDP socket.

    python -m chaos.netcut down --keep 10.0.3.4     # every link but lo and the one holding 10.0.3.4
    python -m chaos.netcut up
"""
from __future__ import annotations

import fcntl
import socket
import struct
import sys

from trainer.argtypes import Parser

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
SIOCGIFADDR = 0x8915
IFF_UP = 0x1


def address_of(sock: socket.socket, name: str) -> str | None:
    """The interface's IPv4 address, or None when it has none."""
    try:
        raw = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
    except OSError:
        return None
    return socket.inet_ntoa(raw[20:24])


def set_up(sock: socket.socket, name: str, up: bool) -> None:
    request = struct.pack("16sH", name.encode()[:15], 0)
    flags = struct.unpack("16sH", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, request)[:18])[1]
    flags = flags | IFF_UP if up else flags & ~IFF_UP
    fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, struct.pack("16sH", name.encode()[:15], flags))


def switch(up: bool, keep: set[str]) -> list[str]:
    """Set every interface but the loopback and those holding an address in `keep` up or
    down; the names switched. Down means every other way out too: a container on a
    non-internal network has a default route through the engine's gateway bridge, and a
    cut-off task must not reach its peers around the cut (that route is not restored when
    the link comes up again: nothing a task does may leave the machine anyway)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        names = [name for _, name in socket.if_nameindex() if name != "lo" and address_of(sock, name) not in keep]
        for name in names:
            set_up(sock, name, up)
    return names


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m chaos.netcut", description="take a network namespace's links down or up")
    p.add_argument("action", choices=("down", "up"), help="take the links down, or bring them up again")
    p.add_argument("--keep", action="append", default=[], metavar="IPV4",
                   help="an address whose interface is left as it is (repeatable; default: none, every link "
                        "but the loopback)")
    args = p.parse_args(argv)
    names = switch(args.action == "up", set(args.keep))
    print(f"{args.action}: {', '.join(names) or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
