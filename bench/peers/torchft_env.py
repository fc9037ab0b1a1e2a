"""torchft's own virtual environment, beside (never inside) the project's dependencies.

The venv lives at bench/out/work/torchft-venv (bench/out is git-ignored). It is made with
--system-site-packages so it reuses the torch this machine already has, and pip is held
to that torch by a constraints file: installing torchft must never pull another torch.

    python bench/peers/torchft_env.py          # create or reuse it; prints one JSON line

From Python: `ensure_torchft()` gives the venv's python (or None, with the reason printed),
`lighthouse_binary()` the Rust lighthouse its wheel ships. Standard library only, so the
project's python can call it without torchft or torch being importable there.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORK_DIR = ROOT / "bench" / "out" / "work"
VENV_DIR = WORK_DIR / "torchft-venv"
TORCHFT_VERSION = "0.2.0"
PIP_TIMEOUT = 600.0       # the whole `pip install`; it took ~16 s here with a warm index
CHECK_TIMEOUT = 120.0     # importing torch + torchft in the venv (slow on a loaded 2-core box)
MARKER = ".islands-torchft.json"

_PROBE = ("import json, torch, torchft, importlib.metadata as m; "
          "print(json.dumps({'torch': torch.__version__, 'torch_file': torch.__file__, "
          "'torchft': m.version('torchft'), 'torchft_file': torchft.__file__}))")


def venv_python(venv: Path = VENV_DIR) -> Path:
    return venv / "bin" / "python"


def lighthouse_binary(venv: Path = VENV_DIR) -> Path | None:
    """The `torchft_lighthouse` executable the torchft wheel installs, or None."""
    path = venv / "bin" / "torchft_lighthouse"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def host_torch_version() -> str | None:
    """The installed torch's public version (2.13.0 for 2.13.0+cpu), read without importing it."""
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version("torch").split("+", 1)[0]
    except PackageNotFoundError:
        return None


def _probe(python: Path) -> dict | None:
    try:
        out = subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True,
                             timeout=CHECK_TIMEOUT, env=_clean_env())
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    return env


def _healthy(info: dict | None, venv: Path) -> str | None:
    """Why the venv's torchft/torch pair is unusable, or None when it is fine."""
    if info is None:
        return "importing torch and torchft in the venv failed"
    if info.get("torchft") != TORCHFT_VERSION:
        return f"the venv holds torchft {info.get('torchft')}, not {TORCHFT_VERSION}"
    if str(venv.resolve()) in str(Path(info.get("torch_file", "")).resolve()):
        return f"pip installed a second torch ({info.get('torch')}) into the venv"
    return None


def ensure_torchft(venv: Path = VENV_DIR, quiet: bool = False) -> Path | None:
    """Create or reuse the venv with torchft==0.2.0; the venv's python, or None (reason printed)."""
    def fail(reason: str) -> None:
        print(f"torchft: not available: {reason}", file=sys.stderr, flush=True)

    python = venv_python(venv)
    if python.exists() and lighthouse_binary(venv) is not None:
        info = _probe(python)
        if _healthy(info, venv) is None:
            return python
    torch_version = host_torch_version()
    if torch_version is None:
        fail("torch is not installed for this python, so the venv would have to download one")
        return None
    venv.parent.mkdir(parents=True, exist_ok=True)
    log = venv.parent / "torchft-install.log"
    started = time.monotonic()
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                           check=True, capture_output=True, text=True, timeout=120)
        constraints = venv.parent / "torchft-constraints.txt"
        constraints.write_text(f"torch=={torch_version}\n")
        cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-c", str(constraints),
               f"torchft=={TORCHFT_VERSION}", f"torch=={torch_version}"]
        if not quiet:
            print(f"torchft: installing into {venv} (log: {log})", file=sys.stderr, flush=True)
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"$ {' '.join(cmd)}\n")
            fh.flush()
            done = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=PIP_TIMEOUT,
                                  env=_clean_env())
    except subprocess.TimeoutExpired as exc:
        fail(f"{' '.join(map(str, exc.cmd))[:80]}... timed out after {exc.timeout:.0f}s (log: {log})")
        return None
    except subprocess.CalledProcessError as exc:
        fail(f"python -m venv failed: {(exc.stderr or exc.stdout or '').strip()[-400:]}")
        return None
    except OSError as exc:
        fail(f"{type(exc).__name__}: {exc}")
        return None
    if done.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-5:]
        fail(f"pip install exited {done.returncode}: {' | '.join(tail)}")
        return None
    if lighthouse_binary(venv) is None:
        fail(f"the torchft wheel installed no torchft_lighthouse in {venv / 'bin'}")
        return None
    info = _probe(python)
    reason = _healthy(info, venv)
    if reason is not None:
        fail(reason)
        return None
    marker = dict(info or {}, installed_in_s=round(time.monotonic() - started, 1), python=str(python),
                  lighthouse=str(lighthouse_binary(venv)))
    (venv / MARKER).write_text(json.dumps(marker, indent=1))
    return python


def describe(venv: Path = VENV_DIR) -> dict:
    python = ensure_torchft(venv)
    if python is None:
        return {"available": False, "venv": str(venv)}
    info = _probe(python) or {}
    marker = {}
    try:
        marker = json.loads((venv / MARKER).read_text())
    except (OSError, ValueError):
        pass
    return {"available": True, "python": str(python), "lighthouse": str(lighthouse_binary(venv)),
            "torch": info.get("torch"), "torchft": info.get("torchft"),
            "installed_in_s": marker.get("installed_in_s")}


if __name__ == "__main__":
    result = describe()
    print(json.dumps(result))
    sys.exit(0 if result["available"] else 1)
