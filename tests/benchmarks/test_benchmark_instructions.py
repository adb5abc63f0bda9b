"""benchmarks/instructions.py: the measured process trains its steps inside the qsort callback (run here without
valgrind), and the parent refuses what it cannot count; no count is asserted."""

import subprocess
import sys
from pathlib import Path

import pytest

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
