"""The checkers on synthetic runs: events and history entries built by hand on a fake monotonic clock.

Events have the shape trainer/events.py writes ({"t", "wall", "process", "pid", "learner", "kind", ...})
with the fields the syncer and the learners really emit; history entries have the shape
chaos/controller.py records. Times passed to the helpers are seconds after the history's `begin`.
"""
from __future__ import annotations

import json
import math

import pytest

from chaos.checkers import (CHECKERS, FAIL, NOT_APPLICABLE, PASS, SAFETY_CHECKS, UNKNOWN, RunView, Verdict, Window,
                            check_converged,
                            check_every_learner_contributes_at_end, check_faults_applied, check_final_loss,
                            check_finite, check_monotonic_versions, check_no_double_apply, check_no_lost_acks,
                            check_push_window,
                            check_progress, check_self_heal, not_passed, run_checkers, verdict_document)

T0 = 1000.0  # the fake monotonic clock at the history's `begin`
WALL0 = 1.7e9


# --------------------------------------------------------------------------- events


def ev(t: float, kind: str, process: str | None = None, learner: int | None = None, **fields) -> dict:
    """One event as EventLog.emit writes it; the process defaults to learner-N or the syncer."""
    if process is None:
        process = f"learner-{learner}" if learner is not None else "syncer"
    return {"t": T0 + t, "wall": WALL0 + t, "process": process, "pid": 100 + len(process),
            "learner": learner, "kind": kind, **fields}


def push_id(learner: int, seq: int, incarnation: int = 1) -> str:
    return f"{learner}:{incarnation}:{seq}"


def contributor(learner: int, seq: int, incarnation: int = 1, base_version: int = 0, version: int = 1) -> dict:
    """One entry of a merge's `contributors`, as Syncer._merge emits it."""
    return {"id": push_id(learner, seq, incarnation), "learner": learner, "incarnation": incarnation, "seq": seq,
            "tokens": 2048, "base_version": base_version, "staleness": version - 1 - base_version,
            "weight": 1.0, "steps": 4}


def merge(t: float, fragment: int, version: int, contributors: list[dict], finite: bool = True) -> dict:
    return ev(t, "merge", fragment=fragment, version=version, reason="quorum", quorum=1,
              alive=sorted({c["learner"] for c in contributors}), contributors=contributors,
              tokens=sum(c["tokens"] for c in contributors), expected_tokens=6144.0, fragment_share=0.5,
              finite=finite, state_bytes=1024, seconds=0.01)


def inner_step(t: float, learner: int, step: int, loss: float | str = 3.0, incarnation: int = 1) -> dict:
    return ev(t, "inner_step", learner=learner, step=step, loss=loss, tokens=512, compute_s=0.05,
              incarnation=incarnation, position=step * 512)


def push(t: float, learner: int, seq: int, status: str = "accepted", fragment: int = 0, incarnation: int = 1,
         version: int = 0) -> dict:
    """The learner's `push` event once the syncer answered (status accepted, duplicate, stale...)."""
    return ev(t, "push", learner=learner, fragment=fragment, seq=seq, id=push_id(learner, seq, incarnation),
              base_version=0, tokens=2048, steps=4, wire_bytes=4096, encoding="fp16", status=status,
              version=version, attempts=1, coalesced=0, latency=0.01, incarnation=incarnation)


def apply(t: float, learner: int, fragment: int | None, version: int, incarnation: int = 1) -> dict:
    return ev(t, "apply", learner=learner, fragment=fragment, version=version, alpha=0.0, incarnation=incarnation)


def final_state(t: float, applied: dict[str, list[str]] | None, finite: bool = True) -> dict:
    """The syncer's `final_state`; applied=None gives the sync-mode shape (no ledger, no `finite`)."""
    if applied is None:
        return ev(t, "final_state", mode="sync", counters={}, members={}, round=10)
    return ev(t, "final_state", mode="decoupled", counters={"merges": 1}, members={},
              versions=[len(ids) for ids in applied.values()], applied=applied, finite=finite)


def final_params(t: float, learner: int, rows: list[tuple[int, int, float | str]], incarnation: int = 1) -> dict:
    """A learner's `final_params`: rows of (fragment, adopted version, drift)."""
    return ev(t, "final_params", learner=learner, incarnation=incarnation,
              fragments=[{"fragment": f, "version": v, "drift": d} for f, v, d in rows])


def global_eval(t: float, version: int, loss: float | str, tokens: float | None = None, reason: str = "merge",
                versions: list[int] | None = None) -> dict:
    """The syncer's `global_eval`: Θ's held-out loss at `version` (the sum of `versions`)."""
    return ev(t, "global_eval", versions=versions or [version], version=version,
              tokens=tokens if tokens is not None else 10240.0 * version, loss=loss, seconds=0.05, reason=reason)


def evaluation(t: float, final_loss: float | str, unigram_entropy: float = 4.0, loss_floor: float = 2.0) -> dict:
    """The evaluator's `eval` event (trainer eval --run-dir)."""
    return ev(t, "eval", process="evaluator", final_loss=final_loss, loss_floor=loss_floor,
              unigram_entropy=unigram_entropy, data="markov")


def _inside(t: float, intervals) -> bool:
    return any(a <= t < b for a, b in intervals)


def training(until: float = 60.0, learners=(1, 2, 3), absent: dict | None = None, syncer_down=(),
             start: float = 0.0, every: float = 1.0, fragments: int = 2) -> list[dict]:
    """A decoupled run: every `every` s each present learner steps and pushes (acked at once), and the
    syncer, unless down, merges one fragment (in turn) with every present learner's push.
    `absent` maps a learner to the intervals in which it neither steps nor pushes."""
    absent = absent or {}
    # The syncer announces its config; here a push every step (H=1), so a round is two ticks.
    events: list[dict] = [ev(start - 1.0, "process_start", role="syncer",
                             config={"sync_every": 1, "fragments": fragments}, syncer={"grace": 0.5})]
    events += [learner_start(start - 1.0, i) for i in learners]
    seq = {i: 0 for i in learners}
    steps = {i: 0 for i in learners}
    versions = [0] * fragments
    k = 0
    while start + k * every <= until + 1e-9:
        t = start + k * every
        present = [i for i in learners if not _inside(t, absent.get(i, ()))]
        for i in present:
            steps[i] += 1
            events.append(inner_step(t - 0.2, i, steps[i]))
        if present and not _inside(t, syncer_down):
            frag = k % fragments
            versions[frag] += 1
            contribs = []
            for i in present:
                seq[i] += 1
                events.append(made_on(push(t - 0.1, i, seq[i], fragment=frag, version=versions[frag] - 1),
                                      versions[frag] - 1))
                contribs.append(contributor(i, seq[i], base_version=versions[frag] - 1, version=versions[frag]))
            events.append(merge(t, frag, versions[frag], contribs))
        k += 1
    return sorted(events, key=lambda e: e["t"])


def ledger(events: list[dict]) -> dict[str, list[str]]:
    """The applied ledger a syncer would hold after the merges in `events`."""
    out: dict[str, list[str]] = {}
    for e in events:
        if e["kind"] == "merge":
            out.setdefault(str(e["fragment"]), []).extend(c["id"] for c in e["contributors"])
    return out


def latest_versions(events: list[dict], until: float) -> dict[int, int]:
    out: dict[int, int] = {}
    for e in events:
        if e["kind"] == "merge" and e["t"] <= T0 + until:
            out[e["fragment"]] = max(out.get(e["fragment"], 0), e["version"])
    return out


# --------------------------------------------------------------------------- history


def h(t: float, event: str, **fields) -> dict:
    return {"t": T0 + t, "wall": WALL0 + t, "event": event, **fields}


def begin(faults: int, duration: float = 60.0) -> dict:
    return h(0.0, "begin", seed=7, faults=faults, duration=duration)


def kill(target: str, at: float, duration: float, restart: bool = True) -> dict:
    fault = {"kind": "kill", "at": at, "duration": duration, "target": target}
    return fault if restart else {**fault, "restart": False}


def pause(target: str, at: float, duration: float) -> dict:
    return {"kind": "pause", "at": at, "duration": duration, "target": target}


def partition(targets: list[str], at: float, duration: float) -> dict:
    return {"kind": "partition", "at": at, "duration": duration, "targets": targets}


def latency(target: str, at: float, duration: float) -> dict:
    return {"kind": "latency", "at": at, "duration": duration, "target": target, "latency_ms": 500}


def action(t: float, event: str, index: int, fault: dict, ok: bool = True, error: str | None = None) -> dict:
    """A `start` or `stop` entry as Controller.apply records it."""
    planned = fault["at"] if event == "start" else fault["at"] + fault["duration"]
    return h(t, event, index=index, kind=fault["kind"], fault=fault, planned=planned, at=round(t, 4), took=0.01,
             did=f"{event} {fault['kind']}" if ok else None, ok=ok, error=error)


def heal(t: float, reason: str = "end", ok: bool = True, error: str | None = None) -> dict:
    if ok:
        return h(t, "heal", reason=reason, did=[], ok=True)
    return h(t, "heal", reason=reason, ok=False, error=error)


def history_for(faults: list[dict], duration: float = 60.0, end: bool = True) -> list[dict]:
    """What the controller records for a schedule whose faults all started and stopped on time."""
    entries = [h(-1.0, "heal", reason="start", did=[], ok=True), begin(len(faults), duration)]
    for i, fault in enumerate(faults):
        entries.append(action(fault["at"], "start", i, fault))
        if fault.get("restart", True) or fault["kind"] != "kill":
            entries.append(action(fault["at"] + fault["duration"], "stop", i, fault))
    entries.sort(key=lambda e: e["t"])
    entries.append(heal(duration))
    if end:
        entries.append(h(duration + 0.1, "end", errors=[]))
    return entries


def view(events: list[dict], history: list[dict] | None = None) -> RunView:
    return RunView(sorted(events, key=lambda e: e["t"]), history if history is not None else history_for([]))


# --------------------------------------------------------------------------- RunView


def test_t0_is_the_history_begin_else_the_first_event_else_zero():
    """Times are measured from `begin`; without one from the first event; an empty run starts at 0."""
    events = [inner_step(-5.0, 1, 1), inner_step(3.0, 1, 2)]
    assert view(events, history_for([])).t0 == T0
    assert RunView(events, []).t0 == T0 - 5.0
    assert RunView([], []).t0 == 0.0
    assert view(events).rel(T0 + 12.3456) == 12.346


def test_end_is_the_last_step_or_merge_not_the_last_event():
    """The run ends at its last inner step, merge or sync step; later shutdown events do not count."""
    events = [inner_step(10.0, 1, 1), merge(20.0, 0, 1, [contributor(1, 1)]),
              ev(30.0, "process_stop", role="syncer", reason="signal")]
    assert view(events).end == T0 + 20.0
    assert view([ev(5.0, "process_start", role="syncer")]).end == T0


