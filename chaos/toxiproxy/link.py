"""One direction of one connection: source socket -> toxics -> destination socket.

Fast path: while no toxic is active in this direction, bytes move with
zero-copy ``os.splice`` (socket -> pipe -> socket). Sockets are blocking with
short kernel timeouts; ``poll`` on the socket plus wake-up fds comes first, so
toxic changes and closes are noticed at once.

Slow path: the link thread becomes a reader that stamps chunks with their
arrival time into a bounded buffer, and a processor thread runs each chunk
through the active toxics and writes the result. Stamping on arrival keeps
latency from throttling throughput, as Toxiproxy's channel pipeline does.

As in Toxiproxy, the end of one direction (EOF, error or a closing toxic)
closes the destination socket completely; the other direction then sees EOF
on its source and ends too. Half-closed TCP connections are not kept.
"""

from __future__ import annotations

import collections
import errno
import fcntl
import logging
import os
import random
import select
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from .fdwake import Waker
from .toxic_collection import ToxicCollection, ToxicWrapper
from .toxics import Chunk

if TYPE_CHECKING:
    from .connection import Connection

log = logging.getLogger(__name__)

READ_SIZE = 32 * 1024  # Go's io.Copy buffer: the chunk size toxics see
SPLICE_SIZE = 1 << 20
MAX_BUFFERED = 16 << 20  # bytes read ahead of the toxics before the reader pauses
POLL_MS = 500  # safety net only; wake-up fds end every wait early
_HAS_SPLICE = hasattr(os, "splice")
_SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)
_IN = select.POLLIN
_OUT = select.POLLOUT
_EOF = object()
_DRAINED = object()


class _Stop(Exception):
    """Unwinds the processor when the direction or the connection ends."""


class ToxicStub:
    """A toxic's runtime on this link: toxicity roll, state, timer, interrupts."""

    def __init__(self, link: "Link", wrapper: ToxicWrapper) -> None:
        self.link = link
        self.wrapper = wrapper
        self.toxic = wrapper.toxic
        self.state: Any = self.toxic.new_state()
        self.scratch: dict[str, Any] = {}
        self.timer: float | None = None
        self.active = False
        self.removed = False
        self.revision = -1
        self.gen = 0  # bumped on every interrupt; sleeps started under an older gen end early
        self.call_gen = 0

    @property
    def effective(self) -> bool:
        """Active here and able to change the stream (noop is not)."""
        return self.active and not self.removed and not self.toxic.passthrough

    def begin_run(self) -> None:
        """(Re)start the toxic: roll toxicity once for this connection and direction."""
        self.gen += 1
        self.revision = self.wrapper.revision
        self.active = random.random() < self.wrapper.toxicity
        self.scratch = {}
        self.timer = None
        if self.active:
            self.toxic.start(self)

    # --- the Stub protocol toxics use ------------------------------------

    def now(self) -> float:
        return time.monotonic()

    def sleep_until(self, deadline: float) -> bool:
        return self.link.sleep_until(deadline, self, self.call_gen)

    def sleep(self, seconds: float) -> bool:
        return self.sleep_until(time.monotonic() + seconds)

    def close(self) -> None:
        self.link.end_direction()

    def reset(self) -> None:
        self.link.conn.abort(reset=True)


def _make_pipe() -> tuple[int, int]:
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        fcntl.fcntl(write_fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), SPLICE_SIZE)
    except OSError:
        pass  # the default 64 KiB pipe still works, just with more syscalls
    return read_fd, write_fd


