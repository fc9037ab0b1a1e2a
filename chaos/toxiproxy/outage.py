"""One proxy's upstream outages: said once when they begin, summed up when they end.

While the upstream is down (a killed syncer) every client connection the proxy accepts
fails to dial it, and a reconnecting learner retries several times a second: one warning
per connection buried the run's output under dozens of identical lines. An outage is
reported once, labelled with the proxy (the link it carries) and the reason, then counted
silently (debug level) until a dial succeeds again, when one line says how many
connections failed and for how long. Nothing is lost: the counts stay on the object.
Each line is written under the object's lock, with the change it reports.

Before the upstream has ever answered it is not down but not up yet: a cluster starts
its learners beside the syncer, and a learner that dials first is refused until the
syncer listens. That wait is said at info level, not as a warning.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)


class UpstreamOutages:
    """Failed dials of one proxy's upstream, grouped into outages; thread-safe."""

    def __init__(self, proxy: str, logger: logging.Logger = log, clock: Callable[[], float] = time.monotonic) -> None:
        self.proxy = proxy
        self.log = logger
        self.clock = clock
        self._lock = threading.Lock()
        self.failures = 0  # in the current outage
        self.total_failures = 0  # over the proxy's life
        self.outages = 0  # outages begun over the proxy's life
        self._since: float | None = None  # when the current outage began
        self._upstream = ""
        self._answered_once = False
        self._starting = False  # the current outage began before the upstream ever answered

    @property
    def down(self) -> bool:
        with self._lock:
            return self._since is not None

    def failed(self, upstream: str, reason: str) -> None:
        """A dial of `upstream` failed: the first of an outage is logged, the rest counted."""
        with self._lock:
            self.failures += 1
            self.total_failures += 1
            first = self._since is None
            if first:
                self._since = self.clock()
                self._upstream = upstream
                self._starting = not self._answered_once
                self.outages += 1
            # Said under the lock: whoever sees the count or the outage change finds its line.
            if first and self._starting:
                self.log.info("proxy %s: upstream %s is not up yet (%s): client connections are refused until "
                              "it answers", self.proxy, upstream, reason)
            elif first:
                self.log.warning("proxy %s: upstream %s is down (%s): its client connection was closed; further "
                                 "failed connections are counted until the upstream answers again",
                                 self.proxy, upstream, reason)
            else:
                self.log.debug("proxy %s: upstream %s still down (%s), %d failed connection(s)",
                               self.proxy, upstream, reason, self.failures)

    def answered(self) -> None:
        """A dial succeeded: end the outage, if any, with one line that sums it up."""
        self._end("answers again")

    def stopped(self) -> None:
        """The proxy stops (disabled, deleted, server stop): sum up an outage still running."""
        self._end("was still down when the proxy stopped")

    def _end(self, how: str) -> None:
        with self._lock:
            self._answered_once = self._answered_once or how == "answers again"
            if self._since is None:
                return
            seconds, count, upstream = self.clock() - self._since, self.failures, self._upstream
            self._since, self.failures = None, 0
            starting, self._starting = self._starting, False
            if starting and how == "answers again":
                self.log.info("proxy %s: upstream %s came up after %.1f s: %d client connection(s) were refused "
                              "meanwhile", self.proxy, upstream, seconds, count)
            else:
                self.log.warning("proxy %s: upstream %s %s after %.1f s down: %d client connection(s) failed to "
                                 "reach it", self.proxy, upstream, how, seconds, count)
