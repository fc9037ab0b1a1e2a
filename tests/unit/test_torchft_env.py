"""bench/peers/torchft_env.py: torchft's venv reuses the torch of the python that runs the bench.

Issue 17: with Islands in a venv, the torchft venv was made with --system-site-packages from
the *base* interpreter, which had no torch, and pip put a second torch in it. Here a throwaway
"Islands venv" (no system site-packages) whose torch lies in its own site-packages is the
host; the peer venv must import exactly that torch and hold none of its own.

The end-to-end test installs a stand-in torchft wheel (built here: same name, version, torch
requirement and lighthouse script) with --no-index, so it needs no network; the one with the
real torchft from the package index is marked slow and skips when the index is unreachable.
"""
from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from .bench_scripts import load_bench

env = load_bench("peers/torchft_env.py", "bench_torchft_env")

TORCH_SPEC = importlib.util.find_spec("torch")
needs_torch = pytest.mark.skipif(TORCH_SPEC is None, reason="torch is not installed for this python")


# ----------------------------------------------------------------------------- pure parts
def test_torch_dirs_are_its_package_dir_then_its_metadata_dir():
    host = {"torch_origin": "/v/lib/site-packages/torch/__init__.py", "torch_dist_dir": "/v/lib/site-packages"}
    assert env.torch_dirs(host) == ["/v/lib/site-packages"]
    host["torch_dist_dir"] = "/meta"
    assert env.torch_dirs(host) == ["/v/lib/site-packages", "/meta"]
    assert env.torch_dirs({"torch_origin": None, "torch_dist_dir": None}) == []


def test_site_dirs_drop_the_standard_library_and_the_current_directory():
    bare = ["/base/lib/python311.zip", "/base/lib/python3.11", "/base/lib/python3.11/lib-dynload"]
    # a venv made with --system-site-packages: its own site-packages, then the base's, then a .pth's
    path = ["", *bare, "/venv/lib/python3.11/site-packages", "/base/lib/python3.11/site-packages",
            "/extra", "/venv/lib/python3.11/site-packages"]
    assert env.site_dirs(path, bare) == ["/venv/lib/python3.11/site-packages",
                                         "/base/lib/python3.11/site-packages", "/extra"]


def test_the_pth_keeps_the_hosts_order_and_nothing_inside_the_peer_venv(tmp_path):
    venv = tmp_path / "peer"
    host = {"torch_origin": "/host/sp/torch/__init__.py", "torch_dist_dir": "/host/sp",
            "path": ["", "/std", "/other", "/host/sp", str(venv / "lib"), str(venv)]}
    assert env.pth_dirs(host, ["/std"], venv) == ["/other", "/host/sp"]
    # torch found by a directory the host's path lacks (an import hook): that directory goes first
    host["torch_origin"] = "/src/torch/__init__.py"
    assert env.pth_dirs(host, ["/std"], venv) == ["/src", "/other", "/host/sp"]
    text = env.pth_text(["/host/sp", "/other"])
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == ["/host/sp", "/other"]
    with pytest.raises(ValueError):
        env.pth_text(["import os; os.system('x')"])
    with pytest.raises(ValueError):
        env.pth_text(["/a\n/b"])


def test_constraints_pin_the_exact_host_torch():
    assert env.constraints_text("2.13.0+cpu") == "torch==2.13.0+cpu\n"


def test_the_venv_is_rebuilt_when_the_host_or_its_torch_changes():
    host = {"executable": "/islands/bin/python", "prefix": "/islands", "python_version": "3.11.7",
            "torch_version": "2.13.0+cpu", "torch_origin": "/islands/sp/torch/__init__.py"}
    built = env.host_fingerprint(host, ["/islands/sp"])
    assert env.stale_reason({"host": built}, dict(built)) is None
    assert "records no host" in env.stale_reason(None, built)
    assert "records no host" in env.stale_reason({"torch": "2.13.0+cpu"}, built)  # an older marker
    for key, value in [("torch_version", "2.14.0+cpu"), ("python", "/usr/bin/python3"),
                       ("torch_origin", "/elsewhere/torch/__init__.py"), ("site_dirs", ["/other"]),
                       ("python_version", "3.12.1"), ("prefix", "/usr")]:
        reason = env.stale_reason({"host": built}, dict(built, **{key: value}))
        assert reason is not None and key in reason, key


