"""Checkpoints whose content was crafted or damaged inside a valid file: one sentence each, nothing half-restored."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from trainwise import TrainwiseError, load_checkpoint, save_checkpoint
from trainwise.seeding import get_rng_state


def _live_state():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    return {"model": model, "optimizer": optimizer, "step": 1}


def _crafted(tmp_path, change):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, _live_state())
    checkpoint = torch.load(path, weights_only=True)
    change(checkpoint)
    torch.save(checkpoint, path)
    return path


def _numpy(entry):
    entry["rng"]["numpy"] = {"kind": "MT19937"}


def _keys(entry):
    entry["rng"]["numpy"]["keys"] = torch.zeros(3, dtype=torch.int64)


RNG_DAMAGE = {
    "a string": lambda c: c.__setitem__("rng", "seed"),
    "no numpy entry": lambda c: c["rng"].pop("numpy"),
    "numpy without keys": _numpy,
    "numpy keys too short": _keys,
    "python state [1]": lambda c: c["rng"].__setitem__("python", [1]),
    "torch state zeros(3)": lambda c: c["rng"].__setitem__("torch", torch.zeros(3)),
    "torch state a string": lambda c: c["rng"].__setitem__("torch", "x"),
}


@pytest.mark.parametrize("damage", sorted(RNG_DAMAGE))
def test_a_damaged_rng_entry_is_one_sentence_and_changes_no_rng(tmp_path, damage):
    path = _crafted(tmp_path, RNG_DAMAGE[damage])
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    live = _live_state()
    before = get_rng_state()
    with pytest.raises(TrainwiseError, match="rng entry is damaged") as caught:
        load_checkpoint(path, live)
    assert "\n" not in str(caught.value)
    after = get_rng_state()
    assert after["python"] == before["python"]
    assert np.array_equal(after["numpy"][1], before["numpy"][1]) and after["numpy"][2] == before["numpy"][2]
    assert torch.equal(after["torch"], before["torch"])
    load_checkpoint(path, _live_state(), rng=False)  # the named way out works


@pytest.mark.parametrize("value", [[1, 2], "state", {"state": 1}, {"param_groups": "x"}])
def test_an_optimizer_entry_that_does_not_fit_is_one_sentence(tmp_path, value):
    path = _crafted(tmp_path, lambda c: c["state"].__setitem__("optimizer", value))
    with pytest.raises(TrainwiseError, match="'optimizer' entry does not fit this SGD") as caught:
        load_checkpoint(path, _live_state())
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("version", ["1", 1.0, True, 0, -3, None])
def test_a_format_version_that_is_not_a_number_says_the_file_is_damaged(tmp_path, version):
    path = _crafted(tmp_path, lambda c: c.__setitem__("trainwise_checkpoint", version))
    with pytest.raises(TrainwiseError, match="is damaged: its checkpoint format is") as caught:
        load_checkpoint(path, _live_state())
    assert "newer trainwise" not in str(caught.value)


def test_a_newer_format_still_says_upgrade(tmp_path):
    path = _crafted(tmp_path, lambda c: c.__setitem__("trainwise_checkpoint", 99))
    with pytest.raises(TrainwiseError, match="newer trainwise"):
        load_checkpoint(path, _live_state())
