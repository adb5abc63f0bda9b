"""docs/fundamentals.md, the table of the twelve fundamentals and their five faces, held to the registries: the
doctor's rules, the guards' checks, the labs, the public names of trainwise and the Trainer's options. A
fundamental that loses a face, a code that no longer exists, or a rule or guard that no row names fails here."""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path

import pytest

from trainwise.config import TrainerConfig
from trainwise.doctor.rules import all_rules, rule_for
from trainwise.guards.registry import all_check_classes
from trainwise.labs import all_labs, lab_for_code

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "fundamentals.md"
COLUMNS = ["#", "fundamental", "primitive", "Trainer", "doctor", "guard", "lab"]
# The fundamentals that have a runtime guard today: a row among them with an empty guard column lost a face.
GUARDED = {1, 2, 3, 4, 6, 7, 9, 12}
CODE = re.compile(r"TW\d{3}")


def _rows(text: str) -> dict[int, dict[str, str]]:
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == COLUMNS, header
    rows = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert len(cells) == len(COLUMNS), line
        row = dict(zip(COLUMNS, cells))
        number = int(row["#"])
        assert number not in rows, f"fundamental {number} has two rows"
        rows[number] = row
    return rows


ROWS = _rows(PAGE.read_text(encoding="utf-8"))


def _resolve(dotted: str) -> object:
    """``trainwise.move_to_device`` or ``trainwise.compiled.CompileWatch``: the object, importing modules."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attr in parts[split:]:
            value = getattr(value, attr)
        return value
    raise AssertionError(f"{dotted} is not importable")


def test_every_fundamental_has_one_row_in_order():
    assert list(ROWS) == list(range(1, 13))


@pytest.mark.parametrize("number", range(1, 13))
def test_each_row_has_its_faces(number):
    row = ROWS[number]
    primitives = re.findall(r"`(trainwise\.[\w.]+)`", row["primitive"])
    assert primitives, f"fundamental {number} names no primitive"
    for name in primitives:
        assert callable(_resolve(name)), name
    options = {f.name for f in dataclasses.fields(TrainerConfig)}
    named = re.findall(r"(?:Trainer\(|, )(\w+)=", row["Trainer"])
    assert row["Trainer"] not in ("", "—") and all(o in options for o in named), (number, named)
    doctor = CODE.findall(row["doctor"])
    assert doctor, f"fundamental {number} has no doctor rule"
    for code in doctor:
        rule = rule_for(code)
        assert rule is not None and not rule.runtime_only, f"{code} is not a rule the doctor runs on source"
        assert f"[{code}](rules/{code}.md)" in row["doctor"] and (ROOT / "docs" / "rules" / f"{code}.md").is_file()
    guards = CODE.findall(row["guard"])
    checks = {cls.code for cls in all_check_classes()}
    assert all(code in checks for code in guards), (number, guards)
    if number in GUARDED:
        assert guards, f"fundamental {number} lost its guard"
    else:
        assert row["guard"] == "—" or guards


@pytest.mark.parametrize("number", range(1, 13))
def test_each_row_names_its_lab_and_the_lab_names_the_rows_codes(number):
    row = ROWS[number]
    (name,) = re.findall(r"`([\w-]+)`", row["lab"])
    labs = {lab.name: lab for lab in all_labs()}
    assert name in labs, name
    lab = labs[name]
    assert lab.fundamental == number
    codes = set(CODE.findall(row["doctor"])) | set(CODE.findall(row["guard"]))
    assert lab.codes and set(lab.codes) <= codes, (lab.codes, codes)
    for code in CODE.findall(row["doctor"]):
        assert lab_for_code(code) in (None, lab), f"{code}'s lab is {lab_for_code(code).name}, not {name}"


def test_every_rule_and_every_guard_is_in_a_row():
    doctor = {c for row in ROWS.values() for c in CODE.findall(row["doctor"])}
    guards = {c for row in ROWS.values() for c in CODE.findall(row["guard"])}
    for rule in all_rules():
        if rule.code == "TW900":
            continue
        assert rule.code in (guards if rule.runtime_only else doctor), f"{rule.code} is in no row of {PAGE.name}"
    for cls in all_check_classes():
        assert cls.code in guards, f"guard {cls.code} is in no row of {PAGE.name}"


@pytest.mark.parametrize("lab", all_labs(), ids=lambda lab: lab.name)
def test_each_lab_names_codes_that_exist_and_each_codes_page_names_the_lab(lab):
    checks = {cls.code for cls in all_check_classes()}
    for code in lab.codes:
        rule = rule_for(code)
        assert rule is not None or code in checks, f"lab {lab.name} names {code}, which nothing reports"
        if rule is not None and lab_for_code(code) is lab:
            assert f"trainwise lab {lab.name}" in rule.documentation(), f"{code}'s page does not name its lab"
            page = (ROOT / "docs" / "rules" / f"{code}.md").read_text(encoding="utf-8")
            assert f"trainwise lab {lab.name}" in page
