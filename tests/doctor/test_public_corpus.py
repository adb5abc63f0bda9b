"""The doctor measured on public training code (issue 15): recall and false alarms per code.

``corpus/`` holds short verbatim excerpts of public repositories (tutorials, course notebooks, paper
repositories), each with a header naming the repository, commit, path and licence; ``corpus/INDEX.json``
lists every case with its source line and why it is, or is not, a bug. In the excerpts:

- ``# expect: TWxxx``  a real bug, checked by hand, that the doctor must report on that line (recall);
- ``# silent: TWxxx``  a look-alike: code that resembles the bug but is correct (a report is a false alarm);
- ``# latent: TWxxx``  the pattern is there but has no effect in that program (a report is neither).

Any other finding on any line counts as a false alarm too. Each repository's excerpts are checked together, as
one run, so that a finding may cross files (a helper of one file called from another). Run with ``-s`` to see
the table:

    .venv/bin/python -m pytest tests/doctor/test_public_corpus.py -s

The floors below are what the doctor reached when the corpus was built. They are floors to raise as the
rules improve (never to lower to make a change pass): when a rule starts finding a missed case, or stops a
false alarm, raise the floor to the new value.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from trainwise.doctor.engine import Config, check_sources

CORPUS = Path(__file__).parent / "corpus"
MARK = re.compile(r"#\s*(?P<tag>expect|silent|latent):\s*(?P<code>TW\d{3})\b")
# Every rule runs, the 4xx ones that are off by default too (TW401 has cases in the corpus).
EVERY_RULE = Config(select=("ALL",))

# Floors measured on this corpus (see docs/doctor.md, "Measured on public code"). Raise them, never lower them.
# Measured after the TW102-TW110 changes of issue 15: 31 of 31 real bugs found and no false alarm (the last one,
# TW104 on jaidedai-easyocr/trainer/test.py:48, is gone: its caller wraps it in no_grad), so precision 31 / 31.
# Issue 29 added 11 multi-file repositories (60 cases, 31 real bugs) and one bug found in an old excerpt: 63 of 63
# real bugs found, no false alarm. Before that issue's last rule changes the new repositories gave 27 of 31
# (the four graph-network TW104 were missed) and two false alarms (TW114 on pytorch-semseg, TW103 on StarGAN).
# Four more repositories were then read with the rules frozen (held out: ViT-pytorch, ssd.pytorch,
# 3D-ResNets-PyTorch, unet-pytorch): 12 of 12 real bugs found, none of their 9 look-alikes reported.
# Over the corpus: 75 of 75; a single false alarm gives 75 / 76 = 0.99 and fails the floor.
# Issue 30 added 6 repositories and cases in pytorch/examples, nanoGPT and the Zero to Mastery course for TW114-TW117
# and TW401 (4 real bugs of these codes, one TW301, 16 look-alikes). Three real bugs are missed and stay marked as
# bugs so that recall is honest: they are listed in KNOWN_MISSES, and any other miss fails the recall test whatever
# the ratio. 77 of 80.
RECALL_FLOOR = 0.97  # 78 of 80 real bugs found
PRECISION_FLOOR = 1.00  # 78 findings, all on marked bugs: no false alarm
# Real bugs the rules do not find (docs/doctor.md, TW114-TW117/TW401 section): V-JEPA 2 and SAM 2 pick bfloat16 from
# their configs at run time (and V-JEPA 2 builds its GradScaler in another file, SAM 2 switches it with a flag).
# Remove an entry when a rule starts finding it. (pytorch/examples' trace of a pretrained ResNet it never trains,
# the third miss at first, is found since TW117 knows models built with BatchNorm: 78 of 80.)
KNOWN_MISSES = {
    "facebookresearch-vjepa2/app/vjepa/train.py:75 TW401",
    "facebookresearch-sam2/training/trainer.py:70 TW401",
}


def corpus_files() -> list[Path]:
    return sorted(CORPUS.rglob("*.py"))


def marks(source: str) -> dict[str, set[tuple[int, str]]]:
    """tag -> {(line, code)} from the ``# expect:``/``# silent:``/``# latent:`` comments."""
    out: dict[str, set[tuple[int, str]]] = {"expect": set(), "silent": set(), "latent": set()}
    for number, line in enumerate(source.splitlines(), start=1):
        for match in MARK.finditer(line):
            out[match.group("tag")].add((number, match.group("code")))
    return out


