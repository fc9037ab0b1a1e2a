"""Unix socket addresses of any length.

A sun_path holds 107 bytes, and pytest's tmp_path or a run directory easily needs more.
A longer path is reached through the directory's descriptor: /proc/self/fd/N/name.
"""
from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from typing import Iterator

SUN_PATH_MAX = 107


@contextmanager
def unix_address(path: str | os.PathLike) -> Iterator[str]:
    """An address for `path` usable by bind or connect while the context is open."""
    text = os.fspath(path)
    if len(text.encode()) <= SUN_PATH_MAX:
        yield text
        return
    directory, name = os.path.split(os.path.abspath(text))
    fd = os.open(directory or ".", os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{name}"
    finally:
        os.close(fd)


def connect(path: str | os.PathLike, timeout: float) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        with unix_address(path) as address:
            sock.connect(address)
    except BaseException:
        sock.close()
        raise
    return sock
