"""A replay read beside its original: verdicts, goodput and final loss side by side.

A replay answers two questions, did the failure come back and how far did the run drift,
and neither can be read from the replay's verdicts alone. The original's figures come from
its `verdict.json` (written by `chaos.runner.evaluate_run`: passed, failed, checks,
summary). A pytest artifacts directory may lack the file, or hold one without a summary
(the plugin's `verdicts()` writes only the checks); then goodput is computed from the
original's events and the final loss taken from its `eval` event, where they were copied.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

VERDICT_FILE = "verdict.json"
COMPARISON_FILE = "replay.json"
ABSENT = "—"


@dataclass
class Figures:
    """One run's verdicts (check name -> status), goodput and final held-out loss."""

    checks: dict[str, str] = field(default_factory=dict)
    passed: bool | None = None
    goodput: float | None = None
    final_loss: float | None = None
    note: str | None = None  # why some figures are missing


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _from_events(run_dir: Path, learners: int) -> tuple[float | None, float | None]:
    """Goodput and final loss from a run's copied events, when its verdict.json has no summary."""
    if not (run_dir / "events").is_dir():
        return None, None
    from trainer.events import read_events
    from trainer.metrics import summarize

    events = read_events(run_dir)
    evals = [e for e in events if e.get("kind") == "eval" and "final_loss" in e]
    final = _number(evals[-1]["final_loss"]) if evals else None
    return _number(summarize(events, learners).get("goodput")), final


def original_figures(run_dir: str | Path, learners: int) -> Figures:
    """What the original run recorded; never raises: a missing or broken file becomes a note."""
    run_dir = Path(run_dir)
    path = run_dir / VERDICT_FILE
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        goodput, final = _from_events(run_dir, learners)
        return Figures(goodput=goodput, final_loss=final,
                       note=f"{path} does not exist (a pytest artifacts directory may lack it): the original's "
                            f"verdicts are unknown")
    except ValueError as exc:
        return Figures(note=f"{path}: not valid JSON ({exc}): the original's figures are unknown")
    if not isinstance(document, dict):
        return Figures(note=f"{path}: expected a JSON object, got {type(document).__name__}")
    checks = {str(c.get("name")): str(c.get("status")) for c in document.get("checks") or []
              if isinstance(c, dict) and c.get("name")}
    passed = document.get("passed") if isinstance(document.get("passed"), bool) else None
    summary = document.get("summary")
    if isinstance(summary, dict):
        return Figures(checks, passed, _number(summary.get("goodput")), _number(summary.get("final_loss")))
    goodput, final = _from_events(run_dir, learners)
    return Figures(checks, passed, goodput, final,
                   note=f"{path} holds no summary: goodput and final loss were read from the original's events")


def replay_figures(document: dict) -> Figures:
    """The replay's figures, from the document `evaluate_run` returned (and wrote)."""
    checks = {str(c["name"]): str(c["status"]) for c in document.get("checks", [])}
    summary = document.get("summary") or {}
    return Figures(checks, bool(document.get("passed")), _number(summary.get("goodput")),
                   _number(summary.get("final_loss")))


def _drift(original: float | None, replay: float | None, digits: int) -> float | None:
    if original is None or replay is None:
        return None
    return round(replay - original, digits)


def compare(original_dir: str | Path, original: Figures, replay: Figures) -> dict:
    """The comparison as recorded in the replay's run dir (replay.json)."""
    names = list(original.checks) + [n for n in replay.checks if n not in original.checks]
    rows = [{"check": n, "original": original.checks.get(n), "replay": replay.checks.get(n)} for n in names]
    changed = [r["check"] for r in rows if r["original"] is not None and r["replay"] is not None
               and r["original"] != r["replay"]]
    came_back = [n for n in names if original.checks.get(n) == "fail" and replay.checks.get(n) == "fail"]
    return {
        "original": str(original_dir),
        "note": original.note,
        "verdict": {"original": None if original.passed is None else ("pass" if original.passed else "fail"),
                    "replay": "pass" if replay.passed else "fail"},
        "checks": rows,
        "changed": changed,
        "failures_came_back": came_back,
        "goodput": {"original": original.goodput, "replay": replay.goodput,
                    "drift": _drift(original.goodput, replay.goodput, 4)},
        "final_loss": {"original": original.final_loss, "replay": replay.final_loss,
                       "drift": _drift(original.final_loss, replay.final_loss, 4)},
    }


def _status(value: str | None) -> str:
    return value.upper() if value else ABSENT


def _pct(value: float | None) -> str:
    return ABSENT if value is None else f"{value:.1%}"


def _loss(value: float | None) -> str:
    return ABSENT if value is None else f"{value:.4f}"


def format_comparison(comparison: dict) -> str:
    """The table a user reads after a replay: check | original | replay, then the figures."""
    rows = [(r["check"], _status(r["original"]), _status(r["replay"])) for r in comparison["checks"]]
    rows.append(("verdict", _status(comparison["verdict"]["original"]), _status(comparison["verdict"]["replay"])))
    goodput, loss = comparison["goodput"], comparison["final_loss"]
    rows.append(("goodput", _pct(goodput["original"]), _pct(goodput["replay"])))
    rows.append(("final held-out loss", _loss(loss["original"]), _loss(loss["replay"])))
    width = max(len(r[0]) for r in rows + [("check", "", "")])
    col = max(len("original"), *(len(r[1]) for r in rows))
    lines = [f"\nreplay beside its original ({comparison['original']}):",
             f"  {'check':<{width}}  {'original':<{col}}  replay"]
    lines += [f"  {name:<{width}}  {a:<{col}}  {b}" for name, a, b in rows]
    if comparison["note"]:
        lines.append(f"  note: {comparison['note']}")
    drift = []
    if loss["drift"] is not None:
        drift.append(f"final loss {loss['drift']:+.4f} (replay − original)")
    if goodput["drift"] is not None:
        drift.append(f"goodput {goodput['drift'] * 100:+.1f} points")
    if drift:
        lines.append("  drift: " + ", ".join(drift))
    if comparison["failures_came_back"]:
        lines.append(f"  the original's failure came back: {', '.join(comparison['failures_came_back'])}")
    elif comparison["verdict"]["original"] == "fail":
        lines.append("  the original's failure did not come back")
    if comparison["changed"]:
        lines.append(f"  checks that changed: {', '.join(comparison['changed'])}")
    return "\n".join(lines)


def record_comparison(original_dir: str | Path, replay_dir: Path, replay_document: dict, learners: int) -> dict:
    """Compare, write RUN_DIR/replay.json beside the replay's verdict.json, return the comparison."""
    comparison = compare(original_dir, original_figures(original_dir, learners), replay_figures(replay_document))
    (Path(replay_dir) / COMPARISON_FILE).write_text(json.dumps(comparison, indent=2), encoding="utf-8")
    return comparison