def test_learners_come_only_from_learner_processes():
    """The syncer's join/push_accepted events carry a learner field but do not make a learner."""
    events = [inner_step(1.0, 3, 1), inner_step(1.0, 1, 1),
              ev(2.0, "join", process="syncer", learner=7, incarnation=1, rejoin=False),
              ev(2.5, "push_accepted", process="syncer", learner=9, incarnation=1, seq=1, id="9:1:1")]
    assert view(events).learners() == [1, 3]


def test_final_state_is_the_last_one_and_progress_times_are_merges_and_sync_steps():
    """final_state() returns the syncer's last clean stop; progress counts merges and sync steps only."""
    first, last = final_state(10.0, {"0": []}), final_state(20.0, {"0": ["1:1:1"]})
    events = [first, merge(5.0, 0, 1, [contributor(1, 1)]), inner_step(6.0, 1, 1),
              ev(7.0, "sync_step", round=1, contributors=[1], tokens=512, seconds=0.1), last]
    v = view(events)
    assert v.final_state() is last
    assert v.progress_times() == [T0 + 5.0, T0 + 7.0]
    assert view([inner_step(1.0, 1, 1)]).final_state() is None


def test_windows_pair_each_ok_start_with_its_stop():
    """A window runs from the start entry to the stop entry, with the fault's kind and targets."""
    faults = [kill("learner-1", 10.0, 5.0), partition(["learner-2", "learner-3"], 20.0, 8.0)]
    windows = view(training(60.0), history_for(faults)).windows()
    assert windows == [Window(0, "kill", ("learner-1",), T0 + 10.0, T0 + 15.0),
                       Window(1, "partition", ("learner-2", "learner-3"), T0 + 20.0, T0 + 28.0)]


def test_windows_skip_a_fault_that_failed_to_start():
    """A start with ok=False put nothing in force: no window."""
    fault = pause("learner-1", 10.0, 5.0)
    history = [begin(1), action(10.0, "start", 0, fault, ok=False, error="ProcessLookupError: gone"),
               action(15.0, "stop", 0, fault), heal(60.0)]
    assert view(training(60.0), history).windows() == []


def test_windows_without_a_stop_end_at_the_next_final_heal():
    """A kill with restart=False has no stop: it is in force until the first later heal, not the start heal."""
    fault = kill("learner-2", 30.0, 5.0, restart=False)
    history = [heal(-1.0, reason="start"), begin(1), action(30.0, "start", 0, fault),
               heal(60.0, reason="end"), heal(61.0, reason="signal"), h(61.5, "end", errors=[])]
    assert view(training(70.0), history).windows() == [Window(0, "kill", ("learner-2",), T0 + 30.0, T0 + 60.0)]


def test_windows_without_stop_or_heal_end_at_the_end_of_the_run():
    """With neither a stop nor a later heal (the controller died), the fault lasts to the run's end."""
    fault = pause("syncer", 30.0, 5.0)
    history = [heal(-1.0, reason="start"), begin(1), action(30.0, "start", 0, fault)]
    (window,) = view(training(45.0), history).windows()
    assert (window.start, window.stop) == (T0 + 30.0, T0 + 45.0)


def test_windows_are_sorted_by_fault_index_and_rank_targets_are_kept():
    """Windows come out in fault-index order whatever the history order; rank targets are kept as written."""
    a, b = pause("learner-2/rank-0", 5.0, 20.0), kill("learner-1", 10.0, 5.0)
    history = [begin(2), action(10.0, "start", 1, b), action(5.0, "start", 0, a),
               action(15.0, "stop", 1, b), action(25.0, "stop", 0, a)]
    windows = view(training(30.0), history).windows()
    assert [w.index for w in windows] == [0, 1]
    assert windows[0].targets == ("learner-2/rank-0",)


def test_a_failed_stop_leaves_the_fault_in_force_until_the_final_heal():
    """SIGCONT failed at 15 s: learner-1 stayed paused until the final heal at 60 s."""
    fault = pause("learner-1", 10.0, 5.0)
    history = [begin(1), action(10.0, "start", 0, fault),
               action(15.0, "stop", 0, fault, ok=False, error="ProcessLookupError: no such process"),
               heal(60.0), h(60.1, "end", errors=["faults[0] stop: ProcessLookupError"])]
    (window,) = view(training(65.0), history).windows()
    assert window.stop == T0 + 60.0


# --------------------------------------------------------------------------- faults_applied


def test_faults_applied_passes_when_every_action_and_heal_succeeded():
    """Every start and stop ok, every heal ok, the run ended: pass, with nothing never started."""
    faults = [kill("learner-1", 10.0, 5.0), latency("learner-2", 20.0, 5.0)]
    verdict = check_faults_applied(view(training(), history_for(faults)))
    assert verdict.status == PASS
    assert {k: verdict.evidence[k] for k in ("faults", "actions", "errors", "never_started")} == \
        {"faults": 2, "actions": 4, "errors": [], "never_started": []}
    assert "2 fault(s)" in verdict.detail


def test_faults_applied_fails_a_fault_started_late_and_in_force_too_short():
    """Issue 26: a 3 s latency due at t=6 started at 8.64 s (the controller was busy
    restarting the syncer) and stopped on time at 9 s: 0.36 s in force. The check fails,
    naming the fault, both intervals and the shortfall; every action had succeeded."""
    faults = [kill("syncer", 3.0, 2.0), latency("learner-1", 6.0, 3.0)]
    history = history_for(faults)
    late = next(i for i, e in enumerate(history) if e.get("event") == "start" and e.get("index") == 1)
    history[late] = {**history[late], "at": 8.63, "took": 0.01}
    verdict = check_faults_applied(view(training(), history))
    assert verdict.status == FAIL
    assert "faults[1] latency learner-1: planned 6-9 s, in force 8.64-9.00 s" in verdict.detail
    assert "0.36 s of the 3 s planned" in verdict.detail
    assert "issued 2.63 s late, took 0.01 s" in verdict.detail, "which of the two made it late"
    row = next(r for r in verdict.evidence["timing"] if r["fault"] == 1)
    assert row["start_late"] == pytest.approx(2.64) and row["shortfall"] == pytest.approx(2.64)


def test_faults_applied_passes_on_time_with_the_deviation_in_its_detail():
    """Every fault in force within the tolerance: pass, with the worst deviation said."""
    faults = [kill("syncer", 3.0, 2.0), latency("learner-1", 6.0, 3.0)]
    verdict = check_faults_applied(view(training(), history_for(faults)))
    assert verdict.status == PASS
    assert "at most 0.010 s late" in verdict.detail and "tolerance 0.25 s" in verdict.detail
    assert verdict.evidence["tolerance"] == 0.25


def test_a_kill_is_in_force_until_its_target_is_back():
    """A kill's restart that takes 4 s makes the kill last 4 s longer, which is no
    shortfall; a restart issued late is (the fault lasted longer than planned)."""
    fault = kill("syncer", 3.0, 2.0)
    history = history_for([fault])
    stop = next(i for i, e in enumerate(history) if e.get("event") == "stop")
    history[stop] = {**history[stop], "took": 4.0}
    verdict = check_faults_applied(view(training(), history))
    assert verdict.status == PASS, verdict.detail
    row = verdict.evidence["timing"][0]
    assert row["in_force"] == [3.01, 9.0] and row["shortfall"] == pytest.approx(-3.99)
    history[stop] = {**history[stop], "at": 6.5}
    verdict = check_faults_applied(view(training(), history))
    assert verdict.status == FAIL and "stopped 1.50 s after its planned end 5 s" in verdict.detail


def test_faults_applied_uses_the_backends_tolerance_from_the_history():
    """A backend whose actions take longer (a Docker engine call) records its tolerance in
    `begin`: a start 0.6 s late then passes under compose's, and fails under the default."""
    faults = [pause("learner-2", 10.0, 5.0)]
    history = history_for(faults)
    start = next(i for i, e in enumerate(history) if e.get("event") == "start")
    history[start] = {**history[start], "took": 0.6}
    assert check_faults_applied(view(training(), history)).status == FAIL
    b = next(i for i, e in enumerate(history) if e.get("event") == "begin")
    history[b] = {**history[b], "tolerance": 1.5}
    assert check_faults_applied(view(training(), history)).status == PASS


def test_faults_applied_fails_naming_the_fault_and_error_of_a_failed_start():
    """A start with ok=False fails the check; the evidence names the fault index, action and error."""
    faults = [kill("learner-1", 10.0, 5.0), pause("learner-2", 20.0, 5.0)]
    history = history_for(faults)
    history[4] = action(20.0, "start", 1, faults[1], ok=False, error="ProcessLookupError: no such process")
    assert history[4]["event"] == "start"
    verdict = check_faults_applied(view(training(), history))
    assert verdict.status == FAIL
    assert "ProcessLookupError: no such process" in verdict.detail
    assert verdict.evidence["errors"] == [{"fault": 1, "action": "start", "at": 20.0,
                                           "error": "ProcessLookupError: no such process"}]
    assert verdict.evidence["never_started"] == [1]


def test_faults_applied_fails_on_a_failed_stop():
    """A stop with ok=False (the restart failed) fails the check and names the fault."""
    fault = kill("learner-3", 10.0, 5.0)
    history = [begin(1), action(10.0, "start", 0, fault),
               action(15.0, "stop", 0, fault, ok=False, error="RuntimeError: restart failed"), heal(60.0)]
    verdict = check_faults_applied(view(training(), history))
    assert verdict.status == FAIL
    assert verdict.evidence["errors"][0]["fault"] == 0
    assert verdict.evidence["errors"][0]["action"] == "stop"
    assert "restart failed" in verdict.detail


def test_faults_applied_fails_on_a_failed_heal():
    """A heal with ok=False (the cluster was left disturbed) fails the check, naming the heal's reason."""
    history = history_for([kill("learner-1", 10.0, 5.0)])
    history[-2] = heal(60.0, reason="end", ok=False, error="ConnectionError: toxiproxy down")
    verdict = check_faults_applied(view(training(), history))
    assert verdict.status == FAIL
    assert {"heal": "end", "error": "ConnectionError: toxiproxy down"} in verdict.evidence["errors"]
    assert "toxiproxy down" in verdict.detail


def test_faults_applied_fails_on_a_failed_start_heal():
    """The heal before the schedule (reason `start`) counts too."""
    history = history_for([])
    history[0] = heal(-1.0, reason="start", ok=False, error="TimeoutError")
    assert check_faults_applied(view(training(), history)).status == FAIL


