"""torchft's own virtual environment, beside (never inside) the project's dependencies.

The venv lives at bench/out/work/torchft-venv (bench/out is git-ignored). It reuses the torch
of the python that runs the bench (the host: `sys.executable`, whether that is the system
python or a venv of its own): the venv is made by the host's python, without
--system-site-packages (which would give it the *base* interpreter's packages, with no torch
when Islands lives in a venv), and a .pth file in its site-packages puts the host's site
directories on its path, in the host's order. pip sees that torch as installed and is held to its
exact version by a constraints file, so installing torchft never pulls a second torch; after
the install the venv's `torch.__file__` must be the host's, or the venv is refused. Directories
outside the venv are never written by its pip (pip uninstalls only inside its environment).
The venv records the host it was built for and is rebuilt when that host, or its torch, changes.

    python bench/peers/torchft_env.py          # create or reuse it; prints one JSON line

From Python: `ensure_torchft()` gives the venv's python (or None, with the reason printed),
`lighthouse_binary()` the Rust lighthouse its wheel ships. Standard library only, so the
project's python can call it without torchft or torch being importable there.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORK_DIR = ROOT / "bench" / "out" / "work"
VENV_DIR = WORK_DIR / "torchft-venv"
TORCHFT_VERSION = "0.2.0"
PIP_TIMEOUT = 600.0       # the whole `pip install`; it took ~16 s here with a warm index
CHECK_TIMEOUT = 120.0     # importing torch + torchft in the venv (slow on a loaded 2-core box)
VENV_TIMEOUT = 300.0      # `python -m venv` (0.2 s here), or ensurepip (7 s) for a host without pip
MARKER = ".islands-torchft.json"
HOST_PTH = "_islands_host_torch.pth"  # in the venv's site-packages: the host's site directories

_PROBE = ("import json, torch, torchft, importlib.metadata as m; "
          "print(json.dumps({'torch': torch.__version__, 'torch_file': torch.__file__, "
          "'torchft': m.version('torchft'), 'torchft_file': torchft.__file__}))")

# Run by the host python: where its torch lies, found without importing torch.
_HOST_PROBE = """\
import importlib.metadata as m, importlib.util as u, json, sys
spec = u.find_spec('torch')
try:
    dist = m.distribution('torch')
    version, dist_dir = dist.version, str(dist.locate_file(''))
except m.PackageNotFoundError:
    version = dist_dir = None
print(json.dumps({'executable': sys.executable, 'prefix': sys.prefix,
                  'python_version': '%d.%d.%d' % sys.version_info[:3], 'path': sys.path,
                  'torch_origin': spec.origin if spec is not None else None,
                  'torch_version': version, 'torch_dist_dir': dist_dir}))
"""
# The same interpreter with no site module: its path without any site directory.
_BARE_PATH_PROBE = "import json, sys; print(json.dumps(sys.path))"


def venv_python(venv: Path = VENV_DIR) -> Path:
    return venv / "bin" / "python"


def lighthouse_binary(venv: Path = VENV_DIR) -> Path | None:
    """The `torchft_lighthouse` executable the torchft wheel installs, or None."""
    path = venv / "bin" / "torchft_lighthouse"
    return path if path.is_file() and os.access(path, os.X_OK) else None


# ------------------------------------------------------------------ the host's torch (pure parts)
def torch_dirs(host: dict) -> list[str]:
    """The directories that make the host's torch importable and visible to pip: the one its
    package lies in, then the one its metadata (dist-info) lies in when that differs."""
    dirs = []
    if host.get("torch_origin"):
        dirs.append(os.path.dirname(os.path.dirname(host["torch_origin"])))  # .../site-packages/torch/__init__.py
    if host.get("torch_dist_dir"):
        dirs.append(host["torch_dist_dir"])
    return _unique(dirs)


def site_dirs(path: Sequence[str], bare_path: Sequence[str]) -> list[str]:
    """The host's sys.path less what it has without its site module (the standard library) and
    less the current directory: its site-packages, user site, .pth-added directories, in order."""
    bare = set(bare_path)
    return _unique(p for p in path if p and p not in bare)


def pth_dirs(host: dict, bare_path: Sequence[str], venv: Path) -> list[str]:
    """What the venv's .pth file lists: the host's site directories in the host's order (so
    every import, torch's included, resolves as it does on the host), after torch's own
    directories where the host's path lacks them; never a directory inside the venv itself."""
    inside = str(venv.absolute())
    sites = site_dirs(host.get("path", []), bare_path)
    missing = [d for d in torch_dirs(host) if d not in sites]
    return [d for d in missing + sites if d != inside and not d.startswith(inside + os.sep)]


