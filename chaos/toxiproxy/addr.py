"""host:port parsing, binding and resolving with Go's net package semantics.

Toxiproxy reports the bound address back in ``listen`` (``localhost:0``
becomes ``127.0.0.1:41234``) and its bind errors read like Go's, so both are
reproduced here.
"""

from __future__ import annotations

import errno
import socket

from . import goparse
from .errors import ListenError

SOMAXCONN_PATH = "/proc/sys/net/core/somaxconn"


def system_backlog(path: str = SOMAXCONN_PATH) -> int:
    """The listen backlog Go's net package uses: the kernel's somaxconn, read once.

    A small fixed backlog (socketserver's 5) resets a burst of concurrent clients, which
    the real Toxiproxy never does; the kernel caps any larger value at somaxconn anyway.
    """
    try:
        with open(path) as fh:
            value = int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return socket.SOMAXCONN
    return value if value > 0 else socket.SOMAXCONN


LISTEN_BACKLOG = system_backlog()


class AddressError(ValueError):
    """Malformed host:port; the message is Go's ``address X: why``."""


def split_host_port(address: str) -> tuple[str, str]:
    """Go's net.SplitHostPort."""
    if address.startswith("["):
        end = address.find("]")
        if end < 0:
            raise AddressError(f"address {address}: missing ']' in address")
        rest = address[end + 1:]
        if not rest:
            raise AddressError(f"address {address}: missing port in address")
        if not rest.startswith(":"):
            raise AddressError(f"address {address}: missing port in address")
        host, port = address[1:end], rest[1:]
        if ":" in port:
            raise AddressError(f"address {address}: too many colons in address")
        return host, port
    colon = address.rfind(":")
    if colon < 0:
        raise AddressError(f"address {address}: missing port in address")
    host, port = address[:colon], address[colon + 1:]
    if ":" in host:
        raise AddressError(f"address {address}: too many colons in address")
    if "]" in host or "[" in host:
        raise AddressError(f"address {address}: unexpected '[' or ']' in address")
    return host, port


def parse_port(port: str) -> int:
    """net.LookupPort: ASCII digits with an optional sign, else a service name.

    str.isdigit() and int() would take '٣' as port 3; Go looks it up as a
    name and fails. Go's range error names only the port ("address 70000").
    """
    value = goparse.parse_port(port)
    if value is None:
        try:
            value = socket.getservbyname(port, "tcp")
        except (OSError, ValueError):  # ValueError: a NUL in the name
            raise AddressError(f"lookup tcp/{port}: unknown port") from None
    if not 0 <= value <= 65535:
        raise AddressError(f"address {port}: invalid port")
    return value


def format_addr(ip: str, port: int) -> str:
    """Go's TCPAddr.String(): IPv6 in brackets."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _is_wildcard(host: str) -> bool:
    return host in ("", "0.0.0.0", "::")


def _resolve(host: str, port: int) -> list[tuple[int, tuple]]:
    """getaddrinfo; a name IDNA cannot encode ("a..b", a 64-byte label) is an OSError too."""
    try:
        infos = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM,
                                   socket.IPPROTO_TCP)
    except (UnicodeError, ValueError) as exc:
        raise OSError(f"lookup {host}: no such host") from exc
    # Go prefers IPv4 addresses for a name that has both (localhost -> 127.0.0.1).
    infos.sort(key=lambda info: 0 if info[0] == socket.AF_INET else 1)
    return [(info[0], info[4]) for info in infos]


def _strerror(exc: OSError) -> str:
    text = exc.strerror or str(exc)
    return text[:1].lower() + text[1:]


def parse_listen(listen: str) -> tuple[str, int]:
    """(host, port) of a listen address; ListenError with Go's text if malformed."""
    try:
        # Go treats an empty address as ":0": any interface, any port.
        host, port_text = split_host_port(listen) if listen else ("", "0")
        return host, parse_port(port_text)
    except AddressError as exc:
        raise ListenError(f"listen tcp: {exc}") from None


def bind_listener(listen: str) -> tuple[socket.socket, str]:
    """Bind and listen like net.Listen("tcp", listen); returns the socket and its real address."""
    host, port = parse_listen(listen)
    if _is_wildcard(host) and socket.has_ipv6:
        # Go listens dual-stack on [::] for a wildcard host.
        candidates = [(socket.AF_INET6, ("::", port)), (socket.AF_INET, ("0.0.0.0", port))]
    elif _is_wildcard(host):
        candidates = [(socket.AF_INET, ("0.0.0.0", port))]
    else:
        try:
            candidates = _resolve(host, port)[:1]
        except OSError:
            raise ListenError(f"listen tcp: lookup {host}: no such host") from None
    last: OSError | None = None
    for family, sockaddr in candidates:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and _is_wildcard(host):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(sockaddr)
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            last = exc
            if exc.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL) and family == socket.AF_INET6:
                continue  # no IPv6 here: fall back to the IPv4 wildcard
            shown = listen if _is_wildcard(host) else format_addr(sockaddr[0], port)
            raise ListenError(f"listen tcp {shown}: bind: {_strerror(exc)}") from None
        bound = sock.getsockname()
        return sock, format_addr(bound[0], bound[1])
    raise ListenError(f"listen tcp {listen}: {_strerror(last) if last else 'no address'}")


def resolve_dial(upstream: str) -> list[tuple[int, tuple]]:
    """Addresses to try for net.Dial("tcp", upstream); raises OSError if unusable."""
    try:
        host, port_text = split_host_port(upstream)
        port = parse_port(port_text)
    except AddressError as exc:
        raise OSError(str(exc)) from None
    if host == "":
        host = "localhost"  # Go dials the local system for an empty host
    return _resolve(host, port)
