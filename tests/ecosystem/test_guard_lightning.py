"""The runtime guard inside a real ``lightning.Trainer`` on the CPU, installed the documented way: in
``on_fit_start`` with ``self.optimizers()`` (a ``LightningOptimizer``), closed in ``on_fit_end``. Clean runs in
automatic and manual optimization get no finding (a clean automatic run used to get TW105: the guard watched the
wrapper's ``zero_grad``, and Lightning zeroes through the optimizer inside it); a loss kept across steps, an
evaluation in train mode, a frozen BatchNorm in train mode and, in manual optimization, a missing ``zero_grad``
get their codes."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import trainwise as tw

L = pytest.importorskip("lightning")


class Classifier(L.LightningModule):
    """A small MLP with BatchNorm and dropout; ``mistake`` injects one of the errors the guard reports."""

    def __init__(self, *, manual: bool = False, mistake: str | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
        self.automatic_optimization = not manual
        self.mistake = mistake
        self.kept: list[torch.Tensor] = []
        if mistake == "frozen_norm_in_train_mode":
            self.net[1].requires_grad_(False)  # frozen, but Lightning's model.train() puts it back in train mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def on_fit_start(self) -> None:
        self.guard = tw.guard(self, self.optimizers(), action="record")  # the documented line

    def on_fit_end(self) -> None:
        self.guard.close()

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        if self.mistake == "kept_loss":
            self.kept.append(loss)  # every step's graph stays alive
        if self.automatic_optimization:
            return loss
        optimizer = self.optimizers()
        if self.mistake != "no_zero_grad":
            optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return None

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if self.mistake == "eval_in_train_mode":
            with torch.no_grad():  # an evaluation without self.eval(): dropout on, BatchNorm updating
                self(batch[0])

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.05)


def _fit(module: Classifier) -> Classifier:
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(48, 4, generator=g), torch.randint(0, 3, (48,), generator=g))
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, limit_train_batches=8, limit_val_batches=2,
                        num_sanity_val_steps=1, enable_progress_bar=False, logger=False, enable_checkpointing=False,
                        enable_model_summary=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice about workers and logging
        trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4),
                    torch.utils.data.DataLoader(data, batch_size=8))
    return module


@pytest.mark.parametrize("manual", [False, True], ids=["automatic", "manual"])
def test_a_clean_lightning_run_gets_no_finding(manual):
    module = _fit(Classifier(manual=manual))
    assert module.guard.findings == []
    assert module.guard.step == 8  # the guard saw every optimizer step
    assert module.guard.optimizer is module.trainer.optimizers[0]  # unwrapped from the LightningOptimizer


@pytest.mark.parametrize(("mistake", "code", "where"), [
    ("kept_loss", "TW102", "(the model)"),
    ("eval_in_train_mode", "TW103", "net.1"),  # the BatchNorm, named as in the user's module
    ("frozen_norm_in_train_mode", "TW108", "net.1"),
])
@pytest.mark.parametrize("manual", [False, True], ids=["automatic", "manual"])
def test_each_mistake_in_a_lightning_run_gets_its_code(mistake, code, where, manual):
    module = _fit(Classifier(manual=manual, mistake=mistake))
    assert [(f.code, f.where) for f in module.guard.findings] == [(code, where)]


def test_manual_optimization_without_zero_grad_is_reported():
    module = _fit(Classifier(manual=True, mistake="no_zero_grad"))
    assert [f.code for f in module.guard.findings] == ["TW105"]
