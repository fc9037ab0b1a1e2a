"""docs/layout.md names every module of the four packages, and nothing that is gone: a page
that says "every module" drifts the first time a module is added without it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("trainer", "faults", "chaos", "bench")
ROW = re.compile(r"^\| `([^`]+)` \| (.*) \|$")


def modules(root: Path) -> set[str]:
    """Every module as the page names it: a file by its path, a subpackage by its directory
    with a trailing slash (its __init__.py); the top packages are the page's headings."""
    out = set()
    for top in PACKAGES:
        for path in (root / top).rglob("*.py"):
            rel = path.relative_to(root).as_posix()
            if path.name != "__init__.py":
                out.add(rel)
            elif path.parent != root / top:
                out.add(rel[: -len("__init__.py")])
    return out


def listed(page: str) -> dict[str, str]:
    """The module rows of the page: name -> what it says it is for."""
    rows = {}
    for line in page.splitlines():
        m = ROW.match(line)
        if m and m.group(1).startswith(tuple(f"{top}/" for top in PACKAGES)):
            rows[m.group(1)] = m.group(2).strip()
    return rows


def layout_problems(root: Path) -> list[str]:
    rows = listed((root / "docs" / "layout.md").read_text(encoding="utf-8"))
    have = modules(root)
    problems = [f"{name}: a module docs/layout.md does not list" for name in sorted(have - rows.keys())]
    problems += [f"{name}: listed in docs/layout.md, but there is no such module" for name in sorted(rows.keys() - have)]
    problems += [f"{name}: listed with no description" for name, text in sorted(rows.items()) if not text]
    return problems


def test_the_layout_page_lists_every_module_and_only_those() -> None:
    assert layout_problems(ROOT) == []


@pytest.fixture
def copy_of_layout(tmp_path: Path) -> Path:
    """The page and the packages' file names (empty files suffice: only names are read)."""
    for rel in modules(ROOT):
        target = tmp_path / (rel + "__init__.py" if rel.endswith("/") else rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "layout.md").write_text((ROOT / "docs" / "layout.md").read_text(encoding="utf-8"))
    return tmp_path


def test_a_new_module_missing_from_the_page_is_named(copy_of_layout: Path) -> None:
    (copy_of_layout / "chaos" / "brand_new.py").touch()
    assert layout_problems(copy_of_layout) == ["chaos/brand_new.py: a module docs/layout.md does not list"]


def test_a_removed_module_still_listed_is_named(copy_of_layout: Path) -> None:
    (copy_of_layout / "trainer" / "wire.py").unlink()
    assert layout_problems(copy_of_layout) == ["trainer/wire.py: listed in docs/layout.md, but there is no such module"]


def test_a_row_without_a_description_is_named(copy_of_layout: Path) -> None:
    page = copy_of_layout / "docs" / "layout.md"
    text = page.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `faults/kinds.py` |"))
    page.write_text(text.replace(row, "| `faults/kinds.py` |  |"))
    assert layout_problems(copy_of_layout) == ["faults/kinds.py: listed with no description"]
