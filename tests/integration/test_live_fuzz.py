"""Mutated frames, unsigned and signed, at a real syncer process (fuzz/live.py): no crash,
every frame answered or counted, memory bounded, and a real learner merges afterwards.
CI sends a short budget; `python -m fuzz.live --frames 100000` is the long run
(BENCHMARKS.md, "Fuzzing")."""
from __future__ import annotations

import os
from pathlib import Path

from fuzz import live

FRAMES = int(os.environ.get("ISLANDS_LIVE_FUZZ_FRAMES", "5000"))


def test_a_syncer_under_live_fuzzing_answers_or_counts_every_frame(tmp_path: Path) -> None:
    result = live.run(FRAMES, workers=4, seed=0, workdir=tmp_path)
    brief = {k: result[k] for k in ("frames", "answered", "closed_without_reply", "syncer_counted", "uncounted",
                                    "crashes", "tracebacks", "rss_growth_mb", "learner_pushes_merged")}
    assert result["frames"] >= FRAMES, brief
    assert result["crashes"] == 0, f"the syncer died or exited badly (exit {result['syncer_exit']}): {brief}"
    assert result["tracebacks"] == 0, f"tracebacks in {tmp_path / 'syncer.log'}: {brief}"
    assert result["uncounted"] == 0, f"frames neither answered nor counted by the syncer: {brief}"
    assert result["rss_growth_mb"] < 256, f"the syncer's memory grew by {result['rss_growth_mb']} MB: {brief}"
    assert result["learner_pushes_merged"] > 0, f"the legitimate learner's pushes were not merged: {brief}"
    assert result["signed"] > FRAMES // 2 and result["unsigned"] > FRAMES // 10, brief


def test_a_flood_of_idle_and_greedy_connections_keeps_no_learner_out(tmp_path: Path) -> None:
    """300 idle unauthenticated connections held open and 16 claiming 64 MiB payloads, with
    default settings: a learner still joins (within the client's 10 s deadline), and the
    syncer's memory barely moves."""
    result = live.flood(idle=300, claiming=16, workdir=tmp_path)
    assert result["joined"], result
    assert result["rss_growth_mb"] < 256, result
    assert result["oversized"] == 16 and result["evicted"] >= 300 - 64, result
