"""``python -m chaos.diskfs --backing DIR --mount DIR --control SOCKET [--ready-file FILE] [--foreground]``

Loads the backing directory (the durable image) into memory, mounts the volatile view at
--mount, answers the control socket, writes --ready-file once the mount answers, and
serves until SIGTERM, SIGINT or `fusermount3 -u`: then everything is flushed to the
backing directory (a clean unmount) and it exits 0. SIGKILL is a power loss: the backing
directory holds exactly what was made durable. See docs/diskfs.md.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

from trainer.argtypes import DescriptionFormatter, Parser

from . import mounts
from .backing import Backing, load_image
from .control import ControlServer
from .fs import DiskFS, serve
from .model import Model
from .modes import FaultPolicy

log = logging.getLogger("chaos.diskfs")

READY_TIMEOUT_S = 30.0
# fuse_main's status when its loop ended with an error, which libfuse 3 also sets when its
# SIGTERM/SIGINT/SIGHUP handler ends the loop (se->error = the signal): a clean stop once mounted.
SIGNAL_STATUS = 8


def build_parser(prog: str = "python -m chaos.diskfs") -> Parser:
    parser = Parser(prog=prog, description=__doc__, formatter_class=DescriptionFormatter)
    parser.add_argument("--backing", required=True, help="directory holding the durable image (created if missing)")
    parser.add_argument("--mount", required=True, help="mount point of the volatile view (created if missing)")
    parser.add_argument("--control", required=True, help="Unix socket path of the control protocol")
    parser.add_argument("--ready-file", default=None,
                        help="file written (JSON: pid, mount, backing, control) once the mount answers")
    parser.add_argument("--mode-file", default=None,
                        help="the fault mode to start in, a JSON object {\"mode\": ..., \"latency_ms\": ...} "
                             "(a harness keeps the mode in force there, so a daemon restarted with its container "
                             "or after a power loss does not silently heal the disk); missing: mode none")
    parser.add_argument("--foreground", action="store_true",
                        help="stay in the foreground; without it the command returns once the mount is ready "
                             "and the daemon goes on in the background")
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m chaos.diskfs") -> int:
    args = build_parser(prog).parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s diskfs[%(process)d] %(levelname)s %(message)s")
    backing, mount = os.path.abspath(args.backing), os.path.abspath(args.mount)
    for a, b in ((backing, mount), (mount, backing)):
        if (a + os.sep).startswith(b + os.sep):
            print(f"{prog}: error: --backing and --mount must not contain one another ({backing}, {mount})",
                  file=sys.stderr)
            return 2
    os.makedirs(backing, exist_ok=True)
    os.makedirs(mount, exist_ok=True)
    if not args.foreground:
        return _background(args, backing, mount)
    return run(backing, mount, args.control, args.ready_file, args.mode_file)


def initial_mode(policy: FaultPolicy, mode_file: str | None) -> None:
    """Start in the mode `mode_file` names (none when it is missing)."""
    if not mode_file or not os.path.exists(mode_file):
        return
    spec = json.loads(Path(mode_file).read_text())
    policy.set_mode(str(spec.get("mode", "none")), float(spec.get("latency_ms", 50.0)))
    log.info("starting in mode %s (from %s)", policy.mode, mode_file)


def run(backing: str, mount: str, control_path: str, ready_file: str | None, mode_file: str | None = None) -> int:
    """Mount, serve until told to stop, flush. The exit status."""
    # Another file system mounted there (a container's volume) is shadowed by this mount, as
    # any mount shadows its mount point; another FUSE mount is another daemon's, or a dead one.
    if mounts.is_mounted(mount) and (mounts.mount_type(mount) or "").startswith("fuse"):
        if not mounts.is_dead(mount):
            log.error("%s is already mounted (%s) and answers: is another daemon serving it?",
                      mount, mounts.mount_type(mount))
            return 1
        log.warning("%s: a dead FUSE mount (its daemon is gone): unmounting it lazily", mount)
        mounts.unmount(mount, lazy=True)
    if ready_file:
        Path(ready_file).unlink(missing_ok=True)
    started = time.monotonic()
    model = Model(load_image(backing))
    ops = DiskFS(model, Backing(backing), FaultPolicy())
    initial_mode(ops.policy, mode_file)
    log.info("loaded %s: %d files, %.1f ms", backing, model.file_count(), (time.monotonic() - started) * 1e3)
    control = ControlServer(control_path, ops.policy.set_mode, ops.status).start()
    done, ready = threading.Event(), threading.Event()
    threading.Thread(target=_announce_ready, args=(mount, backing, control_path, ready_file, done, ready),
                     name="diskfs-ready", daemon=True).start()
    rc = 0
    try:
        serve(ops, mount)
    except RuntimeError as exc:  # mfusepy: fuse_main's status, when not 0
        if exc.args == (SIGNAL_STATUS,) and ready.is_set():
            log.info("a signal ended the FUSE loop: a clean stop")
        else:
            log.error("the FUSE loop failed: status %s", exc)
            rc = 1
    except Exception as exc:
        log.exception("the FUSE loop failed: %s", exc)
        rc = 1
    finally:
        done.set()
        unsynced = ops.flush_all()
        control.stop()
        if ready_file:
            Path(ready_file).unlink(missing_ok=True)
    log.info("stopped: flushed %d unsynced bytes into %s", unsynced, backing)
    return rc


def _announce_ready(mount: str, backing: str, control: str, ready_file: str | None, done: threading.Event,
                    ready: threading.Event) -> None:
    """Write the ready file once `mount` is a FUSE mount that answers statfs."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not done.is_set():
        kind = mounts.mount_type(mount)
        if kind is not None and kind.startswith("fuse"):
            try:
                os.statvfs(mount)
                break
            except OSError:
                pass
        if time.monotonic() >= deadline:
            log.error("%s did not become a FUSE mount that answers within %.0f s", mount, READY_TIMEOUT_S)
            return
        done.wait(0.02)
    else:
        return
    ready.set()
    log.info("mounted %s (backing %s, control %s)", mount, backing, control)
    if ready_file:
        text = json.dumps({"pid": os.getpid(), "mount": mount, "backing": backing, "control": control})
        tmp = f"{ready_file}.{os.getpid()}.tmp"
        Path(tmp).write_text(text + "\n")
        os.replace(tmp, ready_file)


def _background(args, backing: str, mount: str) -> int:
    """Fork before any thread starts; the parent returns 0 once the child's mount is ready.
    The daemon's stdout goes to /dev/null and its stderr (the log) stays where it was."""
    ready = args.ready_file or os.path.join(os.path.dirname(os.path.abspath(args.control)),
                                            f".diskfs-ready.{os.getpid()}")
    Path(ready).unlink(missing_ok=True)
    pid = os.fork()
    if pid == 0:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)  # the parent's stdout (a pipe, often) must close when the parent exits
        os.close(devnull)
        code = 1
        try:
            code = run(backing, mount, args.control, ready, args.mode_file)
        finally:
            os._exit(code)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        finished, status = os.waitpid(pid, os.WNOHANG)
        if finished:
            print(f"diskfs: the daemon exited before its mount was ready (status {status})", file=sys.stderr)
            return 1
        try:
            if json.loads(Path(ready).read_text()).get("pid") == pid:
                print(json.dumps({"pid": pid, "mount": mount}))
                return 0
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    print(f"diskfs: the mount at {mount} was not ready within {READY_TIMEOUT_S:.0f} s", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