def measure() -> dict:
    """Run the doctor over the corpus; sort every expected case and every finding."""
    rows: dict[str, Counter] = {}
    missed, false_alarms = [], []
    independent = {(c["file"], c["line"], c["code"]) for c in index()["cases"]
                   if c["kind"] == "finding" and c["found_by"] == "independent"}
    blind = Counter()
    sources = {path.relative_to(CORPUS).as_posix(): path.read_text(encoding="utf-8") for path in corpus_files()}
    repositories: dict[str, dict[str, str]] = {}
    for name, source in sources.items():
        repositories.setdefault(name.split("/", 1)[0], {})[name] = source
    checked = {name: found for files in repositories.values()
               for name, found in check_sources(files, config=EVERY_RULE).items()}
    for name, source in sources.items():
        marked = marks(source)
        findings = checked[name]
        assert not [f for f in findings if f.code == "TW900"], (name, findings)
        got = {(f.line, f.code) for f in findings}
        messages = {(f.line, f.code): f.message for f in findings}
        for line, code in marked["expect"]:
            row = rows.setdefault(code, Counter())
            row["expected"] += 1
            if (name, line, code) in independent:
                blind["expected"] += 1
                blind["found"] += (line, code) in got
            if (line, code) in got:
                row["found"] += 1
            else:
                missed.append(f"{name}:{line} {code}")
        for _line, code in marked["silent"]:
            rows.setdefault(code, Counter())["lookalikes"] += 1
        for line, code in marked["latent"]:
            row = rows.setdefault(code, Counter())
            row["latent"] += 1
            row["latent reported"] += (line, code) in got
        for line, code in sorted(got - marked["expect"] - marked["latent"]):
            row = rows.setdefault(code, Counter())
            row["false alarms"] += 1
            row["on look-alikes"] += (line, code) in marked["silent"]
            false_alarms.append(f"{name}:{line} {code} {messages[(line, code)]}")
    total = sum(rows.values(), Counter())
    found, expected, alarms = total["found"], total["expected"], total["false alarms"]
    return {
        "rows": rows, "total": total, "missed": missed, "false_alarms": false_alarms, "blind": blind,
        "recall": found / expected if expected else 1.0,
        "precision": found / (found + alarms) if found + alarms else 1.0,
    }


COLUMNS = ("expected", "found", "recall", "false alarms", "on look-alikes", "lookalikes", "latent",
           "latent reported")


def table(result: dict) -> str:
    def cells(row: Counter) -> list[str]:
        recall = f"{row['found'] / row['expected']:.2f}" if row["expected"] else "-"
        return [str(row[c]) if c != "recall" else recall for c in COLUMNS]

    lines = ["| code | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for code in sorted(result["rows"]):
        lines.append(f"| {code} | " + " | ".join(cells(result["rows"][code])) + " |")
    lines.append("| all | " + " | ".join(cells(result["total"])) + " |")
    blind = result["blind"]
    lines.append(f"recall {result['recall']:.2f}, precision {result['precision']:.2f}; recall on the bugs found "
                 f"without the doctor's help: {blind['found']}/{blind['expected']}")
    lines += [f"missed: {m}" for m in result["missed"]]
    lines += [f"false alarm: {m}" for m in result["false_alarms"]]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def result() -> dict:
    measured = measure()
    print("\n" + table(measured))
    return measured


def test_recall_floor(result):
    assert result["recall"] >= RECALL_FLOOR, (
        f"recall on public code fell to {result['recall']:.2f} (floor {RECALL_FLOOR}); newly missed:\n"
        + "\n".join(result["missed"]))
    assert set(result["missed"]) <= KNOWN_MISSES, "newly missed:\n" + "\n".join(
        sorted(set(result["missed"]) - KNOWN_MISSES))


def test_precision_floor(result):
    assert result["precision"] >= PRECISION_FLOOR, (
        f"precision on public code is {result['precision']:.2f} (floor {PRECISION_FLOOR}); false alarms:\n"
        + "\n".join(result["false_alarms"]))


# ------------------------------------------------------------------------------------------------ the corpus itself
def index() -> dict:
    return json.loads((CORPUS / "INDEX.json").read_text(encoding="utf-8"))


def test_index_lists_every_marked_line_and_nothing_else():
    listed = {(c["file"], c["line"], c["code"], c["kind"]) for c in index()["cases"]}
    kind = {"expect": "finding", "silent": "lookalike", "latent": "latent"}
    marked = set()
    for path in corpus_files():
        name = path.relative_to(CORPUS).as_posix()
        for tag, pairs in marks(path.read_text(encoding="utf-8")).items():
            marked |= {(name, line, code, kind[tag]) for line, code in pairs}
    assert listed == marked


def test_every_case_names_its_source():
    data = index()
    for case in data["cases"]:
        assert case["repository"] in data["repositories"], case
        assert re.fullmatch(r"[0-9a-f]{40}", case["commit"]), case
        assert case["why"] and case["source_code"] and case["found_by"] in {"independent", "doctor"}, case
    for path in corpus_files():
        head = path.read_text(encoding="utf-8").splitlines()[:5]
        assert any(line.startswith("# Source: https://github.com/") for line in head), path
        assert any(line.startswith("# Licence: ") for line in head), path


def test_corpus_size_meets_the_issue():
    data = index()
    kinds = Counter(c["kind"] for c in data["cases"])
    assert len(data["repositories"]) >= 40
    assert kinds["finding"] >= 80
    assert kinds["lookalike"] >= 93
    # Issue 30: the registration, compile, NumPy-sharing, export-mode and bf16 codes have cases.
    codes = Counter(c["code"] for c in data["cases"])
    assert all(codes[code] >= 2 for code in ("TW114", "TW115", "TW116", "TW117", "TW401")), codes
    # Issue 29: at least ten repositories laid out as projects, checked as one run of several files.
    folders = Counter(path.relative_to(CORPUS).parts[0] for path in corpus_files())
    assert sum(1 for count in folders.values() if count >= 2) >= 10
