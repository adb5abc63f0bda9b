"""``trainwise doctor``: formats, exit codes, --explain, --fix/--diff, and no torch import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainwise.cli import main

SCRIPT = """\
import torch
from torch.utils.data import DataLoader

loader = DataLoader(ds, batch_size=32)
correct = 0
for x, y in loader:
    correct += (model(x).argmax(1) == y).sum().item()
print(correct / len(loader))  # the accuracy
ckpt = torch.load("ckpt.pt",  map_location="cpu")
model.requires_grad = False
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "clean.py").write_text("print('hello')\n")
    return tmp_path


@pytest.mark.slow
def test_text_output_sorted_with_summary_and_exit_1(project, capsys):
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == [
        "train.py:8:7: TW101 `correct` counts samples but is divided by len(loader), the number of batches; "
        "divide by len(loader.dataset)",
        "train.py:9:8: TW301 torch.load without weights_only=True can run arbitrary code from the file; "
        "pass weights_only=True",
        "train.py:10:1: TW110 `model` is a module: `requires_grad = False` on it freezes nothing; "
        "use `model.requires_grad_(False)`",
    ]
    assert out[3] == "Found 3 problems in 2 files; 2 fixable with --fix; 1 more with --fix --unsafe-fixes."


def test_clean_exit_0(project, capsys):
    assert main(["doctor", "clean.py"]) == 0
    assert "No problems found in 1 file." in capsys.readouterr().out