def test_faults_applied_fails_when_a_fault_never_started_although_the_run_ended():
    """The schedule had 3 faults, the history started only 2, and the controller ended: fail, naming index 2."""
    faults = [kill("learner-1", 10.0, 5.0), pause("learner-2", 20.0, 5.0)]
    history = history_for(faults)
    history[1] = begin(3)
    verdict = check_faults_applied(view(training(), history))
    assert verdict.status == FAIL
    assert verdict.evidence["never_started"] == [2]
    assert "[2]" in verdict.detail


def test_faults_applied_does_not_count_missing_faults_before_the_end():
    """Without an `end` entry (the controller is still running) a fault not yet started is no failure."""
    history = history_for([kill("learner-1", 10.0, 5.0)], end=False)
    history[1] = begin(2)
    verdict = check_faults_applied(view(training(), history))
    assert verdict.status == PASS
    assert verdict.evidence["never_started"] == [1]


def test_faults_applied_reports_at_most_three_errors_in_the_detail():
    """The detail quotes the first three errors; the evidence keeps them all."""
    faults = [pause(f"learner-{i}", 10.0 * i, 5.0) for i in (1, 2, 3)] + [pause("syncer", 40.0, 5.0)]
    history = [begin(4)] + [action(f["at"], "start", i, f, ok=False, error=f"boom-{i}") for i, f in enumerate(faults)]
    verdict = check_faults_applied(view(training(), history))
    assert verdict.status == FAIL
    assert "boom-2" in verdict.detail and "boom-3" not in verdict.detail
    assert len(verdict.evidence["errors"]) == 4


def test_faults_applied_is_unknown_without_a_begin():
    """No `begin`: no schedule ran, so there is nothing to judge."""
    assert check_faults_applied(view(training(), [heal(-1.0, reason="start")])).status == UNKNOWN
    assert check_faults_applied(view(training(), [])).status == UNKNOWN


# --------------------------------------------------------------------------- progress


def test_progress_passes_on_a_steady_run():
    """A merge every second: pass, with the first and last progress times in the evidence."""
    verdict = check_progress(view(training(60.0)))
    assert verdict.status == PASS
    assert verdict.evidence["violations"] == []
    assert (verdict.evidence["first"], verdict.evidence["last"]) == (0.0, 60.0)


def test_progress_fails_without_any_merge():
    """Learners stepped but the syncer never merged: fail."""
    events = [inner_step(float(t), 1, t) for t in range(1, 30)]
    verdict = check_progress(view(events))
    assert verdict.status == FAIL
    assert "no merge" in verdict.detail


def test_progress_fails_on_a_long_gap_while_everyone_is_healthy():
    """No merge from 20 s to 55 s with no fault in force: fail, naming the gap."""
    verdict = check_progress(view(training(80.0, syncer_down=[(20.0, 55.0)])), max_gap=20.0)
    assert verdict.status == FAIL
    (violation,) = verdict.evidence["violations"]
    assert (violation["from"], violation["to"]) == (19.0, 55.0)
    assert violation["healthy_seconds"] > 20.0


def test_progress_excuses_the_same_gap_while_the_syncer_is_paused():
    """The same gap, while a pause of the syncer (20..45 s, plus 10 s recovery) is in force: pass."""
    events = training(80.0, syncer_down=[(20.0, 55.0)])
    verdict = check_progress(view(events, history_for([pause("syncer", 20.0, 25.0)], duration=80.0)), max_gap=20.0)
    assert verdict.status == PASS, verdict.evidence


def test_progress_gap_longer_than_the_recovery_allowance_fails():
    """A syncer fault excuses its window plus `recovery`, not a stall that goes on long after it."""
    events = training(100.0, syncer_down=[(20.0, 80.0)])
    history = history_for([pause("syncer", 20.0, 10.0)], duration=100.0)
    verdict = check_progress(view(events, history), max_gap=20.0, recovery=10.0)
    assert verdict.status == FAIL
    assert verdict.evidence["violations"][0]["healthy_seconds"] == pytest.approx(40.0, abs=1.0)


def test_progress_quorum_decides_whether_one_healthy_learner_should_merge():
    """Learners 1 and 2 cut off, learner 3 healthy, no merges: a gap with quorum=1, excused with quorum=2."""
    events = training(80.0, absent={1: [(20.0, 55.0)], 2: [(20.0, 55.0)]}, syncer_down=[(20.0, 55.0)])
    history = history_for([partition(["learner-1", "learner-2"], 20.0, 25.0)], duration=80.0)
    assert check_progress(view(events, history), max_gap=20.0, quorum=1).status == FAIL
    assert check_progress(view(events, history), max_gap=20.0, quorum=2).status == PASS


def test_progress_is_not_excused_by_a_link_fault_or_a_failed_start():
    """Latency does not impair a learner, and a fault that failed to start was never in force."""
    events = training(80.0, syncer_down=[(20.0, 55.0)])
    fault = pause("syncer", 20.0, 25.0)
    failed = [begin(1), action(20.0, "start", 0, fault, ok=False, error="boom"), action(45.0, "stop", 0, fault)]
    assert check_progress(view(events, failed), max_gap=20.0).status == FAIL
    lat = history_for([latency(f"learner-{i}", 20.0, 25.0) for i in (1, 2, 3)], duration=80.0)
    assert check_progress(view(events, lat), max_gap=20.0).status == FAIL



def test_progress_allows_a_latency_on_every_learner_up_its_round_trips_and_no_more():
    """The only learner left (1 and 2 killed for good) under a 1.6 s latency each way: a
    merge costs it 3 round trips of 3.2 s more. A 9.6 s gap in that window passes; the same
    gap without the latency fails, and so does a gap past the allowance."""
    gone = {1: [(0.0, 200.0)], 2: [(0.0, 200.0)]}
    slow = training(80.0, learners=(1, 2, 3), absent={**gone, 3: [(30.0, 39.6)]})
    stalled = training(80.0, learners=(1, 2, 3), absent={**gone, 3: [(30.0, 60.0)]})
    kills = [kill("learner-1", 0.0, 1.0, restart=False), kill("learner-2", 0.0, 1.0, restart=False)]
    lat = {"kind": "latency", "at": 25.0, "duration": 20.0, "target": "learner-3", "latency_ms": 1600}
    with_latency = history_for(kills + [lat], duration=80.0)
    without = history_for(kills, duration=80.0)
    assert check_progress(view(slow, with_latency), max_gap=5.0).status == PASS
    assert check_progress(view(slow, without), max_gap=5.0).status == FAIL
    verdict = check_progress(view(stalled, with_latency), max_gap=5.0)
    assert verdict.status == FAIL
    # ... and the closing merge's own 0.01 s
    assert verdict.evidence["violations"][0]["allowed_with_latency"] == pytest.approx(5.0 + 3 * 3.2 + 0.01)

def _closing_merge_took(events: list[dict], t: float, seconds: float) -> list[dict]:
    """The events with the merge at `t` taking `seconds` (its write and sync) instead of 0.01."""
    return [{**e, "seconds": seconds} if e["kind"] == "merge" and e["t"] == T0 + t else e for e in events]


def test_progress_allows_a_stretch_its_closing_merges_own_time_and_no_more():
    """A merge whose fragment file took 2.5 s to write and sync (a disk stalled by a loaded
    machine) closes a 7 s stretch against a 5 s allowance: its own time is the disk's pace,
    and passes. The same stretch closed by a fast merge fails, and so does a syncer frozen
    for 20 s in the middle of a merge: a merge's time counts at most one allowance more."""
    gap = training(80.0, syncer_down=[(20.0, 25.5)])  # merges at 19 s, then 26 s
    assert check_progress(view(gap), max_gap=5.0).status == FAIL, "the control: a fast closing merge"
    assert check_progress(view(_closing_merge_took(gap, 26.0, 2.5)), max_gap=5.0).status == PASS
    frozen = _closing_merge_took(training(80.0, syncer_down=[(20.0, 40.5)]), 41.0, 21.0)
    verdict = check_progress(view(frozen), max_gap=5.0)
    assert verdict.status == FAIL, verdict.evidence
    assert verdict.evidence["violations"][0]["closing_merge_seconds"] == 5.0


def test_progress_ignores_the_start_up_recovery():
    """The first `recovery` seconds after `begin` are not judged: a first merge at 25 s is fine, at 35 s not."""
    assert check_progress(view(training(60.0, start=25.0)), max_gap=20.0, recovery=10.0).status == PASS
    assert check_progress(view(training(60.0, start=35.0)), max_gap=20.0, recovery=10.0).status == FAIL


def test_progress_fails_when_merges_stop_but_learners_keep_stepping():
    """The last stretch runs to the end of the run (the last inner step), so a stall at the end is caught."""
    events = training(30.0) + [inner_step(float(t), 1, 100 + t) for t in range(31, 70)]
    verdict = check_progress(view(events), max_gap=20.0)
    assert verdict.status == FAIL
    assert verdict.evidence["violations"][-1]["to"] == 69.0


def test_progress_counts_sync_steps():
    """Sync mode has no merges: its all-reduce rounds are progress."""
    events = [ev(float(t), "sync_step", round=t, contributors=[1, 2], tokens=1024, seconds=0.01)
              for t in range(0, 61)]
    events += [inner_step(float(t) - 0.1, i, t) for t in range(0, 61) for i in (1, 2)]
    verdict = check_progress(view(events))
    assert verdict.status == PASS
    assert verdict.evidence["progress_events"] == 61


# --------------------------------------------------------------------------- self_heal


def test_self_heal_passes_when_a_killed_learner_contributes_soon_after_the_stop():
    """learner-1 killed 20..30 s contributes to a merge at 32 s: pass, 2 s after the heal."""
    events = training(80.0, absent={1: [(20.0, 32.0)]})
    verdict = check_self_heal(view(events, history_for([kill("learner-1", 20.0, 10.0)], duration=80.0)))
    assert verdict.status == PASS
    # The allowance on this run's clock: a cold start (20 s, none measured), a reconnect (a lease
    # and a backoff: 3 s), the late-merge wait (3 s) and 3 rounds of 2 s.
    assert verdict.evidence["healings"] == [{"fault": 0, "kind": "kill", "learner": 1, "healed_at": 30.0,
                                             "within": 32.0, "contributed_after": 2.0}]


def test_self_heal_fails_naming_a_learner_that_never_contributes_again():
    """learner-1 killed 20..30 s never contributes again in an 80 s run: fail, naming learner and fault."""
    events = training(80.0, absent={1: [(20.0, 1000.0)]})
    verdict = check_self_heal(view(events, history_for([kill("learner-1", 20.0, 10.0)], duration=80.0)))
    assert verdict.status == FAIL
    assert verdict.evidence["failed"] == [{"fault": 0, "kind": "kill", "learner": 1, "healed_at": 30.0,
                                           "within": 32.0, "contributed_after": None}]
    assert "learner-1 after kill: never" in verdict.detail


