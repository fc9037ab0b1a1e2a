"""A warm spare process: it imports (and warms up) what a role needs ahead of time, then
waits for the one command line it will become.

Restarting a learner means a fresh Python process that imports torch and pays torch's
lazy first-use costs: 2 s on a quiet core, 5-9 s when four learners share two, which
is the whole of a restart's downtime. A spare pays that before it is needed, the way a
hot-standby host has its runtime loaded. Once assigned it is an ordinary process of
the role: its own PID (the handle the harness already holds), log, environment and exit
status, so kills, pauses and the registry treat it like any other.

Run as a script (`python chaos/spare_main.py --preload mod,mod`), never imported: it uses
the standard library only, so a spare carries no harness code into the role it becomes.

Protocol: one JSON line on stdin, {"argv": [...], "env": {...}, "log": path, "cwd": path}.
`argv` is the command line after the interpreter, either ["-m", module, args...] or
[script, args...]. End of file (the harness went away) makes the spare exit 0 unused.
"""
from __future__ import annotations

import importlib
import json
import os
import runpy
import sys

MAX_REQUEST_BYTES = 1 << 20


def _preload(modules: list[str]) -> None:
    for name in modules:
        importlib.import_module(name)


def _redirect(log: str) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


def _become(request: dict) -> None:
    argv = [str(a) for a in request["argv"]]
    if not argv:
        raise ValueError("argv: empty")
    if request.get("cwd"):
        os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in request["env"].items()})
    _redirect(str(request["log"]))
    if argv[0] == "-m":
        if len(argv) < 2:
            raise ValueError("argv: -m needs a module name")
        sys.path[0] = os.getcwd()  # what `python -m` puts first
        sys.argv = [argv[1], *argv[2:]]  # run_module puts the module's file in sys.argv[0]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))  # what `python script` puts first
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")


def main() -> int:
    # As a script, sys.path[0] is this file's directory; chaos' own modules must not
    # shadow anything the role imports (chaos/toxiproxy vs a `toxiproxy` package).
    sys.path[0] = os.getcwd()
    args = sys.argv[1:]
    if len(args) != 2 or args[0] != "--preload":
        print("usage: spare_main.py --preload MODULE[,MODULE...]", file=sys.stderr)
        return 2
    _preload([m for m in args[1].split(",") if m])
    print(f"spare {os.getpid()}: ready", flush=True)
    line = sys.stdin.buffer.readline(MAX_REQUEST_BYTES)
    if not line:
        return 0  # never assigned: the harness closed the pipe
    _become(json.loads(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
