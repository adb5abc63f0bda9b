"""fit() builds the model after seeding when given a factory, so the README's first example repeats exactly.

Before: Trainer(seed=0).fit(Model(), ...) built the model before any seed was set; two runs started from
different weights (only the data order repeated), and fit refused a factory.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainwise import Trainer, TrainwiseError, read_log


def _data():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(24, 4, generator=g), torch.randint(0, 3, (24,), generator=g))


def _trainer(run_dir):
    return Trainer(epochs=1, batch_size=8, seed=0, device="cpu", progress="off", plot=False, diagnose=False,
                   checkpoints=False, run_dir=str(run_dir))


def _model():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def test_a_factory_gives_the_same_weights_whatever_the_rng_did_before(tmp_path):
    torch.manual_seed(123)
    first = _trainer(tmp_path / "a").fit(_model, _data())
    torch.rand(1000)  # the caller's RNG moves on
    second = _trainer(tmp_path / "b").fit(_model, _data())
    assert isinstance(first.model, nn.Sequential)
    for (name, a), (_, b) in zip(first.model.state_dict().items(), second.model.state_dict().items()):
        assert torch.equal(a, b), name


def test_an_instance_keeps_the_callers_weights_and_the_log_says_so(tmp_path):
    model = _model()
    result = _trainer(tmp_path / "run").fit(model, _data())
    assert result.model is model
    notes = [r for r in read_log(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "note"]
    assert len(notes) == 1 and "caller's RNG" in notes[0]["message"]


def test_a_factory_that_returns_no_module_is_one_sentence(tmp_path):
    with pytest.raises(TrainwiseError, match=r"returned a dict, not a torch\.nn\.Module"):
        _trainer(tmp_path / "run").fit(lambda: {}, _data())


def test_the_readme_first_example_repeats_bit_for_bit(tmp_path, monkeypatch):
    """The README's first example, run twice as written (with a different RNG state before each run)."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    code = re.search(r"```python\n(import trainwise as tw\n.*?)```", readme, re.S).group(1)
    code = code.replace("epochs=5", "epochs=1")  # the same example, shorter
    results = []
    for run in range(2):
        monkeypatch.chdir(tmp_path)
        torch.manual_seed(run)  # whatever the caller's RNG held before
        namespace: dict = {}
        exec(compile(code, "README.md", "exec"), namespace)
        results.append(namespace["result"])
    first, second = (r.model.state_dict() for r in results)
    for name in first:
        assert torch.equal(first[name], second[name]), name
    assert results[0].last["val_accuracy"] == results[1].last["val_accuracy"]
