"""chaos/diskfs without a mount: the fault table through the FUSE operations object, the
control protocol (parsing, a live socket, the client and its command line). Runs everywhere."""
from __future__ import annotations

import errno
import json
import os
import socket
import time

import pytest

from chaos.diskfs.backing import Backing, load_image
from chaos.diskfs.client import DiskControl, DiskControlError, main as client_main
from chaos.diskfs.control import MAX_LINE, ControlServer, handle_line, parse_request
from chaos.diskfs.fs import DiskFS
from chaos.diskfs.model import Model
from chaos.diskfs.modes import ERRNOS, FaultPolicy


@pytest.fixture
def ops(tmp_path) -> DiskFS:
    root = tmp_path / "backing"
    return DiskFS(Model(load_image(root)), Backing(root), FaultPolicy())


def errno_of(call) -> int | None:
    try:
        call()
    except OSError as exc:
        return exc.errno
    return None


def test_full_refuses_what_takes_space_and_lets_a_process_clean_up(ops) -> None:
    fh = ops.create("/a", 0o644, os.O_WRONLY)
    ops.write("/a", b"abcd", 0, fh)
    ops.policy.set_mode("full")
    assert errno_of(lambda: ops.write("/a", b"x", 0, fh)) == errno.ENOSPC
    assert errno_of(lambda: ops.create("/b", 0o644, 0)) == errno.ENOSPC
    assert errno_of(lambda: ops.mknod("/b", 0o100644, 0)) == errno.ENOSPC
    assert errno_of(lambda: ops.mkdir("/d", 0o755)) == errno.ENOSPC
    assert errno_of(lambda: ops.truncate("/a", 10)) == errno.ENOSPC
    assert errno_of(lambda: ops.truncate("/a", 2)) is None  # shrinking frees space
    assert ops.statfs("/")["f_bavail"] == ops.statfs("/")["f_bfree"] == 0
    assert ops.read("/a", 10, 0, fh) == b"ab"
    ops.fsync("/a", 0, fh)
    ops.rename("/a", "/c")
    ops.unlink("/c")
    ops.release(None, fh)
    counters = ops.status()["counters"]
    assert counters["errors"]["full"] == {"create": 1, "mkdir": 1, "mknod": 1, "truncate": 1, "write": 1}


def test_eio_takes_writes_fails_syncs_and_the_failed_fsync_is_forgotten(ops) -> None:
    fh = ops.create("/a", 0o644, 0)
    ops.write("/a", b"v1", 0, fh)
    ops.fsync("/a", 0, fh)
    ops.fsyncdir("/", 0, 0)
    ops.write("/a", b"v2", 0, fh)
    ops.policy.set_mode("eio")
    assert errno_of(lambda: ops.fsync("/a", 0, fh)) == errno.EIO
    assert errno_of(lambda: ops.fsync("/a", 1, fh)) == errno.EIO
    assert errno_of(lambda: ops.fsyncdir("/", 0, 0)) == errno.EIO
    assert ops.read("/a", 10, 0, fh) == b"v2"  # reads still work
    ops.policy.set_mode("none")
    ops.fsync("/a", 0, fh)  # succeeds, but writes nothing: fsyncgate
    assert load_image(ops.backing.root).as_dict() == {"a": b"v1"}
    assert ops.status()["unsynced_bytes"] == 2
    assert ops.status()["counters"]["errors"]["eio"] == {"fdatasync": 1, "fsync": 1, "fsyncdir": 1}


def test_slow_delays_every_operation(ops) -> None:
    ops.policy.set_mode("slow", latency_ms=30)
    started = time.monotonic()
    ops.getattr("/")
    ops.statfs("/")
    assert time.monotonic() - started >= 0.06


def test_the_errno_table_names_only_known_modes_and_operations(ops) -> None:
    assert set(ERRNOS) == {"none", "full", "eio", "slow"}
    for table in ERRNOS.values():
        assert all(callable(getattr(ops, op if op != "fdatasync" else "fsync")) for op in table)


def test_rename_flags(ops) -> None:
    ops.release(None, ops.create("/a", 0o644, 0))
    ops.release(None, ops.create("/b", 0o644, 0))
    assert errno_of(lambda: ops.rename("/a", "/b", 1)) == errno.EEXIST  # RENAME_NOREPLACE
    assert errno_of(lambda: ops.rename("/a", "/b", 2)) == errno.EINVAL  # RENAME_EXCHANGE
    assert errno_of(lambda: ops.rename("/a", "/b", 4)) == errno.EINVAL  # RENAME_WHITEOUT
    ops.rename("/a", "/c", 1)
    assert [name for name, _, _ in ops.readdir("/", 0)] == [".", "..", "b", "c"]


