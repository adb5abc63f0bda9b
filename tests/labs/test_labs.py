"""``trainwise lab``: every lab runs with --json and shows its effect (the wrong way's error large, the right way's
within tolerance), so a lab can never silently stop demonstrating its point; the list, the errors, the plots and
the pointers from the doctor and the guards."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainwise.cli import main
from trainwise.labs import LAB_MODULES, all_labs, lab_for_code


def _lab_names():
    return [lab.name for lab in all_labs()]


def test_one_lab_per_fundamental_in_order():
    labs = all_labs()
    assert len(labs) == len(LAB_MODULES) == 12
    assert [lab.fundamental for lab in labs] == list(range(1, 13))
    assert len(set(_lab_names())) == 12


def test_the_list_names_each_lab_with_its_codes(capsys):
    assert main(["lab"]) == 0
    out = capsys.readouterr().out
    for lab in all_labs():
        assert lab.name in out and all(code in out for code in lab.codes)


def test_listing_the_labs_does_not_import_torch():
    code = "import sys; from trainwise.labs import all_labs; all_labs(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.slow
@pytest.mark.parametrize("name", [lab.name for lab in all_labs()])
def test_each_lab_measures_its_effect(name, capsys):
    assert main(["lab", name, "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["lab"] == name and report["shown"] is True
    assert report["figures"] and all(isinstance(k, str) for k in report["figures"])
    assert report["reading"] and report["seconds"] > 0


def test_an_unknown_lab_is_one_sentence(capsys):
    assert main(["lab", "acuracy"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "trainwise lab: error: no lab named 'acuracy'; did you mean accuracy?"


@pytest.mark.slow
def test_plots_are_written_where_a_lab_has_one(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    with_plot = [lab for lab in all_labs() if lab.plot is not None]
    if not with_plot:
        pytest.skip("no lab draws a picture")
    lab = with_plot[0]
    assert main(["lab", lab.name, "--plot", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["plot"] and (tmp_path / report["plot"].split("/")[-1]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_doctor_and_the_guards_point_to_the_lab(capsys):
    from trainwise.guards.core import GuardFinding

    assert main(["doctor", "--explain", "TW101"]) == 0
    assert "trainwise lab accuracy" in capsys.readouterr().out
    finding = GuardFinding(code="TW102", step=3, message="a graph is kept", where="")
    assert "trainwise lab kept-graph" in str(finding)
    assert lab_for_code("TW999") is None


def _without_permission_override() -> list[str]:
    """The command prefix that runs a process bound by permission bits: as it is for a user, through setpriv
    with the two capabilities that let root pass them dropped for root (skipped without setpriv)."""
    import os
    import shutil

    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv to drop root's permission override")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


@pytest.mark.parametrize("inside", ["", "inner"])
def test_a_plot_folder_under_an_unreadable_folder_is_one_line(tmp_path, inside):
    """Before (issue 48, item 10, reported twice): ``--plot DIR`` under a folder without search permission
    ended in pathlib's PermissionError traceback (``Path.exists`` raises it) before any lab ran."""
    pytest.importorskip("matplotlib")
    locked = tmp_path / "locked"
    (locked / "inner").mkdir(parents=True)
    locked.chmod(0)
    target = locked / inside / "plots" if inside else locked / "plots"
    try:
        out = subprocess.run([*_without_permission_override(), sys.executable, "-m", "trainwise", "lab", "accuracy",
                              "--plot", str(target)], capture_output=True, text=True, timeout=300)
    finally:
        locked.chmod(0o755)
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == [
        f"trainwise lab: error: --plot {target} cannot be reached (Permission denied); choose a folder you can "
        "write to."]
    assert out.stdout == ""  # refused before any lab ran
    assert sorted(p.name for p in locked.iterdir()) == ["inner"] and not any((locked / "inner").iterdir())
