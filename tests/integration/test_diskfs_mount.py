"""chaos/diskfs on a real FUSE mount: faults seen by another process, power loss, clean
stop, syncfs, the control socket, and the mount point after a SIGKILL.

Skipped (with the reason) where /dev/fuse, fusermount3 or mfusepy's libfuse3 is missing;
CI installs them. Every wait is bounded and says what did not happen.
"""
from __future__ import annotations

import ctypes
import errno
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from chaos.diskfs import mounts
from chaos.diskfs.backing import load_image
from chaos.diskfs.client import DiskControl
from chaos.diskfs.launch import DiskfsError, power_loss, start_diskfs, stop_diskfs
from chaos.diskfs.model import HIDDEN

ROOT = Path(__file__).resolve().parents[2]


def _missing() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse (a container needs --device /dev/fuse and CAP_SYS_ADMIN)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not readable and writable by this user"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (apt-get install fuse3)"
    try:
        import mfusepy  # noqa: F401
    except Exception as exc:  # mfusepy raises at import when libfuse3 is missing
        return f"mfusepy cannot be imported or cannot load libfuse3: {exc}"
    return None


pytestmark = [pytest.mark.integration, pytest.mark.skipif(_missing() is not None, reason=_missing() or "")]


@dataclass
class Disk:
    """One daemon's paths, and its process while it runs."""
    work: Path
    popen: subprocess.Popen | None = None

    @property
    def mount(self) -> Path:
        return self.work / "mnt"

    @property
    def backing(self) -> Path:
        return self.work / "backing"

    @property
    def control(self) -> Path:
        return self.work / "control.sock"

    @property
    def log(self) -> Path:
        return self.work / "diskfs.log"

    def start(self) -> "Disk":
        self.popen = start_diskfs(self.backing, self.mount, self.control, self.log, timeout=30.0)
        return self

    def client(self) -> DiskControl:
        return DiskControl(self.control, timeout=10.0)

    def durable(self) -> dict:
        return load_image(self.backing).as_dict()


@pytest.fixture
def disk():
    # a short path: the tests print it, and mount points read better
    work = Path(tempfile.mkdtemp(prefix="diskfs-"))
    d = Disk(work).start()
    yield d
    if d.popen is not None and d.popen.poll() is None:
        if stop_diskfs(d.popen, d.mount) != 0:
            pytest.fail(f"the daemon did not stop cleanly; see {d.log}")
    if mounts.is_mounted(d.mount):
        mounts.unmount(d.mount, lazy=True)
    shutil.rmtree(work, ignore_errors=True)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(path: Path, data: bytes, fsync: bool = True) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


# The probe another process runs: each operation's errno name, or "ok".
PROBE = r"""
import errno, json, os, sys
m = sys.argv[1]
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = "ok"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
fd = os.open(os.path.join(m, "existing"), os.O_RDWR)
attempt("write", lambda: os.pwrite(fd, b"x" * 10, 0))
attempt("read", lambda: os.pread(fd, 4, 0))
attempt("fsync", lambda: os.fsync(fd))
attempt("fdatasync", lambda: os.fdatasync(fd))
def fsyncdir():
    d = os.open(m, os.O_RDONLY)
    try:
        os.fsync(d)
    finally:
        os.close(d)
attempt("fsyncdir", fsyncdir)
attempt("create", lambda: os.close(os.open(os.path.join(m, "new"), os.O_WRONLY | os.O_CREAT | os.O_EXCL)))
attempt("mkdir", lambda: os.mkdir(os.path.join(m, "newdir")))
attempt("truncate_grow", lambda: os.ftruncate(fd, 1 << 20))
attempt("truncate_shrink", lambda: os.ftruncate(fd, 1))
attempt("rename", lambda: os.rename(os.path.join(m, "victim"), os.path.join(m, "renamed")))
attempt("unlink", lambda: os.unlink(os.path.join(m, "renamed")))
out["statfs_bavail"] = os.statvfs(m).f_bavail
os.close(fd)
print(json.dumps(out))
"""


