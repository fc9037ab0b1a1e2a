"""Hosts whose clocks disagree: the host clock a process stamps its events with, the clock
probe, events placed on the controller's timeline, and the `timeline` check. A healthy run
whose hosts' clocks are 5 s apart passes once placed and fails when judged on its hosts'
own clocks (the planted defect: a harness that trusts every clock)."""
from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time

import pytest

from chaos import clock_probe, timeline
from chaos.checkers import FAIL, NOT_APPLICABLE, PASS, UNKNOWN, RunView, check_self_heal, check_timeline, run_checkers
from chaos.timeline import ClockSample, HostClock, place
from trainer import clock
from trainer.events import EventLog
from trainer.runspec import RunSpec, parse_host_clocks

from .test_chaos_checkers import healthy_chaos_run


# ----------------------------------------------------------------------------- the host clock
def test_a_process_stamps_events_on_its_hosts_clock_and_names_the_host(tmp_path, monkeypatch):
    spec = tmp_path / "host.json"
    spec.write_text(json.dumps({"offset": 5.0, "rate": 1.0 + 200e-6, "anchor": time.monotonic() - 100.0}))
    monkeypatch.setenv(clock.HOST_CLOCK_ENV, str(spec))
    monkeypatch.setenv(clock.HOST_ENV, "node-2")
    record = EventLog(None, "learner-1", 1).emit("inner_step")
    assert record["host"] == "node-2"
    # 5 s, plus 200 ppm of the 100 s since its anchor
    assert record["t"] - time.monotonic() == pytest.approx(5.02, abs=0.005)
    assert record["wall"] - time.time() == pytest.approx(5.02, abs=0.005)


def test_without_a_host_clock_events_are_on_the_kernels_clock_and_name_no_host(monkeypatch):
    monkeypatch.delenv(clock.HOST_CLOCK_ENV, raising=False)
    monkeypatch.delenv(clock.HOST_ENV, raising=False)
    record = EventLog(None, "syncer").emit("merge")
    assert "host" not in record
    assert record["t"] == pytest.approx(time.monotonic(), abs=0.005)


def test_an_unreadable_host_clock_file_is_the_kernels_clock(tmp_path, monkeypatch):
    (tmp_path / "bad.json").write_text("{not json")
    monkeypatch.setenv(clock.HOST_CLOCK_ENV, str(tmp_path / "bad.json"))
    assert clock.monotonic() == pytest.approx(time.monotonic(), abs=0.005)


@pytest.mark.parametrize("text,message", [
    ("learner-1", "expected PROCESS=OFFSET"), ("learner-1=soon", "must be numbers"),
    ("syncer=1e9", "offset must be within"), ("syncer=0@5000", "drift must be within"),
    ("syncer=1,syncer=2", "given twice"), ("learner-7=1", "'learner-7' is not a process"),
])
def test_a_bad_host_clock_spec_is_refused_naming_the_field(text, message):
    with pytest.raises(ValueError, match=message) as info:
        RunSpec(learners=3, host_clocks=text)
    assert str(info.value).startswith("host_clocks:")


def test_host_clocks_parse_and_belong_to_the_local_backend():
    assert parse_host_clocks("syncer=-4, learner-1=+5@200") == {"syncer": (-4.0, 0.0), "learner-1": (5.0, 200.0)}
    with pytest.raises(ValueError, match="only the local backend"):
        RunSpec(backend="compose", host_clocks="syncer=1")
    assert RunSpec.from_json(RunSpec(host_clocks="syncer=1").to_json()).host_clocks == "syncer=1"


# ----------------------------------------------------------------------------- the probe
@pytest.fixture
def responder():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    stop = threading.Event()
    thread = threading.Thread(target=clock_probe.serve, args=(sock, "node-1", stop), daemon=True)
    thread.start()
    yield sock.getsockname()
    stop.set()
    thread.join(timeout=5)
    sock.close()


def test_a_probe_brackets_the_hosts_reading(responder):
    sample = clock_probe.probe(responder, "node-1")
    assert sample is not None and sample.sent <= sample.remote <= sample.received  # one kernel here


@pytest.mark.parametrize("request_bytes", [b"", b"x" * 600, b"[1]", b'{"n": 5}', b'{"n": "' + b"a" * 70 + b'"}'])
def test_a_datagram_that_is_not_a_probe_gets_no_answer(request_bytes):
    assert clock_probe.answer(request_bytes, "h") is None


