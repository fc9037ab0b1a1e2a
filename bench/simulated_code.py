"""Which code a simulation runs, as git knows it: the identity a long run's ledger keys
its chunks by, so that a commit which cannot change a simulated schedule's outcome keeps
counting the schedules run before it.

The simulated code is all of trainer/ (the code under test) and faults/ (the vocabulary),
and of chaos/ the files the simulator reaches: the static import closure of its entry
(`chaos/sim/explore.py`), every import statement followed, those inside functions too. A
package in the closure that imports by name at run time (`importlib.import_module`) brings
its whole directory. The live backends are inside (chaos/runner.py, which the simulator
imports for its live cross-check, imports them); the proxy server, the goodput simulator,
the report, replay, the pytest plugin and the CLIs are outside.

Why that is sound: if every file of the closure is unchanged at two commits, their import
statements are unchanged, so the closure (and the code a simulation runs) is the same.
"""
from __future__ import annotations

import ast
import hashlib
import subprocess
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[1]
WHOLE_TREES = ("trainer", "faults")  # the code under test and the vocabulary: every file counts
CHAOS = "chaos"
ENTRY = "chaos/sim/explore.py"
DYNAMIC_IMPORT = "import_module"


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30).stdout


def _module_file(module: str, files: set[str]) -> str | None:
    path = module.replace(".", "/")
    for candidate in (f"{path}.py", f"{path}/__init__.py"):
        if candidate in files:
            return candidate
    return None


def _package_of(path: str) -> str:
    parts = PurePosixPath(path).with_suffix("").parts
    return ".".join(parts[:-1])


def imported_modules(path: str, source: str) -> set[str]:
    """Every module an import statement in `source` (the file at `path`) may load, relative
    ones resolved; for `from X import Y`, both X and X.Y (Y may be a submodule)."""
    names: set[str] = set()
    package = _package_of(path)
    for node in ast.walk(ast.parse(source, filename=path)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


_IMPORTS: dict[str, tuple[set[str], bool]] = {}  # blob id -> (modules it imports, imports by name)


def _read_blobs(blobs: dict[str, str]) -> None:
    """Parse every chaos/ blob not parsed yet, read in one `git cat-file --batch`."""
    wanted = sorted({b for b in blobs.values() if b not in _IMPORTS})
    if not wanted:
        return
    raw = subprocess.run(["git", "-C", str(ROOT), "cat-file", "--batch"], input=("\n".join(wanted) + "\n").encode(),
                         capture_output=True, timeout=60).stdout
    paths = {b: p for p, b in blobs.items()}
    at = 0
    for blob in wanted:
        header_end = raw.index(b"\n", at)
        size = int(raw[at:header_end].split()[2])
        source = raw[header_end + 1: header_end + 1 + size].decode("utf-8")
        at = header_end + 1 + size + 1
        _IMPORTS[blob] = (imported_modules(paths[blob], source), DYNAMIC_IMPORT in source)


def chaos_closure(blobs: dict[str, str]) -> list[str]:
    """The chaos/ files (of {path: blob}) the entry reaches, each package's __init__ with it."""
    _read_blobs(blobs)
    files = set(blobs)
    seen: set[str] = set()
    todo = [ENTRY]
    while todo:
        path = todo.pop()
        if path in seen or path not in files:
            continue
        seen.add(path)
        parts = PurePosixPath(path).parts
        todo += [f"{'/'.join(parts[:i])}/__init__.py" for i in range(1, len(parts))]
        modules, by_name = _IMPORTS[blobs[path]]
        if by_name:
            folder = str(PurePosixPath(path).parent)
            todo += [f for f in files if f.startswith(folder + "/")]
        for module in modules:
            found = _module_file(module, files) if module.split(".")[0] == CHAOS else None
            if found is not None:
                todo.append(found)
    return sorted(seen)


def simulated_blobs(commit: str) -> dict[str, str]:
    """{path: blob id} of the simulated code at `commit`; {} when git does not know it."""
    listing = git("ls-tree", "-r", commit, "--", *WHOLE_TREES, CHAOS)
    blobs = {}
    for line in listing.splitlines():
        meta, _, path = line.partition("\t")
        if meta.split()[1:2] == ["blob"] and (path.endswith(".py") or not path.startswith(CHAOS + "/")):
            blobs[path] = meta.split()[2]
    if not blobs:
        return {}
    closure = set(chaos_closure({p: b for p, b in blobs.items() if p.startswith(CHAOS + "/")}))
    return {p: b for p, b in blobs.items() if not p.startswith(CHAOS + "/") or p in closure}


def code_of(commit: str) -> str:
    """The simulated code's identity at `commit` (12 hex digits); "" when git does not know it."""
    try:
        blobs = simulated_blobs(commit)
    except (OSError, subprocess.TimeoutExpired, SyntaxError):
        return ""
    if not blobs:
        return ""
    return hashlib.sha1("\n".join(f"{p} {b}" for p, b in sorted(blobs.items())).encode()).hexdigest()[:12]


def dirty(commit: str) -> bool:
    """Whether the working tree's simulated files differ from `commit`'s (tracked files)."""
    paths = sorted(simulated_blobs(commit))
    return bool(paths) and subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", commit, "--", *paths],
                                          capture_output=True, timeout=30).returncode != 0
