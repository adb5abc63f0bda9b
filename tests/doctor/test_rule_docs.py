"""Every rule documents itself in the ruff style; its Example fires and its Use-instead stays silent; the
pages in docs/rules/ and the rules table of docs/doctor.md are generated from the classes and up to date."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainwise.doctor.docs import SECTIONS, TABLE_BEGIN, TABLE_END, code_blocks, main, stale, write
from trainwise.doctor.engine import Config, check_source
from trainwise.doctor.rule import FixAvailability
from trainwise.doctor.rules import all_rules

EVERY_RULE = Config(select=("ALL",))  # the 4xx rules, off by default, are checked too

RULES = [r for r in all_rules() if r.code != "TW900"]
DOCS = Path(__file__).resolve().parents[2] / "docs" / "rules"
DOCTOR_PAGE = DOCS.parent / "doctor.md"


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
        assert not [f for f in check_source(example, config=EVERY_RULE) if f.code == rule.code]
        return
    found = [f.code for f in check_source(example, config=EVERY_RULE) if f.code == rule.code]
    assert found, f"{rule.code} Example does not fire"
    for block in use_instead:
        fired = [f for f in check_source(block, config=EVERY_RULE) if f.code == rule.code]
        assert not fired, f"{rule.code} Use instead fires"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_fixable_example_fix_matches_declaration(rule):
    (example,) = code_blocks(rule, "Example")
    findings = [f for f in check_source(example, config=EVERY_RULE) if f.code == rule.code]
    has_fix = any(f.fix is not None for f in findings)
    assert has_fix == (rule.fix_availability is not FixAvailability.NONE)
    for f in findings:
        if f.fix is not None:
            assert f.fix.safe == rule.fix_safe


def test_committed_docs_are_up_to_date():
    assert stale(DOCS, DOCTOR_PAGE) == [], "run: python -m trainwise.doctor.docs"
    assert main([str(DOCS), "--check"]) == 0  # the page beside the folder, docs/doctor.md, by default


def test_doctor_page_lists_every_rule():
    text = DOCTOR_PAGE.read_text(encoding="utf-8")
    table = text[text.index(TABLE_BEGIN) : text.index(TABLE_END)]
    for rule in all_rules():
        finds = rule.summary() + ("" if rule.default_enabled else " Off by default (`--select` it).")
        assert f"| [{rule.code}](rules/{rule.code}.md) | {rule.name} | {finds} |" in table, rule.code


def _docs_copy(tmp_path: Path) -> tuple[Path, Path]:
    folder, page = tmp_path / "docs" / "rules", tmp_path / "docs" / "doctor.md"
    page.parent.mkdir()
    page.write_text(f"# Doctor\n\nHand-written.\n\n{TABLE_BEGIN}\nold table\n{TABLE_END}\n\nMore prose.\n",
                    encoding="utf-8")
    return folder, page


def test_plain_run_writes_the_table_between_the_markers_and_keeps_the_prose(tmp_path, capsys):
    folder, page = _docs_copy(tmp_path)
    assert main([str(folder), "--check"]) == 1
    assert f"{page} is out of date" in capsys.readouterr().err
    assert main([str(folder)]) == 0
    text = page.read_text(encoding="utf-8")
    assert text.startswith(f"# Doctor\n\nHand-written.\n\n{TABLE_BEGIN}\n| code | name | finds | fix |\n")
    assert text.endswith(f"|\n{TABLE_END}\n\nMore prose.\n") and "old table" not in text
    assert text.count("| [TW") == len(all_rules()) and "(rules/TW101.md)" in text
    assert main([str(folder), "--check"]) == 0 and stale(folder, page) == []
    page.write_text(text.replace("| no |", "| always |", 1), encoding="utf-8")  # a hand edit of the table
    assert stale(folder, page) == [str(page)]


def test_table_links_follow_the_page(tmp_path):
    folder, _ = _docs_copy(tmp_path)
    page = tmp_path / "elsewhere.md"
    page.write_text(f"{TABLE_BEGIN}\n{TABLE_END}\n", encoding="utf-8")
    write(folder, page)
    assert "(docs/rules/TW101.md)" in page.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "content", ["no markers\n", f"{TABLE_END}\n{TABLE_BEGIN}\n", f"{TABLE_BEGIN}\n{TABLE_BEGIN}\n{TABLE_END}\n"]
)
def test_page_without_its_markers_is_refused_and_nothing_is_written(tmp_path, capsys, content):
    folder, page = _docs_copy(tmp_path)
    page.write_text(content, encoding="utf-8")
    assert main([str(folder), "--check"]) == 1
    assert main([str(folder)]) == 1
    err = capsys.readouterr().err
    assert "could not write the rules table" in err and "Traceback" not in err
    assert page.read_text(encoding="utf-8") == content and not folder.exists()


def test_missing_page_is_reported(tmp_path, capsys):
    folder = tmp_path / "rules"
    assert main([str(folder), "--page", str(tmp_path / "nope.md")]) == 1
    assert "could not write the rules table" in capsys.readouterr().err
    write(folder)
    assert stale(folder) == [] and stale(folder, tmp_path / "nope.md") == [str(tmp_path / "nope.md")]
