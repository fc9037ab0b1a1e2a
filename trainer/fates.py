"""Where the tokens a decoupled run's learners processed went, and what to change when
little of it was merged: the summary of `trainer run` and `chaos run` (issue 26: a small
conv net merged 7.4% of its capacity with the defaults, and nothing said why).
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict


def merged_tokens(events) -> float:
    from .metrics import merged_tokens as merged
    return merged(events)


# Where the tokens the learners processed went (decoupled mode), in the order the summary says.
TOKEN_FATES = {
    "merged": "merged into Θ",
    "discarded_at_adoption": "thrown away at adoption (--adopt mix overwrites the steps made while a push waits)",
    "dropped_stale": "dropped as stale (pushed more than --max-staleness versions behind)",
    "refused": "refused by the syncer (out of its bounds)",
    "acknowledged_unmerged": "acknowledged, not merged when the syncer stopped (durable: a restart merges them)",
    "lost_to_faults": "lost to faults (made by a learner killed before it pushed them)",
    "unpushed_at_stop": "not pushed at the end (the clean stop's last pushes did not get through)",
}


def _fragment_shares(events: list[dict]) -> dict[int, float]:
    """Each fragment's share of the parameters, from its merges (else 1/P from the config)."""
    shares = {int(e["fragment"]): float(e.get("fragment_share", 1.0)) for e in events if e["kind"] == "merge"}
    fragments = next((int((e.get("config") or {}).get("fragments") or 1) for e in events
                      if e["kind"] == "process_start" and e.get("role") == "syncer"), max(shares, default=0) + 1)
    return {f: shares.get(f, 1.0 / fragments) for f in range(max(fragments, len(shares)))}


def _incarnation_of(push_id: str) -> tuple[int | None, int | None]:
    """(learner, incarnation) of a push id `learner:incarnation:seq`."""
    parts = str(push_id).split(":")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None, None


def token_fates(events: list[dict]) -> dict[str, float]:
    """The processed tokens of a decoupled run by what became of them (TOKEN_FATES), each
    fragment's part weighted by its share of the parameters as goodput weighs merges; the
    fates add up to the tokens processed (within the rounding of coalesced pushes).

    A push counts once, by id, from whichever side saw it: the learner's answer, the
    syncer's acceptance or a merge. A learner killed before its acknowledgement came back
    never logged the push its syncer merged; counted from the learner's side alone, those
    tokens were both merged and lost."""
    shares = _fragment_shares(events)
    out = dict.fromkeys(TOKEN_FATES, 0.0)
    out["merged"] = merged_tokens(events)
    processed: dict[tuple, float] = defaultdict(float)   # (learner, incarnation) -> tokens
    accounted: dict[tuple, float] = defaultdict(float)   # ... pushed, discarded or dropped, share-weighted
    stopped: set[tuple] = set()                          # incarnations that stopped cleanly
    acked: dict[str, tuple[tuple, float]] = {}           # push id -> ((learner, incarnation), share-weighted tokens)
    merged: set[str] = set()
    answered: dict[str, tuple[tuple, str, float]] = {}   # push id -> (key, stale | refused, tokens)
    for e in events:
        key = (e.get("learner"), e.get("incarnation"))
        kind = e["kind"]
        if kind == "inner_step" and e.get("learner") is not None:
            processed[key] += float(e["tokens"])
        elif kind == "process_stop" and e.get("role") == "learner":
            stopped.add(key)
        elif kind == "apply" and e.get("fragment") is not None:
            part = float(e.get("discarded_tokens") or 0.0) * shares.get(int(e["fragment"]), 0.0)
            out["discarded_at_adoption"] += part
            accounted[key] += part
        elif kind == "merge":
            share = shares.get(int(e["fragment"]), 0.0)
            for c in e["contributors"]:
                merged.add(c["id"])
                acked.setdefault(c["id"], (_incarnation_of(c["id"]), float(c.get("tokens") or 0.0) * share))
        elif (kind == "push" and e.get("status") in ("accepted", "duplicate")) or kind == "push_accepted":
            part = float(e.get("tokens") or 0.0) * shares.get(int(e.get("fragment", 0)), 0.0)
            acked.setdefault(e["id"], (_incarnation_of(e["id"]), part))
        elif kind == "push" and e.get("status") in ("stale", "refused"):
            part = float(e.get("tokens") or 0.0) * shares.get(int(e.get("fragment", 0)), 0.0)
            answered.setdefault(e["id"], (key, "dropped_stale" if e["status"] == "stale" else "refused", part))
    for ident, (key, part) in acked.items():
        accounted[key] += part
        if ident not in merged:
            out["acknowledged_unmerged"] += part
    for ident, (key, fate, part) in answered.items():
        if ident not in acked:
            out[fate] += part
            accounted[key] += part
    for key, tokens in processed.items():
        out["unpushed_at_stop" if key in stopped else "lost_to_faults"] += max(0.0, tokens - accounted[key])
    return {k: round(v, 1) for k, v in out.items()}


