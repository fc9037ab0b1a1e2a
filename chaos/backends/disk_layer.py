"""The disk-fault layer of a local cluster: a diskfs daemon (chaos/diskfs) mounted over the
syncer's state directory for the whole run.

`RUN_DIR/state` is the mount the syncer uses; `RUN_DIR/state.disk` holds the durable image
underneath. A disk fault sets the daemon's mode; a power loss SIGKILLs it (with the syncer)
and a new daemon comes back with only what was durable, in the mode in force. At the end
the daemon stops cleanly (everything flushed, as at an unmount) and the durable image is
moved back to `RUN_DIR/state`, so the run directory reads like any other.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path

from ..diskfs import DiskControl, cut_power, reap_power_cut, start_diskfs, stop_diskfs
from ..processes import Registry

FUSE_DEVICE = Path("/dev/fuse")
MODE_FILE = "diskfs-mode.json"  # the mode in force, which a restarted daemon starts in (--mode-file)


def write_mode_file(path: Path, mode: str, latency_ms: float) -> None:
    """Keep the mode in force where a daemon started later reads it (atomically)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"mode": mode, "latency_ms": latency_ms}))
    os.replace(tmp, path)


def missing_requirements() -> list[str]:
    """What this machine lacks to mount the layer (empty when nothing)."""
    missing = []
    if not FUSE_DEVICE.exists():
        missing.append("the /dev/fuse device")
    if shutil.which("fusermount3") is None:
        missing.append("fusermount3 (Debian: apt-get install fuse3)")
    if importlib.util.find_spec("mfusepy") is None:
        missing.append("the mfusepy package (pip install mfusepy)")
    return missing


class LocalDiskLayer:
    """One diskfs daemon under `run_dir/state`, recorded in the cluster's registry (a crashed
    run's daemon is reaped by the next, like its other processes)."""

    NAME = "diskfs"

    def __init__(self, run_dir: Path, registry: Registry) -> None:
        self.mount = run_dir / "state"
        self.backing = run_dir / "state.disk"
        self.control = run_dir / "diskfs.sock"
        self.log = run_dir / "logs" / "diskfs.log"
        self.mode_file = run_dir / MODE_FILE
        self.registry = registry
        self.popen: subprocess.Popen | None = None
        self.powered_off = False  # cut by `power_off`, not yet reaped (its teardown may still run)

    @property
    def running(self) -> bool:
        return self.popen is not None and not self.powered_off and self.popen.poll() is None

    def start(self) -> None:
        """Mount (again) over the durable image, in the mode in force."""
        self._reap()
        self.mount.mkdir(parents=True, exist_ok=True)
        self.popen = start_diskfs(self.backing, self.mount, self.control, self.log, mode_file=self.mode_file)
        self.registry.record_pid(self.NAME, self.popen.pid, list(map(str, self.popen.args)))

    def set_mode(self, mode: str, latency_ms: float = 50.0) -> None:
        """The mode in force from now, and in the daemon started after a power loss. A daemon
        whose power is cut is not asked: it may still be dying, its control socket open but
        never answering (the kernel frees its memory before its files)."""
        write_mode_file(self.mode_file, mode, latency_ms)
        if not self.powered_off:  # a daemon that died on its own is asked, and the error says so
            DiskControl(self.control).set_mode(mode, latency_ms)

    def power_off(self) -> None:
        """SIGKILL the daemon and return: what was not durable is gone from that moment. The
        power loss is in force from the signal, so its teardown is reaped by the next `start`
        (or `stop`), not here: on a loaded machine it took over half a second, which the
        fault's start was charged with (faults_applied failed a power loss issued on time)."""
        if self.popen is not None:
            cut_power(self.popen)
            self.powered_off = True

    def _reap(self) -> None:
        """Wait out a cut daemon's end and free its mount point, once."""
        if self.popen is not None and self.powered_off:
            reap_power_cut(self.popen, self.mount)
            self.popen = None
        self.powered_off = False

    def stop(self) -> None:
        """Stop cleanly (everything becomes durable) and put the durable image at `run_dir/state`."""
        self._reap()
        if self.popen is not None:
            stop_diskfs(self.popen, self.mount)
            self.popen = None
        if self.backing.is_dir() and self.mount.is_dir() and not os.listdir(self.mount):
            self.mount.rmdir()
            self.backing.rename(self.mount)
