"""Run the fuzz targets under atheris (libFuzzer, coverage-guided) and print a table.

    python -m fuzz.run                          # every target, 20 s each
    python -m fuzz.run frame_decoder --runs 5000
    python -m fuzz.run --seconds 300 --json bench/out/fuzz.json --grow-corpus

Why atheris: it is libFuzzer driving Python with coverage feedback (edges of our own
modules, plus comparison tracing that finds magic values and lengths), which suits byte
parsers (frames, handshakes, HTTP) far better than random generation; Hypothesis stays
where structure matters (fault schedules, the live fuzzer's frame mutations). Each target
runs in its own process, seeded from fuzz/corpus/<target>/; new inputs go to a scratch
directory unless --grow-corpus writes them back. A crash (any exception a target does not
expect) leaves its input in the scratch directory and fails the run.
"""
from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from trainer.argtypes import Parser
from bench.outputs import output_file

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"
TARGETS_DIR = ROOT / "fuzz" / "targets"
INSTRUMENTED = ["trainer", "chaos", "fuzz"]


def targets() -> list[str]:
    return sorted(p.stem for p in TARGETS_DIR.glob("*.py") if p.stem not in ("__init__", "support"))


def child(name: str, libfuzzer_args: list[str]) -> None:
    """Inside the fuzzing process: import the target instrumented, then hand it to libFuzzer."""
    import atheris

    with atheris.instrument_imports(include=INSTRUMENTED):
        module = importlib.import_module(f"fuzz.targets.{name}")
    module.setup()
    atheris.Setup([sys.argv[0], *libfuzzer_args], module.test_one_input)
    atheris.Fuzz()


def _stats(log: str) -> dict:
    """Executions, coverage and features as libFuzzer reports them."""
    def last(pattern: str) -> int | None:
        found = re.findall(pattern, log)
        return int(found[-1]) if found else None

    return {"executions": last(r"stat::number_of_executed_units:\s*(\d+)") or last(r"#(\d+)\s"),
            "coverage": last(r"\bcov: (\d+)"), "features": last(r"\bft: (\d+)"),
            "corpus": last(r"\bcorp: (\d+)"), "peak_rss_mb": last(r"stat::peak_rss_mb:\s*(\d+)")}


def run_target(name: str, runs: int | None, seconds: int, grow_corpus: bool, scratch: Path) -> dict:
    seeds = CORPUS / name
    seeds.mkdir(parents=True, exist_ok=True)
    work = scratch / name
    work.mkdir(parents=True, exist_ok=True)
    args = [f"-max_total_time={seconds}", "-timeout=20", "-rss_limit_mb=3072", "-print_final_stats=1",
            f"-artifact_prefix={work}/", str(seeds if grow_corpus else work), str(seeds)]
    if runs is not None:
        args.insert(0, f"-runs={runs}")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "fuzz.run", "--child", name, "--", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=seconds + 300)
    elapsed = time.monotonic() - started
    log = proc.stdout + proc.stderr
    crashes = sorted(p.name for p in work.glob("crash-*")) + sorted(p.name for p in work.glob("timeout-*"))
    crashed = proc.returncode != 0 or bool(crashes)
    row = {"target": name, "seconds": round(elapsed, 1), "returncode": proc.returncode,
           "crashes": max(len(crashes), 1 if crashed else 0), "artifacts": crashes, **_stats(log)}
    row["exec_per_s"] = round(row["executions"] / elapsed) if row["executions"] else None
    if crashed:
        row["log_tail"] = log[-4000:]
    return row


def print_table(rows: list[dict]) -> None:
    cols = ("target", "executions", "exec_per_s", "coverage", "features", "corpus", "crashes", "seconds")
    print(" | ".join(f"{c:>14}" for c in cols))
    for r in rows:
        print(" | ".join(f"{'' if r.get(c) is None else r.get(c)!s:>14}" for c in cols))
    for r in rows:
        if r["crashes"]:
            print(f"\n{r['target']}: CRASH (exit {r['returncode']}, {r['artifacts']})\n{r.get('log_tail', '')}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        child(argv[1], argv[3:] if argv[2:3] == ["--"] else argv[2:])
        return 0
    p = Parser(prog="python -m fuzz.run", description=__doc__.split("\n\n")[0])
    p.add_argument("targets", nargs="*", help=f"targets to fuzz, by name (default: all of {', '.join(targets())})")
    p.add_argument("--runs", type=int, default=None, help="executions per target (default: until --seconds)")
    p.add_argument("--seconds", type=int, default=20, help="time budget per target (default 20)")
    p.add_argument("--json", type=output_file, help="write the rows here (one per target: executions, coverage, crashes)")
    p.add_argument("--grow-corpus", action="store_true", help="keep new interesting inputs in fuzz/corpus/")
    args = p.parse_args(argv)
    unknown = sorted(set(args.targets) - set(targets()))
    if unknown:
        p.error(f"unknown target(s) {', '.join(unknown)}; known: {', '.join(targets())}")
    scratch = Path(tempfile.mkdtemp(prefix="islands-fuzz-"))
    rows = [run_target(t, args.runs, args.seconds, args.grow_corpus, scratch) for t in args.targets or targets()]
    print_table(rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "runs": args.runs, "seconds": args.seconds}, indent=1))
    if not any(r["crashes"] for r in rows):
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        print(f"\ncrash inputs kept in {scratch}")
    return 1 if any(r["crashes"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
