"""Reading doctor fixtures: expected findings are marked inline with a trailing ``# expect: TW101`` comment.

A fixture may be a folder (``fixtures/TW108/fires_helper_in_utils/``): a small project checked as one run
(``train.py``, ``utils/``, ``eval.py``), whose files carry the same ``# expect:`` marks, and ``# related: TW108``
on each line a finding across files must name as a related place."""

from __future__ import annotations

import re
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
EXPECT = re.compile(r"#\s*expect:\s*(?P<codes>TW\d{3}(?:\s*,\s*TW\d{3})*)")
RELATED = re.compile(r"#\s*related:\s*(?P<codes>TW\d{3}(?:\s*,\s*TW\d{3})*)")


def expected_lines(source: str, marker: re.Pattern[str] = EXPECT) -> dict[str, set[int]]:
    """code -> lines that must be reported with that code (with ``RELATED``: named as related places)."""
    out: dict[str, set[int]] = {}
    for number, line in enumerate(source.splitlines(), start=1):
        match = marker.search(line)
        if match:
            for code in re.split(r"\s*,\s*", match.group("codes")):
                out.setdefault(code, set()).add(number)
    return out


def fixture_files(pattern: str) -> list[Path]:
    """Fixture files matching a glob under fixtures/<CODE>/, expected outputs (``*.fixed.py``) left out."""
    return sorted(p for p in FIXTURES.glob(pattern) if not p.name.endswith(".fixed.py"))


def fixture_id(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def fixture_projects() -> list[Path]:
    """Folder fixtures: ``fixtures/<CODE>/fires_*/`` and ``silent_*/``, each a project checked as one run."""
    return sorted(p for p in FIXTURES.glob("TW*/*") if p.is_dir() and p.name.startswith(("fires_", "silent_")))
