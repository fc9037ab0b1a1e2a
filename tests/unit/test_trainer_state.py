"""Durable state: atomic writes survive SIGKILL at any instant; the state directory's typed files."""
from __future__ import annotations

import json
import os
import queue
import random
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from trainer.state import (StateDir, atomic_write_bytes, atomic_write_json, load_tensors, read_json,
                           remove_stale_temporaries, save_tensors)

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- basics

def test_atomic_write_bytes_round_trip(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "dir" / "blob.bin"
    data = os.urandom(100_000)
    assert atomic_write_bytes(target, data) == len(data)
    assert target.read_bytes() == data
    assert atomic_write_bytes(target, b"") == 0  # overwrite, even with nothing
    assert target.read_bytes() == b""
    assert not list(target.parent.glob(".*.tmp")), "no temporary may be left after a write"


def test_atomic_write_json_round_trip(tmp_path: Path) -> None:
    obj = {"b": [1, 2, {"c": None}], "a": "é", "n": 1.5}
    atomic_write_json(tmp_path / "x.json", obj)
    assert read_json(tmp_path / "x.json") == obj
    assert json.loads((tmp_path / "x.json").read_text()) == obj
    assert read_json(tmp_path / "missing.json") is None


def test_failed_write_leaves_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f.bin"
    atomic_write_bytes(target, b"old")

    def boom(*_a, **_k):
        raise OSError("disk on fire")

    monkeypatch.setattr("trainer.state.os.replace", boom)
    with pytest.raises(OSError, match="disk on fire"):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert not list(tmp_path.glob(".*.tmp"))


def test_save_and_load_tensors_with_metadata(tmp_path: Path) -> None:
    tensors = {"a": torch.randn(3, 2), "b": torch.arange(4, dtype=torch.int8)}
    meta = {"version": 3, "applied": ["1:1:1", "2:1:4"], "name": "x"}
    n = save_tensors(tmp_path / "t.safetensors", tensors, meta)
    assert n == (tmp_path / "t.safetensors").stat().st_size
    got, got_meta = load_tensors(tmp_path / "t.safetensors")
    assert got_meta == meta
    assert set(got) == set(tensors) and all(torch.equal(got[k], tensors[k]) for k in tensors)


def test_state_dir_fragment_round_trip(tmp_path: Path) -> None:
    store = StateDir(tmp_path / "state")
    assert store.read_fragment(0) is None
    params = {"w": torch.randn(4, 4), "b": torch.randn(4)}
    momentum = {"w": torch.randn(4, 4), "b": torch.zeros(4)}
    store.write_fragment(0, params, momentum, version=7, applied=["1:1:1", "3:2:5"])
    p, m, version, applied = store.read_fragment(0)
    assert version == 7 and applied == ["1:1:1", "3:2:5"]
    assert set(p) == set(params) and set(m) == set(momentum)
    for k in params:
        assert torch.equal(p[k], params[k]) and torch.equal(m[k], momentum[k])
    store.write_fragment(0, params, momentum, version=8, applied=["1:1:1", "3:2:5", "2:1:1"])
    assert store.read_fragment(0)[2:] == (8, ["1:1:1", "3:2:5", "2:1:1"])


def test_state_dir_read_params_and_missing_fragment(tmp_path: Path) -> None:
    store = StateDir(tmp_path)
    store.write_fragment(0, {"a": torch.ones(2)}, {"a": torch.zeros(2)}, 0, [])
    store.write_fragment(1, {"b": torch.full((3,), 2.0)}, {"b": torch.zeros(3)}, 0, [])
    params = store.read_params(2)
    assert torch.equal(params["a"], torch.ones(2)) and torch.equal(params["b"], torch.full((3,), 2.0))
    with pytest.raises(FileNotFoundError, match="fragment 2"):
        store.read_params(3)


def test_state_dir_paths(tmp_path: Path) -> None:
    store = StateDir(tmp_path)
    assert store.pending_path(2, "1:3:17") == tmp_path / "pending" / "2" / "1-3-17.safetensors"
    assert store.pending_files(2) == []
    save_tensors(store.pending_path(2, "1:3:17"), {"x": torch.zeros(1)}, {})
    save_tensors(store.pending_path(2, "1:3:2"), {"x": torch.zeros(1)}, {})
    assert [p.name for p in store.pending_files(2)] == ["1-3-17.safetensors", "1-3-2.safetensors"]


def test_remove_stale_temporaries(tmp_path: Path) -> None:
    (tmp_path / "pending" / "0").mkdir(parents=True)
    stale = [tmp_path / ".meta.json.abc.tmp", tmp_path / "pending" / "0" / ".1-1-1.safetensors.x.tmp"]
    keep = [tmp_path / "meta.json", tmp_path / "pending" / "0" / "1-1-1.safetensors", tmp_path / "notes.tmp"]
    for p in stale + keep:
        p.write_bytes(b"x")
    assert remove_stale_temporaries(tmp_path) == len(stale)
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in keep)
    assert remove_stale_temporaries(tmp_path) == 0


