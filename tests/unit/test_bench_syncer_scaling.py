"""The pure parts of bench/syncer_scaling.py: argument parsing, /proc parsing, the PUSH a
pusher builds, merge rows from syncer events, a point's summary and the table.

No process is started: the one wire check goes through a socketpair."""
from __future__ import annotations

import socket
import time

import pytest
import torch

from .bench_scripts import load_bench

sc = load_bench("syncer_scaling.py", "bench_syncer_scaling")


# ----------------------------------------------------------------------------- arguments
def test_parse_ns_sorts_and_deduplicates():
    assert sc.parse_ns("4,1,2,64,4") == [1, 2, 4, 64]


@pytest.mark.parametrize("text", ["", "0,2", "a", "-1"])
def test_parse_ns_refuses_nonsense(text):
    with pytest.raises(ValueError):
        sc.parse_ns(text)


def test_parse_sizes_knows_the_two_models():
    assert sc.parse_sizes("small, default") == ["small", "default"]
    with pytest.raises(ValueError, match="--sizes"):
        sc.parse_sizes("huge")


# ----------------------------------------------------------------------------- /proc
STATUS = "Name:\tpython\nVmPeak:\t 900000 kB\nVmHWM:\t  312548 kB\nVmRSS:\t  300000 kB\nThreads:\t7\n"


def test_vm_kib_reads_proc_status_fields():
    assert sc.vm_kib(STATUS, "VmRSS") == 300000
    assert sc.vm_kib(STATUS, "VmHWM") == 312548
    assert sc.vm_kib(STATUS, "VmSwap") is None


def test_read_vm_of_this_process_and_of_a_missing_one():
    import os
    mine = sc.read_vm(os.getpid())
    assert mine["VmRSS"] > 0 and mine["VmHWM"] >= mine["VmRSS"]
    assert sc.read_vm(2 ** 22 + 12345) == {"VmRSS": None, "VmHWM": None}


# ----------------------------------------------------------------------------- the PUSH frame
def test_a_pushers_frame_is_what_the_syncer_reads_and_decodes():
    from trainer import wire
    from trainer.codec import decode, encode

    shapes = {"a.weight": torch.Size([3, 4]), "b.bias": torch.Size([5])}
    header = sc.push_header(learner=7, incarnation=2, seq=3, base_version=9, tokens=5120, steps=10, position=30,
                            encoding="int8")
    # The syncer requires every one of these (trainer/syncer/core.py, parse_push).
    for key, minimum in (("fragment", 0), ("incarnation", 1), ("seq", 1), ("base_version", 0), ("tokens", 0),
                         ("steps", 0), ("position", 0)):
        assert wire.header_int(header, key, minimum) == header[key]
    assert wire.header_str(header, "encoding") == "int8"
    secret = b"s" * 32
    payload = wire.pack_tensors(encode({n: torch.randn(s) for n, s in shapes.items()}, "int8"))
    key = wire.derive_key(secret, b"c" * 32, b"s" * 32)
    data = wire.Session(key, client=True).seal(wire.message(wire.PUSH, header, payload=payload))
    a, b = socket.socketpair()
    try:
        a.sendall(data)
        frame = wire.read_frame(b, wire.Session(key, client=False), time.monotonic() + 5)
    finally:
        a.close()
        b.close()
    assert frame.type == wire.PUSH and frame.header["seq"] == 3 and frame.wire_bytes == len(data)
    delta = decode(frame.tensors(), "int8", shapes)
    assert {n: t.shape for n, t in delta.items()} == shapes


# ----------------------------------------------------------------------------- merge rows
def _accepted(t, j, seq=1):
    return {"t": t, "kind": "push_accepted", "id": f"{j}:1:{seq}", "learner": j}


def _merge(t, version, learners, seconds=0.05, reason="quorum", seq=1):
    return {"t": t, "kind": "merge", "fragment": 0, "version": version, "reason": reason, "seconds": seconds,
            "contributors": [{"id": f"{j}:1:{seq}", "learner": j} for j in learners]}


