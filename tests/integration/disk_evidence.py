"""What examples/schedules/disk-power-clock.yaml must leave in the events, on any backend.

The full disk meets whichever durable write comes next, and which one that is comes down
to milliseconds: a push's file (the learner is answered storage_full, keeps the push and
defers it) or a merged fragment (the syncer retries the merge until space returns, and a
learner whose last push waits on that merge sends nothing, with push_window 1). Either is
right. What must hold on both paths: the syncer felt the full disk, the failing disk ended
it for a restart, and no learner lost a push or its connection to a disk error."""
from __future__ import annotations

from collections import Counter

STORAGE_REASONS = {"storage_full", "storage_io"}
OS_ERROR_WORDS = ("No space", "Input/output", "Errno 28", "Errno 5]")


def disk_schedule_problems(events: list[dict]) -> list[str]:
    """Each way the run's events fall short of refusals-not-drops; empty when none does."""
    seen = Counter((e.get("process"), e["kind"], str(e.get("reason", ""))) for e in events)
    problems = []
    if not seen[("syncer", "storage_error", "storage_full")]:
        problems.append("the full disk was never felt: no storage_error storage_full from the syncer")
    if not seen[("syncer", "disk_failed", "")]:
        problems.append("the failed sync was not seen: no disk_failed from the syncer")
    deferred = {reason for (process, kind, reason) in seen if kind == "push_deferred"}
    if not deferred <= STORAGE_REASONS:
        problems.append(f"pushes deferred for reasons other than the disk: {sorted(deferred - STORAGE_REASONS)}")
    dropped = [e for e in events if e["kind"] == "push" and e.get("status") == "refused"
               and str(e.get("reason", "")).startswith("storage")]
    if dropped:
        problems.append(f"pushes dropped for a storage refusal: {dropped[:3]}")
    # Before issue 27 a disk error closed the learner's connection: `leave` events whose
    # reason was the OSError ("[Errno 28] No space left on device"), no ERROR frame.
    left = [e for e in events if e["kind"] == "leave" and any(w in str(e.get("reason")) for w in OS_ERROR_WORDS)]
    if left:
        problems.append(f"learners dropped by the disk faults instead of refused: {left[:3]}")
    return problems


def syncer_incarnations(events: list[dict]) -> list[float]:
    """When each syncer process began, by the first event every syncer writes (state_loaded,
    once it has read its state back), not by process_start: a syncer killed while it starts
    (a power loss that finds it restarting) never writes that one. Not by PID either: in a
    container each start may get the same one."""
    return [float(e["t"]) for e in events if e.get("process") == "syncer" and e["kind"] == "state_loaded"]