def probe(mount: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, str(mount)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"the probe process failed: {done.stderr}"
    return json.loads(done.stdout)


def prepare_probe(mount: Path) -> None:
    for name in ("new", "renamed"):
        (mount / name).unlink(missing_ok=True)
    if (mount / "newdir").exists():
        (mount / "newdir").rmdir()
    write(mount / "existing", b"0123456789")
    write(mount / "victim", b"v")


OK = "ok"
EXPECTED = {
    "none": dict(write=OK, read=OK, fsync=OK, fdatasync=OK, fsyncdir=OK, create=OK, mkdir=OK, truncate_grow=OK,
                 truncate_shrink=OK, rename=OK, unlink=OK),
    "full": dict(write="ENOSPC", read=OK, fsync=OK, fdatasync=OK, fsyncdir=OK, create="ENOSPC", mkdir="ENOSPC",
                 truncate_grow="ENOSPC", truncate_shrink=OK, rename=OK, unlink=OK),
    "eio": dict(write=OK, read=OK, fsync="EIO", fdatasync="EIO", fsyncdir="EIO", create=OK, mkdir=OK,
                truncate_grow=OK, truncate_shrink=OK, rename=OK, unlink=OK),
}
INJECTED = {"none": {}, "full": {"full": {"write", "create", "mkdir", "truncate"}},
            "eio": {"eio": {"fsync", "fdatasync", "fsyncdir"}}}


@pytest.mark.parametrize("mode", ["none", "full", "eio"])
def test_each_fault_mode_is_seen_by_another_process_with_its_errno(disk, mode) -> None:
    prepare_probe(disk.mount)
    reply = disk.client().set_mode(mode)
    assert reply["mode"] == mode
    seen = probe(disk.mount)
    disk.client().set_mode("none")
    bavail = seen.pop("statfs_bavail")
    assert seen == EXPECTED[mode]
    assert (bavail == 0) == (mode == "full")
    errors = disk.client().status()["counters"]["errors"]
    assert {m: set(ops) for m, ops in errors.items()} == INJECTED[mode]


def test_slow_adds_latency_to_every_operation(disk) -> None:
    write(disk.mount / "f", b"x")
    disk.client().set_mode("slow", latency_ms=60)
    script = ("import os, sys, time\nm = sys.argv[1]\nt = time.monotonic()\n"
              "for i in range(5):\n"
              "    fd = os.open(os.path.join(m, 'f'), os.O_RDONLY); os.read(fd, 1); os.close(fd)\n"
              "print(time.monotonic() - t)\n")
    done = subprocess.run([sys.executable, "-c", script, str(disk.mount)], capture_output=True, text=True, timeout=120)
    disk.client().set_mode("none")
    assert done.returncode == 0, done.stderr
    # each open, read and close waits for at least the daemon's open and flush (release and
    # readahead may go asynchronously): 2 x 60 ms
    assert float(done.stdout) >= 5 * 2 * 0.060, f"5 slow opens and reads took only {done.stdout.strip()} s"
    assert disk.client().status()["counters"]["errors"] == {}


def test_power_loss_keeps_what_was_made_durable_and_nothing_else(disk) -> None:
    m = disk.mount
    write(m / "synced", b"S1")  # fsync + fsyncdir (below)
    os.mkdir(m / "dir")
    write(m / "dir" / "deep", b"D")
    fsync_dir(m / "dir")
    fsync_dir(m)
    write(m / "synced", b"S2-unsynced", fsync=False)  # a later write without fsync
    write(m / "no_fsyncdir", b"N")  # fsynced, but its name never made durable
    write(m / "nothing", b"X", fsync=False)
    assert (m / "synced").read_bytes() == b"S2-unsynced"  # now in the page cache too
    status = disk.client().status()
    assert status["files"] == 4 and status["unsynced_bytes"] >= len(b"S2-unsynced") + 1
    power_loss(disk.popen, m)
    assert not mounts.is_mounted(m)
    assert disk.durable() == {"synced": b"S1", "dir": {"deep": b"D"}}
    disk.start()
    assert sorted(os.listdir(m)) == ["dir", "synced"]
    assert (m / "synced").read_bytes() == b"S1"  # not the cached S2 of the dead mount
    assert (m / "dir" / "deep").read_bytes() == b"D"


def test_a_clean_stop_flushes_everything(disk) -> None:
    m = disk.mount
    os.makedirs(m / "a" / "b")
    write(m / "a" / "b" / "f", b"F", fsync=False)
    write(m / "g", b"G", fsync=False)
    assert stop_diskfs(disk.popen, m) == 0
    assert disk.durable() == {"a": {"b": {"f": b"F"}}, "g": b"G"}
    disk.start()
    assert (m / "a" / "b" / "f").read_bytes() == b"F"


def test_unmounting_is_a_clean_stop(disk) -> None:
    write(disk.mount / "f", b"F", fsync=False)
    subprocess.run(["fusermount3", "-u", str(disk.mount)], check=True, timeout=30)
    try:
        assert disk.popen.wait(timeout=30) == 0
    except subprocess.TimeoutExpired:
        pytest.fail("the daemon did not exit within 30 s of fusermount3 -u")
    assert disk.durable() == {"f": b"F"}


def test_syncfs_is_not_forwarded_to_a_fuse_daemon(disk) -> None:
    """syncfs(2) on a FUSE mount returns 0 without asking the daemon (the kernel's sync_fs is
    set only for virtiofs), so it makes nothing durable here: only fsync, fdatasync and
    fsyncdir do. The trainer fsyncs each file on such mounts because of it."""
    m = disk.mount
    write(m / "f", b"data", fsync=False)
    fsync_ops = {k: v for k, v in disk.client().status()["counters"]["ops"].items() if k.startswith(("fsync", "fdata"))}
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(m / "f", os.O_RDONLY)
    try:
        assert libc.syncfs(fd) == 0, os.strerror(ctypes.get_errno())
    finally:
        os.close(fd)
    after = {k: v for k, v in disk.client().status()["counters"]["ops"].items() if k.startswith(("fsync", "fdata"))}
    assert after == fsync_ops  # no fsync, fdatasync or fsyncdir reached the daemon
    os.sync()  # sync(2) neither
    assert disk.client().status()["unsynced_bytes"] == 4
    power_loss(disk.popen, m)
    assert disk.durable() == {}
    disk.start()
    assert os.listdir(m) == []


def test_control_errors_name_the_field(disk) -> None:
    client = disk.client()
    assert client.raw(b'{"op": "mode", "mode": "melt"}\n')["error"].startswith("mode: ")
    assert client.raw(b'{"op": "mode", "mode": "slow", "latency_ms": -5}\n')["error"].startswith("latency_ms: ")
    assert client.raw(b'{"op": "explode"}\n')["error"].startswith("op: ")
    assert client.raw(b'{"op": "status", "verbose": true}\n')["error"].startswith("verbose: ")
    assert client.raw(b"{]\n")["error"].startswith("request: ")
    assert client.status()["ok"] is True  # still serving
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cli = [sys.executable, "-m", "chaos.diskfs.client", str(disk.control)]
    done = subprocess.run(cli + ["mode", "full"], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert done.returncode == 0 and json.loads(done.stdout)["mode"] == "full", done.stderr
    done = subprocess.run(cli + ["status"], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert done.returncode == 0 and json.loads(done.stdout)["mode"] == "full", done.stderr
    done = subprocess.run(cli + ["mode", "slow", "--latency-ms", "99999"], capture_output=True, text=True,
                          timeout=60, env=env, cwd=ROOT)
    assert done.returncode == 1 and json.loads(done.stdout)["error"].startswith("latency_ms: ")


def test_the_mount_point_is_reusable_after_sigkill(disk) -> None:
    m = disk.mount
    power_loss(disk.popen, m)
    assert not mounts.is_mounted(m) and os.listdir(m) == []
    disk.start()
    write(m / "a", b"A")
    fsync_dir(m)
    # SIGKILL of the whole group takes auto_unmount's fusermount3 watcher along: the mount is
    # left dead (ENOTCONN) until power_loss unmounts it lazily
    os.killpg(disk.popen.pid, signal.SIGKILL)
    disk.popen.wait(timeout=30)
    deadline = time.monotonic() + 10
    while not mounts.is_dead(m) and mounts.is_mounted(m):
        assert time.monotonic() < deadline, f"{m} neither dead nor unmounted 10 s after SIGKILL"
        time.sleep(0.02)
    power_loss(disk.popen, m)
    assert not mounts.is_mounted(m)
    disk.start()
    assert (m / "a").read_bytes() == b"A"
    # and a new daemon clears a dead mount left at its mount point by itself (once it is
    # dead: the group's other processes, the fusermount3 watcher holding the FUSE device
    # among them, are not reaped by waiting for the leader, and while one lives the mount
    # still answers, which a new daemon rightly refuses to take over)
    os.killpg(disk.popen.pid, signal.SIGKILL)
    disk.popen.wait(timeout=30)
    deadline = time.monotonic() + 10
    while not mounts.is_dead(m) and mounts.is_mounted(m):
        assert time.monotonic() < deadline, f"{m} neither dead nor unmounted 10 s after SIGKILL"
        time.sleep(0.02)
    disk.start()
    assert (m / "a").read_bytes() == b"A"


def test_the_syncers_python_patterns_work_on_the_mount(disk) -> None:
    """mkstemp, write, fsync, os.replace, fsync of the directory (trainer/atomic.py itself),
    glob, unlink, and safetensors' safe_open (an mmap read)."""
    np = pytest.importorskip("numpy")
    from safetensors import safe_open
    from safetensors.numpy import save_file

    from trainer.atomic import atomic_write_bytes

    m = disk.mount
    os.makedirs(m / "state" / "pending")
    fsync_dir(m)
    fsync_dir(m / "state")
    atomic_write_bytes(m / "state" / "meta.json", b'{"v": 1}')
    atomic_write_bytes(m / "state" / "meta.json", b'{"v": 2}')
    for i in range(3):
        atomic_write_bytes(m / "state" / "pending" / f"push-{i}.bin", bytes([i]) * 100)
    assert sorted(os.path.basename(p) for p in glob.glob(str(m / "state" / "pending" / "*.bin"))) == \
        ["push-0.bin", "push-1.bin", "push-2.bin"]
    os.unlink(m / "state" / "pending" / "push-1.bin")
    fsync_dir(m / "state" / "pending")
    tensors = {"w": np.arange(1000, dtype=np.float32).reshape(10, 100)}
    save_file(tensors, str(m / "state" / "frag.safetensors"))
    with open(m / "state" / "frag.safetensors", "rb+") as fh:
        os.fsync(fh.fileno())
    fsync_dir(m / "state")
    with safe_open(str(m / "state" / "frag.safetensors"), framework="np") as f:
        assert np.array_equal(f.get_tensor("w"), tensors["w"])
    power_loss(disk.popen, m)
    disk.start()
    assert (m / "state" / "meta.json").read_bytes() == b'{"v": 2}'
    assert sorted(os.listdir(m / "state" / "pending")) == ["push-0.bin", "push-2.bin"]
    assert not [n for n in os.listdir(m / "state") if n.endswith(".tmp")]
    with safe_open(str(m / "state" / "frag.safetensors"), framework="np") as f:
        assert np.array_equal(f.get_tensor("w"), tensors["w"])


def test_a_file_unlinked_while_open_is_usable_and_never_durable(disk) -> None:
    m = disk.mount
    write(m / "keep", b"K")
    fsync_dir(m)
    with open(m / "gone", "wb+") as fh:
        fh.write(b"data")
        fh.flush()
        os.unlink(m / "gone")
        os.replace(m / "keep", m / "kept")  # a rename while a file is open in the directory
        fh.seek(0)
        assert fh.read() == b"data"  # read() fstats: this fails with libfuse's hard_remove
        os.fsync(fh.fileno())
        fsync_dir(m)
        assert not any(n.startswith(HIDDEN) for n in os.listdir(disk.backing))
    assert os.listdir(m) == ["kept"]
    power_loss(disk.popen, m)
    assert disk.durable() == {"kept": b"K"}
    disk.start()
    assert os.listdir(m) == ["kept"]  # neither the hidden name nor the backing's staging directory


def test_rename_flags_reach_the_daemon(disk) -> None:
    m = disk.mount
    write(m / "a", b"A")
    write(m / "b", b"B")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd = -100

    def renameat2(old: Path, new: Path, flags: int) -> int:
        if libc.renameat2(at_fdcwd, bytes(old), at_fdcwd, bytes(new), flags) == 0:
            return 0
        return ctypes.get_errno()

    assert renameat2(m / "a", m / "b", 1) == errno.EEXIST  # RENAME_NOREPLACE
    assert renameat2(m / "a", m / "b", 2) == errno.EINVAL  # RENAME_EXCHANGE: not supported
    assert renameat2(m / "a", m / "c", 1) == 0
    assert sorted(os.listdir(m)) == ["b", "c"]


def test_the_daemon_backgrounds_itself_without_foreground(tmp_path) -> None:
    work = Path(tempfile.mkdtemp(prefix="diskfs-bg-"))
    ready = work / "ready.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "chaos.diskfs", "--backing", str(work / "b"), "--mount", str(work / "m"),
            "--control", str(work / "c.sock"), "--ready-file", str(ready)]
    with open(work / "log", "wb") as log:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=log, timeout=60, env=env, cwd=ROOT)
    assert done.returncode == 0, (work / "log").read_text()
    pid = json.loads(ready.read_text())["pid"]
    try:
        assert json.loads(done.stdout)["pid"] == pid
        assert mounts.mount_type(work / "m") == "fuse.diskfs"
        write(work / "m" / "f", b"F", fsync=False)
    finally:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{pid}") and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z":
            assert time.monotonic() < deadline, f"the background daemon {pid} did not exit within 30 s of SIGTERM"
            time.sleep(0.02)
        assert mounts.wait_unmounted(work / "m", 10), "the background daemon left its mount behind"
    assert load_image(work / "b").as_dict() == {"f": b"F"}
    shutil.rmtree(work, ignore_errors=True)


def test_start_reports_a_daemon_that_cannot_mount(tmp_path) -> None:
    work = Path(tempfile.mkdtemp(prefix="diskfs-bad-"))
    try:
        with pytest.raises(DiskfsError, match="must not contain one another"):
            start_diskfs(work / "b", work / "b" / "m", work / "c.sock", work / "log", timeout=30)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_the_bench_measures_both_figures(tmp_path) -> None:
    from chaos.diskfs.bench import measure

    work = Path(tempfile.mkdtemp(prefix="diskfs-bench-"))
    try:
        figures = measure(work, count=20, repeats=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert figures["diskfs_4mb_write_fsync_mb_s"] > 0 and figures["diskfs_10kb_atomic_writes_per_s"] > 0


def test_a_daemon_started_again_keeps_the_mode_in_force_from_its_mode_file(disk) -> None:
    """A daemon restarted with its container (or after a power loss) must not heal the disk
    by itself: it starts in the mode the harness keeps in --mode-file."""
    mode_file = disk.work / "mode.json"
    mode_file.write_text(json.dumps({"mode": "full", "latency_ms": 50}))
    power_loss(disk.popen, disk.mount)
    disk.popen = start_diskfs(disk.backing, disk.mount, disk.control, disk.log, timeout=30.0, mode_file=mode_file)
    assert disk.client().status()["mode"] == "full"
    with pytest.raises(OSError) as info:
        (disk.mount / "new").write_bytes(b"x" * 4096)
    assert info.value.errno == errno.ENOSPC