def _write(version, seconds):
    return {"t": 0.0, "kind": "state_write", "what": "fragment-0", "version": version, "seconds": seconds}


def test_merge_rows_time_each_merge_from_its_own_pushes():
    events = [
        _accepted(1.0, 1), _accepted(1.4, 2), _merge(1.5, 1, [1, 2], seconds=0.06), _write(1, 0.02),
        _accepted(3.0, 2, 2), _accepted(3.1, 1, 2), _merge(3.3, 2, [1, 2], seconds=0.08, seq=2), _write(2, 0.05),
        _merge(4.0, 3, [1], reason="final", seq=3),
        {"t": 4.1, "kind": "merge", "fragment": 1, "version": 1, "reason": "quorum", "seconds": 1,
         "contributors": []},
    ]
    rows = sc.merge_rows(events)
    assert [r["version"] for r in rows] == [1, 2]
    r1, r2 = rows
    assert r1["contributors"] == 2 and r1["write_seconds"] == 0.02 and r1["seconds"] == 0.06
    assert r1["first_push_to_merge"] == pytest.approx(0.5) and r1["last_push_to_merge"] == pytest.approx(0.1)
    assert r2["first_push_to_merge"] == pytest.approx(0.3) and r2["last_push_to_merge"] == pytest.approx(0.2)


def test_summarize_point_skips_the_warm_up_and_flags_partial_merges_and_lost_leases():
    merges = [
        {"version": 1, "contributors": 4, "seconds": 9.0, "write_seconds": 1.0, "first_push_to_merge": 9.0,
         "last_push_to_merge": 9.0},
        {"version": 2, "contributors": 4, "seconds": 0.10, "write_seconds": 0.04, "first_push_to_merge": 1.0,
         "last_push_to_merge": 0.2},
        {"version": 3, "contributors": 3, "seconds": 0.20, "write_seconds": 0.05, "first_push_to_merge": 2.0,
         "last_push_to_merge": 0.3},
        {"version": 4, "contributors": 4, "seconds": 0.30, "write_seconds": 0.06, "first_push_to_merge": 3.0,
         "last_push_to_merge": 0.4},
    ]
    rounds = [{"round": r, "seconds": s} for r, s in ((1, 50.0), (2, 1.5), (3, 2.5), (4, 3.5))]
    vm = {"start": 200 * 1024, "end_of_round": [300 * 1024, 310 * 1024, 320 * 1024], "peak": 400 * 1024,
          "hwm": 410 * 1024}
    events = [{"kind": "heartbeat_lost"}, {"kind": "merge"}]
    p = sc.summarize_point("small", 12345, 4, merges, rounds, warmup=1, vm=vm, events=events)
    assert p["merges"] == 3 and p["rounds"] == 3 and p["partial_merges"] == 1
    assert p["merge_s_median"] == pytest.approx(0.2) and p["merge_s_p90"] == pytest.approx(0.28)
    assert p["merge_write_s_median"] == pytest.approx(0.05)
    assert p["merge_compute_s_median"] == pytest.approx(0.15)
    assert p["first_push_to_merge_s_median"] == pytest.approx(2.0)
    assert p["round_s_median"] == pytest.approx(2.5)
    assert p["rss_start_mib"] == 200.0 and p["rss_end_of_round_mib"] == 310.0
    assert p["rss_peak_sampled_mib"] == 400.0 and p["hwm_mib"] == 410.0
    assert p["heartbeats_lost"] == 1
    table = sc.format_table([p])
    assert "small" in table and "1 partial merges" in table and "1 heartbeats lost" in table


def test_summary_of_a_point_without_measurements_is_empty_not_an_error():
    p = sc.summarize_point("default", 1, 2, [], [], warmup=1, vm={}, events=[])
    assert p["merge_s_median"] is None and p["rss_end_of_round_mib"] is None
    assert "-" in sc.format_table([p])


def test_percentile_interpolates_like_numpy():
    assert sc.percentile([1.0, 2.0, 3.0, 4.0, 10.0], 90) == pytest.approx(7.6)
    assert sc.med([None, 3.0, 1.0]) == 2.0 and sc.p90([]) is None