def test_a_torch_in_the_peer_venv_is_found_and_refused(tmp_path):
    venv = tmp_path / "peer"
    sp = venv / "lib" / "python3.11" / "site-packages"
    (sp / "torchft").mkdir(parents=True)
    (sp / "torchvision").mkdir()
    assert env.second_torch(venv) == []
    (sp / "torch").mkdir()
    (sp / "torch-2.13.0+cpu.dist-info").mkdir()
    assert [Path(p).name for p in env.second_torch(venv)] == ["torch", "torch-2.13.0+cpu.dist-info"]
    host = {"torch_origin": "/host/sp/torch/__init__.py", "executable": "/host/bin/python"}
    info = {"torch": "2.13.0+cpu", "torch_file": str(sp / "torch" / "__init__.py"), "torchft": env.TORCHFT_VERSION}
    assert "second torch" in env._healthy(info, venv, host)
    (sp / "torch").rmdir()
    (sp / "torch-2.13.0+cpu.dist-info").rmdir()
    info["torch_file"] = "/base/sp/torch/__init__.py"
    assert "not the host's /host/sp/torch/__init__.py" in env._healthy(info, venv, host)
    info["torch_file"] = host["torch_origin"]
    assert env._healthy(info, venv, host) is None
    assert "torchft 0.1.0" in env._healthy(dict(info, torchft="0.1.0"), venv, host)


@needs_torch
def test_host_info_finds_torch_without_importing_it():
    host, bare = env.host_info(sys.executable)
    assert host["torch_origin"] == TORCH_SPEC.origin
    assert host["torch_version"] == importlib.metadata.version("torch")
    assert os.path.dirname(os.path.dirname(TORCH_SPEC.origin)) in env.site_dirs(host["path"], bare)
    assert not set(env.site_dirs(host["path"], bare)) & set(bare)


def test_a_host_without_torch_is_refused_before_anything_is_built(tmp_path, capsys):
    bare_venv = tmp_path / "no-torch"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare_venv)], check=True, timeout=120)
    peer = tmp_path / "work" / "peer"
    assert env.ensure_torchft(peer, quiet=True, host_python=bare_venv / "bin" / "python") is None
    assert "torch is not installed for" in capsys.readouterr().err
    assert not peer.exists()


def test_a_directory_that_is_not_a_venv_is_left_alone(tmp_path, capsys):
    if TORCH_SPEC is None:
        pytest.skip("torch is not installed for this python")
    peer = tmp_path / "peer"
    peer.mkdir()
    (peer / "precious.txt").write_text("keep me")
    assert env.ensure_torchft(peer, quiet=True) is None
    assert "is not a venv" in capsys.readouterr().err
    assert (peer / "precious.txt").read_text() == "keep me"


# ----------------------------------------------------------------------------- end to end
def _islands_venv(root: Path) -> tuple[Path, Path]:
    """A venv WITHOUT system site-packages whose torch lies in its own site-packages (links to
    this machine's torch: its path is not the base interpreter's), as when Islands is installed
    in a venv. torch's own dependencies come from this python's site directories via a .pth,
    behind it. Its python and its site-packages."""
    venv = root / "islands-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    sp = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True).stdout.strip())
    dist = importlib.metadata.distribution("torch")
    torch_pkg = Path(TORCH_SPEC.origin).parent
    (sp / "torch").symlink_to(torch_pkg, target_is_directory=True)
    (sp / Path(dist._path).name).symlink_to(dist._path, target_is_directory=True)
    (sp / "zz_deps.pth").write_text(f"{torch_pkg.parent}\n")
    return python, sp


