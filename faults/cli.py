"""``validate FILE [--learners N]``: check a schedule file before a run spends time on it.

The chaos package wires this in as ``python -m chaos validate FILE``; here it
only needs the arguments after ``validate``. Exit 0 when the file is valid,
2 when it is invalid or can't be read (argparse's code for usage errors too).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from faults.kinds import fmt_seconds
from faults.schedule import Schedule, ScheduleError

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


def summary(schedule: Schedule) -> str:
    """One line for a valid schedule: ``OK: 3 faults over 34 s, targets: learner-1, ...``."""
    n = len(schedule.faults)
    targets = ", ".join(schedule.targets()) or "none"
    return f"OK: {n} fault{'' if n == 1 else 's'} over {fmt_seconds(schedule.horizon)} s, targets: {targets}"


def build_parser(prog: str = "python -m chaos validate") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Check a fault schedule file (.yaml, .yml or .json).")
    parser.add_argument("file", metavar="FILE", help="schedule file")
    parser.add_argument(
        "--learners",
        type=_positive_int,
        metavar="N",
        help="learners in the run; targets are checked against it (default: the file's learners field)",
    )
    return parser


def validate_main(argv: Sequence[str] | None = None, *, prog: str = "python -m chaos validate") -> int:
    """Validate one schedule file; prints a summary (stdout) or every error (stderr); returns the exit code.

    ``argv`` is the arguments after ``validate`` (default ``sys.argv[1:]``).
    Never raises SystemExit, so callers can wrap it in their own CLI.
    """
    try:
        args = build_parser(prog).parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_INVALID
    path = Path(args.file)
    try:
        if not path.exists():  # before the extension check: "no such file" is the real problem
            raise FileNotFoundError(args.file)
        schedule = Schedule.load(path, learners=args.learners)
    except FileNotFoundError:
        print(f"error: no such file: {args.file}", file=sys.stderr)
        return EXIT_INVALID
    except OSError as exc:
        print(f"error: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_INVALID
    except ScheduleError as exc:
        print(str(exc), file=sys.stderr)
        n = len(exc.errors)
        print(f"INVALID: {n} error{'' if n == 1 else 's'}", file=sys.stderr)
        return EXIT_INVALID
    print(summary(schedule))
    return EXIT_OK


if __name__ == "__main__":  # python -m faults.cli FILE
    raise SystemExit(validate_main())