def test_self_heal_fails_when_the_contribution_comes_too_late():
    """Back 45 s after the heal with within=30: fail, with the real delay in the evidence."""
    events = training(100.0, absent={1: [(20.0, 75.0)]})
    verdict = check_self_heal(view(events, history_for([kill("learner-1", 20.0, 10.0)], duration=100.0)),
                              within=30.0)
    assert verdict.status == FAIL
    assert verdict.evidence["failed"][0]["contributed_after"] == 45.0


def test_self_heal_is_unknown_when_the_heal_is_too_close_to_the_end():
    """Healed at 70 s of an 80 s run and not back yet: not enough run left to judge."""
    events = training(80.0, absent={1: [(50.0, 1000.0)]})
    verdict = check_self_heal(view(events, history_for([kill("learner-1", 50.0, 20.0)], duration=80.0)))
    assert verdict.status == UNKNOWN
    assert verdict.evidence["healings"][0]["status"] == "run ended too soon"


def test_self_heal_counts_a_syncer_fault_for_every_learner():
    """After a syncer pause every learner must contribute again: learner-3, never back, is named."""
    events = training(80.0, syncer_down=[(20.0, 31.0)], absent={3: [(20.0, 1000.0)]})
    verdict = check_self_heal(view(events, history_for([pause("syncer", 20.0, 10.0)], duration=80.0)))
    assert verdict.status == FAIL
    assert [r["learner"] for r in verdict.evidence["failed"]] == [3]
    assert [r["learner"] for r in verdict.evidence["healings"]] == [1, 2, 3]


def test_self_heal_does_not_expect_a_learner_still_down_for_another_fault():
    """learner-2 killed at 2 s without a restart (down until the final heal at 40 s) is not
    expected back when a syncer pause ends at 7 s: its own kill is judged from 40 s."""
    faults = [kill("learner-2", 2.0, 1.0, restart=False), pause("syncer", 3.0, 4.0)]
    events = training(80.0, syncer_down=[(3.0, 7.5)], absent={2: [(2.0, 44.0)]})
    verdict = check_self_heal(view(events, history_for(faults, duration=40.0)))
    assert verdict.status == PASS, verdict.evidence.get("failed")
    after_pause = [r for r in verdict.evidence["healings"] if r["fault"] == 1 and r["learner"] == 2]
    assert after_pause and after_pause[0]["extended_by_faults"] == [0]


def test_self_heal_moves_the_deadline_to_a_fault_that_starts_inside_a_process_exits_allowance():
    """A syncer pause ends at 22 s (allowed until 30 s) while the syncer, which exited on its own
    at 20 s, is restarted at 25 s (allowed until 33 s); a syncer kill at 31 s then starts inside
    the time, so learner-2, down until 40 s, is judged against the kill's deadline (42 s), though
    the exit comes after the kill among the windows. learner-2 back only at 50 s still fails."""
    faults = [pause("syncer", 17.0, 5.0), kill("syncer", 31.0, 3.0)]
    exited = [ev(20.0, "exit", process="supervisor", target="syncer", exit_code=75, restart=True),
              ev(25.0, "restart", process="supervisor", target="syncer", exit_code=75)]

    def healings(back: float) -> tuple[str, list[dict]]:
        events = training(80.0, syncer_down=[(17.0, 25.5), (31.0, 34.5)], absent={2: [(17.0, back)]}) + exited
        verdict = check_self_heal(view(events, history_for(faults, duration=80.0)), within=8.0)
        return verdict.status, [r for r in verdict.evidence["healings"] if r["learner"] == 2 and r["fault"] == 0]

    status, rows = healings(40.0)
    assert status == PASS, rows
    assert rows[0]["within"] == 20.0 and set(rows[0]["extended_by_faults"]) == {1, None}, rows
    status, rows = healings(50.0)
    assert status == FAIL and rows[0]["contributed_after"] == 28.0, rows


def test_self_heal_checks_every_partitioned_learner_and_rank_targets():
    """A partition of two learners and a pause of one rank are judged per learner (rank -> its learner)."""
    faults = [partition(["learner-1", "learner-2"], 10.0, 5.0), pause("learner-3/rank-0", 30.0, 5.0)]
    events = training(80.0, absent={1: [(10.0, 16.0)], 2: [(10.0, 18.0)], 3: [(30.0, 36.0)]})
    verdict = check_self_heal(view(events, history_for(faults, duration=80.0)))
    assert verdict.status == PASS
    rows = {(r["fault"], r["learner"]): r["contributed_after"] for r in verdict.evidence["healings"]}
    assert rows == {(0, 1): 1.0, (0, 2): 3.0, (1, 3): 1.0}
    assert "slowest contribution 3.0s" in verdict.detail


def test_self_heal_passes_when_no_learner_was_impaired():
    """Link faults do not impair: with only a latency fault there is nothing to heal."""
    verdict = check_self_heal(view(training(), history_for([latency("learner-1", 10.0, 5.0)])))
    assert verdict.status == PASS
    assert verdict.evidence["healings"] == []


def test_self_heal_counts_sync_step_contributors():
    """In sync mode a learner's contribution is its id in a sync step's contributors."""
    events = [ev(float(t), "sync_step", round=t, contributors=[1, 2] if not 20 <= t < 33 else [2], tokens=1024,
                 seconds=0.01) for t in range(0, 81)]
    events += [inner_step(float(t) - 0.1, i, t) for t in range(0, 81) for i in (1, 2)]
    verdict = check_self_heal(view(events, history_for([kill("learner-1", 20.0, 10.0)], duration=80.0)))
    assert verdict.status == PASS
    assert verdict.evidence["healings"][0]["contributed_after"] == 3.0


def test_self_heal_does_not_count_pushes_made_before_a_syncer_kill():
    """Syncer killed 20..30 s; at 30.5 s it merges the pushes pending from before the kill (learner-3's at 19.9 s).
    learner-3 then never pushes again, so it did not self-heal."""
    events = training(80.0, syncer_down=[(19.5, 31.0)], absent={3: [(19.5, 1000.0)]})
    events += [push(19.9, 3, 50, fragment=1), ev(19.9, "push_accepted", process="syncer", learner=3, incarnation=1,
                                                seq=50, id=push_id(3, 50), fragment=1),
               merge(30.5, 1, 99, [contributor(1, 500), contributor(2, 500), contributor(3, 50)])]
    verdict = check_self_heal(view(events, history_for([kill("syncer", 20.0, 10.0)], duration=80.0)))
    assert verdict.status == FAIL
    assert [r["learner"] for r in verdict.evidence["failed"]] == [3]


# --------------------------------------------------------------------------- rejoined


def test_rejoined_passes_when_every_learner_contributes_after_the_faults():
    """Everyone contributes up to the end: pass, under the name `rejoined`."""
    events = training(62.0, absent={1: [(20.0, 32.0)]})
    verdict = check_every_learner_contributes_at_end(view(events, history_for([kill("learner-1", 20.0, 10.0)])))
    assert verdict.name == "rejoined"
    assert verdict.status == PASS
    assert {k: verdict.evidence[k] for k in ("since", "learners", "missing")} == \
        {"since": 30.0, "learners": [1, 2, 3], "missing": []}  # the kill's stop


def test_rejoined_fails_naming_a_learner_gone_long_before_the_end():
    """learner-3, killed at 5 s, never came back in a 62 s run: fail, naming it."""
    events = training(62.0, absent={3: [(5.0, 1000.0)]})
    verdict = check_every_learner_contributes_at_end(view(events, history_for([kill("learner-3", 5.0, 3.0)])))
    assert verdict.status == FAIL
    assert "[3]" in verdict.detail


def test_rejoined_without_a_final_heal_measures_from_the_last_fault_stop():
    """No `end` heal (the controller was killed): the last fault's stop (50 s) is the reference."""
    faults = [pause("learner-2", 40.0, 10.0)]
    history = [begin(1), action(40.0, "start", 0, faults[0]), action(50.0, "stop", 0, faults[0])]
    events = training(100.0, absent={2: [(15.0, 1000.0)]})
    verdict = check_every_learner_contributes_at_end(view(events, history))
    assert verdict.evidence["since"] == 50.0
    assert verdict.status == FAIL  # learner-2's last contribution, at 14 s, is before the fault's stop
    events = training(100.0, absent={2: [(15.0, 52.0)]})
    assert check_every_learner_contributes_at_end(view(events, history)).status == PASS  # back at 52 s


def test_rejoined_does_not_count_contributions_from_before_the_learner_was_killed():
    """learner-2 killed for good at 30 s (restart=False), final heal at 50 s, run over at 51 s: it never rejoined."""
    events = training(51.0, absent={2: [(30.0, 1000.0)]})
    history = history_for([kill("learner-2", 30.0, 5.0, restart=False)], duration=50.0)
    verdict = check_every_learner_contributes_at_end(view(events, history))
    assert verdict.status != PASS, verdict.detail


# --------------------------------------------------------------------------- no_lost_acks


def test_no_lost_acks_passes_when_every_acked_push_is_in_the_ledger():
    """Every `push` answered `accepted` appears in the final state's applied ledger."""
    events = training(30.0)
    events.append(final_state(31.0, ledger(events)))
    verdict = check_no_lost_acks(view(events))
    assert verdict.status == PASS
    assert verdict.evidence["lost"] == []
    assert verdict.evidence["acked"] == verdict.evidence["applied"] == 93


def test_no_lost_acks_fails_naming_an_acked_push_missing_from_the_ledger():
    """An acknowledged push that no fragment's ledger holds is lost: fail, naming its id."""
    events = training(10.0)
    applied = ledger(events)
    applied["1"].remove("2:1:4")
    events.append(final_state(11.0, applied))
    verdict = check_no_lost_acks(view(events))
    assert verdict.status == FAIL
    assert verdict.evidence["lost"] == ["2:1:4"]


def test_no_lost_acks_ignores_pushes_that_were_not_acknowledged():
    """Refused and stale pushes were never promised: missing from the ledger is fine."""
    events = [push(1.0, 1, 1), push(2.0, 1, 2, status="stale"),
              ev(3.0, "push", learner=1, fragment=0, seq=3, status="refused", reason="protocol", detail="x",
                 wire_bytes=10, id="1:1:3", incarnation=1),
              merge(4.0, 0, 1, [contributor(1, 1)]), final_state(5.0, {"0": ["1:1:1"]})]
    assert check_no_lost_acks(view(events)).status == PASS


def test_no_lost_acks_is_unknown_without_a_final_state_or_a_state_dir():
    """The syncer did not stop cleanly and there are no state files to read: unknown."""
    events = training(10.0)
    assert check_no_lost_acks(view(events)).status == UNKNOWN
    assert check_no_lost_acks(RunView(events, history_for([]), state_dir=None)).status == UNKNOWN


