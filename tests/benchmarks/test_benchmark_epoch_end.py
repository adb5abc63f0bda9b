"""benchmarks/epoch_end.py times a fit's phases end to end on a tiny run; no time is asserted."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "epoch_end.py"


@pytest.mark.slow
def test_the_phases_of_a_fit_add_up_to_the_fit():
    done = subprocess.run([sys.executable, str(SCRIPT), "--epochs", "2", "--runs", "1", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    for clock in ("main-thread cpu", "wall"):
        phases = report["clocks"][clock]
        parts = [phases[name]["ms"] for name in phases if name not in ("fit", "epoch-end work")]
        assert phases["fit"]["ms"] > 0 and all(ms >= 0 for ms in parts)
        assert sum(parts) == pytest.approx(phases["fit"]["ms"], rel=0.05)  # nothing of the fit goes untimed
        assert 0 < phases["epoch-end work"]["share"] < 1


def test_bad_arguments_exit_2_without_a_traceback():
    done = subprocess.run([sys.executable, str(SCRIPT), "--runs", "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "at least 1" in done.stderr and "Traceback" not in done.stderr
