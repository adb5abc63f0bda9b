"""CI runs every test: ``make test`` runs the tests not marked slow, ``make test-slow`` the others, and
``.ci/run`` runs both targets (a test left out of both would never run anywhere)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _recipe(target: str) -> list[str]:
    """The command lines of ``target`` in the Makefile."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(n for n, line in enumerate(lines) if re.match(rf"{re.escape(target)}:", line))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return recipe


def _pytest_markers(target: str) -> list[str]:
    """The ``-m`` expression of each pytest command of ``target`` (``""`` for a pytest run without one)."""
    found = []
    for line in _recipe(target):
        if "-m pytest" in line:
            match = re.search(r"""-m pytest .*?-m ("[^"]+"|\S+)""", line)
            found.append(match.group(1).strip('"') if match else "")
    return found


def test_make_test_and_make_test_slow_split_the_suite_by_the_slow_marker():
    assert _pytest_markers("test") == ["not slow"]
    assert _pytest_markers("test-slow") == ["slow"]


def test_ci_runs_both_halves_of_the_suite():
    commands = [line.split("#")[0].strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "make test" in commands and "make test-slow" in commands
    assert "set -euo pipefail" in commands  # a failing first half fails CI