def round_trips(events: list[dict]) -> list[float]:
    """Seconds from sending each accepted push to adopting the version that holds it."""
    sent: dict[tuple, list[tuple[int, float]]] = defaultdict(list)  # (learner, incarnation, fragment) -> (target, t)
    out = []
    for e in events:
        key = (e.get("learner"), e.get("incarnation"), e.get("fragment"))
        if e["kind"] == "push" and e.get("status") == "accepted":
            sent[key].append((int(e.get("version", 0)) + 1, float(e["t"]) - float(e.get("latency") or 0.0)))
        elif e["kind"] == "apply" and e.get("fragment") is not None:
            waiting = sent.get(key, [])
            done = [t for target, t in waiting if target <= int(e["version"])]
            out += [float(e["t"]) - t for t in done]
            sent[key] = [(target, t) for target, t in waiting if target > int(e["version"])]
    return out


def where_tokens_went(events: list[dict], cpu_waits: dict[int, float], wall: float) -> dict:
    """The summary's fates of the processed tokens, the push round trip against a round of
    H steps, and advice: what to change where little was merged."""
    fates = token_fates(events)
    processed = sum(float(e["tokens"]) for e in events if e["kind"] == "inner_step") or 1.0
    cfg = next(((e.get("config") or {}) for e in events if e["kind"] == "process_start" and e.get("role") == "syncer"),
               {})
    sync_every, fragments = int(cfg.get("sync_every") or 20), int(cfg.get("fragments") or 1)
    steps: dict[tuple, list[float]] = defaultdict(list)
    for e in events:
        if e["kind"] == "inner_step" and e.get("learner") is not None:
            steps[(e["learner"], e.get("incarnation"))].append(float(e["t"]))
    intervals = [b - a for ts in steps.values() for a, b in zip(ts, ts[1:])]
    step = statistics.fmean(intervals) if intervals else None
    trips = round_trips(events)
    trip = statistics.median(trips) if trips else None
    advice = []
    share = {k: v / processed for k, v in fates.items()}
    if share["discarded_at_adoption"] > 0.05:
        advice.append(f"{share['discarded_at_adoption']:.0%} of the tokens were thrown away at adoption: --adopt "
                      f"rebase (the default) keeps the steps a learner makes while its push waits for a merge")
    if trip is not None and step and trip > sync_every * step:
        suggested = fragments * math.ceil(2 * trip / step / fragments)
        advice.append(f"a push takes {trip * 1000:.0f} ms from send to adoption, longer than a round of H="
                      f"{sync_every} steps ({sync_every * step * 1000:.0f} ms): the syncer's round trip, not the "
                      f"learners, sets the pace; --sync-every {suggested} makes H steps last two round trips")
    if share["dropped_stale"] > 0.05:
        advice.append(f"{share['dropped_stale']:.0%} of the tokens were dropped as stale: raise --max-staleness, "
                      f"or --sync-every so that fewer versions pass while a push waits")
    waited = {k: v / wall for k, v in cpu_waits.items() if wall > 0}
    if waited and statistics.fmean(waited.values()) > 0.1:
        advice.append(f"the learners waited {statistics.fmean(waited.values()):.0%} of the time for a CPU (more "
                      f"learners than free cores): goodput counts only the time they could compute; goodput_solo "
                      f"counts every learner's solo rate for the whole run")
    return {"token_fates": fates, "push_round_trip_seconds": round(trip, 4) if trip is not None else None,
            "round_seconds": round(sync_every * step, 4) if step else None, "advice": advice}


def describe_fates(summary: dict) -> list[str]:
    """One line per fate that holds any tokens, with its share of the processed tokens."""
    fates = summary.get("token_fates") or {}
    processed = float(summary.get("tokens_processed") or 0.0)
    if not fates or processed <= 0:
        return []
    return [f"{value / processed:6.1%}  {TOKEN_FATES[name]}" for name, value in fates.items()
            if value / processed >= 0.0005 and name in TOKEN_FATES]


def fates_lines(summary: dict) -> list[str]:
    """The summary's lines on where the tokens went and what would merge more."""
    fates = describe_fates(summary)
    lines = ["where the processed tokens went:", *(f"  {line}" for line in fates)] if fates else []
    return lines + [f"to merge more: {line}" for line in summary.get("advice") or []]
