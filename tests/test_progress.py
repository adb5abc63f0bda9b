"""Progress: a bar on a terminal, plain lines otherwise; numbers, durations and plurals people can read."""

import io
import re

import pytest

from trainwise import progress as progress_module
from trainwise.progress import BarProgress, PlainProgress, format_duration, format_value, make_progress, plural


class _Tty(io.StringIO):
    def isatty(self):
        return True


class _Clock:
    """A clock the test moves by hand."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = _Clock()
    monkeypatch.setattr(progress_module, "_clock", fake)
    return fake


def _bar(monkeypatch, width=160):
    """A BarProgress on a terminal of ``width`` columns, without colours."""
    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.setenv("NO_COLOR", "1")
    stream = _Tty()
    return BarProgress(stream), stream


def _screen(bar, stream):
    """What the bar shows now: the text of its latest refresh, escape codes removed."""
    bar._progress.refresh()
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", stream.getvalue())
    return text.replace("\r", "\n").strip().splitlines()[-1]


def test_auto_is_plain_lines_when_not_a_terminal():
    stream = io.StringIO()
    progress = make_progress("auto", stream)
    assert type(progress) is PlainProgress
    progress.start_epoch(1, 2, 10)
    progress.end_epoch(1, 2, {"train_loss": 0.25, "step": 3})
    assert stream.getvalue() == "epoch 1/2  train_loss 0.2500  step 3\n"


def test_auto_is_a_bar_on_a_terminal():
    stream = _Tty()
    progress = make_progress("auto", stream)
    assert isinstance(progress, BarProgress)
    progress.start_epoch(1, 1, 4)
    progress.advance(4)
    progress.show({"loss": 1.0})
    progress.end_epoch(1, 1, {"loss": 0.5})
    progress.close()
    assert "epoch 1/1  loss 0.5000" in stream.getvalue()


def test_off_prints_nothing():
    stream = io.StringIO()
    progress = make_progress("off", stream)
    progress.start_epoch(1, 1, 4)
    progress.advance()
    progress.show({"loss": 0.5})
    progress.end_epoch(1, 1, {"loss": 0.5})
    assert stream.getvalue() == ""


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.04, "40 ms"),
        (0.1, "0.1 s"),
        (1.7, "1.7 s"),
        (1.6128, "1.6 s"),
        (59.94, "59.9 s"),
        (59.96, "1 min 0 s"),
        (123.4, "2 min 3 s"),
        (3599.4, "59 min 59 s"),
        (3599.6, "1 h 0 min"),
        (3720, "1 h 2 min"),
        (90000, "25 h 0 min"),
        (-0.5, "0 ms"),
        (float("inf"), "inf s"),
    ],
)
def test_durations_read_as_seconds_minutes_hours(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("count", "noun", "text"),
    [(1, "epoch", "1 epoch"), (2, "epoch", "2 epochs"), (0, "epoch", "0 epochs"), (1, "batch", "1 batch"),
     (3, "batch", "3 batches"), (2, "step", "2 steps"), (2, "process", "2 processes")],
)
def test_plurals(count, noun, text):
    assert plural(count, noun) == text
    assert plural(2, "index", "indices") == "2 indices"


@pytest.mark.parametrize(
    ("key", "value", "text"),
    [
        ("lr", 3e-05, "lr 3.0e-05"),
        ("lr", 0.0028, "lr 2.8e-03"),
        ("lr", 0.0, "lr 0.0e+00"),
        ("backbone_lr", 1e-4, "backbone_lr 1.0e-04"),
        ("lr_head", 0.01, "lr_head 1.0e-02"),
        ("learning_rate", 5e-5, "learning_rate 5.0e-05"),
        ("train_loss", 0.25, "train_loss 0.2500"),  # other metrics keep four decimals
        ("val_accuracy", 0.9916434, "val_accuracy 0.9916"),
        ("perplexity", 123456.7, "perplexity 1.235e+05"),
        ("step", 3, "step 3"),
        ("seconds", 1.6128, "time 1.6 s"),
        ("seconds", 123.4, "time 2 min 3 s"),
        ("eval_seconds", 0.04, "eval 40 ms"),
        ("device", "cpu", "device cpu"),
        ("clip", True, "clip True"),
    ],
)
def test_values(key, value, text):
    assert format_value(key, value) == text


def test_epoch_line_has_lr_in_scientific_notation_and_the_time_as_a_duration():
    stream = io.StringIO()
    progress = PlainProgress(stream)
    progress.end_epoch(12, 12, {"train_loss": 0.0188, "val_accuracy": 0.9916, "lr": 2.1e-07, "step": 276,
                                "seconds": 2.81})
    line = "epoch 12/12  train_loss 0.0188  val_accuracy 0.9916  lr 2.1e-07  step 276  time 2.8 s\n"
    assert stream.getvalue() == line


def test_plain_running_line_has_the_batch_the_eta_and_the_metrics(clock):
    stream = io.StringIO()
    progress = PlainProgress(stream, interval=30.0)
    progress.start_epoch(2, 5, 100)
    clock.now += 1.0
    progress.advance()  # the first batch pays for warm-up: not timed
    for _ in range(9):
        clock.now += 0.5
        progress.advance()
    progress.show({"loss": 0.7, "lr": 3e-5})
    assert stream.getvalue() == ""  # at most one running line every 30 s
    clock.now += 30.0
    progress.show({"loss": 0.7, "lr": 3e-5})
    # 10 batches done, 0.5 s each after the first: 90 left, 45 s
    assert stream.getvalue() == "epoch 2/5 (running: batch 10/100, ETA 45.0 s)  loss 0.7000  lr 3.0e-05\n"


def test_plain_running_line_without_a_length_has_no_eta(clock):
    stream = io.StringIO()
    progress = PlainProgress(stream, interval=0.0)
    progress.start_epoch(1, 1, None)
    for _ in range(3):
        clock.now += 1.0
        progress.advance()
    progress.show({"loss": 1.5})
    assert stream.getvalue() == "epoch 1/1 (running: batch 3)  loss 1.5000\n"


def test_eta_ignores_the_batches_a_resumed_epoch_skips(clock):
    stream = io.StringIO()
    progress = PlainProgress(stream, interval=0.0)
    progress.start_epoch(3, 3, 50)
    progress.advance(40)  # trained before the resume: no time spent on them now
    for _ in range(2):
        clock.now += 2.0
        progress.advance()
    progress.show({})
    assert stream.getvalue() == "epoch 3/3 (running: batch 42/50, ETA 16.0 s)\n"


def test_eta_from_the_previous_epoch_until_this_one_is_timed(clock):
    stream = io.StringIO()
    progress = PlainProgress(stream, interval=0.0)
    progress.start_epoch(1, 2, 4)
    for _ in range(4):
        clock.now += 0.25
        progress.advance()
    progress.start_epoch(2, 2, 4)
    progress.show({"loss": 1.0})
    assert stream.getvalue() == "epoch 2/2 (running: batch 0/4, ETA 1.0 s)  loss 1.0000\n"


def test_bar_shows_the_running_loss_from_the_first_show_and_the_eta(monkeypatch, clock):
    bar, stream = _bar(monkeypatch)
    try:
        bar.start_epoch(1, 12, 23)
        clock.now += 0.8
        bar.advance()
        bar.show({"loss": 2.3012, "accuracy": 0.125})  # step 1: long before log_every
        first = _screen(bar, stream)
        assert "epoch 1/12" in first and " 1/23 " in first and "loss 2.3012  accuracy 0.1250" in first
        assert "ETA" not in first  # one batch: no time per batch yet
        for _ in range(9):
            clock.now += 0.5
            bar.advance()
        bar.show({"loss": 1.2, "lr": 3e-5})
        later = _screen(bar, stream)
        assert "10/23" in later and "5.3 s  ETA 6.5 s" in later and "loss 1.2000  lr 3.0e-05" in later
        assert "2.3012" not in later
    finally:
        bar.close()


def test_bar_without_a_length_has_no_eta(monkeypatch, clock):
    bar, stream = _bar(monkeypatch)
    try:
        bar.start_epoch(1, 1, None)
        for _ in range(5):
            clock.now += 1.0
            bar.advance()
        bar.show({"loss": 0.5})
        screen = _screen(bar, stream)
        assert "5/?" in screen and "5.0 s" in screen and "ETA" not in screen and "loss 0.5000" in screen
    finally:
        bar.close()


def test_bar_metrics_start_empty_each_epoch_and_show_before_an_epoch_is_harmless(monkeypatch, clock):
    bar, stream = _bar(monkeypatch)
    try:
        bar.show({"loss": 9.0})  # before any epoch
        bar.advance()
        bar.start_epoch(1, 2, 4)
        bar.show({"loss": 0.25})
        assert "loss 0.2500" in _screen(bar, stream)
        bar.start_epoch(2, 2, 4)
        assert "loss" not in _screen(bar, stream)
    finally:
        bar.close()


def test_bar_epoch_line_uses_the_same_formats(monkeypatch, clock):
    bar, stream = _bar(monkeypatch)
    bar.start_epoch(1, 1, 2)
    bar.end_epoch(1, 1, {"train_loss": 0.5, "lr": 6e-4, "seconds": 150.0})
    bar.close()
    assert "epoch 1/1  train_loss 0.5000  lr 6.0e-04  time 2 min 30 s" in stream.getvalue()


def test_bar_on_a_narrow_terminal_keeps_one_line(monkeypatch, clock):
    bar, stream = _bar(monkeypatch, width=80)
    try:
        bar.start_epoch(10, 12, 23)
        clock.now += 1.0
        bar.advance()
        bar.show({"loss": 0.7393, "accuracy": 0.952, "lr": 3e-5})
        bar._progress.refresh()
        text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", stream.getvalue())
        lines = [line for line in text.replace("\r", "\n").splitlines() if line.strip()]
        assert lines and all(len(line) <= 80 for line in lines)
        assert "epoch 10/12" in lines[-1] and "loss 0.7393" in lines[-1]
    finally:
        bar.close()


def test_no_eta_once_the_epoch_is_done(clock):
    stream = io.StringIO()
    progress = PlainProgress(stream, interval=0.0)
    progress.start_epoch(1, 1, 3)
    for _ in range(3):
        clock.now += 1.0
        progress.advance()
    progress.show({"loss": 0.5})  # validation may still run: no "ETA 0 ms"
    assert stream.getvalue() == "epoch 1/1 (running: batch 3/3)  loss 0.5000\n"


def test_bar_messages_are_not_wrapped_by_rich(monkeypatch, clock):
    bar, stream = _bar(monkeypatch, width=40)
    line = "epoch 1/1  " + "  ".join(f"metric_{i} 0.5000" for i in range(8))
    bar.message(line)
    bar.close()
    assert line in stream.getvalue()


def test_the_run_starts_with_the_device_and_the_precision_and_their_reasons(tmp_path, capsys):
    import torch

    import trainwise as tw

    data = [(torch.randn(4, 3), torch.randint(0, 2, (4,)))]
    tw.Trainer(epochs=1, progress="lines", checkpoints=False, plot=False, device="cpu", precision="auto",
               run_dir=str(tmp_path / "run")).fit(lambda: torch.nn.Linear(3, 2), data)
    first = capsys.readouterr().out.splitlines()[0]
    assert first == ("training on cpu (asked for explicitly) in fp32 "
                     "(cpu device: autocast would not speed training up)")


def test_a_batch_on_the_bar_makes_no_call_into_rich(monkeypatch, clock):
    """Advancing the bar is counting: rich reads the count when it draws (its own advance, once a batch, took a
    lock and kept a speed sample, about 20 us of a 1 ms CPU step); what it draws is the same."""
    import threading

    import rich.progress

    bar, stream = _bar(monkeypatch)
    calls = []

    def counted(name, real):
        def call(self, *args, **kwargs):
            if threading.current_thread() is threading.main_thread():  # not rich's drawing thread
                calls.append(name)
            return real(self, *args, **kwargs)
        return call

    for name in ("advance", "update"):
        monkeypatch.setattr(rich.progress.Progress, name, counted(name, getattr(rich.progress.Progress, name)))
    try:
        bar.start_epoch(1, 1, 100)
        calls.clear()
        for _ in range(100):
            clock.now += 0.01
            bar.advance()
        assert calls == []
        assert " 100/100 " in _screen(bar, stream)
    finally:
        bar.close()


def test_a_drawing_that_read_a_task_the_next_epoch_removed_draws_on(monkeypatch, clock):
    """rich draws on its own thread: one that read the epoch's task just before the next epoch removed it must
    not fail (a failure there would end the thread that draws the bar)."""
    bar, _ = _bar(monkeypatch)
    try:
        bar.start_epoch(1, 2, 4)
        removed = bar._task
        bar.start_epoch(2, 2, 4)
        monkeypatch.setattr(bar, "_task", removed)  # what the drawing thread read
        assert list(bar._progress.get_renderables())
    finally:
        bar._task = None
        bar.close()
