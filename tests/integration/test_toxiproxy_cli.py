"""``python -m chaos.toxiproxy``: flags, --config, and a quick clean stop on signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from chaos.toxiproxy.testing import EchoServer, connect, round_trip

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def spawn(*args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "chaos.toxiproxy", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_url(proc: subprocess.Popen, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        if "listening on" in line:
            return line.strip().rsplit(" ", 1)[1]
    proc.kill()
    raise AssertionError(f"server did not start: {proc.communicate(timeout=5)}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_runs_with_config_and_stops_on_signal(tmp_path, signum):
    with EchoServer() as echo:
        config = tmp_path / "proxies.json"
        config.write_text(json.dumps([
            {"name": "from_config", "listen": "127.0.0.1:0", "upstream": echo.address}]))
        proc = spawn("--port", "0", "--config", str(config))
        try:
            url = wait_for_url(proc)
            assert url.startswith("http://127.0.0.1:")  # safe default host
            assert requests.get(url + "/version", timeout=5).json() == {"version": "2.12.0"}
            proxy = requests.get(url + "/proxies/from_config", timeout=5).json()
            with connect(proxy["listen"]) as live:
                round_trip(live)
                start = time.monotonic()
                proc.send_signal(signum)
                assert proc.wait(timeout=5) == 0
                assert time.monotonic() - start < 3.0
                live.settimeout(2)
                assert live.recv(10) == b""
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=5)


def test_go_style_single_dash_flags():
    proc = spawn("-host", "127.0.0.1", "-port", "0")
    try:
        url = wait_for_url(proc)
        assert requests.get(url + "/proxies", timeout=5).json() == {}
    finally:
        proc.terminate()
        assert proc.wait(timeout=5) == 0
        proc.communicate(timeout=5)


@pytest.mark.parametrize("args", [["--bogus"], ["--port", "notanumber"], ["--port", "70000"]])
def test_bad_flags_exit_2(args):
    proc = spawn(*args)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2
    assert "usage:" in err


@pytest.mark.parametrize("content", ["[{\"name\": \"x\"}]", "not json", None])
def test_bad_config_exits_1(tmp_path, content):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    proc = spawn("--port", "0", "--config", str(path))
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 1
    assert str(path) in err
