"""Every event kind a process writes is described in trainer.events.KINDS, the one place
writers and readers (the checkers, docs/events.md) agree on: a new kind cannot be
emitted without saying what it means."""
from __future__ import annotations

import re
from pathlib import Path

from trainer.events import KINDS

ROOT = Path(__file__).resolve().parents[2]
# A kind written as a literal: events.emit("kind", ...), a supervisor's emit("kind", ...), or
# the syncer's throttled report("kind", ...).
EMITTED = re.compile(r"""\b(?:emit|report)\(\s*["']([a-z_]+)["']""")


def emitted_kinds(root: Path) -> dict[str, str]:
    """kind -> the first file that writes it, over trainer/ and chaos/."""
    found: dict[str, str] = {}
    for top in ("trainer", "chaos"):
        for path in sorted((root / top).rglob("*.py")):
            for kind in EMITTED.findall(path.read_text(encoding="utf-8")):
                found.setdefault(kind, path.relative_to(root).as_posix())
    return found


def undescribed(found: dict[str, str]) -> list[str]:
    return [f"{kind} (written in {where})" for kind, where in sorted(found.items()) if kind not in KINDS]


def test_every_kind_written_is_described() -> None:
    found = emitted_kinds(ROOT)
    assert len(found) >= 30, f"the pattern found only {sorted(found)}: has the emit call changed shape?"
    assert undescribed(found) == []


def test_a_kind_written_but_not_described_is_named(tmp_path: Path) -> None:
    (tmp_path / "trainer").mkdir()
    (tmp_path / "chaos").mkdir()
    (tmp_path / "trainer" / "x.py").write_text('self.events.emit(\n    "made_up_kind", a=1)\nlog.emit("merge")\n')
    assert undescribed(emitted_kinds(tmp_path)) == ["made_up_kind (written in trainer/x.py)"]
