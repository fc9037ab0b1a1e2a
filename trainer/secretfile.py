"""Files that hold a secret, private (0600) from their first byte.

`write_text` then `chmod` leaves a window in which the file has the umask's mode (0644
under the usual 022, 0666 under umask 0): anyone on the machine may open it then and keep
the descriptor after the chmod. Here the mode goes to open(2) itself, on a temporary file
that is complete before it appears under its name, so no reader ever sees it world-readable
or half written. Kept free of torch and of chaos, so the trainer, the harness and the
benches share it.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path

SECRET_MODE = 0o600
SECRET_BYTES = 32  # 64 hex characters, well above trainer.wire's minimum


def new_secret() -> str:
    """A fresh shared secret, as hex text (what `load_secret` reads back)."""
    return secrets.token_hex(SECRET_BYTES)


def _write_private(path: Path, data: bytes) -> None:
    """Create `path` (it must not exist) with mode 0600 and `data`, fsynced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, SECRET_MODE)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _tighten(path: Path) -> None:
    """A secret file written before this module (or by hand) may be readable by others."""
    if path.stat().st_mode & 0o077:
        path.chmod(SECRET_MODE)


def ensure_secret(path: str | os.PathLike) -> Path:
    """`path` holding a secret, created 0600 with a fresh one when it is missing. An
    existing file is kept (its mode tightened to 0600), so processes that share a run
    directory share one secret; of two callers at once, the first link wins and the other
    keeps its file."""
    target = Path(path)
    if target.exists():
        _tighten(target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    _write_private(tmp, new_secret().encode())
    try:
        os.link(tmp, target)  # atomic: fails when another caller made it first
    except FileExistsError:
        _tighten(target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def main(argv: list[str] | None = None) -> int:
    """`python -m trainer.secretfile PATH`: make PATH a private secret file unless it is one
    already (e.g. for the compose cluster brought up by hand)."""
    import sys
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m trainer.secretfile PATH", file=sys.stderr)
        return 2
    print(ensure_secret(args[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