def test_in_sync_mode_only_finite_is_required_and_the_rest_say_why_not():
    """Sync mode acknowledges no push, merges none and has no versions: those checks have
    nothing to judge there, say so, and are not required; `finite` is."""
    events = [ev(-1.0, "process_start", role="syncer", mode="sync")]
    events += [ev(float(t), "sync_step", round=t, contributors=[1, 2], tokens=1024, seconds=0.01) for t in range(20)]
    events += [inner_step(float(t) - 0.5, i, t) for t in range(20) for i in (1, 2)] + [final_state(21.0, None)]
    verdicts = {v.name: v for v in run_checkers(view(events))}
    for name in ("no_lost_acks", "no_double_apply", "push_window", "monotonic_versions"):
        assert verdicts[name].status == NOT_APPLICABLE and "not applicable in sync mode" in verdicts[name].detail
    assert verdicts["finite"].status == PASS
    document = verdict_document(list(verdicts.values()))
    assert document["required"] == ["finite"]
    # timeline: every event on one clock, nothing to place
    assert document["not_applicable"] == ["timeline", "no_lost_acks", "no_double_apply", "push_window",
                                          "monotonic_versions"]


def test_no_lost_acks_counts_a_duplicate_answer_as_an_acknowledgement():
    """The first reply to 1:1:5 was lost; the retry was answered `duplicate`; the ledger never got it."""
    events = [ev(1.0, "push_accepted", process="syncer", learner=1, incarnation=1, seq=5, id="1:1:5", fragment=0),
              push(2.0, 1, 5, status="duplicate"), merge(3.0, 0, 1, [contributor(2, 1)]),
              final_state(4.0, {"0": ["2:1:1"]})]
    verdict = check_no_lost_acks(view(events))
    assert verdict.status == FAIL
    assert verdict.evidence["lost"] == ["1:1:5"]


# --------------------------------------------------------------------------- no_double_apply


def test_no_double_apply_passes_when_each_push_is_merged_once():
    """Distinct ids across merges and a ledger without repeats: pass."""
    events = training(20.0)
    events.append(final_state(21.0, ledger(events)))
    verdict = check_no_double_apply(view(events))
    assert verdict.status == PASS
    assert verdict.evidence == {"merged": 63}


def test_no_double_apply_fails_naming_a_push_merged_twice():
    """The same push id in two merges: fail, naming the id and both times."""
    events = [merge(5.0, 0, 1, [contributor(1, 1), contributor(2, 1)]),
              merge(9.0, 0, 2, [contributor(2, 1), contributor(1, 2)])]
    verdict = check_no_double_apply(view(events))
    assert verdict.status == FAIL
    assert verdict.evidence["doubles"] == [{"id": "2:1:1", "first": 5.0, "again": 9.0}]


def test_no_double_apply_fails_on_duplicates_in_the_final_ledger():
    """A ledger listing an id twice (e.g. replayed after a restart) fails, naming the fragment."""
    events = [merge(5.0, 1, 1, [contributor(1, 1)]), final_state(6.0, {"0": [], "1": ["1:1:1", "1:1:1"]})]
    verdict = check_no_double_apply(view(events))
    assert verdict.status == FAIL
    assert verdict.evidence["doubles"] == [{"fragment": "1", "ledger_duplicates": 1}]


def test_no_double_apply_tells_incarnations_apart():
    """seq 1 of incarnation 1 and seq 1 of incarnation 2 (a restarted learner) are different pushes."""
    events = [merge(5.0, 0, 1, [contributor(1, 1, incarnation=1)]),
              merge(9.0, 0, 2, [contributor(1, 1, incarnation=2)])]
    assert check_no_double_apply(view(events)).status == PASS


# --------------------------------------------------------------------------- push_window


def learner_start(t: float, learner: int, window: int = 1) -> dict:
    return ev(t, "process_start", learner=learner, role="learner", mode="decoupled", push_window=window,
              incarnation=1)


def made_on(event: dict, base_version: int, **fields) -> dict:
    """A learner's `push` event for a push made while it held `base_version`."""
    return {**event, "base_version": base_version, **fields}


def test_push_window_passes_when_each_push_waits_for_the_version_holding_the_last():
    events = [learner_start(0.0, 1),
              made_on(push(1.0, 1, 1), 0), merge(1.5, 0, 1, [contributor(1, 1)]), apply(1.6, 1, 0, 1),
              made_on(push(2.0, 1, 2), 1), merge(2.5, 0, 2, [contributor(1, 2, base_version=1, version=2)])]
    verdict = check_push_window(view(events))
    assert verdict.status == PASS and verdict.evidence["judged"] == 2


def test_push_window_fails_a_push_made_while_the_last_one_was_still_pending():
    """A duplicate answer naming the current version released push 1 while it was pending:
    push 2 was made on version 0, and push 1 was merged only in version 1."""
    events = [learner_start(0.0, 1),
              made_on(push(1.0, 1, 1, status="duplicate"), 0),
              made_on(push(2.0, 1, 2), 0),
              merge(2.5, 0, 1, [contributor(1, 1), contributor(1, 2)])]
    verdict = check_push_window(view(events))
    assert verdict.status == FAIL
    early = verdict.evidence["early"][0]
    assert early["id"] == "1:1:2" and early["out"] == [{"id": "1:1:1", "status": "duplicate", "merged_in": 1}]


def test_push_window_allows_as_many_pushes_out_as_the_window():
    events = [learner_start(0.0, 1, window=2),
              made_on(push(1.0, 1, 1), 0), made_on(push(2.0, 1, 2), 0),
              merge(2.5, 0, 1, [contributor(1, 1), contributor(1, 2)])]
    assert check_push_window(view(events)).status == PASS
    events.insert(3, made_on(push(2.2, 1, 3), 0))  # a third on version 0: two out, window 2
    assert check_push_window(view(events + [merge(3.0, 0, 2, [contributor(1, 3)])])).status == FAIL


def test_push_window_exempts_the_residual_push_and_a_fragment_after_a_rollback():
    pending_first = [learner_start(0.0, 1), made_on(push(1.0, 1, 1), 0)]
    residual = made_on(push(2.0, 1, 2), 0, residual=True)  # a clean stop pushes what is left, whatever is out
    merged = merge(2.5, 0, 1, [contributor(1, 1), contributor(1, 2)])
    assert check_push_window(view(pending_first + [residual, merged])).status == PASS
    rollback = ev(1.5, "syncer_rollback", learner=1, fragment=0, held=3, syncer_version=0, incarnation=1)
    after = made_on(push(2.0, 1, 2), 0)
    assert check_push_window(view(pending_first + [after, merged])).status == FAIL
    assert check_push_window(view(pending_first + [rollback, after, merged])).status == PASS


def test_push_window_is_not_applicable_when_no_learner_said_its_window():
    events = [made_on(push(1.0, 1, 1), 0), made_on(push(2.0, 1, 2), 0), merge(2.5, 0, 1, [contributor(1, 1)])]
    assert check_push_window(view(events)).status == NOT_APPLICABLE


def accepted(t: float, learner: int, seq: int, position: int, incarnation: int = 1, fragment: int = 0) -> dict:
    """The syncer's `push_accepted`, with the data position the push claimed."""
    return ev(t, "push_accepted", learner=learner, incarnation=incarnation, seq=seq,
              id=push_id(learner, seq, incarnation), fragment=fragment, base_version=0, version=1, tokens=2048,
              steps=4, position=position)


def test_no_double_apply_fails_on_one_progress_merged_under_two_ids():
    """A learner that sends a push again under a new seq (its answer lost): two ids, one
    position, both merged. The ids differ, so only the claimed position shows it."""
    retried = 1 + (1 << 32)
    events = [accepted(4.0, 1, 1, position=40), merge(5.0, 0, 1, [contributor(1, 1)]),
              accepted(6.0, 1, retried, position=40), merge(7.0, 0, 2, [contributor(1, retried)]),
              accepted(8.0, 1, 2, position=80), merge(9.0, 0, 3, [contributor(1, 2)])]
    verdict = check_no_double_apply(view(events))
    assert verdict.status == FAIL
    assert verdict.evidence["doubles"] == [{"id": f"1:1:{retried}", "same_progress_as": "1:1:1", "learner": 1,
                                            "fragment": 0, "position": 40, "again": 7.0}]


def test_no_double_apply_lets_fragments_and_incarnations_share_a_position():
    """Fragments pushed at one step share its position, and a learner started again trains
    from where the syncer last heard of it: new work, not a double."""
    events = [accepted(4.0, 1, 1, position=40, fragment=0), accepted(4.0, 1, 2, position=40, fragment=1),
              merge(5.0, 0, 1, [contributor(1, 1)]), merge(5.0, 1, 1, [contributor(1, 2)]),
              accepted(6.0, 1, 1, position=40, incarnation=2), merge(7.0, 0, 2, [contributor(1, 1, incarnation=2)])]
    assert check_no_double_apply(view(events)).status == PASS


# --------------------------------------------------------------------------- monotonic_versions


def test_monotonic_versions_passes_when_each_fragment_rises_on_its_own():
    """Fragments have independent version counters; learners' applies only rise."""
    events = training(20.0) + [apply(3.0, 1, 0, 1), apply(6.0, 1, 0, 2), apply(6.5, 1, 0, 2), apply(7.0, 1, 1, 3)]
    verdict = check_monotonic_versions(view(events))
    assert verdict.status == PASS
    assert verdict.evidence["final_versions"] == {0: 11, 1: 10}
    assert verdict.detail.startswith("fragments 0-1 reached versions 11, 10, never going back")


def test_monotonic_versions_says_in_words_how_far_each_fragment_got():
    """Information, not a dict dump: `versions only rose: {0: 15}` read as noise."""
    one = check_monotonic_versions(view(training(14.0, fragments=1)))
    assert one.detail.startswith("fragment 0 reached version 15, never going back")
    assert "{" not in one.detail


def test_monotonic_versions_fails_when_a_merge_repeats_a_version():
    """A syncer restarted from stale state merges version 3 of fragment 0 again: fail, naming it."""
    events = [merge(1.0, 0, 1, []), merge(2.0, 0, 2, []), merge(3.0, 0, 3, []), merge(4.0, 1, 1, []),
              merge(9.0, 0, 3, [])]
    verdict = check_monotonic_versions(view(events))
    assert verdict.status == FAIL
    assert verdict.evidence["backwards"] == [{"fragment": 0, "version": 3, "after": 3, "at": 9.0}]


def test_monotonic_versions_fails_when_a_merge_goes_back():
    """Version 2 after version 5 of fragment 1: fail."""
    events = [merge(1.0, 1, 5, []), merge(2.0, 1, 2, [])]
    verdict = check_monotonic_versions(view(events))
    assert verdict.status == FAIL
    assert verdict.evidence["backwards"][0]["version"] == 2


