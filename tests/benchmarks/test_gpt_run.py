"""benchmarks/gpt_run.py --quick runs both sides end to end and reports every figure; no time is asserted."""

import json

import pytest
from benchmark_scripts import load_benchmark


@pytest.mark.slow
def test_quick_mode_times_both_sides_and_they_end_at_the_same_validation_loss(capsys):
    gpt_run = load_benchmark("gpt_run", "gpt_run_benchmark")
    assert gpt_run.main(["--quick", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["quick"] and report["repeats"] == 1
    assert report["steps"] == gpt_run.QUICK.epochs * gpt_run.QUICK.train_batches
    for side in ("hand", "trainer"):
        for clock in ("cpu", "wall"):
            figure = report["sides"][side][clock]
            assert 0 < figure["min"] <= figure["median"] <= figure["max"]
    for clock in ("cpu", "wall"):
        assert report["ratio"][clock]["median"] > 0
    assert report["same_result"], report["val_loss"]  # same weights, batches, optimizer and loss on both sides
    inputs, targets = gpt_run.make_data(gpt_run.QUICK)[0][:3]
    assert (inputs[:, 1:] == targets[:, :-1]).all()  # the targets are the inputs shifted by one token

