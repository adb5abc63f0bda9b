"""Progress: a bar on a terminal, plain lines otherwise."""

import io

from trainwise.progress import BarProgress, PlainProgress, make_progress


class _Tty(io.StringIO):
    def isatty(self):
        return True


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
    progress.end_epoch(1, 1, {"loss": 0.5})
    assert stream.getvalue() == ""
