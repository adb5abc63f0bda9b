"""benchmarks/overhead.py runs end to end on a tiny run and reports every figure; no time is asserted."""

import json
import sys

import pytest
from benchmark_scripts import load_benchmark


def _overhead():
    return load_benchmark("overhead", "overhead_benchmark")


def _summary_ok(summary):
    return 0 < summary["min"] <= summary["median"] <= summary["max"]


@pytest.mark.slow
def test_two_sides_one_small_epoch_report_every_figure_and_the_same_result(capsys):
    overhead = _overhead()
    code = overhead.main(["--repeats", "1", "--sizes", "small", "--small-epochs", "1", "--warmup-batches", "1",
                          "--sides", "minimal,same-work,trainer-off", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["sides"] == ["minimal", "same-work", "trainer-off"]
    assert report["skipped"] == {}
    entry = report["sizes"]["small"]
    assert entry["steps"] == 64 and entry["epochs"] == 1
    for side in report["sides"]:
        figures = entry["sides"][side]
        for figure in ("per_step", "run"):
            for clock in ("cpu", "wall"):
                assert _summary_ok(figures[figure][clock]), (side, figure, clock)
        # the whole run holds the steps, and more (set-up, epoch end)
        assert figures["run"]["wall"]["median"] > figures["per_step"]["wall"]["median"] * 0.5 * entry["steps"]
        assert figures["threads"] == [1]
    assert set(entry["vs"]["minimal"]) == {"same-work", "trainer-off"}
    assert set(entry["vs"]["same-work"]) == {"trainer-off"}
    for ratios in [*entry["vs"]["minimal"].values(), *entry["vs"]["same-work"].values()]:
        for figure in ("per_step", "run"):
            for clock in ("cpu", "wall"):
                assert ratios[figure][clock]["ratio"] > 0
                assert _summary_ok(ratios[figure][clock]["pair_ratio"])
    # Same seed, same order: each family ends at one loss; the bias family differs from the one-group family.
    same = entry["same_result"]
    assert same["one AdamW group"]["sides"] == ["minimal"]
    assert same["no decay on biases"]["sides"] == ["same-work", "trainer-off"]
    assert same["no decay on biases"]["match"], same
    losses = same["no decay on biases"]["final_loss"]
    assert losses["same-work"] == pytest.approx(losses["trainer-off"], rel=1e-4)
    assert [t["side"] for t in entry["targets"]] == ["trainer-off"]
    assert entry["targets"][0]["target"] == {"per_step": 1.02, "run": 1.02}
    assert set(entry["targets"][0]["per_round_ratio_median"]) == {"per_step cpu", "per_step wall", "run cpu",
                                                                  "run wall"}


@pytest.mark.slow
def test_the_users_own_optimizer_sides_compare_with_the_minimal_loop_on_that_optimizer(capsys):
    overhead = _overhead()
    code = overhead.main(["--repeats", "1", "--sizes", "small", "--small-epochs", "1", "--warmup-batches", "1",
                          "--sides", "minimal,minimal-adam,trainer-adam-off", "--json"])
    assert code == 0
    entry = json.loads(capsys.readouterr().out)["sizes"]["small"]
    assert set(entry["vs"]["minimal-adam"]) == {"trainer-adam-off"}
    same = entry["same_result"]["the user's Adam"]
    assert same["sides"] == ["minimal-adam", "trainer-adam-off"] and same["match"], same
    # AdamW with weight decay and Adam end elsewhere: the families really are different work
    assert entry["same_result"]["one AdamW group"]["final_loss"]["minimal"] != same["final_loss"]["minimal-adam"]
    target = next(t for t in entry["targets"] if t["side"] == "trainer-adam-off")
    assert target["baseline"] == "minimal-adam" and target["target"] == {"per_step": 1.02, "run": 1.10}


@pytest.mark.parametrize("side", ["fabric", "accelerate", "lightning"])
def test_a_missing_peer_asked_for_is_one_sentence_naming_the_install(side, monkeypatch):
    overhead = _overhead()
    monkeypatch.setitem(sys.modules, overhead.PEERS[side], None)  # installed or not: an import that fails
    assert overhead._missing(side) is not None
    with pytest.raises(SystemExit) as stopped:
        overhead.main(["--repeats", "1", "--sizes", "small", "--sides", f"minimal,{side}"])
    message = str(stopped.value)
    assert 'pip install -e ".[bench]" -c constraints.txt' in message
    assert side in message and "\n" not in message


def test_missing_peers_are_left_out_by_default_with_the_reason():
    overhead = _overhead()
    sides, skipped = overhead._choose_sides(None)
    assert sides[:6] == ["minimal", "same-work", "guard", "guard-every-8", "trainer", "trainer-off"]
    for side in ("fabric", "accelerate", "lightning"):
        assert (side in sides) != (side in skipped)


def test_sides_must_include_the_baseline():
    overhead = _overhead()
    with pytest.raises(SystemExit, match="minimal"):
        overhead.main(["--sides", "trainer"])
