"""The Trainer end to end on real tensors: reproducibility, no graph leaks, precision, bad input, stops."""

import gc
import json
import os
import warnings
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainwise import NonFiniteLossError, Trainer, TrainwiseError
from trainwise.demo import run_demo
from trainwise.guards import UnoptimizedParameterWarning
from trainwise.runlog import read_log


def _data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g))


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _trainer(tmp_path, **kw):
    kw.setdefault("progress", "off")
    kw.setdefault("device", "cpu")
    kw.setdefault("plot", False)
    return Trainer(run_dir=str(tmp_path / "run"), **kw)


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.slow
def test_demo_same_seed_with_workers_is_bitwise_identical(tmp_path):
    runs = [
        run_demo(seed=s, epochs=2, workers=2, run_dir=str(tmp_path / f"r{i}"), device="cpu", progress="off")
        for i, s in enumerate((1, 1, 2))
    ]
    a, b, c = (_weights(r["model"]) for r in runs)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)
    assert runs[0]["val_loss"] == runs[1]["val_loss"]


def test_effective_batch_matches_one_big_batch(tmp_path):
    data = _data(64)
    base = _mlp()
    accumulated = _mlp()
    sgd = lambda p: torch.optim.SGD(p, lr=0.5)  # noqa: E731
    loader = DataLoader(data, batch_size=32, shuffle=False)
    _trainer(tmp_path / "a", epochs=2, optimizer=sgd).fit(base, loader)
    micro = DataLoader(data, batch_size=8, shuffle=False)
    _trainer(tmp_path / "b", epochs=2, optimizer=sgd, effective_batch=32).fit(accumulated, micro)
    for p, q in zip(base.parameters(), accumulated.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_effective_batch_not_divisible_by_loader_batch(tmp_path):
    with pytest.raises(TrainwiseError, match="does not divide the effective batch"):
        _trainer(tmp_path, effective_batch=30).fit(_mlp(), DataLoader(_data(), batch_size=8))


def test_no_tensor_with_grad_fn_survives_a_step(tmp_path):
    previous = []  # weak references to every earlier step's outputs and loss
    leaks = []

    def loss_fn(outputs, targets):
        gc.collect()
        leaks.extend(ref for ref in previous if ref() is not None)
        loss = F.cross_entropy(outputs, targets)
        if outputs.grad_fn is not None:
            previous.extend([weakref.ref(outputs), weakref.ref(loss)])
        return loss

    def graph_tensors():
        gc.collect()
        with warnings.catch_warnings():  # isinstance() on torch's deprecated module attributes warns
            warnings.simplefilter("ignore", FutureWarning)
            return {id(o) for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.grad_fn is not None}

    before = graph_tensors()  # other tests may keep their own graphs alive; only ours count
    gc.freeze()  # collections scan only what this test creates, however much earlier tests imported (seconds)
    try:
        model = _mlp()
        _trainer(tmp_path, epochs=3, batch_size=16, loss_fn=loss_fn, log_every=1).fit(model, _data(), _data(32, 1))
    finally:
        gc.unfreeze()
    assert len(previous) == 2 * 3 * 4
    assert leaks == []
    assert not graph_tensors() - before
    assert all(ref() is None for ref in previous)


def test_fp16_uses_a_scaler_and_bf16_does_not(tmp_path, monkeypatch):
    calls = []
    original = torch.amp.GradScaler.step

    def counting_step(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.amp.GradScaler, "step", counting_step)
    result = _trainer(tmp_path / "fp16", epochs=1, batch_size=16, precision="fp16").fit(_mlp(), _data())
    assert result.precision == "fp16" and len(calls) == 4
    calls.clear()
    result = _trainer(tmp_path / "bf16", epochs=1, batch_size=16, precision="bf16").fit(_mlp(), _data(), _data())
    assert result.precision == "bf16" and calls == []
    assert result.stopped == "completed" and result.last["train_loss"] == result.last["train_loss"]  # not NaN


def test_bf16_autocast_is_really_used_on_cpu(tmp_path):
    dtypes = []

    def loss_fn(outputs, targets):
        dtypes.append(outputs.dtype)
        return F.cross_entropy(outputs, targets)

    _trainer(tmp_path, epochs=1, batch_size=32, precision="bf16", loss_fn=loss_fn).fit(_mlp(), _data())
    assert dtypes == [torch.bfloat16, torch.bfloat16]


def test_run_folder_has_a_jsonl_log_of_every_logged_metric(tmp_path):
    result = _trainer(tmp_path, epochs=3, batch_size=16, log_every=2).fit(_mlp(), _data(), _data(32, 1))
    records = read_log(result.run_dir)
    kinds = [r["kind"] for r in records]
    assert kinds.count("epoch") == 3 and kinds.count("train") == 6  # 12 steps, every 2
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [1, 2, 3]
    assert epochs[-1]["val_accuracy"] == result.history[-1]["val_accuracy"]
    assert json.loads((result.run_dir / "config.json").read_text())["trainer"]["epochs"] == 3
    assert len(result.history) == 3 and result.steps == 12


def test_model_without_trainable_parameters(tmp_path):
    model = _mlp().requires_grad_(False)
    with pytest.raises(TrainwiseError, match="no trainable parameters; unfreeze some"):
        _trainer(tmp_path).fit(model, _data())


def test_loss_that_is_not_a_scalar(tmp_path):
    trainer = _trainer(tmp_path, loss_fn=lambda o, t: F.cross_entropy(o, t, reduction="none"))
    with pytest.raises(TrainwiseError, match="scalar tensor, got shape"):
        trainer.fit(_mlp(), _data())


def test_unsupported_batch(tmp_path):
    with pytest.raises(TrainwiseError, match=r"could not be collated into a batch .*found <class 'object'>"):
        _trainer(tmp_path).fit(_mlp(), [[object(), torch.zeros(2)]])


def test_three_item_batch_needs_split_batch(tmp_path):
    data = [(torch.randn(4, 8), torch.randint(0, 4, (4,)), torch.ones(4))]
    with pytest.raises(TrainwiseError, match="split_batch"):
        _trainer(tmp_path).fit(_mlp(), data)
    result = _trainer(tmp_path / "ok", epochs=1, split_batch=lambda b: (b[0], b[1])).fit(_mlp(), data)
    assert result.steps == 1


class _ExplodesAt(nn.Module):
    def __init__(self, step):
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.calls = 0
        self.step = step

    def forward(self, x):
        self.calls += 1
        out = self.lin(x)
        return out * float("nan") if self.calls == self.step else out


def test_nonfinite_loss_stops_naming_the_step_and_keeps_the_log(tmp_path):
    with pytest.raises(NonFiniteLossError, match="became nan at step 7") as info:
        _trainer(tmp_path, epochs=5, batch_size=16, log_every=2).fit(_ExplodesAt(7), _data())
    result = info.value.result
    assert result.stopped == "nonfinite" and len(result.history) == 1  # epoch 1 (steps 1-4) finished
    records = read_log(result.run_dir)
    assert [r["kind"] for r in records][-2:] == ["nonfinite", "end"] and records[-1]["status"] == "failed"
    assert any(r["kind"] == "epoch" for r in records)


def test_nonfinite_skip_skips_the_step(tmp_path):
    model = _ExplodesAt(3)
    result = _trainer(tmp_path, epochs=2, batch_size=16, nonfinite="skip").fit(model, _data())
    assert result.stopped == "completed" and result.steps == 7  # 8 windows, one skipped
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_ctrl_c_keeps_what_was_logged(tmp_path):
    class _Interrupt(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 4)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            if self.calls == 6:
                raise KeyboardInterrupt
            return self.lin(x)

    with pytest.raises(KeyboardInterrupt) as info:  # a script must not run on as if training had finished
        _trainer(tmp_path, epochs=3, batch_size=16, log_every=1).fit(_Interrupt(), _data())
    result = info.value.result
    assert result.stopped == "interrupted" and len(result.history) == 1 and result.steps == 5
    records = read_log(result.run_dir)
    assert [r["kind"] for r in records].count("train") == 5
    assert [r["kind"] for r in records][-2:] == ["interrupted", "end"] and records[-1]["status"] == "interrupted"


def test_parameter_outside_the_optimizer_is_reported(tmp_path):
    model = _mlp()
    optimizer = torch.optim.SGD(model[0].parameters(), lr=0.1)
    with pytest.warns(UnoptimizedParameterWarning, match="2 trainable parameter"):
        _trainer(tmp_path, epochs=1, optimizer=optimizer, guards="off").fit(model, _data())
    model = _mlp()
    optimizer = torch.optim.SGD(model[0].parameters(), lr=0.1)
    result = _trainer(tmp_path / "guarded", epochs=1, optimizer=optimizer).fit(model, _data())  # guards on: TW107
    found = [r for r in read_log(result.run_dir) if r["kind"] == "guard"]
    assert [(r["code"], r["where"]) for r in found] == [("TW107", "2.weight")]


def test_scheduler_factory_steps_per_optimizer_step(tmp_path):
    model = _mlp()
    result = _trainer(
        tmp_path,
        epochs=2,
        batch_size=16,
        accumulation_steps=2,
        optimizer=lambda p: torch.optim.SGD(p, lr=1.0),
        scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5),
    ).fit(model, _data())
    assert result.steps == 4
    assert result.last["lr"] == pytest.approx(0.5**4)


