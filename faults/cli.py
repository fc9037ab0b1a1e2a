"""``validate FILE [--learners N] [--ranks R]``: check a schedule file before a run spends time on it.

The chaos package wires this in as ``python -m chaos validate FILE``; here it
only needs the arguments after ``validate``. Exit 0 when the file is valid,
2 when it is invalid or can't be read (argparse's code for usage errors too).

It checks against the cluster ``chaos run`` would start with the same flags: the
file's ``learners:`` (else 3) learner units of ``--ranks`` (1) ranks each, so a
schedule that validates is one that ``chaos run`` accepts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from faults.kinds import fmt_seconds
from faults.schedule import Schedule, ScheduleError, declared_learners
from faults.sizing import DEFAULT_LEARNERS, DEFAULT_RANKS, SizeConflict, resolve_learners

EXIT_OK = 0
EXIT_INVALID = 2


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def summary(schedule: Schedule, learners: int | None = None, ranks: int = DEFAULT_RANKS) -> str:
    """One line for a valid schedule: ``OK: 3 faults over 34 s, targets: learner-1, ... (3 learners)``."""
    n = len(schedule.faults)
    targets = ", ".join(schedule.targets()) or "none"
    line = f"OK: {n} fault{'' if n == 1 else 's'} over {fmt_seconds(schedule.horizon)} s, targets: {targets}"
    if learners is None:
        return line
    return line + f" ({learners} learners" + (f" of {ranks} ranks" if ranks > 1 else "") + ")"


def build_parser(prog: str = "python -m chaos validate",
                 parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`parser_class`: chaos passes its own (short errors, every default shown); faults imports nothing of ours."""
    parser = parser_class(prog=prog, description="Check a fault schedule file (.yaml, .yml or .json).")
    parser.add_argument("file", metavar="FILE", help="schedule file")
    parser.add_argument(
        "--learners",
        type=_positive_int,
        metavar="N",
        help=f"learners in the run, as `chaos run --learners`; targets are checked against it (default: the "
        f"file's learners field, else {DEFAULT_LEARNERS}, as `chaos run`); must agree with the file's learners",
    )
    parser.add_argument(
        "--ranks",
        type=_positive_int,
        default=DEFAULT_RANKS,
        metavar="R",
        help=f"ranks per learner unit, as `chaos run --ranks`; learner-N/rank-R targets need R < this "
        f"(default {DEFAULT_RANKS}: single-process learners, no rank targets)",
    )
    return parser


def validate_main(argv: Sequence[str] | None = None, *, prog: str = "python -m chaos validate",
                  parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser) -> int:
    """Validate one schedule file; prints a summary (stdout) or every error (stderr); returns the exit code.

    ``argv`` is the arguments after ``validate`` (default ``sys.argv[1:]``).
    Never raises SystemExit, so callers can wrap it in their own CLI.
    """
    try:
        args = build_parser(prog, parser_class).parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_INVALID
    path = Path(args.file)
    try:
        if not path.exists():  # before the extension check: "no such file" is the real problem
            raise FileNotFoundError(args.file)
        learners = resolve_learners(declared_learners(path), args.learners)
        schedule = Schedule.load(path, learners=learners, ranks=args.ranks)
    except FileNotFoundError:
        print(f"error: no such file: {args.file}", file=sys.stderr)
        return EXIT_INVALID
    except OSError as exc:
        print(f"error: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_INVALID
    except SizeConflict as exc:
        print(f"{args.file}: {exc}", file=sys.stderr)
        print("INVALID: 1 error", file=sys.stderr)
        return EXIT_INVALID
    except ScheduleError as exc:
        print(str(exc), file=sys.stderr)
        n = len(exc.errors)
        print(f"INVALID: {n} error{'' if n == 1 else 's'}", file=sys.stderr)
        return EXIT_INVALID
    print(summary(schedule, learners, args.ranks))
    return EXIT_OK


if __name__ == "__main__":  # python -m faults.cli FILE
    raise SystemExit(validate_main())