# ----------------------------------------------------------------------------- SIGKILL

# One "zygote" imports trainer.state once (importing torch costs seconds), then forks a
# writer per cycle on request. The test SIGKILLs writers; the zygote reaps them.
ZYGOTE = textwrap.dedent(r'''
    import os, signal, struct, sys, time
    sys.path.insert(0, sys.argv[3])
    from trainer.state import atomic_write_bytes

    path, sizes = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
    HEADER = struct.Struct("!8sQQ")

    def out(*words):
        os.write(1, (" ".join(str(w) for w in words) + "\n").encode())

    def writer(start, mode):
        real_fsync, calls = os.fsync, {"n": 0}
        block_version = start + 2   # block only once one complete version was written
        k = start
        def fsync(fd):
            calls["n"] += 1
            # atomic_write_bytes fsyncs the temporary first, then the directory.
            which = "file" if calls["n"] % 2 == 1 else "dir"
            if k == block_version and mode == "block_" + which:
                out("B", k, which)
                while True:
                    signal.pause()
            real_fsync(fd)
        os.fsync = fsync
        while True:
            k += 1
            size = sizes[k % len(sizes)]
            atomic_write_bytes(path, HEADER.pack(b"VERSION!", k, size) + bytes([k % 251 + 1]) * size)
            out("W", k)

    out("READY")
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "spawn":
            pid = os.fork()
            if pid == 0:
                try:
                    writer(int(cmd[1]), cmd[2])
                finally:
                    os._exit(1)
            out("PID", pid)
        elif cmd[0] == "reap":
            _, status = os.waitpid(int(cmd[1]), 0)
            out("REAPED", cmd[1], status)
''')

HEADER = struct.Struct("!8sQQ")


