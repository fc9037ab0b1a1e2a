"""bench/simulator.py's long run: chunks recorded in a ledger and not run again, so a
million schedules can span sessions and commits that leave the simulated code alone; the
summary over chunks of several commits."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from .bench_scripts import load_bench

sim = load_bench("simulator.py", "bench_simulator")
simulated_code = sim.simulated_code


def fake_chunk(ran: list[tuple[int, int]]):
    def run_chunk(seed, start, count, space, jobs):
        ran.append((start, count))
        return {"seed": seed, "start": start, "count": count, "space": sim.space_key(space), "jobs": jobs,
                "commit": sim.COMMIT, "code": sim.CODE, "finished": "now", "wall_seconds": count / 50, "simulated_seconds": 20.0 * count,
                "faults": count, "median_s": 0.04, "p99_s": 0.07, "max_s": 0.1,
                "violations": 1 if start == 20 else 0,
                "failed": [{"index": start + 3, "checks": ["no_lost_acks"]}] if start == 20 else [],
                **({"unknown": {"progress": 2}} if start == 10 else {} if start == 0 else {"unknown": {}})}
    return run_chunk


@pytest.fixture
def ran(monkeypatch) -> list[tuple[int, int]]:
    """The (start, count) of every chunk run, with a fake chunk in place of the simulator."""
    chunks: list[tuple[int, int]] = []
    monkeypatch.setattr(sim, "run_chunk", fake_chunk(chunks))
    return chunks


def test_a_ledger_resumes_where_the_last_run_stopped(tmp_path, ran):
    ledger = tmp_path / "long.jsonl"
    space = sim.Space()
    sim.run(1, 25, space, 2, 10, ledger, say=lambda _: None)
    assert ran == [(0, 10), (10, 10), (20, 5)]
    # A longer run later: the three chunks it shares are read back, only the rest runs.
    ran.clear()
    chunks = sim.run(1, 40, space, 2, 10, ledger, say=lambda _: None)
    assert ran == [(20, 10), (30, 10)]  # 20..24 was a chunk of 5, not of 10: run again
    assert [(c["start"], c["count"]) for c in chunks] == [(0, 10), (10, 10), (20, 10), (30, 10)]
    assert len(ledger.read_text().splitlines()) == 5


def test_a_chunk_of_another_seed_space_or_commit_or_a_torn_line_is_not_counted(tmp_path, ran):
    ledger = tmp_path / "long.jsonl"
    space = sim.Space()
    sim.run(1, 10, space, 2, 10, ledger, say=lambda _: None)
    with ledger.open("a") as f:
        f.write('{"seed": 1, "start": 10, "count": 1')  # a write cut short by a kill
    ran.clear()
    sim.run(2, 10, space, 2, 10, ledger, say=lambda _: None)
    sim.run(1, 10, replace(space, max_faults=2), 2, 10, ledger, say=lambda _: None)
    sim.run(1, 20, space, 2, 10, ledger, say=lambda _: None)
    assert ran == [(0, 10), (0, 10), (10, 10)]
    # A chunk other simulated code ran is history: this code runs it again.
    lines = ledger.read_text().splitlines()
    ledger.write_text("\n".join(line.replace(sim.CODE, "0ther00") for line in lines) + "\n")
    ran.clear()
    sim.run(1, 10, space, 2, 10, ledger, say=lambda _: None)
    assert ran == [(0, 10)]


def test_a_chunk_of_another_commit_with_the_same_simulated_code_counts(tmp_path, ran):
    """A commit that changed only tests or docs keeps the long run going."""
    ledger = tmp_path / "long.jsonl"
    space = sim.Space()
    sim.run(1, 10, space, 2, 10, ledger, say=lambda _: None)
    ledger.write_text(ledger.read_text().replace(f'"commit":"{sim.COMMIT}"', '"commit":"docsonly"'))
    ran.clear()
    assert sim.run(1, 10, space, 2, 10, ledger, say=lambda _: None)[0]["commit"] == "docsonly"
    assert ran == []


def test_a_chunk_recorded_before_codes_is_matched_through_its_commit(monkeypatch):
    monkeypatch.setattr(sim, "_CODE_OF_COMMIT", {})
    monkeypatch.setattr(sim, "code_of", lambda commit: {"abc1234": "c0de"}.get(commit, ""))
    assert sim.chunk_code({"commit": "abc1234"}) == "c0de"
    assert sim.chunk_code({"commit": "abc1234", "code": "given"}) == "given"
    assert sim.chunk_code({"commit": "abc1234-dirty"}) == "abc1234-dirty"  # never another run's code
    assert sim.chunk_code({"commit": "gone999"}) == "gone999"           # a commit git no longer has


def test_the_simulated_code_changes_exactly_when_a_file_the_simulation_runs_changes():
    """Over the last commits: a commit's code equals its parent's exactly when it left the
    simulated files alone (all of trainer/ and faults/, chaos/'s import closure of the
    simulator); a shallow clone without history proves nothing."""
    commits = sim._git("log", "--format=%H", "-n", "40").split()
    if len(commits) < 2:
        pytest.skip("no history in this clone")
    for commit in commits[:-1]:
        files = set(simulated_code.simulated_blobs(commit)) | set(simulated_code.simulated_blobs(f"{commit}^"))
        changed = set(sim._git("diff", "--name-only", f"{commit}^", commit).split())
        assert (sim.code_of(commit) != sim.code_of(f"{commit}^")) == bool(changed & files), commit
    assert sim.code_of("0" * 40) == ""


def test_the_closure_holds_every_chaos_module_a_simulation_loads_and_no_live_backend():
    """Soundness: a fresh process that simulates schedules of every kind (power loss
    included) loads no chaos/ file outside the closure; and the closure leaves out what a
    simulation never runs, so a change there keeps a long run counting."""
    probe = ("import sys; from chaos.sim.explore import Space, draw, judge; space = Space()\n"
             "for i in range(40): judge(draw(1, i, space), space)\n"
             "print('\\n'.join(sorted(m.__file__ for n, m in list(sys.modules.items())"
             " if n.split('.')[0] == 'chaos' and getattr(m, '__file__', None))))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=sim.ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = {str(Path(f).resolve().relative_to(sim.ROOT)) for f in out.stdout.split()}
    head = sim._git("rev-parse", "HEAD")
    closure = {p for p in simulated_code.simulated_blobs(head) if p.startswith("chaos/")}
    assert "chaos/sim/world.py" in loaded and "chaos/checkers.py" in loaded, sorted(loaded)
    assert loaded <= closure, f"loaded by a simulation but not in its code's identity: {sorted(loaded - closure)}"
    for outside in ("chaos/report.py", "chaos/pytest_plugin.py", "chaos/toxiproxy/server.py"):
        assert outside not in closure, outside


def test_the_summary_adds_chunks_up_and_keeps_their_failures(monkeypatch):
    monkeypatch.setattr(sim, "run_chunk", fake_chunk([]))
    space = sim.Space()
    result = sim.summarize(sim.run(1, 30, space, 2, 10, None, say=lambda _: None), space)
    assert result["schedules"] == 30 and result["chunks"] == 3
    assert result["schedules_per_second"] == 50.0 and result["speedup"] == 1000.0
    assert result["violations"] == 1 and result["failed"] == [{"index": 23, "checks": ["no_lost_acks"]}]
    assert result["commits"] == [sim.COMMIT]
    # The first chunk is an older one that did not record the checks left unknown.
    assert result["unknown"] == {"progress": 2} and result["unknown_recorded"] == 20
    json.dumps(result)


def test_a_real_chunk_runs_the_schedules_explore_draws():
    chunk = sim.run_chunk(1, 5, 3, sim.Space(), 1)
    assert (chunk["start"], chunk["count"], chunk["violations"]) == (5, 3, 0)
    drawn = [sim.draw(1, i, sim.Space()) for i in range(5, 8)]
    assert chunk["faults"] == sum(len(s.faults) for s in drawn)
    assert chunk["simulated_seconds"] == round(sum(s.horizon + sim.Space().tail for s in drawn), 1)


def test_the_report_sums_the_ledger_per_code_and_names_failing_schedules(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sim, "run_chunk", fake_chunk([]))
    ledger = tmp_path / "long.jsonl"
    sim.run(1, 30, sim.Space(), 2, 10, ledger, say=lambda _: None)
    assert sim.main(["--report", "--ledger", str(ledger)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[:3] == [sim.CODE, sim.COMMIT, "30"] and "23 (no_lost_acks)" in out[1]
    assert out[0].split()[-4:] == ["unknown", "first", "failing", "schedules"] 
    assert out[1].split()[7:9] == ["1", "2"]  # violations, unknown
    assert out[1].endswith("(this checkout)")
