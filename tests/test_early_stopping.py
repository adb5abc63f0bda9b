"""Early stopping on a scripted metric sequence; the model ends with the best epoch's weights."""

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainwise import Trainer, TrainwiseError
from trainwise.early_stopping import EarlyStopping


def test_stops_at_the_right_epoch_and_restores_the_best_weights():
    model = nn.Linear(2, 1)
    stopper = EarlyStopping("val_loss", patience=2)
    losses = [1.0, 0.8, 0.5, 0.6, 0.55, 0.7, 0.4]  # best at epoch 3; epochs 4 and 5 are no better; stop at 5
    weights = {}
    stopped_at = None
    for epoch, loss in enumerate(losses, start=1):
        with torch.no_grad():
            model.weight.fill_(epoch)
        weights[epoch] = model.weight.detach().clone()
        if stopper.update(epoch, {"val_loss": loss}, model):
            stopped_at = epoch
            break
    assert stopped_at == 5 and stopper.best_epoch == 3 and stopper.best_value == 0.5
    assert stopper.restore(model) == 3
    assert torch.equal(model.weight, weights[3])


def test_max_mode_min_delta_and_disk(tmp_path):
    model = nn.Linear(2, 1)
    stopper = EarlyStopping("val_accuracy", patience=2, min_delta=0.01, keep="disk", path=tmp_path / "best.pt")
    assert stopper.mode == "max"
    sequence = [0.50, 0.60, 0.605, 0.59]  # 0.605 is within min_delta: no improvement
    results = [stopper.update(e, {"val_accuracy": v}, model) for e, v in enumerate(sequence, start=1)]
    assert results == [False, False, False, True] and stopper.best_epoch == 2
    assert (tmp_path / "best.pt").exists()


def test_monitor_that_is_never_logged_names_the_ones_that_exist():
    with pytest.raises(TrainwiseError, match=r"'val_acc', which is not logged; use one of: .*val_accuracy"):
        EarlyStopping("val_acc").update(1, {"val_accuracy": 0.5, "val_loss": 1.0, "epoch": 1})


def _data():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(32, 4, generator=g), torch.randint(0, 2, (32,), generator=g))


def test_trainer_early_stopping_restores_best_epoch(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)

    class _Probe(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)

    wrapped = _Probe(model)
    val = _data()
    # lr so large that validation loss diverges after the first epochs: early stopping must catch it
    result = Trainer(epochs=30, lr=5.0, batch_size=8, patience=2, progress="off", device="cpu", plot=False,
                     optimizer=lambda p: torch.optim.SGD(p, lr=5.0), run_dir=str(tmp_path)).fit(wrapped, _data(), val)
    losses = [r["val_loss"] for r in result.history]
    best = min(range(len(losses)), key=losses.__getitem__) + 1
    assert result.stopped_early and result.best_epoch == best
    assert len(result.history) == best + 2  # patience 2: stops on the second epoch without improvement
    check = Trainer(progress="off", device="cpu", run_dir=str(tmp_path / "v")).validate(wrapped, [val[:]])
    assert check["loss"] == pytest.approx(losses[best - 1], rel=1e-6)


def test_trainer_monitor_missing_is_an_error_after_first_validation(tmp_path):
    trainer = Trainer(epochs=3, patience=1, monitor="val_f1", progress="off", device="cpu", plot=False,
                      run_dir=str(tmp_path))
    with pytest.raises(TrainwiseError, match="'val_f1', which is not logged"):
        trainer.fit(nn.Linear(4, 2), _data(), _data())


def test_patience_zero_stops_at_the_first_epoch_that_does_not_improve():
    """Keras and Lightning: patience=0 stops on the first bad epoch; it used to stop after an improving one."""
    stopper = EarlyStopping("val_loss", patience=0)
    assert [stopper.update(e, {"val_loss": v}) for e, v in enumerate([3.0, 2.0, 1.0, 1.5], start=1)] == [
        False, False, False, True]
    assert stopper.best_epoch == 3 and stopper.stopped_epoch == 4


def test_a_run_that_stopped_early_stays_stopped_when_resumed(tmp_path):
    """Relaunching an early-stopped run with resume="auto" used to train one more epoch."""
    data = TensorDataset(torch.randn(16, 3), torch.randint(0, 2, (16,)))
    val = TensorDataset(torch.randn(8, 3), torch.randint(0, 2, (8,)))

    def fit(**options):
        torch.manual_seed(0)
        model = nn.Linear(3, 2)
        trainer = Trainer(epochs=30, batch_size=8, patience=1, progress="off", device="cpu", plot=False,
                          optimizer=lambda p: torch.optim.SGD(p, lr=20.0), run_dir=str(tmp_path / "run"), **options)
        return model, trainer.fit(model, data, val)

    model, first = fit()
    assert first.stopped_early and len(first.history) < 30
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    again, second = fit(resume="auto")
    assert second.stopped_early and second.history == first.history
    assert second.steps == first.steps  # not one step more
    assert second.best_epoch == first.best_epoch
    for key, value in again.state_dict().items():
        assert torch.equal(value, weights[key]), key  # the best epoch's weights, as the first run ended
