"""``trainwise.integrations.lightning.TrainwiseGuard`` in a real ``lightning.Trainer`` on the CPU: a clean fit
reports nothing and logs nothing; each mistake the guards catch inside a LightningModule is reported with its
code and place, and its count reaches Lightning's logger, whether ``training_step`` calls ``self(x)`` or the
submodule ``self.model(x)`` (as most LightningModules do)."""

from __future__ import annotations

import csv
import warnings

import pytest
import torch
from torch import nn

L = pytest.importorskip("lightning")
from trainwise.guards import GuardWarning  # noqa: E402
from trainwise.integrations.lightning import TrainwiseGuard  # noqa: E402


class Classifier(L.LightningModule):
    """A small MLP (BatchNorm, dropout) in ``self.model``; ``mistake`` injects one error, ``style`` says whether
    ``training_step`` calls ``self(x)`` or ``self.model(x)``."""

    def __init__(self, *, style: str = "self", mistake: str | None = None, manual: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
        self.style, self.mistake = style, mistake
        self.automatic_optimization = not manual
        self.losses: list[torch.Tensor] = []
        if mistake == "frozen_norm_in_train_mode":
            self.model[:2].requires_grad_(False)  # frozen, but Lightning's model.train() puts the BatchNorm back
        if mistake == "unregistered_head":
            self.extra = [nn.Linear(3, 3)]  # a plain list: not in parameters(), never trained
        self.start = [p.detach().clone() for p in self.model.parameters()]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(x)
        return self.extra[0](out) if self.mistake == "unregistered_head" else out

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self(x) if self.style == "self" else self.model(x)
        loss = nn.functional.cross_entropy(out, y)
        if self.mistake == "kept_loss":
            self.losses.append(loss)  # every step's graph stays alive
        if self.mistake == "sqrt_of_zero":  # an L2-SP pull to the start, through sqrt: its gradient at 0 is NaN
            drift = sum(((p - p0) ** 2).sum() for p, p0 in zip(self.model.parameters(), self.start))
            loss = loss + 0.01 * drift.sqrt()
        if self.mistake == "eval_with_grad" and batch_idx % 2:
            self.eval()  # a validation by hand, without no_grad: a graph recorded for nothing
            held_out = nn.functional.cross_entropy(self(x) if self.style == "self" else self.model(x), y)
            self.log("held_out", held_out.item())
            self.train()
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
            with torch.no_grad():  # an evaluation without eval(): dropout on, BatchNorm updating
                self(batch[0]) if self.style == "self" else self.model(batch[0])

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.05)


def _data():
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(48, 4, generator=g), torch.randint(0, 3, (48,), generator=g))
    return torch.utils.data.DataLoader(data, batch_size=4), torch.utils.data.DataLoader(data, batch_size=16)


def _fit(module: L.LightningModule, callback: TrainwiseGuard, **trainer_args) -> L.Trainer:
    options = dict(max_steps=8, limit_val_batches=1, val_check_interval=4, num_sanity_val_steps=1,
                   accelerator="cpu", devices=1, enable_progress_bar=False, logger=False,
                   enable_checkpointing=False, enable_model_summary=False, callbacks=[callback])
    trainer = L.Trainer(**{**options, **trainer_args})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice about workers and logging
        warnings.simplefilter("always", GuardWarning)
        trainer.fit(module, *_data())
    return trainer


@pytest.mark.parametrize("style", ["self", "model"])
@pytest.mark.parametrize("manual", [False, True], ids=["automatic", "manual"])
def test_a_clean_fit_reports_and_logs_nothing(style, manual):
    callback = TrainwiseGuard(action="record")
    trainer = _fit(Classifier(style=style, manual=manual), callback)
    assert callback.findings == []
    assert callback.guards[0].step == 8  # the guard saw every optimizer step
    assert callback.guards[0].optimizer is trainer.optimizers[0]  # inside the LightningOptimizer
    assert not [name for name in trainer.logged_metrics if name.startswith("trainwise/")]


MISTAKES = [
    ("kept_loss", "TW102", "(the model)"),
    ("eval_in_train_mode", "TW103", "model.1"),  # the BatchNorm, named as in the LightningModule
    ("eval_with_grad", "TW104", "(the model)"),
    ("frozen_norm_in_train_mode", "TW108", "model.1"),
    ("sqrt_of_zero", "TW113", "model.0.weight"),
]


@pytest.mark.parametrize("style", ["self", "model"])
@pytest.mark.parametrize(("mistake", "code", "where"), MISTAKES)
def test_each_mistake_in_a_lightning_fit_is_reported_and_logged(mistake, code, where, style):
    callback = TrainwiseGuard(action="record")
    trainer = _fit(Classifier(style=style, mistake=mistake), callback)
    assert [(f.code, f.where) for f in callback.findings] == [(code, where)]
    if code != "TW113":  # found at the last check, at fit end: logged to the loggers then (next test)
        assert float(trainer.logged_metrics[f"trainwise/{code}"]) == 1.0