def test_iterable_without_len_steps_its_short_last_window(tmp_path):
    def batches():
        for _ in range(5):
            yield torch.randn(4, 8), torch.randint(0, 4, (4,))

    class _Once:
        def __iter__(self):
            return batches()

    result = _trainer(tmp_path, epochs=1, accumulation_steps=2).fit(_mlp(), _Once())
    assert result.steps == 3


def test_unknown_option_gets_the_closest_name():
    with pytest.raises(TypeError):
        Trainer(epocs=3)  # a plain Python keyword error from the explicit signature
    with pytest.raises(TrainwiseError, match="precision must be one of"):
        Trainer(precision="half")


@pytest.mark.slow
def test_compile_is_opt_in_and_trains(tmp_path):
    model = _mlp()
    result = _trainer(tmp_path, epochs=2, batch_size=16, compile=True).fit(model, _data(), _data(32, 1))
    assert result.stopped == "completed" and result.steps == 8
    assert not any(k.startswith("_orig_mod") for k in model.state_dict())  # the user's model stays unwrapped


def test_empty_training_data(tmp_path):
    loader = DataLoader(_data(8), batch_size=16, drop_last=True)
    with pytest.raises(TrainwiseError, match="yields no batches"):
        _trainer(tmp_path).fit(_mlp(), loader)