def pth_text(dirs: Sequence[str]) -> str:
    """A .pth file that appends `dirs` to sys.path (path lines only: nothing it names is run)."""
    for d in dirs:
        if "\n" in d or d.lstrip().startswith(("import ", "import\t", "#")):
            raise ValueError(f"cannot name {d!r} in a .pth file")
    return "# Islands: the site directories of the python that runs the bench (torchft_env.py)\n" + \
        "".join(f"{d}\n" for d in dirs)


def constraints_text(torch_version: str) -> str:
    """pip's constraints: exactly the host's torch (its local label included, 2.13.0+cpu)."""
    return f"torch=={torch_version}\n"


def host_fingerprint(host: dict, dirs: Sequence[str]) -> dict:
    """What the venv was built against; any change means a rebuild."""
    return {"python": host.get("executable"), "prefix": host.get("prefix"),
            "python_version": host.get("python_version"), "torch_version": host.get("torch_version"),
            "torch_origin": host.get("torch_origin"), "site_dirs": list(dirs)}


def stale_reason(marker: dict | None, fingerprint: dict) -> str | None:
    """Why a venv built as `marker` records must be rebuilt for this host, or None."""
    if not marker or not isinstance(marker.get("host"), dict):
        return "it records no host interpreter (built by an older version of this script)"
    built = marker["host"]
    changed = [k for k in sorted(set(built) | set(fingerprint)) if built.get(k) != fingerprint.get(k)]
    if not changed:
        return None
    return "the host changed: " + "; ".join(f"{k} {built.get(k)!r} -> {fingerprint.get(k)!r}" for k in changed)


def _unique(items) -> list[str]:
    seen: set[str] = set()
    return [x for x in items if not (x in seen or seen.add(x))]


def _same_file(a: str | None, b: str | None) -> bool:
    return bool(a and b) and os.path.realpath(a) == os.path.realpath(b)


# ------------------------------------------------------------------ probes
def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSAFEPATH"):
        env.pop(name, None)
    return env


def _run_json(cmd: Sequence[str], timeout: float):
    try:
        out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=_clean_env())
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def host_info(python: str | os.PathLike) -> tuple[dict, list[str]] | None:
    """The host's torch and sys.path (torch not imported), and its path with no site module."""
    host = _run_json([str(python), "-c", _HOST_PROBE], CHECK_TIMEOUT)
    bare = _run_json([str(python), "-I", "-S", "-c", _BARE_PATH_PROBE], CHECK_TIMEOUT)
    if not isinstance(host, dict) or not isinstance(bare, list):
        return None
    return host, bare


def _probe(python: Path) -> dict | None:
    return _run_json([str(python), "-c", _PROBE], CHECK_TIMEOUT)


def _site_packages(python: Path) -> Path | None:
    out = _run_json([str(python), "-c", "import json, sysconfig; print(json.dumps(sysconfig.get_path('purelib')))"],
                    CHECK_TIMEOUT)
    return Path(out) if isinstance(out, str) else None


def second_torch(venv: Path) -> list[str]:
    """A torch installed into the venv's own site-packages (it must have none), as paths."""
    return sorted(str(p) for sp in venv.glob("lib*/python*/site-packages") for p in sp.iterdir()
                  if p.name == "torch" or (p.name.startswith("torch-") and p.name.endswith(".dist-info")))


def _healthy(info: dict | None, venv: Path, host: dict) -> str | None:
    """Why the venv's torchft/torch pair is unusable, or None when it is fine."""
    if info is None:
        return "importing torch and torchft in the venv failed"
    if info.get("torchft") != TORCHFT_VERSION:
        return f"the venv holds torchft {info.get('torchft')}, not {TORCHFT_VERSION}"
    own = second_torch(venv)
    venv_torch = Path(info.get("torch_file", "")).resolve()
    if own or str(venv.resolve()) in str(venv_torch):
        return f"pip installed a second torch ({info.get('torch')}) into the venv: {', '.join(own) or venv_torch}"
    if not _same_file(info.get("torch_file"), host.get("torch_origin")):
        return (f"the venv imports torch from {info.get('torch_file')}, not the host's "
                f"{host.get('torch_origin')} ({host.get('executable')})")
    return None


