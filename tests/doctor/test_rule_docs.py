"""Every rule documents itself in the ruff style; its Example fires and its Use-instead stays silent; the
pages in docs/rules/ are generated from the classes and up to date."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainwise.doctor.docs import SECTIONS, code_blocks, stale
from trainwise.doctor.engine import check_source
from trainwise.doctor.rule import FixAvailability
from trainwise.doctor.rules import all_rules

RULES = [r for r in all_rules() if r.code != "TW900"]
DOCS = Path(__file__).resolve().parents[2] / "docs" / "rules"


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.code)
def test_rule_metadata_and_sections(rule):
    assert re.fullmatch(r"TW\d{3}", rule.code)
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)+", rule.name), rule.name
    assert rule.summary() and rule.message
    headings = re.findall(r"^## (.+)$", rule.documentation(), flags=re.M)
    assert headings == list(SECTIONS), headings
    module = rule.__module__.rsplit(".", 1)[1]
    assert module == f"{rule.code.lower()}_{rule.name.replace('-', '_')}", "one file per rule, named after it"


def test_codes_and_names_are_unique():
    assert len({r.code for r in all_rules()}) == len(all_rules())
    assert len({r.name for r in all_rules()}) == len(all_rules())


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_example_fires_and_use_instead_is_silent(rule):
    (example,) = code_blocks(rule, "Example")
    use_instead = code_blocks(rule, "Use instead")
    assert use_instead
    if rule.runtime_only:  # found by trainwise.guard while the run goes (tests/guards), never statically
        assert not [f for f in check_source(example) if f.code == rule.code]
        return
    assert [f.code for f in check_source(example) if f.code == rule.code], f"{rule.code} Example does not fire"
    for block in use_instead:
        assert not [f for f in check_source(block) if f.code == rule.code], f"{rule.code} Use instead fires"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_fixable_example_fix_matches_declaration(rule):
    (example,) = code_blocks(rule, "Example")
    findings = [f for f in check_source(example) if f.code == rule.code]
    has_fix = any(f.fix is not None for f in findings)
    assert has_fix == (rule.fix_availability is not FixAvailability.NONE)
    for f in findings:
        if f.fix is not None:
            assert f.fix.safe == rule.fix_safe


def test_committed_docs_are_up_to_date():
    assert stale(DOCS) == [], "run: python -m trainwise.doctor.docs"
