"""benchmarks/trainer_costs.py runs end to end on one round and checks that its sides do the same work; no time is
asserted."""

from benchmark_scripts import load_benchmark


def _costs():
    return load_benchmark("trainer_costs")


def test_one_round_reports_every_side_and_the_same_result():
    costs = _costs()
    sides = ["minimal-adam", "primitives", "train-step", "trainer-off", "+accuracy"]
    report = costs.measure(sides, rounds=1, epochs=1)
    assert list(report["sides"]) == sides
    for side, entry in report["sides"].items():
        assert entry["us_per_step"] > 0 and entry["ms_per_run"] > 0
        # a whole run holds its steps (64 of them) and more
        assert entry["ms_per_run"] * 1e3 > 64 * entry["us_per_step"] * 0.9
        assert entry["ratio"]["median"] > 0 and entry["run_ratio"]["median"] > 0
        assert ("ratio_to_trainer_off" in entry) == ("run_ratio_to_trainer_off" in entry) == side.startswith("+")
    assert report["sides"]["minimal-adam"]["ratio"]["median"] == 1.0
    assert report["sides"]["minimal-adam"]["run_ratio"]["median"] == 1.0
    assert report["same_result"], report["losses"]


def test_a_side_that_trains_differently_is_told(monkeypatch, capsys):
    costs = _costs()

    def fewer_epochs(model, dataset, options):  # one epoch where the others train two: not the same work
        options.epochs = 1
        return costs.run_minimal_adam(model, dataset, options)

    monkeypatch.setitem(costs.SIDES, "loader", fewer_epochs)
    assert costs.main(["--rounds", "1", "--epochs", "2", "--sides", "minimal-adam,loader"]) == 1
    assert "different losses" in capsys.readouterr().out


def test_probes_report_their_cost_in_a_step_and_alone_and_leave_the_training_as_it_is(capsys):
    costs = _costs()
    sides = ["minimal-adam", "probe:none", "probe:accuracy-ops", "probe:numpy-sum"]
    report = costs.measure(sides, rounds=2, epochs=1)
    assert report["same_result"], report["losses"]  # a probe's work changes nothing the step computes
    assert "probe" not in report["sides"]["probe:none"]
    for side in sides[2:]:
        probe = report["sides"][side]["probe"]
        assert probe["alone_us"] > 0
        assert probe["in_step_over_alone"] == probe["added_us"] / probe["alone_us"]
    assert costs.main(["--rounds", "1", "--epochs", "1", "--sides", "minimal-adam,probe:none,probe:1-op"]) == 0
    out = capsys.readouterr().out
    assert "in a step, us" in out and "probe:1-op" in out.split("in a step, us")[1]
