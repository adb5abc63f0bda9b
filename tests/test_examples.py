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