def test_monotonic_versions_fails_when_a_learner_adopts_an_older_version():
    """learner-2 adopts version 4 then version 3 of fragment 1 in one incarnation: fail, naming the learner."""
    events = [merge(1.0, 1, 4, []), apply(2.0, 2, 1, 4), apply(3.0, 2, 1, 3)]
    verdict = check_monotonic_versions(view(events))
    assert verdict.status == FAIL
    assert verdict.evidence["backwards"] == [{"learner": 2, "fragment": 1, "version": 3, "after": 4, "at": 3.0}]


def test_monotonic_versions_resets_per_incarnation_and_ignores_sync_resyncs():
    """A restarted learner may adopt an older version than its previous life; sync resyncs have no fragment."""
    events = [merge(1.0, 0, 4, []), apply(2.0, 2, 0, 4, incarnation=1), apply(3.0, 2, 0, 2, incarnation=2),
              apply(4.0, 1, None, 9), apply(5.0, 1, None, 1)]
    assert check_monotonic_versions(view(events)).status == PASS


# --------------------------------------------------------------------------- finite


def test_finite_passes_on_a_healthy_run():
    events = training(10.0) + [final_state(11.0, {"0": []})]
    verdict = check_finite(view(events))
    assert verdict.status == PASS
    assert verdict.evidence == {"nonfinite_merges": [], "nonfinite_losses": [], "final_finite": True}


def test_finite_fails_on_a_non_finite_merge():
    """A merge that produced NaN global parameters: fail, with its time."""
    events = [merge(4.0, 0, 1, [contributor(1, 1)], finite=False)]
    verdict = check_finite(view(events))
    assert verdict.status == FAIL
    assert verdict.evidence["nonfinite_merges"] == [4.0]


def test_finite_fails_on_a_non_finite_final_state():
    events = [merge(4.0, 0, 1, [contributor(1, 1)]), final_state(5.0, {"0": ["1:1:1"]}, finite=False)]
    verdict = check_finite(view(events))
    assert verdict.status == FAIL
    assert verdict.evidence["final_finite"] is False


def test_task_healthy_passes_without_task_errors_and_fails_naming_learner_and_error():
    from chaos.checkers import check_task_healthy
    assert check_task_healthy(view(training(10.0))).status == PASS
    error = "task /t.py:task: task.loss returned nan at step 31"
    events = training(10.0) + [ev(4.0, "task_error", "learner-2", 2, method="loss", error=error),
                               ev(7.0, "task_error", "learner-2", 2, method="loss", error=error)]
    verdict = check_task_healthy(view(events))
    assert verdict.status == FAIL
    assert "2 time(s) on learner(s) 2" in verdict.detail and error in verdict.detail
    assert "logs/learner-2.log" in verdict.detail
    assert [e["method"] for e in verdict.evidence["task_errors"]] == ["loss", "loss"]


@pytest.mark.parametrize("loss", ["nan", "inf", "-inf", float("nan"), float("inf")])
def test_finite_fails_on_a_non_finite_loss_naming_the_learner(loss):
    """EventLog writes NaN/Inf as strings; either form of a non-finite loss fails, naming learner and time."""
    events = [inner_step(1.0, 1, 1, 3.0), inner_step(2.0, 3, 1, loss)]
    verdict = check_finite(view(events))
    assert verdict.status == FAIL
    assert verdict.evidence["nonfinite_losses"] == [(3, 2.0)]


def test_finite_accepts_a_sync_mode_final_state():
    """The sync-mode final state has no `finite` field: it is not taken as a failure."""
    events = [inner_step(1.0, 1, 1, 2.5), final_state(2.0, None)]
    assert check_finite(view(events)).status == PASS


# --------------------------------------------------------------------------- converged


def _converged_run(drift: dict[int, float | str] | None = None, adopted: dict[int, dict[int, int]] | None = None):
    """40 s of training; each learner stops cleanly at 41 s holding `adopted` versions (default: the latest)."""
    events = training(40.0)
    latest = latest_versions(events, 41.0)
    for i in (1, 2, 3):
        versions = {**latest, **(adopted or {}).get(i, {})}
        d = (drift or {}).get(i, 0.01)
        events.append(final_params(41.0, i, [(f, v, d) for f, v in sorted(versions.items())]))
    return events


def test_converged_is_unknown_without_merges():
    """Sync mode (or nothing merged): nothing to converge to."""
    events = [inner_step(1.0, 1, 1), final_params(2.0, 1, [(0, 0, 0.0)])]
    assert check_converged(view(events)).status == UNKNOWN


def test_converged_passes_when_every_learner_holds_a_recent_version():
    """Each learner's final parameters are close to the latest global version: pass."""
    verdict = check_converged(view(_converged_run()))
    assert verdict.status == PASS
    assert len(verdict.evidence["learners"]) == 6
    assert all(r["behind_seconds"] == 0.0 for r in verdict.evidence["learners"])
    assert "each held the newest version of every fragment at its stop" in verdict.detail
    assert "superseded for at most 0.0s" not in verdict.detail


def test_converged_fails_naming_a_learner_that_drifted():
    """learner-2's parameters are 0.9 (relative L2) from its global version: fail, naming it."""
    verdict = check_converged(view(_converged_run(drift={2: 0.9})), tolerance=0.5)
    assert verdict.status == FAIL
    assert {r["learner"] for r in verdict.evidence["learners"] if r["drift"] > 0.5} == {2}
    assert "2 learner fragment(s)" in verdict.detail


def test_converged_fails_naming_a_learner_that_stopped_adopting():
    """learner-3 holds version 5 of fragment 0 although version 6 was merged at 10 s: ~31 s behind, fail."""
    verdict = check_converged(view(_converged_run(adopted={3: {0: 5}})), max_behind=10.0)
    assert verdict.status == FAIL
    bad = [r for r in verdict.evidence["learners"] if r["behind_seconds"] > 10.0]
    assert [(r["learner"], r["fragment"], r["version"]) for r in bad] == [(3, 0, 5)]
    assert bad[0]["behind_seconds"] == pytest.approx(31.0)


def test_converged_allows_a_version_superseded_only_recently():
    """A version superseded 1 s before the stop is within max_behind; merges after the stop do not count."""
    events = _converged_run()
    latest = latest_versions(events, 41.0)
    events += [merge(50.0, 0, latest[0] + 1, [contributor(1, 900)])]
    events = [e for e in events if not (e["kind"] == "final_params" and e["learner"] == 1)]
    events.append(final_params(41.0, 1, [(0, latest[0] - 1, 0.1), (1, latest[1], 0.1)]))
    verdict = check_converged(view(events), max_behind=10.0)
    assert verdict.status == PASS, verdict.evidence
    row = next(r for r in verdict.evidence["learners"] if r["learner"] == 1 and r["fragment"] == 0)
    assert row["behind_seconds"] == pytest.approx(1.0)


def test_converged_is_unknown_when_a_learner_did_not_stop_cleanly():
    """A learner with no `final_params` cannot be judged: unknown (unless another learner already fails)."""
    events = [e for e in _converged_run() if not (e["kind"] == "final_params" and e["learner"] == 2)]
    verdict = check_converged(view(events))
    assert verdict.status == UNKNOWN
    assert {"learner": 2, "status": "no clean stop"} in verdict.evidence["learners"]
    events = [e for e in _converged_run(drift={1: 0.9}) if not (e["kind"] == "final_params" and e["learner"] == 2)]
    assert check_converged(view(events)).status == FAIL


def test_converged_fails_on_a_nan_float_drift():
    """An in-memory NaN drift is not <= tolerance: fail."""
    assert check_converged(view(_converged_run(drift={1: math.nan}))).status == FAIL


def test_converged_fails_on_a_nan_drift_as_written_to_the_event_log():
    """A learner whose parameters went NaN reports drift "nan" in its JSONL: the check must fail, not crash."""
    events = json.loads(json.dumps(_converged_run(drift={1: "nan"})))
    assert check_converged(view(events)).status == FAIL


def _streamed_params(t: float, learner: int, rows: list[tuple[int, int, float, float]]) -> dict:
    """`final_params` of a learner that reports absolute numbers: rows of (fragment, version, diff, norm)."""
    def drift(d, n):
        return float(d) / float(n) if float(n) > 0 else float(d)
    return ev(t, "final_params", learner=learner, incarnation=1,
              fragments=[{"fragment": f, "version": v, "drift": drift(d, n), "diff": d, "norm": n}
                         for f, v, d, n in rows])


# The global fragment norms of a P=4 run (tests/properties, --chaos-streaming, after 4 syncer
# kills): the embedding (0), the projections (1, 3) and the LayerNorm gains with the biases (2).
STREAMED_NORMS = {0: 25.24, 1: 4.89, 2: 13.81, 3: 6.87}


def _streamed_run(drifts: dict[int, dict[int, float]], adopted: dict[int, dict[int, int]] | None = None):
    """_converged_run with P=4 and absolute numbers: learner -> {fragment: relative drift}."""
    events = training(40.0, fragments=4)
    latest = latest_versions(events, 41.0)
    for i in (1, 2, 3):
        versions = {**latest, **(adopted or {}).get(i, {})}
        d = drifts.get(i, {})
        events.append(_streamed_params(41.0, i, [(f, versions[f], d.get(f, 0.01) * STREAMED_NORMS[f],
                                                  STREAMED_NORMS[f]) for f in range(4)]))
    return events


def test_converged_judges_the_whole_model_when_fragments_report_diff_and_norm():
    """From a real P=4 run: learner-3's small-norm fragment 3 drifted 0.698 of its own norm within a
    few rounds, but the model only 0.169 of its norm (P=1 would have seen that): pass. Per-fragment
    drift alone would have failed it."""
    drifts = {3: {0: 0.032, 1: 0.181, 2: 0.082, 3: 0.698}, 2: {0: 0.401, 1: 0.034, 2: 0.066, 3: 0.462}}
    events = _streamed_run(drifts)
    verdict = check_converged(view(events), tolerance=0.5)
    assert verdict.status == PASS, verdict.evidence
    assert verdict.evidence["model_drift"][3] == pytest.approx(0.169, abs=0.001)
    assert verdict.evidence["model_drift"][2] == pytest.approx(0.355, abs=0.001)
    assert max(r["drift"] for r in verdict.evidence["learners"]) == pytest.approx(0.698)
    without_norms = json.loads(json.dumps(events))
    for e in without_norms:
        for row in e.get("fragments", []):
            row.pop("norm")
    assert check_converged(view(without_norms), tolerance=0.5).status == FAIL  # per fragment: 0.698 > 0.5


def test_converged_fails_a_model_that_drifted_and_names_it():
    """From the same runs: learner-1 had not adopted fragments 0 and 1 since a 26 s outage (22x and 4x
    their norms): the model is 18.8 of its norm away. Fail, naming the learner."""
    drifts = {1: {0: 22.323, 1: 3.99, 2: 0.021, 3: 0.047}}
    verdict = check_converged(view(_streamed_run(drifts)), tolerance=0.5, max_behind=1e9)
    assert verdict.status == FAIL
    assert verdict.evidence["failed"] == [{"learner": 1, "model_drift": pytest.approx(18.8, abs=0.1)}]
    assert "1 learner fragment(s) or model(s)" in verdict.detail