def _fake_torchft_wheel(directory: Path) -> Path:
    """torchft-0.2.0 with the real one's torch requirement and lighthouse script, and no code."""
    dist_info = f"torchft-{env.TORCHFT_VERSION}.dist-info"
    files = {
        "torchft/__init__.py": "def lighthouse_main():\n    print('stand-in lighthouse')\n",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: torchft\nVersion: {env.TORCHFT_VERSION}\n"
                                 "Requires-Dist: torch>=2.7\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: islands-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist_info}/entry_points.txt": "[console_scripts]\ntorchft_lighthouse = torchft:lighthouse_main\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files[f"{dist_info}/RECORD"] = "\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n"
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / f"torchft-{env.TORCHFT_VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return wheel


def _peer_torch(python: Path) -> str:
    """Where `import torch` finds torch in the peer venv (ensure_torchft's probe imported it)."""
    out = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('torch').origin)"],
                         check=True,
                         capture_output=True, text=True, timeout=env.CHECK_TIMEOUT, env=env._clean_env())
    return out.stdout.strip().splitlines()[-1]


def _installs(work: Path) -> int:
    """How many `pip install` runs the install log records."""
    return sum(line.startswith("$ ") for line in (work / "torchft-install.log").read_text().splitlines())


@needs_torch
def test_the_peer_venv_reuses_the_torch_of_an_islands_venv(tmp_path):
    host_python, host_sp = _islands_venv(tmp_path)
    wheels = tmp_path / "wheels"
    _fake_torchft_wheel(wheels)
    work = tmp_path / "work"
    peer = work / "torchft-venv"
    pip_args = ["--no-index", "--find-links", str(wheels)]

    python = env.ensure_torchft(peer, quiet=True, host_python=host_python, pip_args=pip_args)
    assert python == env.venv_python(peer)
    assert env.lighthouse_binary(peer) is not None
    # torch comes from the Islands venv's site-packages, by its path there (not the base's) ...
    assert _peer_torch(python) == str(host_sp / "torch" / "__init__.py")
    # ... and pip put no torch into the peer venv, nor was the venv given the base's packages
    assert env.second_torch(peer) == []
    assert "include-system-site-packages = false" in (peer / "pyvenv.cfg").read_text()
    marker = json.loads((peer / env.MARKER).read_text())
    assert marker["host"]["python"] == str(host_python)
    assert marker["host"]["torch_version"] == importlib.metadata.version("torch")
    assert marker["host"]["site_dirs"][0] == str(host_sp)
    assert (work / "torchft-constraints.txt").read_text() == f"torch=={importlib.metadata.version('torch')}\n"
    assert _installs(work) == 1

    # the same host again: reused, nothing reinstalled
    assert env.ensure_torchft(peer, quiet=True, host_python=host_python, pip_args=pip_args) == python
    assert _installs(work) == 1

    # the host's torch changed (as recorded): rebuilt from scratch against the host as it is now
    marker["host"]["torch_version"] = "2.12.0+cpu"
    (peer / env.MARKER).write_text(json.dumps(marker))
    (env.venv_python(peer).parent / "leftover").write_text("from the old venv")
    assert env.ensure_torchft(peer, quiet=True, host_python=host_python, pip_args=pip_args) == python
    assert _installs(work) == 2
    assert not (env.venv_python(peer).parent / "leftover").exists()
    assert json.loads((peer / env.MARKER).read_text())["host"]["torch_version"] == importlib.metadata.version("torch")
    assert _peer_torch(python) == str(host_sp / "torch" / "__init__.py")


def _torchft_reachable(tmp_path: Path) -> bool:
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(tmp_path / "dl"),
                              f"torchft=={env.TORCHFT_VERSION}"], capture_output=True, timeout=120)
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0


@pytest.mark.slow
@needs_torch
def test_the_real_torchft_installs_on_the_torch_of_an_islands_venv(tmp_path):
    if not _torchft_reachable(tmp_path):
        pytest.skip(f"torchft=={env.TORCHFT_VERSION} cannot be downloaded from this machine's package index")
    host_python, host_sp = _islands_venv(tmp_path)
    peer = tmp_path / "work" / "torchft-venv"
    python = env.ensure_torchft(peer, quiet=True, host_python=host_python)
    assert python is not None, "see the reason printed above"
    assert _peer_torch(python) == str(host_sp / "torch" / "__init__.py")
    assert env.second_torch(peer) == []
    assert env.lighthouse_binary(peer) is not None
