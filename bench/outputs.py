"""Output paths of the bench scripts, checked before any work is done.

A benchmark that runs for minutes and then cannot write its JSON (the path is a
directory, its parent is a file, the parent is read-only) has wasted those minutes:
`output_file` and `output_dir` are argparse types that refuse such a path when the
command line is parsed, and `check_output` does the same for a path a script builds
itself (from another flag, or a fixed one), to be called at the start of main.

Neither type creates the output itself: `output_file` creates a file's missing parent
directories (the only sure test that they can be), `output_dir` creates nothing and
checks the nearest directory that exists.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path


def _writable_dir(directory: Path, label: str) -> None:
    """Create `directory` (and its parents) if missing; raise ArgumentTypeError, starting
    with `label`, if that fails, if it is not a directory, or if it cannot be written."""
    if directory.exists() and not directory.is_dir():
        raise argparse.ArgumentTypeError(f"{label}: {str(directory)!r} exists and is not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):  # a component of the path is a regular file
        raise argparse.ArgumentTypeError(
            f"{label}: cannot create directory {str(directory)!r}: part of that path is a file") from None
    except OSError as exc:
        raise argparse.ArgumentTypeError(
            f"{label}: cannot create directory {str(directory)!r}: {exc.strerror or exc}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{label}: directory {str(directory)!r} is not writable")


def output_file(text: str | os.PathLike) -> Path:
    """argparse type for a file a script will write: refuses an existing directory, a
    parent that is not a directory or cannot be created or written. Creates the missing
    parent directories, never the file itself."""
    if not str(text):
        raise argparse.ArgumentTypeError("expected a file path, got an empty string")
    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{str(path)!r} is a directory; expected the path of a file to write")
    if path.exists() and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"{str(path)!r} exists and is not writable")
    _writable_dir(path.parent, f"cannot write {str(path)!r}")
    return path


def output_dir(text: str | os.PathLike) -> Path:
    """argparse type for a directory a script will write into (or create): refuses a path
    that is a file, one under a file, or one whose nearest existing directory cannot be
    written. Creates nothing: the script makes the directory when it writes into it."""
    if not str(text):
        raise argparse.ArgumentTypeError("expected a directory path, got an empty string")
    path = Path(text).expanduser()
    label = f"cannot write into {str(path)!r}"
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "it" if existing == path else f"{str(existing)!r}"
        raise argparse.ArgumentTypeError(f"{label}: {what} exists and is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{label}: directory {str(existing)!r} is not writable")
    return path


def check_output(parser: argparse.ArgumentParser, flag: str, path: str | os.PathLike, kind=output_file) -> Path:
    """`kind(path)`, or `parser.error` naming `flag`: for output paths a script builds
    itself, checked at the start of main like the ones argparse checks."""
    try:
        return kind(path)
    except argparse.ArgumentTypeError as exc:
        parser.error(f"{flag}: {exc}")
        raise  # unreachable: error() exits
