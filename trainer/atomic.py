"""Atomic, durable file writes (temp file, fsync, rename, fsync of the directory) on the
real disk: the Storage seam's file side (storage.py), for callers that hold no Storage.

Kept free of torch so that light processes (the unit supervisor) can use it.
"""
from __future__ import annotations

import os
from pathlib import Path

from .storage import FILES


def fsync_dir(path: Path) -> None:
    FILES.fsync_dir(Path(path))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> int:
    """Write `data` to `path` atomically and durably; returns the bytes written."""
    return FILES.atomic_write(Path(path), data)


def atomic_write_json(path: str | os.PathLike, obj: object) -> int:
    return FILES.atomic_write_json(Path(path), obj)
