"""Whatever the input, one diagnostic per bad file, the run goes on, and no input file changes."""

from __future__ import annotations

import hashlib
import os
import sys

import pytest

from trainwise.cli import main
from trainwise.doctor.engine import check_paths, check_source

GOOD = "import torch\nsd = torch.load('a.pt')\n"

BAD_FILES = {
    "syntax_error.py": b"def f(:\n    pass\n",
    "null_bytes.py": b"x = 1\x00\n",
    "latin1.py": "x = 'caf\xe9'\n".encode("latin-1"),
    "binary.py": bytes(range(256)) * 8,
    "parens.py": b"x = " + b"(" * 5000 + b"1" + b")" * 5000 + b"\n",
    "terms.py": b"x = " + b" + ".join([b"1"] * 200_000) + b"\n",
    "bad_cookie.py": b"# -*- coding: klingon -*-\nx = 1\n",
    "tabs_spaces.py": b"if x:\n\tpass\n        pass\n",
}


def _digest(folder):
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as fh:
                out[path] = hashlib.sha256(fh.read()).hexdigest()
    return out


@pytest.fixture
def messy(tmp_path):
    for name, data in BAD_FILES.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "empty.py").write_bytes(b"")
    (tmp_path / "good.py").write_text(GOOD)
    (tmp_path / "long.py").write_text("x = 1\n" * 49_998 + GOOD)
    return tmp_path


@pytest.mark.slow
def test_each_bad_file_gives_one_tw900_and_the_rest_runs(messy):
    before = _digest(messy)
    results = {os.path.basename(r.path): r for r in check_paths([str(messy)])}
    for name in BAD_FILES:
        assert [f.code for f in results[name].findings] == ["TW900"], (name, results[name].findings)
    assert results["empty.py"].findings == []
    assert [f.code for f in results["good.py"].findings] == ["TW301"]
    assert [(f.code, f.line) for f in results["long.py"].findings] == [("TW301", 50_000)]
    assert _digest(messy) == before


def test_fix_never_touches_broken_files(messy, capsys):
    (messy / "long.py").unlink()  # libcst needs ~a minute for 50,000 lines; the check itself is covered above
    (messy / "fixable_but_broken.py").write_text("import torch\ntorch.load('a.pt')\ndef f(:\n")
    before = _digest(messy)
    broken = {k: v for k, v in before.items() if not k.endswith("good.py")}
    main(["doctor", "--fix", "--unsafe-fixes", str(messy)])
    after = _digest(messy)
    assert {k: after[k] for k in broken} == broken
    assert after[str(messy / "good.py")] != before[str(messy / "good.py")]


def test_syntax_error_location():
    (finding,) = check_source("x = 1\ny = (\n")
    assert finding.code == "TW900" and finding.line >= 2 and "syntax error" in finding.message


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() == 0, reason="needs POSIX permissions, not root")
def test_unreadable_folder_and_file(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "a.py").write_text(GOOD)
    secret = tmp_path / "secret.py"
    secret.write_text(GOOD)
    (tmp_path / "good.py").write_text(GOOD)
    locked.chmod(0)
    secret.chmod(0)
    try:
        results = {os.path.basename(r.path): r for r in check_paths([str(tmp_path)])}
    finally:
        locked.chmod(0o755)
        secret.chmod(0o644)
    assert [f.code for f in results["locked"].findings] == ["TW900"]
    assert [f.code for f in results["secret.py"].findings] == ["TW900"]
    assert [f.code for f in results["good.py"].findings] == ["TW301"]


def test_permission_errors_simulated(tmp_path, monkeypatch):
    """The same as above where the tests run as root (who may read anything): the OS calls fail."""
    import trainwise.doctor.engine as engine

    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "a.py").write_text(GOOD)
    (tmp_path / "secret.py").write_text(GOOD)
    (tmp_path / "good.py").write_text(GOOD)
    real_scandir, real_open = os.scandir, os.open

    def scandir(path):
        if os.path.basename(path) == "locked":
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    def os_open(path, flags, *args, **kwargs):
        if os.path.basename(path) == "secret.py":
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(engine.os, "scandir", scandir)
    monkeypatch.setattr(engine.os, "open", os_open)
    results = {os.path.basename(r.path): r for r in check_paths([str(tmp_path)])}
    assert [f.message for f in results["locked"].findings] == ["cannot read folder: Permission denied"]
    assert [f.message for f in results["secret.py"].findings] == ["cannot read: Permission denied"]
    assert [f.code for f in results["good.py"].findings] == ["TW301"]


def test_symlink_loops(tmp_path):
    (tmp_path / "good.py").write_text(GOOD)
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "back").symlink_to(tmp_path, target_is_directory=True)  # a loop through a folder link
    (tmp_path / "self.py").symlink_to(tmp_path / "self.py")  # a link to itself
    results = check_paths([str(tmp_path)])
    by_name = {os.path.relpath(r.path, tmp_path): [f.code for f in r.findings] for r in results}
    assert by_name == {"good.py": ["TW301"], "self.py": ["TW900"], os.path.join("sub", "back"): ["TW900"]}


@pytest.mark.slow
def test_run_over_messy_folder_via_cli_exits_1(messy, capsys):
    assert main(["doctor", str(messy)]) == 1
    out = capsys.readouterr().out
    assert out.count("TW900") == len(BAD_FILES)
