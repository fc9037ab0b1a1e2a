"""`python -m chaos check RUN_DIR`: judge a finished run directory again, without running
anything: after a checker changed, on a run fetched from elsewhere, or with the events left
on their hosts' own clocks (`--clock-alignment off`) to see what a harness that trusted
every clock would have concluded.

It reads run.json, history.jsonl, events/ and, for runs whose hosts' clocks disagree, the
clock probes; it writes the verdict into RUN_DIR (verdict.json; with the clocks left
unaligned, a file of its own) and prints the verdicts as `chaos run` does. Exit 0 when the run passes, 1 when a check fails, 2 for a directory that
holds no run.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from trainer.argtypes import Parser, on_off
from trainer.runspec import RunSpec

from .controller import HISTORY_FILE
from .reference import ReferenceCurve

UNALIGNED_VERDICT = "verdict-clock-alignment-off.json"


def recorded_reference(run_dir: Path) -> ReferenceCurve | None:
    """The fault-free reference the run was judged against, if its cache file is still there."""
    try:
        note = json.loads((run_dir / "run.json").read_text()).get("reference") or {}
        return ReferenceCurve.from_dict(json.loads(Path(note["path"]).read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def main(argv: list[str] | None = None) -> int:
    from .__main__ import print_verdicts
    from .runner import evaluate_run

    p = Parser(prog="python -m chaos check", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", metavar="RUN_DIR", help="a `chaos run` directory (run.json, history.jsonl, events/)")
    p.add_argument("--clock-alignment", type=on_off, default="on", metavar="{on,off}",
                   help="place events stamped on other hosts' clocks on the controller's timeline through the "
                        "run's clock probes (on), or judge them on their own clocks as if all agreed (off)")
    p.add_argument("--evaluate", type=on_off, default="off", metavar="{on,off}",
                   help="score the final parameters again with `trainer eval` when the syncer wrote no score "
                        "(a torch import); off uses what the run recorded")
    p.add_argument("--verdict-file", default=None, metavar="NAME",
                   help=f"the verdict's file name in RUN_DIR (default: verdict.json, or {UNALIGNED_VERDICT} with "
                        f"--clock-alignment off, so the run's own verdict stays)")
    args = p.parse_args(argv)
    if args.verdict_file is not None and (not args.verdict_file or Path(args.verdict_file).name != args.verdict_file):
        p.error(f"--verdict-file: a file name in RUN_DIR, not a path: {args.verdict_file!r}")
    run_dir = Path(args.run_dir)
    try:
        spec = RunSpec.from_json(json.loads((run_dir / "run.json").read_text()), source=str(run_dir / "run.json"))
    except FileNotFoundError:
        print(f"check: error: RUN_DIR: {run_dir} holds no run.json: not a `chaos run` directory", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"check: error: {exc}", file=sys.stderr)
        return 2
    if not (run_dir / HISTORY_FILE).exists():
        print(f"check: error: RUN_DIR: {run_dir} holds no {HISTORY_FILE}", file=sys.stderr)
        return 2
    verdict_file = args.verdict_file or ("verdict.json" if args.clock_alignment else UNALIGNED_VERDICT)
    result = evaluate_run(run_dir, spec.learners, None, spec.data, args.evaluate, recorded_reference(run_dir),
                          align=args.clock_alignment, verdict_file=verdict_file)
    print_verdicts(result, verdict_file)
    return 0 if result.passed else 1
