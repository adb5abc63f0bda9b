"""benchmarks/first_step.py runs end to end and reports every figure; no time is asserted."""

import json

import pytest
from benchmark_scripts import load_benchmark


@pytest.mark.slow
def test_one_round_reports_import_first_and_later_runs_against_the_hand_loop(capsys):
    first_step = load_benchmark("first_step", "first_step_benchmark")
    assert first_step.main(["--repeats", "1", "--again", "1", "--sides", "hand,trainer", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["sides"] == ["hand", "trainer"] and report["skipped"] == {}
    trainer = report["figures"]["trainer"]
    for figure in ("import", "first", "again", "first_excess", "again_excess"):
        assert set(trainer[figure]) == {"wall", "cpu"}
    assert trainer["first"]["wall"]["median"] > 0 and trainer["import"]["cpu"]["median"] > 0
    assert trainer["bytecode"][0] in ("cached", "compiled from source")
    assert "first_excess" not in report["figures"]["hand"]
