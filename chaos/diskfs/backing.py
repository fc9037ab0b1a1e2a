"""The backing directory: the durable image on the host disk.

The daemon loads it whole at start (the volatile view starts as the durable image) and
applies the model's `Effect`s to it whenever something becomes durable. A file is
replaced atomically (a temporary file in `STAGING`, then `os.replace`), so a daemon
killed mid-effect leaves either the old or the new content, never a torn file; the
staging directory is emptied at the next load. The host disk itself is assumed reliable
and is not fsynced: a SIGKILLed daemon loses its memory, not the host's page cache.
"""
from __future__ import annotations

import logging
import os
import shutil
import stat
from pathlib import Path

from .model import STAGING, DirImage, Effect, FileImage, MakeDir, Remove, WriteFile

log = logging.getLogger("chaos.diskfs")


def load_image(root: str | os.PathLike) -> DirImage:
    """The durable image held in `root` (created if missing); clears leftover staging files.
    Anything but regular files and directories (symlinks, fifos) is skipped with a warning."""
    base = Path(root)
    base.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(base / STAGING, ignore_errors=True)
    return _load_dir(base, top=True)


def _load_dir(path: Path, top: bool = False) -> DirImage:
    image = DirImage(mode=stat.S_IMODE(path.stat().st_mode))
    with os.scandir(path) as it:
        for entry in sorted(it, key=lambda e: e.name):
            if top and entry.name == STAGING:
                continue
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                image.entries[entry.name] = _load_dir(Path(entry.path))
            elif stat.S_ISREG(st.st_mode):
                image.entries[entry.name] = FileImage(Path(entry.path).read_bytes(), stat.S_IMODE(st.st_mode))
            else:
                log.warning("diskfs: skipping %s in the backing directory: not a regular file or directory", entry.path)
    return image


class Backing:
    """Applies effects to the backing directory `root`."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.staging = self.root / STAGING
        self._seq = 0

    def apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, WriteFile):
                self._write(effect)
            elif isinstance(effect, MakeDir):
                target = self._path(effect.path)
                target.mkdir(exist_ok=True)
                os.chmod(target, effect.mode)
            elif isinstance(effect, Remove):
                self._remove(self._path(effect.path))
            else:  # pragma: no cover - the model makes only these
                raise TypeError(f"unknown effect {effect!r}")

    def _path(self, parts: tuple[str, ...]) -> Path:
        for part in parts:
            if not part or "/" in part or part in (".", ".."):
                raise ValueError(f"diskfs backing: unsafe name {part!r} in {parts!r}")
        return self.root.joinpath(*parts)

    def _write(self, effect: WriteFile) -> None:
        target = self._path(effect.path)
        self.staging.mkdir(exist_ok=True)
        self._seq += 1
        tmp = self.staging / f"{os.getpid()}.{self._seq}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(effect.data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, effect.mode)
        finally:
            os.close(fd)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(tmp, target)

    @staticmethod
    def _remove(target: Path) -> None:
        try:
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink()
        except FileNotFoundError:
            pass
