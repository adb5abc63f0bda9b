"""Trainer(callbacks=...): each event at its point with the state it promises, metrics a callback logs, a
stop it requests, and one sentence for a callback that would silently never run."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainwise import Callback, Trainer, TrainwiseError, read_log


def _data(n=96):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long())


def _trainer(tmp_path, **options):
    defaults = dict(epochs=2, batch_size=16, log_every=2, run_dir=str(tmp_path / "run"), progress="off", seed=0)
    return Trainer(**{**defaults, **options})


def _view():
    """A callback view over stand-alone parts (no run): what a CallbackList needs to be built."""
    from trainwise.callbacks import LatestMetrics, TrainingState
    from trainwise.checkpoint.resume import LoopCounters
    from trainwise.run_control import Outcome, RunControl

    model, counters = nn.Linear(8, 2), LoopCounters()
    return TrainingState(epochs=1, counters=counters, steps=lambda: 0, latest=LatestMetrics(), model=model,
                         optimizer=torch.optim.SGD(model.parameters(), lr=0.1), run_dir=".",
                         control=RunControl(counters), outcome=Outcome())


class Trace(Callback):
    def __init__(self):
        self.events = []

    def on_fit_start(self, state):
        self.events.append(("fit_start", state.epoch, state.step, len(state.history)))

    def on_epoch_start(self, state):
        self.events.append(("epoch_start", state.epoch, state.step, state.model.training))

    def on_step_end(self, state):
        self.events.append(("step_end", state.epoch, state.step, dict(state.metrics)))

    def on_validation_end(self, state):
        self.events.append(("validation_end", state.epoch, state.step, sorted(state.metrics)))

    def on_epoch_end(self, state):
        self.events.append(("epoch_end", state.epoch, state.step, dict(state.metrics)))

    def on_fit_end(self, state):
        self.events.append(("fit_end", state.epoch, state.step, state.status))


def test_every_event_in_order_with_the_state_it_promises(tmp_path):
    trace = Trace()
    result = _trainer(tmp_path, accumulation_steps=2, callbacks=[trace]).fit(
        lambda: nn.Linear(8, 2), _data(), _data(32))
    kinds = [e[0] for e in trace.events]
    per_epoch = ["epoch_start", *["step_end"] * 3, "validation_end", "epoch_end"]  # 6 batches, windows of 2
    assert kinds == ["fit_start", *per_epoch, *per_epoch, "fit_end"]
    assert trace.events[0] == ("fit_start", 1, 0, 0)
    steps = [e[2] for e in trace.events if e[0] == "step_end"]
    assert steps == [1, 2, 3, 4, 5, 6]  # after each optimizer step, not each micro-batch
    # during an epoch, the metrics are the last log interval's (no device read per step)
    assert trace.events[2][3] == {} and "loss" in trace.events[3][3]
    assert trace.events[5][3] == ["epoch", "train_accuracy", "train_loss", "val_accuracy", "val_loss"]
    assert trace.events[6][3] == result.history[0]
    assert trace.events[-1] == ("fit_end", 2, 6, "finished")


def test_a_metric_logged_after_validation_joins_the_epoch_record_and_can_be_monitored(tmp_path):
    class ValError(Callback):
        def on_validation_end(self, state):
            state.log("val_error", 1.0 - state.metrics["val_accuracy"])

        def on_step_end(self, state):
            state.log("grad_steps", torch.tensor(state.step))  # a tensor is read once, here

    result = _trainer(tmp_path, epochs=3, callbacks=[ValError()], monitor="val_error", patience=5).fit(
        lambda: nn.Linear(8, 2), _data(), _data(32))
    assert [r["val_error"] for r in result.history] == [pytest.approx(1 - r["val_accuracy"]) for r in result.history]
    assert result.best_value == min(r["val_error"] for r in result.history)
    steps = [(r["step"], r["grad_steps"]) for r in read_log(result.run_dir) if r["kind"] == "metric"]
    assert steps == [(s, float(s)) for s in range(1, 19)]


def test_a_requested_stop_ends_the_run_after_the_current_epoch_with_its_checkpoint(tmp_path):
    class StopAtStep(Callback):
        def on_step_end(self, state):
            if state.step == 8:  # in epoch 2: the epoch finishes, validates and saves, then the run ends
                state.request_stop("the time budget is spent")

    result = _trainer(tmp_path, epochs=5, callbacks=[StopAtStep()]).fit(lambda: nn.Linear(8, 2), _data(), _data(32))
    assert len(result.history) == 2 and result.steps == 12 and result.stopped_early
    assert result.message == "stopped after epoch 2: the time budget is spent."
    kinds = [(r["kind"], r.get("status")) for r in read_log(result.run_dir)][-2:]
    assert kinds == [("stopped_early", None), ("end", "stopped_early")] and (result.run_dir / "checkpoints").exists()
    resumed = _trainer(tmp_path, epochs=5, resume="auto").fit(lambda: nn.Linear(8, 2), _data(), _data(32))
    assert resumed.stopped_early and len(resumed.history) == 2  # a stopped run stays stopped


def test_any_object_with_an_event_is_a_callback(tmp_path):
    seen = []
    callback = types.SimpleNamespace(on_epoch_end=lambda state: seen.append(state.epoch))
    _trainer(tmp_path, callbacks=[callback]).fit(lambda: nn.Linear(8, 2), _data())
    assert seen == [1, 2]


class Misspelt:
    def on_epoch_ends(self, state):
        pass


class LightningStyle:
    def on_train_batch_end(self, state):
        pass


class Nothing:
    def helper(self):
        pass


@pytest.mark.parametrize(("callback", "message"), [
    (Misspelt(), "callback Misspelt has a method on_epoch_ends, which is no event; did you mean on_epoch_end?"),
    (LightningStyle(), "has a method on_train_batch_end, which is no event; did you mean on_step_end?"),
    (Nothing(), "callback Nothing defines none of the events on_fit_start,"),
    (Trace, "callbacks takes callback objects, got the class Trace; pass Trace() instead."),
])
def test_a_callback_that_would_never_run_is_one_sentence(tmp_path, callback, message):
    with pytest.raises(TrainwiseError) as info:
        _trainer(tmp_path, callbacks=[callback]).fit(lambda: nn.Linear(8, 2), _data())
    assert message in str(info.value)


@pytest.mark.parametrize(("name", "value", "message"), [
    ("val_loss", 1.0, "a callback logged val_loss, which the Trainer already logs this epoch"),
    ("step", 1.0, "a callback metric needs a name other than kind, epoch, step"),
    ("f1", "high", "callback metric f1 must be a number or a one-element tensor, got str."),
    # before (issue 48, item 10): float() raised OverflowError from inside trainwise
    pytest.param("count", 10**400, "callback metric count is an integer of 1329 bits, too large for a float (at "
                 "most about 1.8e308); log a scaled value, such as math.log10 of it.", id="count-10**400"),
])
def test_a_bad_callback_metric_is_one_sentence(tmp_path, name, value, message):
    class Logs(Callback):
        def on_validation_end(self, state):
            state.log(name, value)

    with pytest.raises(TrainwiseError) as info:
        _trainer(tmp_path, callbacks=[Logs()]).fit(lambda: nn.Linear(8, 2), _data(), _data(32))
    assert message in str(info.value)
    records = read_log(tmp_path / "run")
    assert "epoch" not in [r["kind"] for r in records]  # nothing half-logged
    assert records[-1]["kind"] == "end" and records[-1]["status"] == "failed"
    assert records[-1]["error"].startswith("TrainwiseError: ")


def test_an_unused_step_event_costs_nothing_per_step(tmp_path):
    class EpochOnly(Callback):
        def on_epoch_end(self, state):
            pass

    from trainwise.callbacks import CallbackList
    from trainwise.run_control import Outcome

    listed = CallbackList([EpochOnly()], _view(), outcome=Outcome())
    assert not listed.step_end and listed.handlers["on_step_end"] == []


class ReportBroken(Callback):
    def on_epoch_end(self, state):
        raise ValueError("the epoch report could not be written")


class SummaryBroken(Callback):
    def __init__(self):
        self.seen = None

    def on_fit_end(self, state):
        self.seen = state.status
        raise RuntimeError("the summary could not be sent")


class UploadBroken(Callback):
    def __init__(self):
        self.seen = None

    def on_fit_end(self, state):
        self.seen = state.status
        raise KeyError("no bucket")


def test_the_end_record_names_the_callback_that_failed_first_and_keeps_the_second_error(tmp_path):
    """Before (issue 48, item 10): an on_epoch_end that raised, then an on_fit_end that raised too, gave an end
    record naming SummaryBroken.on_fit_end beside ReportBroken's error, and SummaryBroken's error was nowhere."""
    with pytest.raises(ValueError, match="the epoch report could not be written") as info:
        _trainer(tmp_path, callbacks=[ReportBroken(), SummaryBroken()]).fit(lambda: nn.Linear(8, 2), _data())
    end = read_log(tmp_path / "run")[-1]
    assert end["kind"] == "end" and end["status"] == "failed"
    assert end["callback"] == "ReportBroken.on_epoch_end"
    assert end["error"] == "ValueError: the epoch report could not be written"
    assert end["also_failed"] == [{"callback": "SummaryBroken.on_fit_end",
                                   "error": "RuntimeError: the summary could not be sent"}]
    assert getattr(info.value, "__notes__", []) == [
        "SummaryBroken.on_fit_end also raised RuntimeError: the summary could not be sent"]


def test_every_on_fit_end_runs_and_each_error_is_kept(tmp_path):
    """Before: the second callback's on_fit_end was never called once the first had raised."""
    summary, upload = SummaryBroken(), UploadBroken()
    with pytest.raises(RuntimeError, match="the summary could not be sent") as info:
        _trainer(tmp_path, callbacks=[summary, upload]).fit(lambda: nn.Linear(8, 2), _data())
    assert (summary.seen, upload.seen) == ("finished", "failed")  # the second is told the run failed
    end = read_log(tmp_path / "run")[-1]
    assert end["status"] == "failed" and end["callback"] == "SummaryBroken.on_fit_end"
    assert end["error"] == "RuntimeError: the summary could not be sent"
    assert end["also_failed"] == [{"callback": "UploadBroken.on_fit_end", "error": "KeyError: 'no bucket'"}]
    assert getattr(info.value, "__notes__", []) == ["UploadBroken.on_fit_end also raised KeyError: 'no bucket'"]


def test_a_callback_error_after_another_failure_is_kept_without_taking_its_place(tmp_path):
    """The run fails in the model (no callback's fault); an on_fit_end that raises then is kept as also_failed,
    and the record names no callback as the cause."""
    class Broken(nn.Linear):
        def forward(self, x):
            raise ArithmeticError("the model is broken")

    with pytest.raises(ArithmeticError, match="the model is broken"):
        _trainer(tmp_path, callbacks=[SummaryBroken()]).fit(Broken(8, 2), _data())
    end = read_log(tmp_path / "run")[-1]
    assert end["status"] == "failed" and "callback" not in end
    assert end["error"] == "ArithmeticError: the model is broken"
    assert end["also_failed"] == [{"callback": "SummaryBroken.on_fit_end",
                                   "error": "RuntimeError: the summary could not be sent"}]
