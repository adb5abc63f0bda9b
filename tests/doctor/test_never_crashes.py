"""Inputs that used to crash or hang the doctor: .gitignore patterns that are valid for git but not Python
regexes, configuration tables of the wrong type, a named pipe on the command line, and the characters that
``str.splitlines`` takes for line breaks inside strings."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading

import pytest

from trainwise.cli import main
from trainwise.doctor.engine import check_file, check_paths, discover, parse_gitignore

GOOD = "import torch\nsd = torch.load('a.pt')\n"


def _run(argv, capsys, *, timeout=60):
    """``trainwise doctor ARGV`` in-process, in a thread that must end within ``timeout`` seconds."""
    result = {}

    def target():
        try:
            result["code"] = main(["doctor", *argv])
        except BaseException as exc:  # reported by the assertion below
            result["exc"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"trainwise doctor {argv} hangs"
    assert "exc" not in result, repr(result.get("exc"))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return result["code"], out, err


# ------------------------------------------------------------------------------------------------ .gitignore
@pytest.fixture
def repo(tmp_path, monkeypatch):
    (tmp_path / ".git").mkdir()
    monkeypatch.chdir(tmp_path)
    for name in ("x.py", "z.py", "].py", "a.py", "sub/y.py"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(GOOD)
    return tmp_path


@pytest.mark.parametrize("pattern", ["[]]", "[]", "[!]", "\\", "[a-", "**/", "!x", "[z-a]", "[[:nope:]]", "[[:alpha:]",
                                     "a[", "[\\", "x\\", "\\ ", "[!", "[^]", "***", "/**/**", "!", "/", "[]-]"])
def test_any_gitignore_line_is_accepted(repo, capsys, pattern):
    (repo / ".gitignore").write_text(f"{pattern}\n{pattern}.py\n{pattern}/\n!{pattern}\n")
    code, _, err = _run(["."], capsys)
    assert code in (0, 1) and err == ""


@pytest.mark.parametrize(
    "pattern, ignored",
    [
        ("[]].py", {"].py"}),  # "]" first in a bracket is a member
        ("[]", set()),  # unterminated: matches nothing, as in git
        ("[!].py", set()),
        ("\\", set()),  # a trailing backslash: matches nothing
        ("[a-", set()),
        ("[z-a].py", {"z.py"}),  # an empty range; "z" itself still counts, as in git's wildmatch
        ("**/", {"sub/y.py"}),  # every folder
        ("*.py\n!x.py", {"].py", "a.py", "z.py", "sub/y.py"}),
        ("[[:alpha:]].py", {"x.py", "z.py", "a.py", "sub/y.py"}),  # no slash: the name at any depth
    ],
)
def test_gitignore_semantics(repo, pattern, ignored):
    (repo / ".gitignore").write_text(pattern + "\n")
    files, errors = discover(["."])
    everything = {"x.py", "z.py", "].py", "a.py", "sub/y.py"}
    assert set(files) == everything - ignored and errors == []


GIT_FILES = ["].py", "[.py", "!x.py", "x.py", "z.py", "a.py", "-.py", "b/x.py", "foo/a/bar.py", "foo/bar.py",
             "foox/y/bar.py", "foox/bar.py", "a/x.py", "a/b/c.py", "\\.py", "sp .py", "c/d/e/f.py", ":.py", "A.py",
             "y/z/.py", "[a-.py", "q/[]/r.py"]
GIT_PATTERNS = [
    "[]].py", "[]", "[!].py", "\\", "[a-", "**/", "!x.py", "[z-a].py", "*.py\n!x.py", "foo**/bar.py", "**/bar.py",
    "a/**", "[[:alpha:]].py", "[[:foo:]].py", "[[:alpha].py", "\\[.py", "[\\]].py", "[!a-c].py", "[a-].py",
    "[-a].py", "sp\\ .py", "sp .py ", "/x.py", "b/", "b", "*/x.py", "b/*.py", "?.py", "**", "a/**/", "foo/**/bar.py",
    "c/**/f.py", "**/d/**", "[^x].py", "[[:upper:]].py", "[[:punct:]].py", "\\!x.py", "#x.py", "\\#x.py",
    "**/*.py\n!**/bar.py", "foo\n!foo/bar.py", "*\n!*/", "[a-.py", "[[].py", "[[:]].py", "[]-a].py", "***/bar.py",
    "foo/***", "a/*/", "x.py/", "[]]", "q/[]/", "q/[[]]/", "q/\\[]/", "/", "*.p[y]", "[!]]*.py", "[a-c-e].py", "z[",
    "[!x-z].py",
]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_gitignore_matches_what_git_ignores(tmp_path, monkeypatch):
    """git itself is the reference: for each pattern, the files it leaves untracked-but-not-ignored are the
    files the doctor checks."""
    failures = []
    for pattern in GIT_PATTERNS:
        root = tempfile.mkdtemp(dir=tmp_path)
        subprocess.run(["git", "init", "-q", root], check=True)
        for name in GIT_FILES:
            path = os.path.join(root, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "w").close()
        with open(os.path.join(root, ".gitignore"), "w") as fh:
            fh.write(pattern + "\n")
        listed = subprocess.run(["git", "ls-files", "-z", "-o", "--exclude-standard"], cwd=root,
                                capture_output=True, check=True).stdout.decode()
        expected = sorted(name for name in listed.split("\0") if name.endswith(".py"))
        monkeypatch.chdir(root)
        found, errors = discover(["."])
        if sorted(found) != expected or errors:
            failures.append((pattern, sorted(set(expected) - set(found)), sorted(set(found) - set(expected))))
    assert failures == [], failures


def test_exclude_with_an_invalid_range(repo, capsys):
    (repo / "pyproject.toml").write_text('[tool.trainwise.doctor]\nexclude = ["[z-a].py", "[]", "\\\\"]\n')
    code, out, _ = _run(["."], capsys)
    assert code == 1
    assert "z.py" not in out and "x.py" in out


def test_parse_gitignore_never_raises():
    import random

    rng = random.Random(7)
    alphabet = "[]!^-\\*?/:#a z.\r"
    for _ in range(3000):
        line = "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
        for rule in parse_gitignore([line]):
            rule.regex.fullmatch("a/b/z.py")


# ------------------------------------------------------------------------------------------------ pyproject.toml
@pytest.mark.parametrize(
    "toml, key",
    [
        ("[tool]\ntrainwise = 5\n", "tool.trainwise is an integer"),
        ("[tool.trainwise]\ndoctor = 5\n", "tool.trainwise.doctor is an integer"),
        ('[tool.trainwise]\ndoctor = "TW1"\n', "tool.trainwise.doctor is a string"),
        ("[tool.trainwise]\ndoctor = [1]\n", "tool.trainwise.doctor is an array"),
        ('tool = "trainwise"\n', "tool is a string"),
        ("[tool.trainwise.doctor]\nselect = [1]\n", "select must be a list of strings"),
        ("[tool.trainwise.doctor]\nper-file-ignores = {}\n", "unknown key 'per-file-ignores'"),
        ("[tool.trainwise.doctor\nselect = []\n", "is not valid TOML"),
        ("[tool.trainwise.doctor]\nselect = [\n", "is not valid TOML"),
        (b"[tool.trainwise.doctor]\nselect = ['\xff']\n", "is not valid TOML (not UTF-8)"),
    ],
)
def test_config_of_the_wrong_type_is_one_line_naming_the_key(tmp_path, monkeypatch, capsys, toml, key):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.py").write_text(GOOD)
    data = toml if isinstance(toml, bytes) else toml.encode()
    (tmp_path / "pyproject.toml").write_bytes(data)
    code, out, err = _run(["a.py"], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("trainwise doctor: error: ") and key in err, err


def test_invalid_toml_of_another_project_is_passed_over(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.py").write_text(GOOD)
    (tmp_path / "pyproject.toml").write_text('[project]\ndependencies = ["trainwise"\n')
    code, _, err = _run(["a.py"], capsys)
    assert code == 1 and err == ""


# ------------------------------------------------------------------------------------------------ special files
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_named_pipe_is_refused_without_being_opened(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "pipe.py")
    (tmp_path / "good.py").write_text(GOOD)
    code, out, _ = _run(["pipe.py", "good.py"], capsys, timeout=30)  # it used to wait for a writer forever
    assert code == 1
    assert "pipe.py:1:1: TW900 not a regular file but a named pipe (FIFO); skipped without reading it" in out
    assert "good.py:2:6: TW301" in out
    code, out, _ = _run(["."], capsys, timeout=30)  # inside a folder it is not even listed
    assert "pipe.py" not in out and "good.py" in out
    (finding,) = check_file("pipe.py").findings  # the API refuses it too
    assert finding.code == "TW900" and "named pipe" in finding.message


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_gitignore_or_pyproject_that_is_a_named_pipe(repo, capsys):
    os.mkfifo(repo / ".gitignore")
    os.mkfifo(repo / "sub" / ".gitignore")
    os.mkfifo(repo / "pyproject.toml")
    code, out, _ = _run(["."], capsys, timeout=30)
    assert code == 1 and "sub/y.py" in out


def test_gitignore_with_bom_and_crlf(repo):
    (repo / ".gitignore").write_bytes(b"\xef\xbb\xbfz.py\r\nsub/\r\n")
    assert discover(["."])[0] == ["].py", "a.py", "x.py"]


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_device_is_refused(capsys):
    code, out, _ = _run(["/dev/zero"], capsys, timeout=30)  # an endless file
    assert code == 1 and "not a regular file but a character device" in out


# ------------------------------------------------------------------------------------------------ line breaks
SEPARATORS = ["\u2028", "\u2029", "\x0c", "\x0b", "\x1c", "\x1d", "\x1e", "\x85"]


@pytest.mark.parametrize("char", SEPARATORS, ids=[f"U+{ord(c):04X}" for c in SEPARATORS])
def test_notebook_cell_with_a_line_separator_in_a_string(tmp_path, char):
    """str.splitlines split the cell inside the string: a false syntax error, the cell left unchecked."""
    cell = f"import torch\ns = 'a{char}b'\nt = '''c{char}d'''\nsd = torch.load('a.pt')\n"
    notebook = {"cells": [{"cell_type": "markdown", "source": "# x"}, {"cell_type": "code", "source": cell}],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(notebook))
    (finding,) = check_file(str(path)).findings
    assert (finding.code, finding.cell, finding.line, finding.column) == ("TW301", 2, 4, 6)


@pytest.mark.parametrize("char", SEPARATORS, ids=[f"U+{ord(c):04X}" for c in SEPARATORS])
def test_python_file_with_a_line_separator_in_a_string(tmp_path, char):
    """Line numbers, columns (after a non-ASCII character) and noqa of later lines stay right."""
    source = (
        f"import torch\ns = 'a{char}b{char}c'\nt = '''\nd{char}e'''\n"
        "é = 1; sd = torch.load('a.pt')\n"
        "sd = torch.load('b.pt')  # noqa: TW301\n"
        "sd = torch.load('c.pt')\n"
    )
    path = tmp_path / "f.py"
    path.write_text(source, encoding="utf-8")
    findings = check_paths([str(path)])[0].findings
    assert [(f.code, f.line, f.column) for f in findings] == [("TW301", 5, 13), ("TW301", 7, 6)]


def test_thousands_of_broken_notebook_cells_take_one_pass(tmp_path):
    """Each broken cell used to be taken out in turn, parsing the rest again: quadratic, minutes for this one."""
    import time

    cells = [{"cell_type": "code", "source": "def f(:" if i % 2 else f"x{i} = {i}"} for i in range(4000)]
    cells.append({"cell_type": "code", "source": "import torch\nsd = torch.load('a.pt')"})
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"cells": cells}))
    start = time.perf_counter()
    findings = check_file(str(path)).findings
    assert time.perf_counter() - start < 5
    assert [f.code for f in findings].count("TW900") == 2000
    assert [(f.code, f.cell, f.line) for f in findings if f.code != "TW900"] == [("TW301", 4001, 2)]


def test_form_feed_as_indentation(tmp_path):
    path = tmp_path / "ff.py"
    path.write_text("import torch\n\x0c\ndef f():\n\x0c    return torch.load('a.pt')\n")
    assert [(f.code, f.line) for f in check_paths([str(path)])[0].findings] == [("TW301", 4)]


def test_undecodable_file_names_and_surrogates_in_output(tmp_path, monkeypatch, capsys):
    if sys.platform == "win32" or sys.getfilesystemencoding() != "utf-8":
        pytest.skip("needs a POSIX file system with UTF-8 names")
    monkeypatch.chdir(tmp_path)
    with open(os.fsencode(tmp_path) + b"/caf\xe9.py", "w") as fh:  # not UTF-8: a surrogate in the str name
        fh.write(GOOD)
    cell = {"cell_type": "code", "source": "import torch\nsd = torch.load('\ud800')\n"}
    (tmp_path / "nb.ipynb").write_text(json.dumps({"cells": [cell]}))
    for fmt in ("text", "json", "sarif", "github"):
        code, out, _ = _run([".", "--format", fmt], capsys)
        assert code == 1 and "caf" in out