def _read_marker(venv: Path) -> dict | None:
    try:
        marker = json.loads((venv / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


# ------------------------------------------------------------------ the venv
def ensure_torchft(venv: Path = VENV_DIR, quiet: bool = False, host_python: str | os.PathLike | None = None,
                   pip_args: Sequence[str] = ()) -> Path | None:
    """Create or reuse the venv with torchft==0.2.0 on the torch of `host_python` (default: the
    python running this); the venv's python, or None (reason printed). `pip_args` go to
    `pip install` before the requirements (a local wheel directory, say)."""
    def fail(reason: str) -> None:
        print(f"torchft: not available: {reason}", file=sys.stderr, flush=True)

    host_python = str(host_python or sys.executable)
    found = host_info(host_python)
    if found is None:
        fail(f"could not ask {host_python} where its torch lies")
        return None
    host, bare = found
    if not host.get("torch_origin") or not host.get("torch_version"):
        fail(f"torch is not installed for {host_python}, so the venv would have to download one")
        return None
    dirs = [d for d in pth_dirs(host, bare, venv) if os.path.isdir(d)]
    fingerprint = host_fingerprint(host, dirs)
    python = venv_python(venv)
    if venv.exists():
        why = (stale_reason(_read_marker(venv), fingerprint) if python.exists() else "it has no python") or \
            (None if lighthouse_binary(venv) else "it has no torchft_lighthouse") or _healthy(_probe(python), venv, host)
        if why is None:
            return python
        if not (venv / "pyvenv.cfg").is_file() and any(venv.iterdir()):
            fail(f"{venv} exists and is not a venv; remove it")
            return None
        if not quiet:
            print(f"torchft: rebuilding {venv}: {why}", file=sys.stderr, flush=True)
        shutil.rmtree(venv)  # from scratch: a second torch or another host's interpreter must not linger
    venv.parent.mkdir(parents=True, exist_ok=True)
    log = venv.parent / "torchft-install.log"
    started = time.monotonic()
    try:
        # The host's own python makes the venv (so the same interpreter runs it), without the
        # base interpreter's site-packages; the .pth below gives it the host's instead. No pip
        # of its own either: the host's, seen through the .pth, installs into the venv, and a
        # bundled setuptools (3.11's venv has one) would shadow the host's and be upgraded.
        subprocess.run([host.get("executable") or host_python, "-m", "venv", "--without-pip", str(venv)],
                       check=True, capture_output=True, text=True, timeout=VENV_TIMEOUT, env=_clean_env())
        site_packages = _site_packages(python)
        if site_packages is None:
            fail(f"{python} does not say where its site-packages is")
            return None
        (site_packages / HOST_PTH).write_text(pth_text(dirs))
        if _run_json([str(python), "-c", "import json, pip; print(json.dumps(pip.__version__))"],
                     CHECK_TIMEOUT) is None:  # the host has no pip: the venv gets its own
            subprocess.run([str(python), "-m", "ensurepip", "--default-pip"], check=True, capture_output=True,
                           text=True, timeout=VENV_TIMEOUT, env=_clean_env())
        constraints = venv.parent / "torchft-constraints.txt"
        constraints.write_text(constraints_text(host["torch_version"]))
        cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-c", str(constraints),
               *pip_args, f"torchft=={TORCHFT_VERSION}", f"torch=={host['torch_version']}"]
        if not quiet:
            print(f"torchft: installing into {venv} on the torch of {host_python} (log: {log})",
                  file=sys.stderr, flush=True)
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"$ {' '.join(cmd)}\n")
            fh.flush()
            done = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=PIP_TIMEOUT,
                                  env=_clean_env())
    except subprocess.TimeoutExpired as exc:
        fail(f"{' '.join(map(str, exc.cmd))[:80]}... timed out after {exc.timeout:.0f}s (log: {log})")
        return None
    except subprocess.CalledProcessError as exc:
        fail(f"{' '.join(map(str, exc.cmd))[:80]} failed: {(exc.stderr or exc.stdout or '').strip()[-400:]}")
        return None
    except (OSError, ValueError) as exc:
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
    reason = _healthy(info, venv, host)
    if reason is not None:
        fail(reason)
        return None
    marker = dict(info or {}, installed_in_s=round(time.monotonic() - started, 1), python=str(python),
                  lighthouse=str(lighthouse_binary(venv)), host=fingerprint)
    (venv / MARKER).write_text(json.dumps(marker, indent=1))
    return python


def describe(venv: Path = VENV_DIR) -> dict:
    python = ensure_torchft(venv)
    if python is None:
        return {"available": False, "venv": str(venv)}
    info = _probe(python) or {}
    marker = _read_marker(venv) or {}
    return {"available": True, "python": str(python), "lighthouse": str(lighthouse_binary(venv)),
            "torch": info.get("torch"), "torch_file": info.get("torch_file"), "torchft": info.get("torchft"),
            "host_python": (marker.get("host") or {}).get("python"), "installed_in_s": marker.get("installed_in_s")}


if __name__ == "__main__":
    result = describe()
    print(json.dumps(result))
    sys.exit(0 if result["available"] else 1)
