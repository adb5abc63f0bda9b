"""Every example runs (briefly), so that the docs cannot drift from the code."""

import importlib.util
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["hand_written_loop", "trainer_loop"])
def test_example_runs_one_epoch(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    values = _load(name).main(epochs=1)
    accuracy = values.get("accuracy", values.get("val_accuracy"))
    assert accuracy > 0.8


def test_hand_written_loop_does_what_the_trainer_does(tmp_path, monkeypatch):
    """The README's hand-written loop, built from the same primitives, ends on the Trainer's exact numbers."""
    monkeypatch.chdir(tmp_path)
    by_hand = _load("hand_written_loop").main(epochs=1)
    trainer = _load("trainer_loop").main(epochs=1, run_dir=str(tmp_path / "run"))
    assert by_hand["loss"] == trainer["val_loss"]
    assert by_hand["accuracy"] == trainer["val_accuracy"]