def test_an_open_file_outlives_its_name(ops) -> None:
    fh = ops.create("/a", 0o644, 0)
    ops.write(None, b"data", 0, fh)
    ops.unlink("/a")
    assert ops.read(None, 10, 0, fh) == b"data"
    assert ops.getattr(None, fh)["st_size"] == 4
    ops.truncate(None, 1, fh)
    ops.fsync(None, 0, fh)
    ops.release(None, fh)
    assert ops.model.file_count() == 0


def test_a_clean_flush_writes_everything(ops) -> None:
    ops.mkdir("/d", 0o755)
    fh = ops.create("/d/f", 0o644, 0)
    ops.write(None, b"F", 0, fh)
    assert ops.flush_all() == 1
    assert load_image(ops.backing.root).as_dict() == {"d": {"f": b"F"}}


# --------------------------------------------------------------------------- the protocol


@pytest.mark.parametrize("line, field", [
    (b"not json", "request"),
    (b"\xff\xfe", "request"),
    (b"[1, 2]", "request"),
    (b"{}", "op"),
    (b'{"op": 3}', "op"),
    (b'{"op": "format"}', "op"),
    (b'{"op": "mode"}', "mode"),
    (b'{"op": "mode", "mode": "lost"}', "mode"),
    (b'{"op": "mode", "mode": 1}', "mode"),
    (b'{"op": "mode", "mode": "slow", "latency_ms": -1}', "latency_ms"),
    (b'{"op": "mode", "mode": "slow", "latency_ms": true}', "latency_ms"),
    (b'{"op": "mode", "mode": "slow", "latency_ms": "50"}', "latency_ms"),
    (b'{"op": "mode", "mode": "slow", "latency_ms": 1e9}', "latency_ms"),
    (b'{"op": "mode", "mode": "slow", "latency_ms": NaN}', "latency_ms"),
    (b'{"op": "mode", "mode": "full", "extra": 1}', "extra"),
    (b'{"op": "status", "mode": "full"}', "mode"),
])
def test_a_bad_request_is_refused_naming_its_field(line, field) -> None:
    reply = handle_line(line, lambda *a: pytest.fail("must not be called"), lambda: pytest.fail("nor this"))
    assert reply["ok"] is False
    assert reply["error"].startswith(f"{field}: "), reply


def test_a_good_request_is_parsed() -> None:
    assert parse_request(b'{"op": "mode", "mode": "slow", "latency_ms": 5}') == \
        {"op": "mode", "mode": "slow", "latency_ms": 5.0}
    assert parse_request(b'{"op": "mode", "mode": "full"}')["latency_ms"] == 50.0


def test_a_failure_behind_the_server_is_an_answer() -> None:
    def broken() -> dict:
        raise KeyError("boom")
    reply = handle_line(b'{"op": "status"}', lambda *a: {}, broken)
    assert reply == {"ok": False, "error": "internal: KeyError: 'boom'"}


@pytest.fixture
def served(ops, tmp_path):
    # a long path: over the 107 bytes of a sun_path
    where = tmp_path / ("x" * 90) / "control.sock"
    where.parent.mkdir()
    server = ControlServer(where, ops.policy.set_mode, ops.status).start()
    yield where, ops
    server.stop()
    assert not where.exists()


def test_the_socket_answers_the_client(served) -> None:
    where, ops = served
    control = DiskControl(where, timeout=5.0)
    reply = control.set_mode("slow", latency_ms=1)
    assert reply["ok"] and reply["mode"] == "slow" and reply["latency_ms"] == 1.0
    assert isinstance(reply["since"], float)
    assert ops.policy.mode == "slow"
    status = control.status()
    assert status["mode"] == "slow" and status["files"] == 0 and status["unsynced_bytes"] == 0
    assert "ops" in status["counters"] and "errors" in status["counters"]
    with pytest.raises(DiskControlError, match="mode: 'lost' is not one of"):
        control.set_mode("lost")
    with pytest.raises(DiskControlError, match=str(where)):
        control.set_mode("lost")


def test_the_server_survives_garbage_and_bounds_a_line(served) -> None:
    where, _ = served
    control = DiskControl(where, timeout=5.0)
    assert control.raw(b"\x00\x01garbage\n")["ok"] is False
    reply = control.raw(b"x" * (MAX_LINE + 10) + b"\n")
    assert reply == {"ok": False, "error": f"request: longer than {MAX_LINE} bytes"}
    with socket.socket(socket.AF_UNIX) as sock:  # a client that says half a line and leaves
        from chaos.diskfs.sockpath import unix_address
        with unix_address(where) as address:
            sock.connect(address)
        sock.sendall(b'{"op": "sta')
    assert control.status()["ok"] is True  # still serving
    assert control.raw(b'{"op": "status"}\n{"op": "status"}\n')["ok"] is True  # two in one write: the first answered