class Link:
    """Forwards one direction; owns the link thread and, in slow mode, a processor."""

    def __init__(self, conn: "Connection", src: socket.socket, dst: socket.socket,
                 direction: str, toxics: ToxicCollection) -> None:
        self.conn = conn
        self.src = src
        self.dst = dst
        self.direction = direction
        self.toxics = toxics
        self.cv = threading.Condition(threading.RLock())
        self.wake = Waker()
        self.stubs: list[ToxicStub] = []
        self.dirty = True
        self.synced_version = -1
        self.dead = False
        self.ended = False
        self._buf: collections.deque[Any] = collections.deque()
        self._buf_bytes = 0
        self._drain_then_stop = False
        self._processor: threading.Thread | None = None
        self._pipe: tuple[int, int] | None = None
        self._splice_ok = _HAS_SPLICE

    # --- called from other threads -------------------------------------------

    def notify(self) -> None:
        """The toxic chain changed: sync at the next safe point, which is now."""
        with self.cv:
            self.dirty = True
            self.cv.notify_all()
        self.wake.wake()

    def interrupt(self) -> None:
        """The connection is closing: wake every wait."""
        with self.cv:
            self.cv.notify_all()
        self.wake.wake()

    def stopping(self) -> bool:
        return self.ended or self.conn.closing

    def end_direction(self) -> None:
        """Close the destination, as Toxiproxy does when a direction ends."""
        with self.cv:
            if self.ended:
                return
            self.ended = True
            self.cv.notify_all()
        self.wake.wake()
        self.conn.close_output(self.dst)

    # --- thread body -------------------------------------------------------------

    def run(self) -> None:
        self.toxics.register(self)
        try:
            self._main()
        except Exception:  # pragma: no cover - a bug must not leak the connection
            log.exception("link %s crashed", self.direction)
            self.end_direction()
        finally:
            try:
                self._stop_processor()
            finally:
                self.dead = True
                self.toxics.unregister(self)
                self.wake.close()
                if self._pipe is not None:
                    for fd in self._pipe:
                        os.close(fd)
                    self._pipe = None

    def _main(self) -> None:
        while True:
            with self.cv:
                self._sync()
                if self.stopping():
                    return
                slow = self._needs_slow()
            if slow:
                self._start_processor()
                outcome = self._read_loop()
                if outcome == "fast":
                    self._stop_processor()
                    continue
                return  # EOF is queued for the processor, or we are stopping
            outcome = self._splice_loop() if self._splice_ok else self._copy_loop()
            if outcome == "eof":
                self.end_direction()
                return
            if outcome == "stop":
                return

    # --- chain sync ----------------------------------------------------------------

    def _needs_slow(self) -> bool:
        return any(stub.effective for stub in self.stubs)

    def _sync(self) -> None:
        """Follow the collection: start new toxics, restart updated ones, drop removed ones."""
        if not self.dirty:
            return
        with self.cv:
            self.dirty = False
            version, chain = self.toxics.snapshot(self.direction)
            old = {stub.wrapper.uid: stub for stub in self.stubs}
            stubs = []
            for wrapper in chain:
                stub = old.pop(wrapper.uid, None)
                if stub is None:
                    stub = ToxicStub(self, wrapper)
                    stub.begin_run()
                elif stub.revision != wrapper.revision:
                    stub.begin_run()
                stubs.append(stub)
            self.stubs = stubs
            for stub in old.values():
                was_active = stub.active
                stub.removed = True
                stub.gen += 1
                if was_active:
                    stub.toxic.on_remove(stub)
            self.synced_version = version
            self.cv.notify_all()
        self.toxics.applied()

    def _fire_timers(self, now: float) -> None:
        for stub in self.stubs:
            if stub.effective and stub.timer is not None and stub.timer <= now:
                stub.timer = None
                stub.toxic.on_timer(stub)

    def _next_timer(self) -> float | None:
        timers = [s.timer for s in self.stubs if s.effective and s.timer is not None]
        return min(timers) if timers else None

    # --- fast path ------------------------------------------------------------------

    def _poller(self, fd: int, events: int) -> select.poll:
        poller = select.poll()
        poller.register(fd, events)
        poller.register(self.wake.fileno(), _IN)
        poller.register(self.conn.closed_fd, _IN)
        return poller

    def _wait_readable(self, poller: select.poll, src_fd: int) -> bool:
        """Block until the source is readable (True) or something woke us (False)."""
        readable = False
        for fd, _events in poller.poll(POLL_MS):
            if fd == src_fd:
                readable = True
            elif fd == self.wake.fileno():
                self.wake.drain()
        return readable

    def _splice_loop(self) -> str:
        """Zero-copy forwarding until EOF, a close, or a toxic needs the slow path.

        Sockets are blocking with short SO_RCVTIMEO/SO_SNDTIMEO: ``poll`` waits for data
        (or a wake-up) first, then one blocking splice gathers everything that keeps
        arriving, which moves far more per call than a non-blocking one.
        """
        if self._pipe is None:
            self._pipe = _make_pipe()
        pipe_r, pipe_w = self._pipe
        src_fd, dst_fd = self.src.fileno(), self.dst.fileno()
        rpoll = self._poller(src_fd, _IN)
        while True:
            verdict = self._control()
            if verdict:
                return verdict
            if not self._wait_readable(rpoll, src_fd):
                continue
            try:
                pending = os.splice(src_fd, pipe_w, SPLICE_SIZE, flags=_SPLICE_FLAGS)
            except BlockingIOError:
                continue
            except OSError as exc:
                if exc.errno in (errno.EINVAL, errno.ENOSYS):
                    self._splice_ok = False
                    return "changed"
                return "eof"  # reset by peer and friends end the direction like EOF
            if pending == 0:
                return "eof"
            while pending > 0:
                try:
                    pending -= os.splice(pipe_r, dst_fd, pending, flags=_SPLICE_FLAGS)
                except BlockingIOError:  # SO_SNDTIMEO passed: the peer reads slowly
                    if self.conn.closing or self.ended:
                        return "stop"
                    if self.dirty:
                        with self.cv:
                            self._sync()  # applies after what is already in the pipe
                except OSError:
                    self.end_direction()
                    return "stop"

    def _control(self) -> str | None:
        """Between chunks of a fast loop: "stop", "changed" (toxics now need the slow
        path), or None to keep forwarding."""
        if self.dirty or self.ended or self.conn.closing:
            with self.cv:
                self._sync()
                if self.stopping():
                    return "stop"
                if self._needs_slow():
                    return "changed"
        return None

    def _copy_loop(self) -> str:
        """Fallback without splice: recv_into/send on the same scheme."""
        buf = bytearray(SPLICE_SIZE)
        view = memoryview(buf)
        src_fd = self.src.fileno()
        rpoll = self._poller(src_fd, _IN)
        while True:
            verdict = self._control()
            if verdict:
                return verdict
            if not self._wait_readable(rpoll, src_fd):
                continue
            try:
                count = self.src.recv_into(buf, 0, socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            except OSError:
                return "eof"
            if count == 0:
                return "eof"
            sent = 0
            while sent < count:
                try:
                    sent += self.dst.send(view[sent:count])
                except BlockingIOError:
                    if self.conn.closing or self.ended:
                        return "stop"
                    if self.dirty:
                        with self.cv:
                            self._sync()
                except OSError:
                    self.end_direction()
                    return "stop"

    # --- slow path: reader (link thread) -----------------------------------------------

    def _read_loop(self) -> str:
        """Read and stamp chunks for the processor until EOF, stop, or the toxics go away."""
        rpoll = self._poller(self.src.fileno(), _IN)
        while True:
            with self.cv:
                self._sync()
                while self._buf_bytes >= MAX_BUFFERED and not self.stopping():
                    self.cv.wait(POLL_MS / 1000)
                    self._sync()
                if self.stopping():
                    return "stop"
                if not self._needs_slow():
                    return "fast"
            try:
                data = self.src.recv(READ_SIZE, socket.MSG_DONTWAIT)
            except BlockingIOError:
                rpoll.poll(POLL_MS)
                self.wake.drain()
                continue
            except OSError:
                data = b""
            arrived = time.monotonic()
            with self.cv:
                if not data:
                    self._buf.append(_EOF)
                    self.cv.notify_all()
                    return "eof"
                self._buf.append(Chunk(data, arrived))
                self._buf_bytes += len(data)
                self.cv.notify_all()

    def _start_processor(self) -> None:
        if self._processor is not None:
            return
        self._drain_then_stop = False
        self._processor = threading.Thread(
            target=self._process_main, name=f"toxiproxy-{self.direction}-toxics", daemon=True
        )
        self._processor.start()

    def _stop_processor(self) -> None:
        """Let the processor flush what is buffered, then wait for it to exit."""
        thread = self._processor
        if thread is None:
            return
        with self.cv:
            self._drain_then_stop = True
            self.cv.notify_all()
        while thread.is_alive():  # ends on drain, EOF, or close; every wait inside wakes on those
            thread.join(0.05)  # short, so toxic changes are still acknowledged meanwhile
            if self.dirty:
                with self.cv:
                    self._sync()
        self._processor = None

    # --- slow path: processor thread ---------------------------------------------------

    def _process_main(self) -> None:
        try:
            while True:
                item = self._next_item()
                if item is _DRAINED:
                    return
                if item is _EOF:
                    self._finish_eof()
                    return
                self._run_chain(item)
        except _Stop:
            pass
        except Exception:  # pragma: no cover - a bug must not hang the link
            log.exception("toxic processor %s crashed", self.direction)
            self.end_direction()

    def _next_item(self) -> Any:
        with self.cv:
            while True:
                self._sync()
                if self.stopping():
                    raise _Stop
                now = time.monotonic()
                self._fire_timers(now)
                if self.stopping():
                    raise _Stop
                if self._buf:
                    item = self._buf.popleft()
                    if item is not _EOF:
                        self._buf_bytes -= len(item.data)
                        self.cv.notify_all()  # room for the reader
                    return item
                if self._drain_then_stop:
                    return _DRAINED
                wait = POLL_MS / 1000
                timer = self._next_timer()
                if timer is not None:
                    wait = max(0.0, min(wait, timer - now))
                self.cv.wait(wait)

    def sleep_until(self, deadline: float, stub: ToxicStub, gen: int) -> bool:
        """A toxic's sleep: False at once if that toxic is updated or removed meanwhile."""
        with self.cv:
            while True:
                self._sync()
                if self.stopping():
                    raise _Stop
                if stub.gen != gen or stub.removed:
                    return False
                now = time.monotonic()
                self._fire_timers(now)
                if self.stopping():
                    raise _Stop
                if now >= deadline:
                    return True
                wait = deadline - now
                timer = self._next_timer()
                if timer is not None:
                    wait = min(wait, timer - now)
                self.cv.wait(max(0.0, min(wait, 1.0)))

    def _run_chain(self, chunk: Chunk) -> None:
        self._through(chunk, [s for s in self.stubs if s.effective], 0)

    def _through(self, chunk: Chunk, stubs: list[ToxicStub], index: int) -> None:
        while index < len(stubs) and not stubs[index].effective:
            index += 1
        if index == len(stubs):
            self._write(chunk.data)
            return
        stub = stubs[index]
        stub.call_gen = stub.gen
        for out in stub.toxic.process(chunk, stub):
            if self.stopping():
                raise _Stop
            if out.data:
                self._through(out, stubs, index + 1)
        if self.stopping():
            raise _Stop

    def _finish_eof(self) -> None:
        for stub in [s for s in self.stubs if s.effective]:
            if stub.effective:
                stub.call_gen = stub.gen
                stub.toxic.on_eof(stub)
            if self.stopping():
                return
        self.end_direction()

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        poller: select.poll | None = None
        while view:
            if self.stopping():
                raise _Stop
            try:
                sent = self.dst.send(view, socket.MSG_DONTWAIT)
            except BlockingIOError:
                if poller is None:
                    poller = select.poll()
                    poller.register(self.dst.fileno(), _OUT)
                    poller.register(self.conn.closed_fd, _IN)
                poller.poll(POLL_MS)
                continue
            except OSError:
                self.end_direction()
                raise _Stop from None
            view = view[sent:]