def test_converged_still_judges_how_long_each_fragment_was_superseded():
    """A small model drift does not excuse a fragment that stopped being adopted."""
    verdict = check_converged(view(_streamed_run({}, adopted={2: {1: 1}})), max_behind=10.0)
    assert verdict.status == FAIL
    assert [(r["learner"], r["fragment"]) for r in verdict.evidence["failed"]] == [(2, 1)]


def test_converged_model_drift_with_one_fragment_is_its_drift():
    """P=1: sqrt(diff²)/sqrt(norm²) is the fragment's own drift, so nothing changes."""
    for d in (0.3, 0.7):
        events = training(40.0)
        latest = latest_versions(events, 41.0)
        with_norms = [e for e in events if e["kind"] != "final_params"]
        with_norms += [_streamed_params(41.0, i, [(0, latest[0], d * 9.8, 9.8), (1, latest[1], d * 9.8, 9.8)])
                       for i in (1, 2, 3)]
        plain = [e for e in events if e["kind"] != "final_params"]
        plain += [final_params(41.0, i, [(0, latest[0], d), (1, latest[1], d)]) for i in (1, 2, 3)]
        a, b = check_converged(view(with_norms)), check_converged(view(plain))
        assert a.status == b.status == (PASS if d < 0.5 else FAIL)


def test_converged_model_drift_nan_fails_and_a_missing_norm_falls_back_to_fragments():
    events = json.loads(json.dumps(_streamed_run({})))
    nan = json.loads(json.dumps(events))
    nan[-1]["fragments"][2]["diff"] = "nan"  # as the event log writes it
    assert check_converged(view(nan)).status == FAIL
    partial = json.loads(json.dumps(events))
    del partial[-1]["fragments"][0]["norm"]
    verdict = check_converged(view(partial))
    assert verdict.status == PASS and 3 not in verdict.evidence["model_drift"]


# --------------------------------------------------------------------------- final_loss


def test_final_loss_is_unknown_without_an_evaluation():
    assert check_final_loss(view(training(10.0))).status == UNKNOWN


def test_final_loss_default_rule_is_unigram_entropy_minus_0_3():
    """Limit = unigram entropy - 0.3: 3.6 <= 3.7 passes, 3.8 fails; the last `eval` event counts."""
    passing = check_final_loss(view([evaluation(1.0, 3.9), evaluation(2.0, 3.6)]))
    assert passing.status == PASS
    assert passing.evidence["limit"] == pytest.approx(3.7)
    assert passing.evidence["loss_floor"] == 2.0
    failing = check_final_loss(view([evaluation(1.0, 3.6), evaluation(2.0, 3.8)]))
    assert failing.status == FAIL
    assert failing.evidence["final_loss"] == 3.8
    assert "unigram entropy" in failing.detail


def test_final_loss_threshold_and_reference():
    """An explicit threshold replaces the default; a reference run (plus margin) takes precedence over both."""
    v = view([evaluation(1.0, 3.0)])
    assert check_final_loss(v, threshold=3.0).status == PASS  # equal to the limit passes
    assert check_final_loss(v, threshold=2.9).status == FAIL
    assert check_final_loss(v, threshold=2.0, reference=2.95, margin=0.1).status == PASS
    verdict = check_final_loss(v, threshold=5.0, reference=2.5, margin=0.1)
    assert verdict.status == FAIL
    assert verdict.evidence["limit"] == pytest.approx(2.6)
    assert "reference" in verdict.evidence["rule"]


def test_final_loss_fails_on_a_nan_loss():
    """A NaN loss (written as the string "nan") is never below the limit."""
    verdict = check_final_loss(view([evaluation(1.0, "nan")]))
    assert verdict.status == FAIL
    assert "nan" in verdict.detail


def task_run(final: float, start: float = 1.657) -> list[dict]:
    """A user's task (no unigram entropy): the syncer scored Θ₀ at `start`, and the
    evaluator the final Θ at `final`."""
    return [ev(0.0, "process_start", process="syncer", role="syncer", config={"task": "conv.py:task"}),
            global_eval(0.5, 0, start, tokens=0.0, reason="start"),
            global_eval(9.0, 9, final, tokens=90000.0),
            ev(10.0, "eval", process="evaluator", final_loss=final, data="markov")]


def frozen(events: list[dict]) -> list[dict]:
    """The same run with a syncer that merges nothing (ISLANDS_SYNCER_DEFECT=merge_nothing):
    every merge event as before, each measured to have moved Θ by 0."""
    return [{**e, "moved": 0.0} if e["kind"] == "merge" else e for e in events]


def test_progress_and_rejoined_fail_a_syncer_that_merges_nothing():
    """Versions advance and every learner is listed as merged, but Θ never moves: progress
    fails (no merge moved Θ), and rejoined and self_heal find no learner back, saying that
    the merges moved nothing. The same run with its merges moving passes both."""
    faults = [kill("learner-1", 20.0, 10.0)]
    events = training(80.0, absent={1: [(20.0, 32.0)]})
    history = history_for(faults, duration=80.0)
    assert check_progress(view(events, history)).status == PASS
    assert check_every_learner_contributes_at_end(view(events, history)).status == PASS
    progress = check_progress(view(frozen(events), history))
    assert progress.status == FAIL and "not one moved Θ" in progress.detail
    rejoined = check_every_learner_contributes_at_end(view(frozen(events), history))
    assert rejoined.status == FAIL and "moved Θ by nothing" in rejoined.detail
    assert check_self_heal(view(frozen(events), history)).status == FAIL


def test_converged_fails_a_learner_that_never_adopts():
    """A learner that records each adoption (versions, apply events) but never copies Θ into
    its model (ISLANDS_LEARNER_DEFECT=never_adopt) is as far from Θ after adopting as before;
    its rule (mix, alpha 0) puts it on Θ. Its final drift (0.3) is under the 0.5 tolerance,
    so only the adoptions show it."""
    events = training(40.0)
    latest = latest_versions(events, 41.0)
    events += [final_params(41.0, i, [(f, v, 0.3 if i == 2 else 0.02) for f, v in sorted(latest.items())])
               for i in (1, 2, 3)]
    events += [{**apply(m["t"] + 0.05, c["learner"], m["fragment"], m["version"]), "adopt": "mix"}
               for m in [e for e in events if e["kind"] == "merge"] for c in m["contributors"]]
    events.sort(key=lambda e: e["t"])
    honest = [{**e, "drift_after": 0.0, "expected_drift": 0.0} if e["kind"] == "apply" else e for e in events]
    missed = [{**e, "drift_after": 0.3, "expected_drift": 0.0}
              if e["kind"] == "apply" and e["learner"] == 2 else e for e in honest]
    assert check_converged(view(honest)).status == PASS
    verdict = check_converged(view(missed))
    assert verdict.status == FAIL, verdict.detail
    assert "did not bring the learner onto the global version: learner-2" in verdict.detail
    assert {m["learner"] for m in verdict.evidence["missed_adoptions"]} == {2}


def test_final_loss_fails_a_model_that_learned_nothing():
    """Issue 26, finding 2: a task whose inner optimizer is SGD with lr 0 ended at its
    untrained 1.6570 and passed `final loss 1.6570 <= 1.6570`. It must beat the untrained
    model by the learning margin (0.25 nats/byte scaled by 1.657 / ln 256: 0.0747)."""
    verdict = check_final_loss(view(task_run(1.657)))
    assert verdict.status == FAIL, verdict.detail
    assert "learned nothing" in verdict.detail and "1.6570" in verdict.detail
    assert verdict.evidence["learning_margin"] == pytest.approx(0.25 * 1.657 / math.log(256), abs=1e-6)
    assert check_final_loss(view(task_run(1.657 - 0.07))).status == FAIL  # short of the margin
    passing = check_final_loss(view(task_run(1.2)))
    assert passing.status == PASS and "learning margin" in passing.evidence["rule"]


def test_final_loss_fails_a_model_that_learned_nothing_against_a_reference_that_did_not_either():
    """The fault-free reference of the same configuration does not learn either: it is
    refused (a reference counts only if it learned by the same rule), and the run fails."""
    from chaos.reference import ReferenceCurve

    frozen = ReferenceCurve("k", ((0.0, 1.657), (90000.0, 1.657)))
    verdict = check_final_loss(view(task_run(1.657)), reference=frozen)
    assert verdict.status == FAIL and "learned nothing" in verdict.detail
    learned = check_final_loss(view(task_run(1.0)), reference=frozen)
    assert learned.status == PASS
    assert "the reference learned nothing" in learned.evidence["reference_refused"]["why"]
    good = ReferenceCurve("k", ((0.0, 1.657), (90000.0, 0.9)))
    assert check_final_loss(view(task_run(1.657)), reference=good).status == FAIL  # learning comes first


# --------------------------------------------------------------------------- run_checkers / verdict_document


def healthy_chaos_run() -> RunView:
    """80 s, 3 learners, learner-1 killed 20..30 s and back at 32 s, everything cleanly stopped and evaluated."""
    events = training(80.0, absent={1: [(20.0, 32.0)]})
    events.append(final_state(81.0, ledger(events)))
    latest = latest_versions(events, 81.0)
    events += [final_params(81.0, i, [(f, v, 0.02) for f, v in sorted(latest.items())]) for i in (1, 2, 3)]
    events.append(evaluation(90.0, 3.2))
    events += [global_eval(float(t), t, 5.5 if t == 0 else 3.0 + 2.0 / t, reason="start" if t == 0 else "merge")
               for t in range(0, 81, 4)]
    return view(events, history_for([kill("learner-1", 20.0, 10.0)], duration=80.0))


def test_run_checkers_runs_every_checker_in_order_and_all_pass_on_a_healthy_run():
    """One verdict per registered checker, named like its key; a healthy faulted run passes them all."""
    verdicts = run_checkers(healthy_chaos_run())
    assert [v.name for v in verdicts] == list(CHECKERS)
    # timeline has nothing to place on one machine's clock
    assert {v.name: v.status for v in verdicts} == {name: NOT_APPLICABLE if name == "timeline" else PASS
                                                    for name in CHECKERS}


def test_run_checkers_passes_options_to_the_named_checker():
    """Options are keyed by checker name; an impossible max_gap makes progress fail; a bad option raises."""
    run = healthy_chaos_run()
    verdicts = {v.name: v for v in run_checkers(run, {"progress": {"max_gap": 0.1},
                                                      "final_loss": {"threshold": 1.0}})}
    assert verdicts["progress"].status == FAIL
    assert verdicts["final_loss"].status == FAIL
    assert verdicts["self_heal"].status == PASS
    with pytest.raises(TypeError):
        run_checkers(run, {"finite": {"no_such_option": 1}})


