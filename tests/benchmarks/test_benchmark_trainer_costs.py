"""benchmarks/trainer_costs.py runs end to end on one round and checks that its sides do the same work; no time is
asserted."""

import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _costs():
    if "trainer_costs" not in sys.modules:
        sys.path.insert(0, str(BENCHMARKS))
        try:
            spec = importlib.util.spec_from_file_location("trainer_costs", BENCHMARKS / "trainer_costs.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules["trainer_costs"] = module
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(str(BENCHMARKS))
    return sys.modules["trainer_costs"]


def test_one_round_reports_every_side_and_the_same_result():
    costs = _costs()
    sides = ["minimal-adam", "primitives", "train-step", "trainer-off", "+accuracy"]
    report = costs.measure(sides, rounds=1, epochs=1)
    assert list(report["sides"]) == sides
    for side, entry in report["sides"].items():
        assert entry["us_per_step"] > 0
        assert entry["ratio"]["median"] > 0
        assert ("ratio_to_trainer_off" in entry) == side.startswith("+")
    assert report["sides"]["minimal-adam"]["ratio"]["median"] == 1.0
    assert report["same_result"], report["losses"]


def test_a_side_that_trains_differently_is_told(monkeypatch, capsys):
    costs = _costs()

    def fewer_epochs(model, dataset, options):  # one epoch where the others train two: not the same work
        options.epochs = 1
        return costs.run_minimal_adam(model, dataset, options)

    monkeypatch.setitem(costs.SIDES, "loader", fewer_epochs)
    assert costs.main(["--rounds", "1", "--epochs", "2", "--sides", "minimal-adam,loader"]) == 1
    assert "different losses" in capsys.readouterr().out
