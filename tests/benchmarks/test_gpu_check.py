"""benchmarks/gpu_check.py: its Trainer-against-hand-loop timing runs on CPU (``--cpu-dry-run``) and reports
tokens/s and MFU for both sides; the GPT-2-small shape and the peak table are the ones MFU needs. On a machine
with CUDA the real check runs too (every CUDA path, with one short timing round)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from benchmark_scripts import load_benchmark

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    try:
        yield load_benchmark("gpu_check")  # registered: dataclasses look their module up while the file executes
    finally:
        sys.modules.pop("gpu_check", None)


def _report(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
def test_dry_run_times_both_sides(gpu_check, capsys):
    assert gpu_check.main(["--cpu-dry-run", "--json", "--peak-tflops", "1"]) == 0
    out = capsys.readouterr().out
    report = _report(out)
    assert report["device"] == "cpu" and report["peak_flops"] == 1e12
    for side in ("hand", "trainer"):
        entry = report["sides"][side]
        assert entry["tokens_per_s"] > 0
        assert entry["mfu"] > 0
        assert math.isfinite(entry["mean_loss"])
    # same model, data and optimizer: the Trainer's own token cross-entropy is the hand loop's
    assert report["sides"]["trainer"]["mean_loss"] == pytest.approx(report["sides"]["hand"]["mean_loss"], abs=0.1)
    assert report["ratio"] > 0 and len(report["round_ratios"]) == report["shape"]["rounds"]
    assert "ratio trainer/hand tokens/s" in out


def test_dry_run_without_a_peak_says_unknown(gpu_check, capsys):
    assert gpu_check.main(["--cpu-dry-run", "--json", "--rounds", "1", "--warmup", "1", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    report = _report(out)
    assert report["sides"]["hand"]["tokens_per_s"] > 0 and report["sides"]["trainer"]["tokens_per_s"] > 0
    assert report["sides"]["hand"]["mfu"] is None and report["sides"]["trainer"]["mfu"] is None
    assert "unknown peak" in out


def test_gpt2_small_shape_and_flops(gpu_check):
    shape = gpu_check.GPT2_SMALL
    with torch.device("meta"):
        model = gpu_check.GPT(shape)
    assert sum(p.numel() for p in model.parameters()) == 124_439_808  # GPT-2 small, tied embeddings
    assert model.lm_head.weight is model.wte.weight
    parameters = gpu_check.flop_parameters(model)
    assert parameters == 124_439_808 - 1024 * 768  # all but the position embedding
    assert gpu_check.flops_per_token(shape, parameters) == 6 * parameters + 12 * 12 * 12 * 64 * 1024


@pytest.mark.parametrize(("name", "peak"), [
    ("NVIDIA H200", 989e12),
    ("NVIDIA H100 80GB HBM3", 989e12),
    ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA GeForce RTX 4090", None),
])
def test_peak_by_device_name(gpu_check, name, peak):
    assert gpu_check.peak_bf16_flops(name)[0] == peak
    assert gpu_check.peak_bf16_flops(name, 100.0)[0] == 100e12


def test_without_cuda_it_says_so_and_exits_0(gpu_check, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # so that it runs on a GPU machine too
    assert gpu_check.main([]) == 0
    assert "no CUDA device here" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the CPU path is the dry run above)")
def test_the_real_check_on_cuda():
    """Every CUDA check of the script (device, precision, pinned copies, bf16/fp16 demo runs, OOM recovery), then
    the GPT-2-small timing cut to one round of 2 + 3 steps per side. In a process of its own: the OOM check caps
    the process's GPU memory."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "--json", "--rounds", "1", "--warmup", "2", "--steps", "3"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    out = proc.stdout
    assert "FAILED" not in out
    assert "device cuda" in out and "OOM recovery: trained at micro-batch" in out
    report = _report(out)
    assert report["device"] == torch.cuda.get_device_name(0)
    assert report["shape"]["layers"] == 12 and report["shape"]["rounds"] == 1 and len(report["round_ratios"]) == 1
    for side in ("hand", "trainer"):
        entry = report["sides"][side]
        assert entry["tokens_per_s"] > 0 and math.isfinite(entry["mean_loss"])
        assert (entry["mfu"] is None) == (report["peak_flops"] is None)
    assert report["sides"]["trainer"]["mean_loss"] == pytest.approx(report["sides"]["hand"]["mean_loss"], abs=0.1)