def test_the_client_names_the_socket_when_nobody_answers(tmp_path) -> None:
    with pytest.raises(DiskControlError, match=f"{tmp_path}/missing.sock: no such socket"):
        DiskControl(tmp_path / "missing.sock", timeout=1.0).status()
    silent = socket.socket(socket.AF_UNIX)  # listens, never answers
    silent.bind(str(tmp_path / "silent.sock"))
    silent.listen(1)
    try:
        started = time.monotonic()
        with pytest.raises(DiskControlError, match="silent.sock: no answer within 0.3 s"):
            DiskControl(tmp_path / "silent.sock", timeout=0.3).status()
        assert time.monotonic() - started < 5.0
    finally:
        silent.close()


def test_the_command_line(served, capsys) -> None:
    where, ops = served
    assert client_main([str(where), "mode", "full"]) == 0
    assert json.loads(capsys.readouterr().out)["mode"] == "full"
    assert client_main([str(where), "status"]) == 0
    assert json.loads(capsys.readouterr().out)["mode"] == "full"
    assert client_main([str(where), "mode", "slow", "--latency-ms", "70000"]) == 1  # refused by the daemon
    assert "latency_ms" in json.loads(capsys.readouterr().out)["error"]
    assert client_main([str(where) + ".nope", "status"]) == 1
    assert "no such socket" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        client_main([str(where), "mode", "lost"])
    assert info.value.code == 2


def test_the_client_waits_for_a_daemon_that_is_starting_again(ops, tmp_path, monkeypatch) -> None:
    """A container Docker started again answers `running` before its daemon made the socket:
    with --wait the mode still reaches the daemon; without, the call fails at once."""
    import chaos.diskfs.client as client

    where = tmp_path / "control.sock"
    servers: list[ControlServer] = []
    attempts: list[bool] = []
    real_connect = client.connect

    def connect_then_start(path, timeout):
        attempts.append(where.exists())
        if len(attempts) == 2:  # the daemon comes up between the client's tries
            servers.append(ControlServer(where, ops.policy.set_mode, ops.status).start())
        return real_connect(path, timeout)

    monkeypatch.setattr(client, "connect", connect_then_start)
    with pytest.raises(client.DaemonNotUp, match="control.sock: no such socket"):
        DiskControl(where, timeout=1.0).set_mode("none")
    assert len(attempts) == 1
    try:
        assert client_main([str(where), "--wait", "10", "mode", "eio"]) == 0
        assert ops.policy.mode == "eio" and attempts[1:] == [False] * (len(attempts) - 1)
    finally:
        for server in servers:
            server.stop()
    with pytest.raises(client.DaemonNotUp, match=r"no such socket after waiting 0.3 s"):
        DiskControl(tmp_path / "never.sock", timeout=1.0, wait=0.3).status()


def test_a_daemon_that_goes_away_mid_request_is_waited_for_like_one_not_up(ops, tmp_path, monkeypatch) -> None:
    """The compose suite's disk test: the heal met the syncer's container restarting, its
    daemon accepted the connection and went away (Broken pipe), and the heal failed. A
    daemon gone mid-request is retried within --wait, as one not up yet."""
    import chaos.diskfs.client as client

    where = tmp_path / "control.sock"
    servers: list[ControlServer] = []
    real_connect = client.connect
    tries: list[int] = []

    class Hangup:
        """A connection whose daemon is on its way out: sending fails, as on a closed peer."""
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            return False
        def sendall(self, data):
            raise BrokenPipeError(32, "Broken pipe")

    def dying_then_up(path, timeout):
        tries.append(1)
        if len(tries) == 1:
            return Hangup()
        if not servers:
            servers.append(ControlServer(where, ops.policy.set_mode, ops.status).start())
        return real_connect(path, timeout)

    monkeypatch.setattr(client, "connect", dying_then_up)
    try:
        assert DiskControl(where, timeout=1.0, wait=10).set_mode("full")["ok"]
        assert ops.policy.mode == "full" and len(tries) == 2
    finally:
        for server in servers:
            server.stop()
    tries.clear()
    with pytest.raises(client.DaemonNotUp, match="went away mid-request"):
        DiskControl(where, timeout=1.0).set_mode("none")  # no --wait: said at once
