"""``python -m chaos.diskfs.bench [--out FILE]``: what a diskfs mount costs.

Two figures, through a fresh mount and, for comparison, in the host directory beneath it:
MB/s of writing and fsyncing a 4 MB file, and operations per second of the syncer's atomic
write of a 10 KB file (mkstemp, write, fsync, rename over the target, fsync of the directory).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from trainer.argtypes import Parser, positive_int

from .launch import power_loss, start_diskfs, stop_diskfs


def big_file_mb_s(directory: str | os.PathLike, size: int = 4 << 20, repeats: int = 5) -> float:
    """MB/s of open, write `size` bytes (1 MiB at a time), fsync, close."""
    chunk = os.urandom(1 << 20)
    target = Path(directory) / "big.bin"
    started = time.perf_counter()
    for _ in range(repeats):
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            left = size
            while left:
                left -= os.write(fd, chunk[:min(left, len(chunk))])
            os.fsync(fd)
        finally:
            os.close(fd)
    elapsed = time.perf_counter() - started
    target.unlink()
    return size * repeats / elapsed / 1e6


def atomic_writes_per_s(directory: str | os.PathLike, count: int = 200, size: int = 10_000) -> float:
    """Atomic durable writes per second: mkstemp, write, fsync, rename, fsync of the directory."""
    base = Path(directory)
    payload = os.urandom(size)
    started = time.perf_counter()
    for i in range(count):
        fd, tmp = tempfile.mkstemp(prefix=".bench.", suffix=".tmp", dir=base)
        try:
            os.write(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, base / f"file-{i % 16}.bin")
        dfd = os.open(base, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    elapsed = time.perf_counter() - started
    for path in base.glob("file-*.bin"):
        path.unlink()
    return count / elapsed


def measure(work: str | os.PathLike, count: int = 200, repeats: int = 5) -> dict[str, float]:
    """The figures through a diskfs mount under `work`, and in a host directory beside it."""
    work = Path(work)
    host = work / "host"
    host.mkdir(parents=True, exist_ok=True)
    figures = {"host_4mb_write_fsync_mb_s": big_file_mb_s(host, repeats=repeats),
               "host_10kb_atomic_writes_per_s": atomic_writes_per_s(host, count=count)}
    mount = work / "mnt"
    popen = start_diskfs(work / "backing", mount, work / "control.sock", work / "diskfs.log")
    try:
        figures["diskfs_4mb_write_fsync_mb_s"] = big_file_mb_s(mount, repeats=repeats)
        figures["diskfs_10kb_atomic_writes_per_s"] = atomic_writes_per_s(mount, count=count)
    finally:
        if stop_diskfs(popen, mount) != 0:
            power_loss(popen, mount)
    return {key: round(value, 1) for key, value in figures.items()}


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m chaos.diskfs.bench", description=__doc__)
    parser.add_argument("--count", type=positive_int, default=200, help="atomic 10 KB writes to time")
    parser.add_argument("--repeats", type=positive_int, default=5, help="4 MB files to write and fsync")
    parser.add_argument("--out", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="diskfs-bench-") as work:
        figures = measure(work, count=args.count, repeats=args.repeats)
    text = json.dumps(figures, indent=1, sort_keys=True)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
