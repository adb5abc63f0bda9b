"""Norm layers frozen with requires_grad_(False) (not trainwise.freeze) keep their running statistics.

Before: the tutorial recipe `backbone.requires_grad_(False)` then Trainer.fit left every BatchNorm of the
"frozen" backbone updating its running statistics in train mode (num_batches_tracked 10000 -> 10012).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainwise import Trainer, read_log
from trainwise.freezing import pin_frozen_norm_layers


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                                      nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4, affine=False), nn.ReLU())
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * 4 * 4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))

    def forward(self, x):
        return self.head(self.backbone(x))


def _data():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(24, 1, 8, 8, generator=g), torch.randint(0, 3, (24,), generator=g))


def _stats(module):
    return {k: v.clone() for k, v in module.state_dict().items() if "running" in k or "num_batches" in k}


def _fit(tmp_path, **options):
    torch.manual_seed(0)
    model = _Net()
    model.backbone.requires_grad_(False)  # the tutorial recipe
    before = _stats(model.backbone)
    Trainer(epochs=2, batch_size=8, device="cpu", progress="off", plot=False, diagnose=False, checkpoints=False,
            run_dir=str(tmp_path / "run"), **options).fit(model, _data())
    return model, before


def test_the_trainer_keeps_frozen_norm_layers_in_eval_and_says_so_once(tmp_path):
    model, before = _fit(tmp_path)
    after = _stats(model.backbone)
    for key in before:
        assert torch.equal(before[key], after[key]), key
    assert model.head[2].num_batches_tracked.item() == 6  # the trainable head's BatchNorm still learns
    notes = [r for r in read_log(tmp_path / "run" / "metrics.jsonl") if r.get("norm_layers")]
    assert len(notes) == 1 and notes[0]["norm_layers"] == ["backbone.1", "backbone.4"]


def test_train_norm_stats_lets_them_update(tmp_path):
    model, before = _fit(tmp_path, train_norm_stats=True)
    assert model.backbone[1].num_batches_tracked.item() == before["1.num_batches_tracked"].item() + 6


def test_one_call_in_a_hand_written_loop():
    model = _Net()
    model.backbone.requires_grad_(False)
    assert pin_frozen_norm_layers(model) == ["backbone.1", "backbone.4"]
    model.train()
    assert not model.backbone[1].training and not model.backbone[4].training and model.head[2].training
    model.head[2].weight.requires_grad_(False)  # weight frozen, bias still trainable: not all frozen
    assert pin_frozen_norm_layers(model) == []
