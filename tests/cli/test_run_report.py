"""What ``trainwise run`` says at exit, in process: static and runtime findings paired, the formats, the exit
status, and the ranks' findings gathered through files."""

from __future__ import annotations

import json
import os

import pytest

from trainwise.cli import run_report
from trainwise.cli.run_report import Ranks, RunReport, Selection
from trainwise.doctor.rule import Finding
from trainwise.errors import TrainwiseError


def _start_in(folder, monkeypatch) -> None:
    """trainwise started in ``folder`` (the report names paths from there)."""
    monkeypatch.chdir(folder)
    monkeypatch.setattr("trainwise.guards.auto._START_FOLDER", str(folder))


def _static(code: str, line: int, path: str = "train.py") -> Finding:
    return Finding(path=path, line=line, column=5, code=code, name="rule", message=f"static {code}")


def _row(code: str, line: int, path: str = "train.py", rank: int = 0, callers: tuple[int, ...] = ()) -> dict:
    return {"code": code, "path": os.path.abspath(path), "line": line, "where": "(the model)", "step": 2,
            "message": f"run {code}", "ranks": [rank], "callers": [[os.path.abspath(path), n] for n in callers]}


def _report(static: list[Finding], selection: Selection | None = None, fmt: str = "text") -> RunReport:
    return RunReport(selection or Selection(), static, Ranks(), fmt=fmt, target="train.py")


def test_static_and_runtime_findings_pair_at_the_same_line_then_nearest_in_the_same_file(tmp_path, monkeypatch):
    _start_in(tmp_path, monkeypatch)
    static = [_static("TW105", 12), _static("TW102", 20), _static("TW102", 40), _static("TW103", 30),
              _static("TW109", 7, path="other.py")]
    rows = [_row("TW105", 12), _row("TW102", 22), _row("TW108", 9), _row("TW109", 8)]
    entries = _report(static)._entries(rows)
    found = [(e.code, e.line, e.found, e.run_line) for e in entries]
    assert found == [
        ("TW105", 12, "both", None),  # the same line
        ("TW102", 20, "both", 22),  # the nearer of the two static TW102 of the file
        ("TW109", 8, "run", None),  # another file than the static TW109: not paired
        ("TW108", 9, "run", None),
        ("TW109", 7, "static", None),
        ("TW103", 30, "static", None),
        ("TW102", 40, "static", None),
    ]


TRAIN = """\
def step(optimizer):
    optimizer.step()


def train_old(model, optimizer):
    total = 0
    for batch in range(3):
        total += model(batch)


def train(model, optimizer):
    total = 0
    for batch in range(3):
        loss = model(batch)
        step(optimizer)
        total += loss


train(model, optimizer)
"""


def test_a_runtime_finding_confirms_the_static_one_on_the_code_path_that_ran(tmp_path, monkeypatch):
    _start_in(tmp_path, monkeypatch)
    (tmp_path / "train.py").write_text(TRAIN)
    # the step is seen in step() (line 2), called from train() (line 15), called at line 19; the doctor names
    # `total += ...` in train_old() (line 8, never called, nearer) and in train() (line 16)
    static = [_static("TW102", 8), _static("TW102", 16)]
    entries = _report(static)._entries([_row("TW102", 2, callers=(15, 19))])
    assert sorted((e.line, e.found, e.run_line) for e in entries) == [(8, "static", None), (16, "both", 2)]
    # in the same function as the line the run saw, the nearest line first; then the callers' functions
    static = [_static("TW102", 8), _static("TW102", 12), _static("TW102", 16)]
    rows = [_row("TW102", 7), _row("TW102", 2, callers=(15, 19))]
    entries = _report(static)._entries(rows)
    assert sorted((e.line, e.found, e.run_line) for e in entries) == [
        (8, "both", 7), (12, "static", None), (16, "both", 2)]


def test_each_format_holds_every_entry(tmp_path, monkeypatch):
    _start_in(tmp_path, monkeypatch)
    static, rows = [_static("TW105", 12), _static("TW103", 30)], [_row("TW105", 12), _row("TW113", 14)]
    text = run_report._render_text(_report(static)._entries(rows), _report(static))
    assert "1 static finding(s) confirmed by the run, 1 found only at run time, 1 static not seen" in text
    assert "TW113  train.py:14  run only" in text
    data = json.loads(run_report._render_json(_report(static)._entries(rows), _report(static)))
    assert [(d["code"], d["found"]) for d in data] == [("TW105", "both"), ("TW113", "run"), ("TW103", "static")]
    assert data[0]["ranks"] == [0] and "ranks" not in data[2]
    sarif = json.loads(run_report._render_sarif(_report(static)._entries(rows), _report(static)))
    results = sarif["runs"][0]["results"]
    assert [(r["ruleId"], r["properties"]["found"]) for r in results] == [
        ("TW105", "both"), ("TW113", "run"), ("TW103", "static")]
    assert results[1]["locations"][0]["physicalLocation"]["region"]["startLine"] == 14
    github = run_report._render_github(_report(static)._entries(rows), _report(static))
    assert github.count("::error ") == 3 and "file=train.py,line=14" in github


