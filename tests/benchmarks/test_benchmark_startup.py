"""benchmarks/startup.py runs end to end (one round) and reports every measurement; no time is asserted."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "startup.py"
HEAVY = {"torch._dynamo", "sympy", "torch.distributed.fsdp", "matplotlib", "onnx", "onnxscript", "onnxruntime",
         "libcst", "tensorboard"}


@pytest.mark.slow
def test_startup_benchmark_reports_the_four_measurements():
    done = subprocess.run([sys.executable, str(SCRIPT), "--repeats", "1", "--json"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["repeats"] == 1
    measurements = report["measurements"]
    assert measurements["import_torch"]["seconds"]["median"] > 0
    for name in ("import_trainwise", "first_step", "ckpt_inspect", "predict"):
        entry = measurements[name]
        assert entry["seconds"]["median"] > 0, name
        assert entry["ratio"] > 0, name
        assert entry["pair_ratio"]["min"] > 0, name
        assert entry["modules"] > 0, name
    assert measurements["import_trainwise"]["torch_loaded"] in (True, False)
    for name in ("first_step", "first_step_hand", "ckpt_inspect", "predict"):
        entry = measurements[name]
        assert set(entry["heavy_modules"]) <= HEAVY, name
        assert set(entry["import_chains"]) <= HEAVY, name
        assert all(isinstance(chain, list) and chain for chain in entry["import_chains"].values()), name
    for name in ("first_step", "first_step_hand"):
        first = measurements[name]["first_step"]
        assert 0 < first["median"] <= measurements[name]["seconds"]["median"], name
        assert "median" in measurements[name]["over_import_torch"], name
    assert "median" in measurements["first_step"]["over_hand_loop"]
    assert measurements["first_step"]["modules"] > measurements["import_trainwise"]["modules"]
