"""The doctor's specification: each fixture under fixtures/<CODE>/ fires on exactly the marked lines
(``fires_*``), stays silent (``silent_*``), and fixable findings give the ``*.fixed.py`` output. A folder
fixture is a project checked as one run: its findings across files name the lines marked ``# related:``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainwise.doctor.engine import Config, check_file, check_paths, check_source
from trainwise.doctor.rules import all_rules, rule_for

from ._fixtures import FIXTURES, RELATED, expected_lines, fixture_files, fixture_id, fixture_projects

# Every rule runs on the fixtures, the 4xx ones that are off by default too (each fixture checks its own code).
EVERY_RULE = Config(select=("ALL",))

PY_FIXTURES = fixture_files("TW*/*.py")
NOTEBOOKS = fixture_files("TW*/*.ipynb")


def test_every_rule_has_fixtures():
    for rule in all_rules():
        if rule.code == "TW900" or rule.runtime_only:  # runtime-only: tested in tests/guards
            continue
        folder = FIXTURES / rule.code
        assert list(folder.glob("fires_*")), f"{rule.code} has no fires_* fixture"
        assert list(folder.glob("silent_*")), f"{rule.code} has no silent_* fixture"


@pytest.mark.parametrize("path", PY_FIXTURES, ids=fixture_id)
def test_python_fixture(path: Path):
    source = path.read_text(encoding="utf-8")
    code = path.parent.name
    expected = expected_lines(source)
    if path.name.startswith("silent_"):
        assert code not in expected, "a silent_ fixture must not expect its own rule"
    else:
        assert expected.get(code), "a fires_ fixture must mark at least one line with # expect: " + code
    findings = check_source(source, str(path), config=EVERY_RULE)
    assert not [f for f in findings if f.code == "TW900"], findings
    for checked in {code, *expected}:
        got = sorted(f.line for f in findings if f.code == checked)
        assert got == sorted(expected.get(checked, ())), (
            f"{checked}: reported on lines {got}, expected {sorted(expected.get(checked, ()))}:\n"
            + "\n".join(f"  {f.line}: {f.message}" for f in findings if f.code == checked)
        )


@pytest.mark.parametrize("folder", fixture_projects(), ids=fixture_id)
def test_project_fixture(folder: Path):
    """A folder checked as one run: exactly the marked lines of every file, and each finding of the folder's
    code that names another place names a line marked ``# related:`` (all of them, between the findings)."""
    code = folder.parent.name
    expected: dict[str, set[tuple[str, int]]] = {}
    related: set[tuple[str, int]] = set()
    for path in sorted(folder.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        name = path.relative_to(folder).as_posix()
        for marked, lines in expected_lines(source).items():
            expected.setdefault(marked, set()).update((name, line) for line in lines)
        related |= {(name, line) for line in expected_lines(source, RELATED).get(code, ())}
    if folder.name.startswith("silent_"):
        assert code not in expected, "a silent_ fixture must not expect its own rule"
    else:
        assert expected.get(code), "a fires_ fixture must mark at least one line with # expect: " + code
    findings = [f for result in check_paths([str(folder)], EVERY_RULE) for f in result.findings]
    assert not [f for f in findings if f.code == "TW900"], findings

    def rel(path: str) -> str:
        return Path(path).resolve().relative_to(folder.resolve()).as_posix()

    for checked in {code, *expected}:
        got = sorted((rel(f.path), f.line) for f in findings if f.code == checked)
        assert got == sorted(expected.get(checked, ())), "\n".join(
            f"  {rel(f.path)}:{f.line}: {f.message}" for f in findings if f.code == checked)
    named = {(rel(r.path), r.line) for f in findings if f.code == code for r in f.related}
    assert named == related, f"related places {sorted(named)}, marked {sorted(related)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=fixture_id)
def test_notebook_fixture(path: Path):
    code = path.parent.name
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    expected = set()
    for number, cell in enumerate(cells, start=1):
        text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        for line in expected_lines(text).get(code, ()):
            expected.add((number, line))
    result = check_file(str(path), EVERY_RULE)
    got = {(f.cell, f.line) for f in result.findings if f.code == code}
    assert got == expected
    assert not [f for f in result.findings if f.code == "TW900"]


FIXABLE = [p for p in PY_FIXTURES if p.with_name(p.stem + ".fixed.py").exists()]


@pytest.mark.parametrize("path", FIXABLE, ids=fixture_id)
def test_fixed_output(path: Path):
    from trainwise.doctor.fix import apply_fixes

    code = path.parent.name
    source = path.read_text(encoding="utf-8")
    findings = [f for f in check_source(source, str(path), config=EVERY_RULE) if f.code == code]
    fixes = [f.fix for f in findings if f.fix is not None]
    assert fixes, "a fixture with a .fixed.py must have fixable findings"
    fixed, applied = apply_fixes(source, fixes)
    assert applied == len(fixes)
    assert fixed == path.with_name(path.stem + ".fixed.py").read_text(encoding="utf-8")
    # after the fix, the rule is silent on the lines it fixed
    remaining = [f for f in check_source(fixed, str(path), config=EVERY_RULE) if f.code == code]
    assert all(f.fix is None for f in remaining), remaining


def test_fixable_rules_have_fixed_fixtures():
    for rule in all_rules():
        if rule.fix_availability.value != "none":
            assert list((FIXTURES / rule.code).glob("*.fixed.py")), f"{rule.code} has no *.fixed.py fixture"
    assert rule_for("tw101") is not None
