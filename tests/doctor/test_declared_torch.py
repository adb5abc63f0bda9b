"""TW301 and the torch a project declares: ``torch.load`` defaults to ``weights_only=True`` from torch 2.6, so a
project whose every versioned torch requirement is at least 2.6 gets no finding for a call without it.

``fixtures/TW301/projects/`` holds small projects (``pyproject.toml``, ``requirements*.txt``, ``setup.cfg``,
``setup.py``) whose scripts mark the lines that must be reported with ``# expect: TW301``; the hostile cases
(a FIFO, a symlink loop, a file over 1 MiB, a ``.git`` folder) are built in ``tmp_path``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainwise.doctor import project
from trainwise.doctor.engine import check_file

from ._fixtures import FIXTURES, expected_lines

PROJECTS = FIXTURES / "TW301" / "projects"
SCRIPTS = sorted(p for p in PROJECTS.rglob("*.py") if p.name != "setup.py")
LOAD = "import torch\n\nstate = torch.load('checkpoint.pt')\n"


def tw301(path: Path) -> list:
    result = check_file(str(path))
    assert not [f for f in result.findings if f.code == "TW900"], result.findings
    return [f for f in result.findings if f.code == "TW301"]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.relative_to(PROJECTS).as_posix())
def test_project_fixture(script):
    expected = sorted(expected_lines(script.read_text(encoding="utf-8")).get("TW301", ()))
    assert sorted(f.line for f in tw301(script)) == expected


def test_every_project_fixture_has_a_script():
    assert {p.relative_to(PROJECTS).parts[0] for p in SCRIPTS} == {p.name for p in PROJECTS.iterdir()}


def test_the_message_names_the_declaration_that_admits_an_older_torch():
    (finding,) = tw301(PROJECTS / "admits_older" / "train.py")
    assert finding.message.endswith(
        "pass weights_only=True (the project's declared `torch>=2.1` in requirements-dev.txt admits torch < 2.6, "
        "where weights_only defaults to False)")
    (finding,) = tw301(PROJECTS / "unversioned" / "train.py")
    assert "declared `torch` in requirements.txt admits torch < 2.6" in finding.message


def test_without_a_declaration_the_message_is_unchanged():
    for script in (PROJECTS / "no_torch_declared" / "analysis.py", PROJECTS / "unreadable_declarations" / "train.py",
                   PROJECTS / "setup_py_only" / "train.py"):
        (finding,) = tw301(script)
        assert finding.message == ("torch.load without weights_only=True can run arbitrary code from the file; "
                                   "pass weights_only=True"), script


def test_a_pickle_module_is_reported_on_torch_2_6_with_the_reason():
    findings = tw301(PROJECTS / "declares_2_6_in_pyproject" / "train.py")
    messages = [f.message for f in findings]
    assert "weights_only=False" in messages[0]
    assert all("pickle_module turns the torch 2.6 default off" in m for m in messages[1:]), messages


@pytest.mark.parametrize(
    ("line", "lower", "versioned"),
    [
        ("torch>=2.6", (0, 2, 6), True),
        ("torch==2.7.1", (0, 2, 7, 1), True),
        ("torch~=2.6", (0, 2, 6), True),
        ("torch==2.6.0", (0, 2, 6), True),  # trailing zeros do not count
        ("torch==2.6.*", (0, 2, 6), True),
        ("torch>=2.6.0rc1", (0, 2, 6), True),  # a pre-release counts as its release
        ("torch==2.7.1+cpu", (0, 2, 7, 1), True),
        ("Torch >= 2.6, < 3", (0, 2, 6), True),
        ("torch (>=2.6)", (0, 2, 6), True),
        ("torch[opt-einsum]>=2.6 ; python_version >= '3.10'", (0, 2, 6), True),
        ("torch>2.5", (0, 2, 5), True),
        ("torch<3", None, True),
        ("torch!=2.5.0", None, True),
        ("torch>=2.1,!=2.3.0", (0, 2, 1), True),
        ("torch", None, False),
        ("torch ; sys_platform == 'linux'", None, False),
        ("torch @ https://download.pytorch.org/whl/cpu/torch-2.7.1.whl", None, False),
    ],
)
def test_torch_requirements_are_read(line, lower, versioned):
    requirement = project.parse_torch_requirement(line)
    assert requirement is not None and (requirement.lower, requirement.versioned) == (lower, versioned)


@pytest.mark.parametrize("line", ["torchvision>=0.21", "torch-tb-profiler", "pytorch>=2.6", "torchaudio", "# torch",
                                  "torch>=two", "torch=>2.6", "torch>=", ""])
def test_other_or_unreadable_requirements_are_not_torch(line):
    assert project.parse_torch_requirement(line) is None


def test_admits_below_2_6():
    older = (0, 2, 6)
    assert not project.parse_torch_requirement("torch>=2.6").admits_below(older)
    assert not project.parse_torch_requirement("torch>=2.6.0").admits_below(older)
    assert project.parse_torch_requirement("torch>=2.5.1").admits_below(older)
    assert project.parse_torch_requirement("torch>2.5").admits_below(older)
    assert project.parse_torch_requirement("torch<3").admits_below(older)


VERSIONS = ["1.13", "2.0", "2.4", "2.5", "2.5.1", "2.6", "2.6.0", "2.7.1", "3.0"]
OLDER = ["0.4", "1.12", "1.13", "1.13.5", "2.0", "2.0.5", "2.4", "2.4.5", "2.5", "2.5.1", "2.5.5"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["==", ">=", ">", "<=", "<", "~=", "!="]), st.sampled_from(VERSIONS)),
                min_size=1, max_size=3))
def test_never_silent_where_packaging_admits_an_older_torch(specs):
    """The safe direction, checked against ``packaging``: a range that admits a torch < 2.6 is never taken for
    one that does not (a range we call admitting may still be empty, and then a finding is harmless)."""
    packaging_specifiers = pytest.importorskip("packaging.specifiers")
    text = ",".join(op + (v if op != "~=" or "." in v else v + ".0") for op, v in specs)
    requirement = project.parse_torch_requirement("torch" + text)
    assert requirement is not None
    admitted = any(packaging_specifiers.SpecifierSet(text).contains(v) for v in OLDER)
    if admitted:
        assert requirement.admits_below((0, 2, 6)), text


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_any_text_is_read_without_an_error(text):
    project._requirements_txt(text)
    project._setup_cfg_requirements(text)
    project._pyproject_requirements(text)
    for line in [*text.splitlines(), "torch" + text, "torch>=" + text]:
        project.parse_torch_requirement(line)


# ------------------------------------------------------------------------------------------------ roots and files
def _project(folder: Path, **files: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("__", ".")).write_text(text)
    return folder


def test_the_walk_stops_at_a_git_folder(tmp_path):
    _project(tmp_path, pyproject__toml='[project]\nname = "outer"\ndependencies = ["torch>=2.6"]\n')
    inner = _project(tmp_path / "repo" / "src", train__py=LOAD)
    assert tw301(inner / "train.py") == []  # the outer project's declaration is the nearest one
    (tmp_path / "repo" / ".git").mkdir()
    assert len(tw301(inner / "train.py")) == 1  # a repository of its own, declaring nothing


@pytest.mark.parametrize("packages", ["site-packages", "dist-packages"])
def test_an_installed_package_is_not_the_project_around_its_environment(tmp_path, packages):
    """A virtual environment inside a project: the installed package's code is not that project's code."""
    _project(tmp_path, pyproject__toml='[project]\nname = "outer"\ndependencies = ["torch>=2.6"]\n')
    installed = _project(tmp_path / ".venv" / "lib" / "python3.11" / packages / "pkg", train__py=LOAD)
    (finding,) = tw301(installed / "train.py")
    assert "pyproject.toml" not in finding.message


def test_an_edited_declaration_is_read_again(tmp_path):
    _project(tmp_path, requirements__txt="torch>=2.6\n", train__py=LOAD)
    assert tw301(tmp_path / "train.py") == []
    (tmp_path / "requirements.txt").write_text("torch>=2.1.0\n")
    (finding,) = tw301(tmp_path / "train.py")
    assert "`torch>=2.1.0` in requirements.txt" in finding.message


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs and symlinks are POSIX")
def test_hostile_declaration_files_count_as_no_declaration(tmp_path):
    cases = {
        "fifo": lambda f: os.mkfifo(f / "requirements.txt"),  # reading it would block forever
        "loop": lambda f: os.symlink(f / "requirements.txt", f / "requirements.txt"),
        "folder": lambda f: (f / "pyproject.toml").mkdir(),
        "huge": lambda f: (f / "requirements.txt").write_text("torch>=2.6\n" + "#" * (1 << 20)),
        "invalid": lambda f: (f / "pyproject.toml").write_text('[project\ndependencies = ["torch>=2.6"\n'),
        "deep": lambda f: (f / "pyproject.toml").write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n"),
        "types": lambda f: (f / "pyproject.toml").write_text(
            '[project]\ndependencies = "torch>=2.6"\noptional-dependencies = [1, {a = 2}]\n'),
        "binary": lambda f: (f / "setup.cfg").write_bytes(b"[options]\ninstall_requires = torch>=2.6\n\x00\xff"),
        "interpolation": lambda f: (f / "setup.cfg").write_text(
            "[options]\ninstall_requires = %(torch)s\n[options]\nx = 1\n"),
    }
    for name, make in cases.items():
        folder = _project(tmp_path / name, train__py=LOAD)
        make(folder)
        assert len(tw301(folder / "train.py")) == 1, name


def test_a_string_without_a_file_has_no_project():
    assert project.torch_requirements("<string>") is None
    assert project.torch_requirements("no/such/file.py") is None
    assert project.torch_requirements("bad\x00name.py") is None