class Zygote:
    def __init__(self, tmp_path: Path, target: Path, sizes: list[int]) -> None:
        script = tmp_path / "zygote.py"
        script.write_text(ZYGOTE)
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(target), ",".join(map(str, sizes)), str(REPO)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        self.lines: queue.Queue[str] = queue.Queue()
        self.max_written = 0
        self.written = threading.Condition()
        self.pump = threading.Thread(target=self._pump, daemon=True)
        self.pump.start()
        self.expect("READY", timeout=60)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            words = line.split()
            if words and words[0] == "W":
                with self.written:
                    self.max_written = max(self.max_written, int(words[1]))
                    self.written.notify_all()
            else:
                self.lines.put(line.strip())
        self.lines.put("EOF")
        with self.written:
            self.written.notify_all()

    def wait_written(self, version: int, timeout: float) -> None:
        with self.written:
            ok = self.written.wait_for(lambda: self.max_written >= version or self.proc.poll() is not None,
                                       timeout)
        assert ok and self.max_written >= version, f"writer did not complete version {version} within {timeout}s"

    def expect(self, word: str, timeout: float) -> list[str]:
        """The next line starting with `word`, skipping others; fails naming what was missing."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"zygote: no {word!r} line within {timeout}s")
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line == "EOF":
                err = self.proc.stderr.read() if self.proc.stderr else ""
                raise AssertionError(f"zygote exited before {word!r}: {err[-2000:]}")
            if line.split()[0] == word:
                return line.split()

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()  # the zygote's loop ends at EOF
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.pump.join(timeout=10)  # it ends at the zygote's EOF
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()


def _read_version(path: Path) -> int:
    """The version the file holds, asserting it is one complete version, never torn."""
    data = path.read_bytes()
    assert len(data) >= HEADER.size, f"file holds only {len(data)} bytes"
    magic, k, size = HEADER.unpack_from(data)
    assert magic == b"VERSION!", f"bad header {magic!r}"
    assert len(data) == HEADER.size + size, f"version {k}: {len(data)} bytes, expected {HEADER.size + size}"
    assert data[HEADER.size:] == bytes([k % 251 + 1]) * size, f"version {k}: body is not all {k % 251 + 1}"
    return k


def _kill_and_reap(z: Zygote, pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    z.send(f"reap {pid}")
    reaped = z.expect("REAPED", timeout=30)
    assert int(reaped[1]) == pid
    status = int(reaped[2])
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"writer ended with {status}"


def test_sigkill_never_leaves_a_torn_file(tmp_path: Path) -> None:
    target = tmp_path / "state" / "blob.bin"
    sizes = [8 << 20, 6 << 20]  # alternate lengths: a mix of two versions would show
    rng = random.Random(20240601)
    z = Zygote(tmp_path, target, sizes)
    try:
        version = 0
        temporaries_seen = 0
        modes = ["random"] * 4 + ["block_file", "block_dir"]
        for mode in modes:
            z.send(f"spawn {version} {mode}")
            pid = int(z.expect("PID", timeout=30)[1])
            try:
                if mode == "random":
                    z.wait_written(version + 1, timeout=60)  # at least one complete version
                    # The kill instant is what is randomised here; nothing waits on it.
                    time.sleep(rng.uniform(0.0, 0.25))
                else:
                    blocked = z.expect("B", timeout=60)
                    assert int(blocked[1]) == version + 2
                    assert blocked[2] == mode.split("_")[1]
            finally:
                _kill_and_reap(z, pid)
            confirmed = z.max_written  # every "W k" is printed after its write returned
            found = _read_version(target)
            if mode == "block_file":
                # Killed after the temporary was written, before the rename: the old version.
                assert found == version + 1 == confirmed
            elif mode == "block_dir":
                # Killed after the rename, before the directory fsync: the new version.
                assert found == version + 2 == confirmed + 1
            else:
                assert confirmed <= found <= confirmed + 1, (found, confirmed)
            leftovers = list(target.parent.glob(".*.tmp"))
            if mode == "block_file":
                assert leftovers, "a writer killed before its rename must leave its temporary"
                assert any(p.stat().st_size == HEADER.size + sizes[(version + 2) % 2] for p in leftovers)
            temporaries_seen += len(leftovers)
            assert remove_stale_temporaries(target.parent) == len(leftovers)
            assert not list(target.parent.glob(".*.tmp"))
            assert _read_version(target) == found, "cleaning temporaries must not touch the state"
            version = found
        assert temporaries_seen >= 1
        assert version >= len(modes)
    finally:
        z.close()


def test_a_pending_file_is_the_wire_payload_under_a_header_naming_the_push(tmp_path):
    """with_metadata keeps the payload's bytes and adds the push's metadata: the file reads
    back as the same tensors, and its data section is 8-byte aligned for any metadata length."""
    from trainer.state import load_tensors, with_metadata
    from trainer.wire import pack_tensors

    tensors = {"h.0.w": torch.randn(4, 6), "q": torch.arange(9, dtype=torch.uint8), "q/scale": torch.tensor([0.5])}
    payload = pack_tensors(tensors)
    for extra in range(9):
        meta = {"fragment": 1, "learner": 3, "encoding": "int4", "pad": "x" * extra}
        head, body = with_metadata(payload, meta)
        assert len(head) % 8 == 0
        assert bytes(body) == payload[8 + int.from_bytes(payload[:8], "little"):]
        path = tmp_path / f"p{extra}.safetensors"
        path.write_bytes(head + bytes(body))
        back, got = load_tensors(path)
        assert got == meta
        assert set(back) == set(tensors) and all(torch.equal(back[k], tensors[k]) for k in tensors)
