"""Engine: noqa, select/ignore, configuration, discovery (.gitignore, skipped folders), notebooks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trainwise.doctor.engine import Config, check_paths, check_source, discover, load_config, parse_codes
from trainwise.errors import TrainwiseError

BUGGY = """\
import torch
sd = torch.load("a.pt")
model.load_state_dict(sd, strict=False)
"""


def codes(findings):
    return [(f.line, f.code) for f in findings]


def test_check_source_reports_both_rules():
    assert codes(check_source(BUGGY)) == [(2, "TW301"), (3, "TW302")]


@pytest.mark.parametrize(
    ("comment", "kept"),
    [
        ("  # noqa: TW301", []),
        ("  # noqa", []),
        ("  # NOQA:TW301,TW302", []),
        ("  # noqa: TW302", ["TW301"]),
        ("  # noqa: TW3", ["TW301"]),  # prefixes are not codes
    ],
)
def test_noqa(comment, kept):
    source = f'import torch\nsd = torch.load("a.pt"){comment}\n'
    assert [f.code for f in check_source(source)] == kept


def test_select_and_ignore_by_code_and_prefix():
    assert codes(check_source(BUGGY, config=Config(select=("TW301",)))) == [(2, "TW301")]
    assert codes(check_source(BUGGY, config=Config(select=("TW3",), ignore=("TW301",)))) == [(3, "TW302")]
    assert codes(check_source(BUGGY, config=Config(ignore=("TW3",)))) == []
    assert codes(check_source(BUGGY, config=Config(select=("ALL",)))) == [(2, "TW301"), (3, "TW302")]


BF16_SCALED = """import torch
scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
"""


def test_performance_rules_run_only_when_selected(tmp_path):
    """4xx codes are off by default: `--select` (or `select` in pyproject) must name them, by code, by prefix or ALL;
    a selection of other codes leaves them off."""
    assert codes(check_source(BF16_SCALED)) == []
    assert codes(check_source(BF16_SCALED, config=Config(select=("TW1",)))) == []
    for select in ("TW401", "TW4", "ALL"):
        assert codes(check_source(BF16_SCALED, config=Config(select=(select,)))) == [(6, "TW401")]
    assert codes(check_source(BF16_SCALED, config=Config(select=("TW4",), ignore=("TW401",)))) == []
    (tmp_path / "pyproject.toml").write_text('[tool.trainwise.doctor]\nselect = ["TW1", "TW4"]\n', encoding="utf-8")
    assert codes(check_source(BF16_SCALED, config=load_config(tmp_path))) == [(6, "TW401")]


def test_parse_codes_rejects_unknown():
    assert parse_codes(["TW1,tw301", " TW3 "], option="--select") == ("TW1", "TW301", "TW3")
    with pytest.raises(TrainwiseError, match="matches no rule"):
        parse_codes(["TW999"], option="--select")
    with pytest.raises(TrainwiseError):
        parse_codes(["E501"], option="--ignore")


def test_config_from_pyproject(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.trainwise.doctor]\nselect = ["TW3"]\nignore = ["TW302"]\n'
        'exclude = ["legacy/"]\nunsafe-fixes = true\n'
    )
    sub = tmp_path / "src"
    sub.mkdir()
    config = load_config(sub)
    assert config == Config(select=("TW3",), ignore=("TW302",), exclude=("legacy/",), unsafe_fixes=True)


@pytest.mark.parametrize(
    "body",
    ['bogus = 1', 'select = "TW1"', 'select = ["TW999"]', 'unsafe-fixes = "yes"'],
)
def test_bad_config_is_a_user_error(tmp_path, body):
    (tmp_path / "pyproject.toml").write_text(f"[tool.trainwise.doctor]\n{body}\n")
    with pytest.raises(TrainwiseError):
        load_config(tmp_path)


def test_no_config_means_defaults(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.ruff]\nline-length = 100\n')
    assert load_config(tmp_path) == Config()


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_discovery_skips_venvs_build_git_and_gitignored(tmp_path, monkeypatch):
    _tree(
        tmp_path,
        {
            "train.py": "",
            "nb.ipynb": '{"cells": []}',
            "notes.txt": "",
            "pkg/model.py": "",
            ".venv/lib/x.py": "",
            "venv/y.py": "",
            "build/z.py": "",
            ".git/hooks/h.py": "",
            "lib/site-packages/s.py": "",
            "generated/out.py": "",
            "pkg/secret_local.py": "",
            "pkg/keep_local.py": "",
            "data/deep/gen.py": "",
            ".gitignore": "# generated code\ngenerated/\n*_local.py\n!keep_local.py\n/data/**/gen.py\n",
        },
    )
    monkeypatch.chdir(tmp_path)
    files, errors = discover(["."])
    assert files == ["nb.ipynb", "pkg/keep_local.py", "pkg/model.py", "train.py"]
    assert errors == []
    # an explicitly named file is always checked
    assert discover(["generated/out.py"])[0] == ["generated/out.py"]
    # exclude patterns from the configuration
    assert discover(["."], exclude=["pkg/"])[0] == ["nb.ipynb", "train.py"]


def test_gitignore_of_the_repository_root_applies_to_a_subfolder(tmp_path, monkeypatch):
    _tree(tmp_path, {".git/HEAD": "", ".gitignore": "ignored/\n", "src/ignored/a.py": "", "src/b.py": ""})
    monkeypatch.chdir(tmp_path)
    assert discover(["src"])[0] == [os.path.join("src", "b.py")]


def test_missing_path_is_tw900_and_others_still_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.py").write_text(BUGGY)
    results = check_paths(["missing.py", "ok.py"])
    assert [(r.path, [f.code for f in r.findings]) for r in results] == [
        ("missing.py", ["TW900"]),
        ("ok.py", ["TW301", "TW302"]),
    ]


def test_notebook_cells_lines_and_broken_cell(tmp_path):
    notebook = {
        "cells": [
            {"cell_type": "markdown", "source": ["# title"]},
            {"cell_type": "code", "source": ["import torch\n", "!nvidia-smi\n"]},
            {"cell_type": "code", "source": "for x in loader\n    pass"},
            {"cell_type": "code", "source": ["x = 1\n", "sd = torch.load('a.pt')\n"]},
        ]
    }
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(notebook))
    (result,) = check_paths([str(path)])
    assert [(f.code, f.cell, f.line) for f in result.findings] == [("TW900", 3, 1), ("TW301", 4, 2)]
    assert result.findings[1].to_dict()["cell"] == 4
    assert not result.findings[1].fixable  # notebooks are reported, not rewritten


@pytest.mark.parametrize("text", ["not json", '{"cells": 3}', "[1, 2]"])
def test_invalid_notebook_is_tw900(tmp_path, text):
    path = tmp_path / "bad.ipynb"
    path.write_text(text)
    (result,) = check_paths([str(path)])
    assert [f.code for f in result.findings] == ["TW900"]


def test_columns_count_characters_not_bytes():
    (finding,) = check_source('import torch\ntitre = "é"; sd = torch.load("a.pt")\n')
    assert (finding.line, finding.column) == (2, 19)  # 20 if counted in bytes