def test_the_exit_status_is_the_scripts_unless_fail_on_matches(tmp_path, monkeypatch, capsys):
    _start_in(tmp_path, monkeypatch)
    fail = Selection.parse(select=None, ignore=None, fail_on=["TW10"])
    assert _report([], fail).after_run([], 0) == 0
    assert _report([_static("TW105", 3)], fail).after_run([], 0) == 1  # a static finding matches
    assert _report([_static("TW105", 3)], fail).after_run([], 4) == 4  # the script's own failure wins
    assert _report([_static("TW105", 3)]).after_run([], 0) == 0  # no --fail-on: findings do not change it
    anything = Selection.parse(select=None, ignore=None, fail_on=["any"])
    assert _report([_static("TW301", 3)], anything).after_run([], 0) == 1
    capsys.readouterr()


def test_codes_are_checked_and_select_ignore_reach_the_guards():
    selection = Selection.parse(select=["TW10,TW113"], ignore=["TW105"], fail_on=None)
    assert selection.guard_codes() == ["TW102", "TW103", "TW104", "TW107", "TW108", "TW109", "TW113"]
    assert Selection.parse(select=["TW115"], ignore=None, fail_on=None).guard_codes() == ["TW115"]  # a guard only
    with pytest.raises(TrainwiseError, match="--ignore: 'TW999' matches no rule or guard"):
        Selection.parse(select=None, ignore=["TW999"], fail_on=None)


def test_the_local_rank_0_gathers_the_other_ranks_findings_through_files(tmp_path):
    folder = str(tmp_path / "launch")
    rank1 = Ranks(rank=1, local_rank=1, world=3, local_world=3, folder=folder)
    rank2 = Ranks(rank=2, local_rank=2, world=3, local_world=3, folder=folder)
    assert rank1.gather([_row("TW105", 12), _row("TW103", 30)]) == []  # left for rank 0
    assert rank2.gather([_row("TW105", 12)]) == []
    rows = Ranks(rank=0, local_rank=0, world=3, local_world=3, folder=folder).gather([_row("TW105", 12)])
    assert sorted((r["code"], r["ranks"]) for r in rows) == [("TW103", [1]), ("TW105", [0, 1, 2])]
    assert not os.path.exists(folder)  # the files and their folder are removed


def test_a_rank_that_leaves_nothing_is_said_after_the_wait(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(run_report, "GATHER_WAIT_S", 0.2)
    rows = Ranks(rank=0, local_rank=0, world=2, local_world=2, folder=str(tmp_path / "x")).gather([_row("TW105", 1)])
    assert [r["ranks"] for r in rows] == [[0]]
    assert "1 rank(s) left no findings within 0 s" in capsys.readouterr().err


def test_ranks_from_torchrun_s_environment(monkeypatch):
    for name, value in {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                        "TORCHELASTIC_RUN_ID": "abc", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    ranks = Ranks.from_environment()
    assert (ranks.rank, ranks.local_rank, ranks.world, ranks.local_world, ranks.reports) == (3, 1, 4, 2, False)
    assert os.path.basename(ranks.folder) == f"trainwise-run-abc-29500-{os.getppid()}-0"
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert Ranks.from_environment() == Ranks()


def test_live_lines_go_to_stderr_only_where_they_do_not_mix_with_the_report(capsys):
    report = RunReport(Selection(), [_static("TW105", 3)], Ranks(), fmt="json", output=None)
    report.before_run()
    assert capsys.readouterr().err == ""  # json on stderr at exit: nothing before it
    report = RunReport(Selection(), [_static("TW105", 3)], Ranks(), fmt="json", output="report.json")
    report.before_run()
    assert capsys.readouterr().err == "trainwise run: doctor: train.py:3:5: TW105 static TW105\n"


def test_a_rank_that_does_not_report_still_fails_on_its_own_findings(tmp_path):
    from trainwise.guards.auto import LocatedFinding, Place
    from trainwise.guards.core import GuardFinding

    rank1 = Ranks(rank=1, local_rank=1, world=2, local_world=2, folder=str(tmp_path / "launch"))
    fail = Selection.parse(select=None, ignore=None, fail_on=["TW105"])
    located = [LocatedFinding(GuardFinding("TW105", 1, "SGD", "m"), Place(str(tmp_path / "train.py"), 3))]
    assert RunReport(fail, [], rank1).after_run(located, 0) == 1
    assert RunReport(Selection(), [], rank1).after_run(located, 0) == 0