def test_json_format(project, capsys):
    assert main(["doctor", "--format", "json", "train.py"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert [d["code"] for d in data] == ["TW101", "TW301", "TW110"]
    assert set(data[0]) == {"path", "line", "column", "code", "name", "message", "fixable"}
    assert data[0]["path"] == "train.py" and data[0]["line"] == 8 and data[0]["fixable"] is True
    assert data[1]["name"] == "torch-load-without-weights-only"


def test_sarif_format(project, capsys):
    assert main(["doctor", "--format", "sarif", "train.py"]) == 1
    log = json.loads(capsys.readouterr().out)
    assert log["version"] == "2.1.0"
    run = log["runs"][0]
    rule_ids = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert "TW101" in rule_ids
    first = run["results"][0]
    assert first["ruleId"] == "TW101" and rule_ids[first["ruleIndex"]] == "TW101"
    region = first["locations"][0]["physicalLocation"]["region"]
    assert region == {"startLine": 8, "startColumn": 7}


def test_github_format(project, capsys):
    assert main(["doctor", "--format", "github", "train.py"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert lines[0] == (
        "::error title=trainwise doctor (TW101 sample-count-divided-by-batches),file=train.py,line=8,col=7::"
        "train.py:8:7: TW101 `correct` counts samples but is divided by len(loader), the number of batches; "
        "divide by len(loader.dataset)"
    )


def test_select_ignore_on_the_command_line(project, capsys):
    assert main(["doctor", "--select", "TW3", "train.py"]) == 1
    assert [ln.split()[1] for ln in capsys.readouterr().out.splitlines()[:-1]] == ["TW301"]
    assert main(["doctor", "--ignore", "TW1,TW301", "train.py"]) == 0


def test_config_file_is_used(project, capsys):
    (project / "pyproject.toml").write_text('[tool.trainwise.doctor]\nignore = ["TW101", "TW110"]\n')
    assert main(["doctor", "train.py"]) == 1
    out = capsys.readouterr().out
    assert "TW301" in out and "TW101" not in out


@pytest.mark.parametrize(
    "argv",
    [["--select", "TW999"], ["--ignore", "XYZ"], ["--explain", "TW999"], ["--format", "xml"]],
)
def test_usage_errors_exit_2(project, argv, capsys):
    try:
        code = main(["doctor", *argv])
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    assert code == 2


def test_explain_prints_documentation(capsys):
    assert main(["doctor", "--explain", "tw101"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# TW101 sample-count-divided-by-batches")
    for section in ("## What it does", "## Why is this bad?", "## Example", "## Use instead", "## Fix safety"):
        assert section in out
    assert main(["doctor", "--list-rules"]) == 0
    assert "TW302" in capsys.readouterr().out


def test_diff_writes_nothing_and_fix_applies_safe_fixes(project, capsys):
    before = (project / "train.py").read_bytes()
    assert main(["doctor", "--diff", "train.py"]) == 1
    out = capsys.readouterr().out
    assert "-print(correct / len(loader))  # the accuracy" in out
    assert "+print(correct / len(loader.dataset))  # the accuracy" in out
    assert "+model.requires_grad_(False)" in out
    assert "weights_only" not in out  # unsafe: needs --unsafe-fixes
    assert (project / "train.py").read_bytes() == before

    assert main(["doctor", "--fix", "train.py"]) == 1  # TW301 is left
    after = (project / "train.py").read_text()
    assert after == SCRIPT.replace("len(loader))", "len(loader.dataset))").replace(
        "model.requires_grad = False", "model.requires_grad_(False)"
    )
    out = capsys.readouterr().out
    assert "TW301" in out and "Fixed 2 problems in 1 file." in out

    assert main(["doctor", "--fix", "--unsafe-fixes", "train.py"]) == 0
    assert 'torch.load("ckpt.pt",  map_location="cpu", weights_only=True)' in (project / "train.py").read_text()


def test_fix_keeps_crlf_and_encoding(project):
    path = project / "win.py"
    path.write_bytes(b"# -*- coding: latin-1 -*-\r\nimport torch\r\nx = 'caf\xe9'\r\nmodel.requires_grad = False\r\n")
    assert main(["doctor", "--fix", "win.py"]) == 0
    expected = b"# -*- coding: latin-1 -*-\r\nimport torch\r\nx = 'caf\xe9'\r\nmodel.requires_grad_(False)\r\n"
    assert path.read_bytes() == expected


def test_missing_libcst_message(project, monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "libcst" or name.startswith("libcst."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    assert main(["doctor", "--fix", "train.py"]) == 2
    assert "pip install 'trainwise[fix]'" in capsys.readouterr().err


def test_doctor_does_not_import_torch_or_numpy(project):
    """`import torch` costs seconds; the doctor must never pay it (nor numpy's)."""
    probe = (
        "import sys, runpy\n"
        "sys.argv = ['trainwise', 'doctor', 'train.py', '--format', 'json']\n"
        "try:\n"
        "    runpy.run_module('trainwise.cli', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'libcst'))\n"
        "print('HEAVY', heavy, file=sys.stderr)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=project, env=env)
    assert "HEAVY []" in proc.stderr, proc.stderr
    assert json.loads(proc.stdout)[0]["code"] == "TW101"


def test_console_script_exit_codes(project):
    exe = Path(sys.executable).with_name("trainwise")
    if not exe.exists():
        pytest.skip("console script not installed next to the interpreter")
    assert subprocess.run([exe, "doctor", "clean.py"], capture_output=True).returncode == 0
    assert subprocess.run([exe, "doctor", "train.py"], capture_output=True).returncode == 1
    assert subprocess.run([exe, "doctor", "--select", "NOPE"], capture_output=True).returncode == 2


def test_fix_keeps_findings_that_cross_files(tmp_path, monkeypatch, capsys):
    """After fixing train.py, the re-check reads it with the run's other files: the frozen backbone that a
    helper of utils/ puts back in train mode (TW108, found only across files) is still reported."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "utils").mkdir()
    (tmp_path / "utils" / "fit.py").write_text(
        "import torch.nn.functional as F\n\n\n"
        "def fit_one_epoch(model, loader, optimizer):\n"
        "    model.train()\n"
        "    for x, y in loader:\n"
        "        optimizer.zero_grad()\n"
        "        F.cross_entropy(model(x), y).backward()\n"
        "        optimizer.step()\n")
    (tmp_path / "train.py").write_text(
        "import torch\nimport torchvision\nfrom torch.utils.data import DataLoader\n"
        "from utils.fit import fit_one_epoch\n\n"
        "model = torchvision.models.resnet50(weights='DEFAULT')\n"
        "model.requires_grad_(False)\n"
        "model.fc = torch.nn.Linear(2048, 10)\n"
        "optimizer = torch.optim.SGD(model.fc.parameters(), lr=0.01)\n"
        "loader = DataLoader(ds, batch_size=32)\n"
        "fit_one_epoch(model, loader, optimizer)\n"
        "correct = 0\n"
        "for x, y in loader:\n"
        "    correct += (model(x).argmax(1) == y).sum().item()\n"
        "print(correct / len(loader))\n")
    assert main(["doctor", "--select", "TW101,TW108", "."]) == 1
    before = capsys.readouterr().out
    assert "train.py:7:1: TW108" in before and "TW101" in before

    assert main(["doctor", "--select", "TW101,TW108", "--fix", "."]) == 1
    out = capsys.readouterr().out
    assert "len(loader.dataset)" in (tmp_path / "train.py").read_text()
    assert "train.py:7:1: TW108" in out and "TW101" not in out and "Fixed 1 problem in 1 file." in out