def test_deterministic_fit_restores_the_global_switches(tmp_path, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = torch.are_deterministic_algorithms_enabled()
    _trainer(tmp_path, epochs=1, deterministic=True).fit(_mlp(), _data())
    assert torch.are_deterministic_algorithms_enabled() == before
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ  # set for the fit (deterministic cuBLAS), not after it
    with pytest.raises(TrainwiseError):
        _trainer(tmp_path / "b", deterministic=True).fit(_mlp().requires_grad_(False), _data())
    assert torch.are_deterministic_algorithms_enabled() == before


def test_the_bar_shows_the_running_loss_from_the_first_steps(tmp_path, monkeypatch):
    """Before the first log interval the bar gets this process's running values at steps 1, 2, 4, 8... of
    each epoch (a few reads an epoch); plain lines and other ranks read nothing extra."""
    from trainwise.progress import BarProgress

    shown, advanced = [], [0]
    advance, show = BarProgress.advance, BarProgress.show

    def recording_advance(self, steps=1):
        advanced[0] += steps
        advance(self, steps)

    def recording_show(self, values):
        shown.append((advanced[0], dict(values)))
        show(self, values)

    monkeypatch.setattr(BarProgress, "advance", recording_advance)
    monkeypatch.setattr(BarProgress, "show", recording_show)
    result = _trainer(tmp_path, epochs=2, batch_size=4, log_every=10, progress="bar").fit(nn.Linear(8, 4), _data())
    assert result.steps == 32  # 16 windows an epoch
    # windows 1, 2, 4, 8 of each epoch, and the log interval every 10 (window 20 is both)
    assert [steps for steps, _ in shown] == [0, 1, 3, 7, 9, 16, 17, 19, 19, 23, 29]
    assert all("loss" in values for _, values in shown)