def test_verdict_document_passes_with_unknowns_but_not_with_a_failure():
    """Unknown in a check that is not required is listed but does not fail the run; any
    failure does. The document is plain JSON."""
    verdicts = [Verdict("a", PASS, "ok"), Verdict("b", UNKNOWN, "?", {"x": 1})]
    document = verdict_document(verdicts)
    assert document == {"passed": True, "failed": [], "unknown": ["b"], "required": [], "undecided": [],
                        "not_applicable": [],
                        "checks": [{"name": "a", "status": "pass", "detail": "ok", "evidence": {}},
                                   {"name": "b", "status": "unknown", "detail": "?", "evidence": {"x": 1}}]}
    document = verdict_document(verdicts + [Verdict("c", FAIL, "bad")])
    assert document["passed"] is False
    assert document["failed"] == ["c"]
    assert verdict_document([])["passed"] is True


def test_verdict_document_of_a_real_run_serialises_to_json():
    """Every checker's evidence survives json.dumps, as runner.evaluate_run writes verdict.json."""
    document = verdict_document(run_checkers(healthy_chaos_run()))
    assert json.loads(json.dumps(document))["passed"] is True


# --------------------------------------------------------------------------- required safety checks


def killed_at_the_end() -> list[dict]:
    """healthy_chaos_run's events as a syncer SIGKILLed at the very end leaves them: no final state."""
    return [e for e in healthy_chaos_run().events if e["kind"] != "final_state"]


@pytest.mark.parametrize("name", SAFETY_CHECKS)
def test_a_required_safety_check_left_unknown_fails_the_run(name: str):
    """Unknown is not pass for safety: the verdict fails and says which required check was undecided."""
    verdicts = [Verdict(n, UNKNOWN if n == name else PASS, "") for n in CHECKERS]
    document = verdict_document(verdicts)
    assert document["passed"] is False and document["failed"] == []
    assert document["required"] == list(SAFETY_CHECKS) and document["undecided"] == [name]
    assert not_passed(document) == [f"{name} (unknown, required)"]


def test_a_syncer_killed_at_the_end_without_its_state_fails_the_run():
    """The run used to pass with no_lost_acks unknown: nothing showed an ack was kept."""
    verdicts = run_checkers(view(killed_at_the_end(), healthy_chaos_run().history))
    by_name = {v.name: v.status for v in verdicts}
    assert by_name["no_lost_acks"] == UNKNOWN
    assert {n: s for n, s in by_name.items() if n != "no_lost_acks"} == {
        n: NOT_APPLICABLE if n == "timeline" else PASS for n in CHECKERS if n != "no_lost_acks"}
    assert verdict_document(verdicts)["passed"] is False


def write_state(root, applied: dict[str, list[str]], pending: dict[str, str] | None = None):
    """A syncer state dir as trainer/state.py writes it: each fragment's file with its ledger,
    and pending pushes (push id -> fragment). The checker reads them as plain files."""
    import torch

    from trainer.state import StateDir, save_tensors
    store, w = StateDir(root), torch.zeros(2)
    for frag, ids in applied.items():
        store.write_fragment(int(frag), {"w": w}, {"w": w.clone()}, len(ids), list(ids))
    for ident, frag in (pending or {}).items():
        learner, incarnation, seq = (int(x) for x in ident.split(":"))
        save_tensors(store.pending_path(int(frag), ident), {"w": w},
                     {"fragment": int(frag), "learner": learner, "incarnation": incarnation, "seq": seq,
                      "tokens": 2048, "steps": 4, "base_version": 0, "encoding": "fp32"})
    return root


def late_acks(events: list[dict]) -> list[dict]:
    """Two pushes acknowledged after the last merge (made on it): durable only in pending/."""
    def last(fragment: int) -> int:
        return max((e["version"] for e in events if e["kind"] == "merge" and e["fragment"] == fragment), default=0)
    return events + [made_on(push(80.5, 2, 900, fragment=0), last(0)), made_on(push(80.6, 3, 900, fragment=1), last(1))]


def test_a_syncer_sigkilled_at_the_end_is_judged_from_its_state_dir(tmp_path):
    """Merged pushes are in the fragments' ledgers, the last acknowledged ones in pending/:
    all accounted for, and the verdict says a restart would merge the pending ones."""
    events = late_acks(killed_at_the_end())
    state = write_state(tmp_path / "state", ledger(events), {"2:1:900": "0", "3:1:900": "1"})
    run = RunView(view(events).events, healthy_chaos_run().history, state_dir=state)
    verdict = check_no_lost_acks(run)
    assert verdict.status == PASS, verdict.detail
    assert "2 of them are still pending durably, which a restart would merge" in verdict.detail
    assert "the state dir" in verdict.evidence["source"]
    assert verdict.evidence["pending_durably"] == ["2:1:900", "3:1:900"]
    assert verdict_document(run_checkers(run))["passed"] is True


def test_an_acknowledged_push_missing_from_the_state_dir_fails(tmp_path):
    events = late_acks(killed_at_the_end())
    state = write_state(tmp_path / "state", ledger(events), {"2:1:900": "0"})
    verdict = check_no_lost_acks(RunView(view(events).events, [], state_dir=state))
    assert verdict.status == FAIL and verdict.evidence["lost"] == ["3:1:900"]
    assert "the state dir" in verdict.detail


def test_a_stale_final_state_of_an_earlier_incarnation_is_not_the_last_word(tmp_path):
    """The syncer stopped cleanly once, was started again and SIGKILLed at the end: the
    acks after its restart are judged from the state dir, not the old final state."""
    events = killed_at_the_end()
    early = [e for e in events if e["t"] <= T0 + 40.0]
    events += [final_state(40.05, ledger(early)), ev(40.1, "process_start", role="syncer", mode="decoupled")]
    assert check_no_lost_acks(view(events)).status == UNKNOWN
    state = write_state(tmp_path / "state", ledger(events))
    assert check_no_lost_acks(RunView(view(events).events, [], state_dir=state)).status == PASS


def quarantined(t: float, ident: str, reason: str = "nonfinite_merge") -> dict:
    """The syncer's `push_quarantined` (trainer/quarantine.py): an accepted push it cannot merge."""
    return ev(t, "push_quarantined", id=ident, fragment=0, learner=int(ident.split(":")[0].split("-")[0]),
              reason=reason, detail="merging it would make the global parameters non-finite", acknowledged=True)


def test_an_acknowledged_push_that_was_quarantined_was_never_applied():
    events = [push(1.0, 1, 5), quarantined(2.0, "1:1:5"), final_state(4.0, {"0": []})]
    verdict = check_no_lost_acks(view(events))
    assert verdict.status == FAIL
    assert "1:1:5 (nonfinite_merge)" in verdict.detail and verdict.evidence["quarantined"] == {"1:1:5": "nonfinite_merge"}


def test_a_pending_file_quarantined_at_recovery_is_named_by_its_file_name():
    """Recovery quarantines an unreadable pending file under its file name's id, 1-1-5."""
    events = [push(1.0, 1, 5), quarantined(2.0, "1-1-5", reason="bad_pending"), final_state(4.0, {"0": []})]
    verdict = check_no_lost_acks(view(events))
    assert verdict.status == FAIL and "1:1:5 (bad_pending)" in verdict.detail


def test_a_quarantine_the_syncer_was_killed_before_reporting_is_read_from_its_note(tmp_path):
    """The note and the move are durable before the event: a SIGKILL in between leaves no event."""
    events = [push(1.0, 1, 5), push(1.5, 2, 1), merge(2.0, 0, 1, [contributor(2, 1)])]
    state = write_state(tmp_path / "state", {"0": ["2:1:1"]})
    (state / "quarantine").mkdir()
    (state / "quarantine" / "0-1-1-5.json").write_text(json.dumps(
        {"id": "1:1:5", "fragment": 0, "learner": 1, "reason": "merge_error", "detail": "x", "acknowledged": True}))
    verdict = check_no_lost_acks(RunView(view(events).events, [], state_dir=state))
    assert verdict.status == FAIL and "1:1:5 (merge_error)" in verdict.detail


def test_the_tolerance_grows_with_the_measured_api_round_trip():
    """A run whose proxy API answered in 0.2 s (a loaded machine) is judged with 5 round
    trips, 1 s; one answering in 0.02 s with the backend's own 0.25 s."""
    from chaos.applied import tolerance_of

    assert tolerance_of([{"event": "begin", "tolerance": 0.25, "api": {"round_trip": 0.2}}]) == 1.0
    assert tolerance_of([{"event": "begin", "tolerance": 0.25, "api": {"round_trip": 0.02}}]) == 0.25
    assert tolerance_of([{"event": "begin"}]) == 0.25


def test_a_toxic_whose_removal_took_long_was_stopped_late():
    """A latency whose stop was issued on time but took 20 s of retries (a stopped proxy)
    stayed in force 20 s past its plan: faults_applied says so."""
    faults = [latency("learner-2", 20.0, 5.0)]
    history = history_for(faults)
    stop = next(i for i, e in enumerate(history) if e.get("event") == "stop")
    history[stop] = {**history[stop], "took": 20.0}
    verdict = check_faults_applied(view(training(), history))
    assert verdict.status == FAIL and "stopped 20.00 s after its planned end 25 s" in verdict.detail


def test_self_heal_allows_a_latency_on_the_recovering_learners_link_its_round_trips_and_no_more():
    """The simulator's long run (schedule 81717 of seed 1): the syncer lost its power, then
    learner-1's link got 3 s of latency each way while it reconnected; it contributed 9.9 s
    after the heal, against 8.7 s allowed for the outage alone. Each of the recovery's round
    trips is slower by the toxic's 6 s: MERGE_ROUND_TRIPS of them are allowed on top, no more."""
    outage = kill("learner-1", 20.0, 2.0)
    slow = {"kind": "latency", "at": 22.5, "duration": 20.0, "target": "learner-1", "latency_ms": 3000}
    base = check_self_heal(view(training(80.0, absent={1: [(20.0, 24.0)]}), history_for([outage], duration=80.0)))
    allowed = base.evidence["healings"][0]["within"]

    def judged(back_after: float, faults: list[dict]):
        events = training(80.0, absent={1: [(20.0, 22.0 + back_after)]})
        return check_self_heal(view(events, history_for(faults, duration=80.0)))

    late = allowed + 4.0  # past the outage's allowance, well within three 6 s round trips
    assert judged(late, [outage]).status == FAIL
    slowed = judged(late, [outage, slow])
    assert slowed.status == PASS and slowed.evidence["healings"][0]["slowed_by_latency"] == 18.0
    assert judged(allowed + 18.0 + 3.0, [outage, slow]).status == FAIL