def test_an_answer_with_another_nonce_is_ignored_and_the_deadline_holds():
    """A stray answer (another probe's nonce) does not count; with no right one, None in time."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))

    def wrong_answers():
        sock.settimeout(2)
        try:
            _, peer = sock.recvfrom(600)
            sock.sendto(json.dumps({"n": "someone-else", "t": 1.0}).encode(), peer)
        except OSError:
            pass

    thread = threading.Thread(target=wrong_answers, daemon=True)
    thread.start()
    started = time.monotonic()
    assert clock_probe.probe(sock.getsockname(), "h", deadline=0.3) is None
    assert time.monotonic() - started < 2.0
    thread.join(timeout=3)
    sock.close()


def test_the_prober_records_each_answer_and_skips_a_dead_host(tmp_path, responder):
    prober = clock_probe.Prober(tmp_path, lambda: {"node-1": responder, "gone": ("127.0.0.1", 9)})
    prober.round()
    prober.round()
    samples = timeline.read_samples(tmp_path)
    assert prober.sent == 4 and prober.answered == 2
    assert [s.host for s in samples] == ["node-1", "node-1"]


# ----------------------------------------------------------------------------- placing events
def shifted(view: RunView, offsets: dict[str, float]) -> tuple[list[dict], dict[str, HostClock]]:
    """The run's events as hosts whose clocks are off by `offsets` (per process prefix) would
    have stamped them, and exact estimates of those clocks (±1 ms)."""
    events = []
    for e in view.events:
        host = next((h for h in offsets if e["process"].startswith(h)), None)
        events.append(e if host is None else {**e, "t": e["t"] + offsets[host], "host": f"host-{host}"})
    clocks = {f"host-{h}": HostClock(f"host-{h}", o, 0.0, 40.0, 0.001, 1e-5, 0.0, 90.0, 90, 45)
              for h, o in offsets.items()}
    return events, clocks


OFFSETS = {"syncer": -5.0, "learner": 5.0}


def test_a_healthy_run_on_disagreeing_clocks_passes_once_placed_and_fails_on_its_own_clocks():
    healthy = healthy_chaos_run()
    events, clocks = shifted(healthy, OFFSETS)
    placed, placement = place(events, clocks)
    verdicts = {v.name: v.status for v in run_checkers(RunView(placed, healthy.history, placement=placement))}
    assert verdicts == {v.name: v.status for v in run_checkers(healthy)} | {"timeline": PASS}
    moved = [e for e in placed if "t_host" in e]
    assert len(moved) == sum(1 for e in events if "host" in e) > 0
    assert all(e["t"] == pytest.approx(e["t_host"] - OFFSETS[e["host"][5:]], abs=1e-6) for e in moved)
    unplaced, off = place(events, clocks, align=False)
    judged = {v.name: v.status for v in run_checkers(RunView(unplaced, healthy.history, placement=off))}
    assert judged["timeline"] == UNKNOWN
    assert FAIL in judged.values(), judged


def test_the_timeline_check_names_a_host_it_could_not_place_and_a_bound_too_wide():
    healthy = healthy_chaos_run()
    events, clocks = shifted(healthy, OFFSETS)
    placed, placement = place(events, {"host-syncer": clocks["host-syncer"]})
    verdict = check_timeline(RunView(placed, healthy.history, placement=placement))
    assert verdict.status == UNKNOWN and "host-learner" in verdict.detail
    wide = {h: dataclasses.replace(c, error=1.5) for h, c in clocks.items()}
    placed, placement = place(events, wide)
    verdict = check_timeline(RunView(placed, healthy.history, placement=placement))
    assert verdict.status == UNKNOWN and "wider than the fault timing tolerance" in verdict.detail
    assert check_timeline(healthy).status == NOT_APPLICABLE


def test_fault_windows_widen_by_the_clocks_bound():
    healthy = healthy_chaos_run()
    events, clocks = shifted(healthy, OFFSETS)
    placed, placement = place(events, clocks)
    wide = RunView(placed, healthy.history, placement=placement)
    (narrow_w,), (wide_w,) = healthy.windows(), wide.windows()
    assert wide_w.start == pytest.approx(narrow_w.start - placement.error)
    assert wide_w.stop == pytest.approx(narrow_w.stop + placement.error)


def test_a_contribution_within_the_bound_of_its_deadline_is_unknown_not_failed():
    """self_heal with a deadline that lands within the clocks' bound of the first contribution."""
    healthy = healthy_chaos_run()
    first = check_self_heal(healthy).evidence["healings"][0]["contributed_after"]
    events, clocks = shifted(healthy, OFFSETS)
    bound = {h: dataclasses.replace(c, error=0.2) for h, c in clocks.items()}
    placed, placement = place(events, bound)
    view = RunView(placed, healthy.history, placement=placement)
    # The window's stop moves 0.2 s later (widened by the bound), and the deadline with it;
    # allowed 0.3 s less than it took, the contribution is 0.1 s past the deadline: within
    # the bound, so the order is open.
    verdict = check_self_heal(view, within=first - 0.3)
    assert verdict.status == UNKNOWN and "within the clocks'" in verdict.detail
    assert check_self_heal(healthy, within=first - 0.3).status == FAIL  # one clock: it is late, and says so
    assert check_self_heal(view, within=first - 1.0).status == FAIL      # well past the bound: late for sure


def test_events_are_placed_and_sorted_and_a_host_without_an_estimate_is_left_where_it_was():
    events = [{"t": 1.0, "process": "a", "host": "h1", "kind": "k"}, {"t": 2.0, "process": "b", "kind": "k"}]
    clock_h1 = timeline.estimate("h1", [ClockSample("h1", 0.0, 0.002, 10.001)])
    placed, placement = place(events, {"h1": clock_h1})
    # h1's clock is 10 s ahead: its reading 1.0 was the controller's -9.0, before b's 2.0
    assert [e["process"] for e in placed] == ["a", "b"]
    assert placed[0]["t"] == pytest.approx(-9.0, abs=0.01) and placed[0]["t_host"] == 1.0
    placed, placement = place(events, {})
    assert placement.unplaced == {"h1": 1} and placed == events
