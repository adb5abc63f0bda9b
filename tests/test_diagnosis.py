"""Overfitting: fires on a run built to overfit, silent on healthy and noisy runs; the plot is a PNG."""

import pytest
import torch
from torch import nn
from torch.utils.data import Subset

from trainwise import Trainer, seed_everything
from trainwise.demo import digits_datasets, run_demo
from trainwise.diagnosis import detect_overfitting
from trainwise.plots import PLOT_HINT, plot_learning_curves


def _history(train, val):
    return [{"epoch": i + 1, "train_loss": t, "val_loss": v} for i, (t, v) in enumerate(zip(train, val, strict=True))]


def test_scripted_onset():
    history = _history([1.0, 0.7, 0.5, 0.4, 0.3, 0.2, 0.1], [1.0, 0.8, 0.6, 0.65, 0.7, 0.8, 0.9])
    report = detect_overfitting(history)
    assert report is not None and report.onset_epoch == 4 and report.best_epoch == 3
    assert report.gap == pytest.approx(0.8 - 0.2)
    assert "epoch 4" in report.message() and "weight decay" in report.message()


@pytest.mark.parametrize(
    "train, val",
    [
        ([1.0, 0.8, 0.6, 0.5, 0.45, 0.4, 0.38], [1.0, 0.82, 0.65, 0.58, 0.55, 0.53, 0.52]),  # healthy
        ([1.0, 0.8, 0.6, 0.5, 0.45, 0.4, 0.38], [1.0, 0.8, 0.6, 0.62, 0.59, 0.61, 0.6]),  # noisy plateau
        ([1.0, 0.8, 0.6, 0.7, 0.9, 1.2, 1.5], [1.0, 0.8, 0.6, 0.7, 0.9, 1.2, 1.5]),  # both rising: divergence
        ([1.0, 0.8, 0.6, 0.5], [1.0, 0.8, 0.9, 1.0]),  # too short to tell
    ],
)
def test_silent_on_healthy_noisy_and_diverging_runs(train, val):
    assert detect_overfitting(_history(train, val)) is None


@pytest.mark.slow
def test_fires_on_a_run_built_to_overfit(tmp_path):
    seed_everything(0)
    train, val = digits_datasets(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 10))
    result = Trainer(epochs=10, lr=3e-3, weight_decay=0.0, batch_size=10, progress="off", device="cpu",
                     run_dir=str(tmp_path)).fit(model, Subset(train, range(30)), val)
    assert result.overfitting is not None
    assert result.overfitting.gap > 1.0
    records = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert sum('"kind": "overfitting"' in line for line in records) == 1  # reported once
    # the default plot is trainwise's own SVG, drawn without matplotlib
    assert result.plot == tmp_path / "learning_curves.svg" and "<svg" in result.plot.read_text()


@pytest.mark.slow
def test_silent_on_a_healthy_demo_run(tmp_path):
    summary = run_demo(seed=0, run_dir=str(tmp_path), device="cpu", progress="off")
    assert summary["overfitting"] is None
    assert summary["val_accuracy"] >= 0.95


def test_plot_is_a_valid_png(tmp_path):
    pytest.importorskip("matplotlib")
    history = _history([1.0, 0.7, 0.5, 0.4], [1.1, 0.8, 0.7, 0.75])
    for record in history:
        record["val_accuracy"] = 0.5
    path = plot_learning_curves(history, tmp_path / "curves.png", monitor="val_accuracy", best_epoch=3,
                                overfitting_epoch=4)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert not list(tmp_path.glob(".*tmp*"))


def test_without_matplotlib_one_line_and_training_goes_on(tmp_path, monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(16, 4, generator=g), torch.randint(0, 2, (16,), generator=g))
    result = Trainer(epochs=2, progress="lines", device="cpu", run_dir=str(tmp_path / "png"),
                     plot_format="png").fit(nn.Linear(4, 2), data)
    assert result.stopped == "completed" and result.plot is None
    assert capsys.readouterr().out.count(PLOT_HINT) == 1
    # the default SVG needs no plotting library at all
    result = Trainer(epochs=2, progress="lines", device="cpu", run_dir=str(tmp_path / "svg")).fit(nn.Linear(4, 2), data)
    assert result.plot is not None and result.plot.suffix == ".svg" and PLOT_HINT not in capsys.readouterr().out


def test_png_learning_curves_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(16, 4, generator=g), torch.randint(0, 2, (16,), generator=g))
    result = Trainer(epochs=2, progress="off", device="cpu", run_dir=str(tmp_path), plot_format="png").fit(
        nn.Linear(4, 2), data, data)
    assert result.plot == tmp_path / "learning_curves.png"
    assert result.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
