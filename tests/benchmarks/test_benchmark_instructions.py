"""benchmarks/instructions.py: the measured process trains its steps inside the qsort callback (run here without
valgrind), and the parent refuses what it cannot count; no count is asserted."""

import subprocess
import sys
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "instructions.py"


@pytest.mark.parametrize("side", ["minimal", "guard", "guard-every-8"])
def test_the_measured_process_trains_inside_the_callback(side):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--child", side, "--steps", "3"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr


def test_sides_not_starting_with_minimal_are_refused_in_one_sentence():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--sides", "guard"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 1 and "--sides must start with minimal" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("side", ["minimal-adam", "trainer-adam"])
def test_a_trainer_side_trains_its_whole_run_inside_the_callback(side):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--child", side, "--batches", "2"],
                          capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr


def test_trainer_sides_mixed_with_guard_sides_are_refused_in_one_sentence():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--sides", "minimal-adam,guard"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 1 and "name only minimal-adam, trainer-adam, trainer-adam-off" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cache_simulation_counts_are_read_and_weighted_as_valgrind_estimates_cycles():
    script = load_benchmark("instructions", "instructions_benchmark", register=False)
    report = ("==1== Events    : Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw\n"
              "==1== Collected : 1000 400 200 7 5 3 2 1 1\n==1== \n")
    events = script.collected_events(report)
    assert events == {"Ir": 1000, "Dr": 400, "Dw": 200, "I1mr": 7, "D1mr": 5, "D1mw": 3, "ILmr": 2, "DLmr": 1,
                      "DLmw": 1}
    assert script.estimated_cycles(events) == 1000 + 10 * (7 + 5 + 3) + 100 * (2 + 1 + 1)
    assert script.collected_events("==1== Events    : Ir\n==1== Collected : 12345\n") == {"Ir": 12345}


def test_a_report_without_the_cache_events_is_refused_in_one_sentence():
    script = load_benchmark("instructions", "instructions_benchmark", register=False)
    with pytest.raises(SystemExit, match="run it with --cache-sim=yes"):
        script.estimated_cycles({"Ir": 5})
    assert script.collected_events("valgrind: no such file\n") is None
