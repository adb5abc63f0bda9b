"""Validation runs in eval mode with autograd off; each module's own mode comes back afterwards."""

import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainwise import Trainer, evaluating


def test_evaluating_restores_each_module_mode():
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.Dropout(0.5))
    model.train()
    model[1].eval()  # a layer the user keeps in eval mode
    with evaluating(model):
        assert all(not m.training for m in model.modules())
        assert not torch.is_grad_enabled() and torch.is_inference_mode_enabled()
    assert model.training and model[0].training and not model[1].training and model[2].training
    assert torch.is_grad_enabled()


def test_evaluating_restores_on_error():
    model = nn.Linear(2, 2)
    try:
        with evaluating(model):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert model.training


def test_evaluating_no_grad_variant():
    model = nn.Linear(2, 2)
    with evaluating(model, inference=False):
        out = model(torch.randn(1, 2))
    assert not torch.is_inference(out)


class _Probe(nn.Module):
    """Records, for each forward, whether every module trained and whether grad mode was on."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.1), nn.Linear(8, 3))
        self.calls = []

    def forward(self, x):
        modes = [m.training for m in self.modules()]
        self.calls.append((all(modes), any(modes), torch.is_grad_enabled()))
        return self.net(x)


def test_trainer_validates_in_eval_mode_and_trains_in_train_mode(tmp_path):
    x, y = torch.randn(40, 4), torch.randint(0, 3, (40,))
    model = _Probe()
    Trainer(epochs=2, batch_size=10, eval_batch_size=20, progress="off", run_dir=str(tmp_path), device="cpu").fit(
        model, TensorDataset(x, y), TensorDataset(x, y)
    )
    # per epoch: 4 training forwards, then 2 validation forwards
    expected = ([(True, True, True)] * 4 + [(False, False, False)] * 2) * 2
    assert model.calls == expected