def test_an_unregistered_module_and_a_missing_zero_grad_are_reported():
    callback = TrainwiseGuard(action="record")
    _fit(Classifier(mistake="unregistered_head"), callback)
    assert [(f.code, f.where) for f in callback.findings] == [("TW114", "extra")]
    callback = TrainwiseGuard(action="record")
    _fit(Classifier(manual=True, mistake="no_zero_grad"), callback)
    assert [f.code for f in callback.findings] == ["TW105"]


def _rows(path) -> list[dict[str, str]]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def test_the_counts_reach_the_logger_file_and_each_finding_is_a_warning(tmp_path):
    """A CSVLogger's metrics.csv holds the count of a finding made during the fit and of one made at its end."""
    callback = TrainwiseGuard()
    with pytest.warns(UserWarning, match=r"TW113 at step \d+ .*model.0.weight.*turned inf or NaN"):
        _fit(Classifier(mistake="sqrt_of_zero"), callback,
             logger=L.pytorch.loggers.CSVLogger(tmp_path, name="run", version=0), log_every_n_steps=1)
    rows = _rows(tmp_path / "run" / "version_0" / "metrics.csv")
    assert [float(r["trainwise/TW113"]) for r in rows if r.get("trainwise/TW113")] == [1.0]
    callback = TrainwiseGuard(action="record")
    _fit(Classifier(mistake="kept_loss"), callback,
         logger=L.pytorch.loggers.CSVLogger(tmp_path, name="kept", version=0), log_every_n_steps=2)
    rows = _rows(tmp_path / "kept" / "version_0" / "metrics.csv")
    logged = [(int(r["step"]), float(r["trainwise/TW102"])) for r in rows if r.get("trainwise/TW102")]
    assert logged and logged[0][0] <= 5 and {n for _, n in logged} == {1.0}  # reported at step 3


def test_a_frozen_teacher_called_under_no_grad_is_not_an_evaluation():
    """Only submodules with trainable parameters count as the model's forward: a frozen teacher's no_grad
    forward in training_step (with the student's dropout in train mode, rightly) reports nothing."""

    class Distills(Classifier):
        def __init__(self):
            super().__init__(style="model")
            self.teacher = nn.Sequential(nn.Linear(4, 3)).requires_grad_(False)

        def training_step(self, batch, batch_idx):
            with torch.no_grad():
                target = self.teacher(batch[0]).softmax(-1)
            return nn.functional.cross_entropy(self.model(batch[0]), target)

    callback = TrainwiseGuard(action="record")
    _fit(Distills(), callback)
    assert callback.findings == []


def test_two_optimizers_get_the_step_checks_each_and_no_false_coverage_finding():
    class TwoParts(Classifier):
        def __init__(self, mistake=None):
            super().__init__(manual=True, mistake=mistake)

        def training_step(self, batch, batch_idx):
            first, second = self.optimizers()
            loss = nn.functional.cross_entropy(self.model(batch[0]), batch[1])
            first.zero_grad()
            if self.mistake != "no_zero_grad":
                second.zero_grad()
            self.manual_backward(loss)
            first.step()
            second.step()

        def configure_optimizers(self):
            return (torch.optim.SGD(self.model[:2].parameters(), lr=0.05),
                    torch.optim.SGD(self.model[2:].parameters(), lr=0.05))

    callback = TrainwiseGuard(action="record")
    _fit(TwoParts(), callback)
    assert len(callback.guards) == 2 and callback.findings == []
    callback = TrainwiseGuard(action="record")
    _fit(TwoParts(mistake="no_zero_grad"), callback)
    assert [f.code for f in callback.findings] == ["TW105"]


def test_the_guard_is_removed_after_the_fit_and_after_an_exception():
    class Fails(Classifier):
        def training_step(self, batch, batch_idx):
            if batch_idx == 2:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    module = Fails()
    callback = TrainwiseGuard(action="record")
    with pytest.raises(RuntimeError, match="boom"):
        _fit(module, callback)
    assert not module._forward_pre_hooks and not module.model._forward_pre_hooks
    assert "zero_grad" not in vars(module)
    module = Classifier(style="model")
    _fit(module, TrainwiseGuard(action="record"))
    assert not module._forward_hooks and not module.model._forward_hooks


def test_the_older_pytorch_lightning_package_takes_the_same_callback():
    pl = pytest.importorskip("pytorch_lightning")

    class Keeps(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = nn.Linear(4, 3)
            self.losses = []

        def training_step(self, batch, batch_idx):
            loss = nn.functional.cross_entropy(self.model(batch[0]), batch[1])
            self.losses.append(loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    callback = TrainwiseGuard(action="record")
    trainer = pl.Trainer(max_steps=6, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Keeps(), _data()[0])
    assert [f.code for f in callback.findings] == ["TW102"]
