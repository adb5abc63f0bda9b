"""The doctor's specification: each fixture under fixtures/<CODE>/ fires on exactly the marked lines
(``fires_*``), stays silent (``silent_*``), and fixable findings give the ``*.fixed.py`` output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainwise.doctor.engine import check_file, check_source
from trainwise.doctor.rules import all_rules, rule_for

from ._fixtures import FIXTURES, expected_lines, fixture_files, fixture_id

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
    findings = check_source(source, str(path))
    assert not [f for f in findings if f.code == "TW900"], findings
    for checked in {code, *expected}:
        got = sorted(f.line for f in findings if f.code == checked)
        assert got == sorted(expected.get(checked, ())), (
            f"{checked}: reported on lines {got}, expected {sorted(expected.get(checked, ()))}:\n"
            + "\n".join(f"  {f.line}: {f.message}" for f in findings if f.code == checked)
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=fixture_id)
def test_notebook_fixture(path: Path):
    code = path.parent.name
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    expected = set()
    for number, cell in enumerate(cells, start=1):
        text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        for line in expected_lines(text).get(code, ()):
            expected.add((number, line))
    result = check_file(str(path))
    got = {(f.cell, f.line) for f in result.findings if f.code == code}
    assert got == expected
    assert not [f for f in result.findings if f.code == "TW900"]


FIXABLE = [p for p in PY_FIXTURES if p.with_name(p.stem + ".fixed.py").exists()]


@pytest.mark.parametrize("path", FIXABLE, ids=fixture_id)
def test_fixed_output(path: Path):
    from trainwise.doctor.fix import apply_fixes

    code = path.parent.name
    source = path.read_text(encoding="utf-8")
    findings = [f for f in check_source(source, str(path)) if f.code == code]
    fixes = [f.fix for f in findings if f.fix is not None]
    assert fixes, "a fixture with a .fixed.py must have fixable findings"
    fixed, applied = apply_fixes(source, fixes)
    assert applied == len(fixes)
    assert fixed == path.with_name(path.stem + ".fixed.py").read_text(encoding="utf-8")
    # after the fix, the rule is silent on the lines it fixed
    remaining = [f for f in check_source(fixed, str(path)) if f.code == code]
    assert all(f.fix is None for f in remaining), remaining


def test_fixable_rules_have_fixed_fixtures():
    for rule in all_rules():
        if rule.fix_availability.value != "none":
            assert list((FIXTURES / rule.code).glob("*.fixed.py")), f"{rule.code} has no *.fixed.py fixture"
    assert rule_for("tw101") is not None
