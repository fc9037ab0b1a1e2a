"""Atomic, durable file writes (temp file, fsync, rename, fsync of the directory).

Kept free of torch so that light processes (the unit supervisor) can use it.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> int:
    """Write `data` to `path` atomically and durably; returns the bytes written."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(target.parent)
    return len(data)


def atomic_write_json(path: str | os.PathLike, obj: object) -> int:
    return atomic_write_bytes(path, json.dumps(obj, indent=1, sort_keys=True).encode())
