"""Reading doctor fixtures: expected findings are marked inline with a trailing ``# expect: TW101`` comment."""

from __future__ import annotations

import re
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
EXPECT = re.compile(r"#\s*expect:\s*(?P<codes>TW\d{3}(?:\s*,\s*TW\d{3})*)")


def expected_lines(source: str) -> dict[str, set[int]]:
    """code -> lines that must be reported with that code."""
    out: dict[str, set[int]] = {}
    for number, line in enumerate(source.splitlines(), start=1):
        match = EXPECT.search(line)
        if match:
            for code in re.split(r"\s*,\s*", match.group("codes")):
                out.setdefault(code, set()).add(number)
    return out


def fixture_files(pattern: str) -> list[Path]:
    """Fixture files matching a glob under fixtures/<CODE>/, expected outputs (``*.fixed.py``) left out."""
    return sorted(p for p in FIXTURES.glob(pattern) if not p.name.endswith(".fixed.py"))


def fixture_id(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"
