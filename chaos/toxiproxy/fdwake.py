"""A file descriptor that other threads can make readable.

Forwarding threads block in ``poll`` on their socket; watching one of these
next to it lets a toxic change or a close wake them at once instead of on a
timeout. Guarded by a lock so a late ``wake`` never writes to a reused fd.
"""

from __future__ import annotations

import os
import threading


class Waker:
    """eventfd (or pipe) based wake-up source for ``select.poll``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed = False
        if hasattr(os, "eventfd"):
            self._rfd = self._wfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        else:  # pragma: no cover - non-Linux fallback
            self._rfd, self._wfd = os.pipe()
            os.set_blocking(self._rfd, False)
            os.set_blocking(self._wfd, False)

    def fileno(self) -> int:
        return self._rfd

    def wake(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                os.write(self._wfd, (1).to_bytes(8, "little"))
            except (BlockingIOError, OSError):
                pass  # already readable (counter full or pipe full) is just as good

    def drain(self) -> None:
        """Make the fd unreadable again; only the owning thread calls this."""
        with self._lock:
            if self._closed:
                return
            try:
                while os.read(self._rfd, 4096):
                    if self._rfd == self._wfd:
                        break
            except (BlockingIOError, OSError):
                pass

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.close(self._rfd)
            if self._wfd != self._rfd:
                os.close(self._wfd)
