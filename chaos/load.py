"""A known artificial CPU load: N busy processes pinned round-robin to the CPUs, bounded in time.

Why: a verdict must not depend on how fast the machine is. `python -m pytest --chaos-load N`
runs the suite beside N processes that each keep one core busy, and `python -m chaos load N`
does the same beside anything else (a replay, a benchmark). Each process spins in pure
Python, pinned to one CPU so that both cores of a 2-core machine are loaded alike, and
stops on its own when its time is up or its parent is gone: no stray load outlives a run.
The load average is sampled while it runs, so a report can say how loaded the machine was.
"""
from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from trainer.argtypes import Parser

DEFAULT_MAX_SECONDS = 4 * 3600.0
SAMPLE_EVERY = 15.0

# Spins until the deadline or until the parent that started it has gone (re-parented). The
# parent's PID comes as an argument: read with getppid() at start-up it would already be
# init's if the parent died first.
_SPIN = """
import os, sys, time
cpu, deadline, parent = int(sys.argv[1]), time.monotonic() + float(sys.argv[2]), int(sys.argv[3])
try:
    os.sched_setaffinity(0, {cpu})
except (AttributeError, OSError):
    pass
while time.monotonic() < deadline and os.getppid() == parent:
    for _ in range(200_000):
        pass
"""


@dataclass
class LoadReport:
    processes: int
    seconds: float
    loadavg_samples: list[float] = field(default_factory=list)  # 1-minute load averages

    def line(self) -> str:
        s = self.loadavg_samples
        avg = (f"load average (1 min) min {min(s):.2f}, median {statistics.median(s):.2f}, max {max(s):.2f} "
               f"over {len(s)} samples") if s else "no load-average sample"
        return f"{self.processes} busy process(es) for {self.seconds:.0f} s; {avg}"


def _cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


class CpuLoad:
    """Start with `start()` (or `with CpuLoad(n):`); `stop()` ends every process and reports."""

    def __init__(self, processes: int, max_seconds: float = DEFAULT_MAX_SECONDS) -> None:
        if processes < 0:
            raise ValueError(f"load: processes must be >= 0, got {processes}")
        if not max_seconds > 0:
            raise ValueError(f"load: max-seconds must be > 0, got {max_seconds}")
        self.processes = processes
        self.max_seconds = max_seconds
        self._procs: list[subprocess.Popen] = []
        self._samples: list[float] = []
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self._started = 0.0

    def start(self) -> "CpuLoad":
        cpus = _cpus()
        self._started = time.monotonic()
        for i in range(self.processes):
            self._procs.append(subprocess.Popen(
                [sys.executable, "-c", _SPIN, str(cpus[i % len(cpus)]), str(self.max_seconds), str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self._sampler = threading.Thread(target=self._sample, name="load-sampler", daemon=True)
        self._sampler.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY):
            self._samples.append(os.getloadavg()[0])

    def running(self) -> int:
        return sum(1 for p in self._procs if p.poll() is None)

    def stop(self) -> LoadReport:
        self._stop.set()
        for p in self._procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in self._procs:
            p.wait(timeout=10)
        if self._sampler is not None:
            self._sampler.join(timeout=1)
        seconds = time.monotonic() - self._started if self._started else 0.0
        self._samples.append(os.getloadavg()[0])
        return LoadReport(self.processes, seconds, list(self._samples))

    def __enter__(self) -> "CpuLoad":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """`python -m chaos load N [--seconds S]`: load the machine until S seconds pass or Ctrl-C."""
    p = Parser(prog="python -m chaos load", description=__doc__.split("\n\n")[0])
    p.add_argument("processes", type=int, metavar="N", help="busy processes, pinned round-robin to the CPUs")
    p.add_argument("--seconds", type=float, default=600.0, help="stop after this long (default 600)")
    args = p.parse_args(argv)
    if args.processes < 1:
        p.error(f"N: must be >= 1, got {args.processes}")
    if not args.seconds > 0:
        p.error(f"--seconds: must be > 0, got {args.seconds}")
    load = CpuLoad(args.processes, args.seconds).start()
    print(f"load: {args.processes} busy process(es) on CPUs {_cpus()} for at most {args.seconds:.0f} s "
          f"(Ctrl-C stops them)", flush=True)
    try:
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline and load.running():
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    print("load: " + load.stop().line(), flush=True)
    return 0
