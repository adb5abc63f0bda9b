"""RunControl, the one owner of how a run ends (issue 47): it takes the signals (Ctrl-C, a preemption), the stops
early stopping and callbacks request, and answers at a step or epoch boundary with one Stop; under several
processes a requested stop is agreed through the strategy (rank 0 decides) and a preemption through the
window's count all-reduce, read one window later. Real signals, sent to this process."""

from __future__ import annotations

import os
import signal
import types

import pytest
import torch

from trainwise.checkpoint.resume import LoopCounters
from trainwise.interrupts import Preempted
from trainwise.run_control import ANOTHER_PROCESS, Outcome, RunControl, Stop


def test_a_ctrl_c_during_training_is_held_until_the_step_and_answered_with_a_save():
    control = RunControl(LoopCounters())
    with control:
        assert not control.asked
        with control.training():
            os.kill(os.getpid(), signal.SIGINT)  # held: training goes on to the window's step
            assert control.asked
            stop = control.at_step()
        with pytest.raises(KeyboardInterrupt):  # outside training: at once, as python's
            os.kill(os.getpid(), signal.SIGINT)
    assert stop == Stop("interrupted", save=True) and isinstance(stop.error(""), KeyboardInterrupt)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


def test_a_second_ctrl_c_stops_at_once():
    with RunControl(LoopCounters()) as control, control.training():
        os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)


def test_a_ctrl_c_held_while_a_checkpoint_is_written_is_answered_at_the_epoch_end():
    control = RunControl(LoopCounters())
    with control:
        with control.held():
            os.kill(os.getpid(), signal.SIGINT)
        assert control.at_epoch(1) == Stop("interrupted", save=False)  # the epoch's checkpoint is whole


def test_one_process_answers_a_preemption_at_its_next_step_or_epoch():
    with pytest.raises(Preempted) as info, RunControl(LoopCounters(), preempt=("SIGUSR1",)) as control:
        os.kill(os.getpid(), signal.SIGUSR1)  # held wherever it arrives, training or not
        assert control.asked
        at_step, at_epoch = control.at_step(), control.at_epoch(2)
        raise at_step.error("preempted by SIGUSR1 at step 3")  # what fit raises, at its one end
    assert at_step == Stop("preempted", save=True, signal="SIGUSR1")
    assert at_epoch == Stop("preempted", save=False, signal="SIGUSR1")
    assert info.value.code == 143 and info.value.signal == "SIGUSR1" and str(info.value).endswith("step 3")
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_a_requested_stop_is_agreed_before_the_checkpoint_and_answered_after_it():
    counters = LoopCounters()
    control = RunControl(counters)
    assert not control.agree() and control.at_epoch(1) is None and not control.asked
    control.request_stop("patience", "stopped after epoch 2: patience.")
    assert control.at_epoch(2) is None  # not agreed yet
    assert control.agree() and counters.state_dict()["stopped_early"] is True  # the epoch's checkpoint holds it
    assert control.at_epoch(2) == Stop("stopped_early", message="stopped after epoch 2: patience.")
    assert control.at_epoch(2).error("") is None  # an early stop returns the result, raises nothing
    resumed = LoopCounters()
    resumed.load_state_dict(counters.state_dict())
    assert RunControl(resumed).stopped_early  # a resumed run that had stopped stays stopped


def test_rank_0_decides_a_requested_stop():
    alone = RunControl(LoopCounters(), agree=lambda flag: False)  # another rank asked; rank 0 did not
    alone.request_stop("budget", "stopped after epoch 1: budget.")
    assert not alone.agree() and alone.at_epoch(1) is None
    told = RunControl(LoopCounters(), agree=lambda flag: True)  # rank 0 asked; this rank did not
    assert told.agree() and told.at_epoch(4) == Stop("stopped_early", message="stopped after epoch 4: rank 0 "
                                                                                     "asked to stop.")


def test_several_processes_agree_on_a_preemption_one_window_after_it_rode_the_count():
    accumulator = types.SimpleNamespace(shared=None)
    with pytest.raises(Preempted), RunControl(LoopCounters(), preempt=("SIGUSR1",), distributed=True) as control:
        control.share(accumulator)
        assert accumulator.shared is control.flag
        os.kill(os.getpid(), signal.SIGUSR1)
        assert not control.asked and control.at_step() is None  # not agreed: the other process goes on
        assert accumulator.shared.value == 1.0  # this process's vote, on the next window's all-reduce
        accumulator.shared.reduced(torch.tensor(1.0))  # that window's sum over the processes
        assert not control.asked  # read at the next window's step, when its copy has long finished
        accumulator.shared.reduced(torch.tensor(1.0))
        assert control.asked
        stop = control.at_step()
        raise stop.error("")
    assert stop == Stop("preempted", save=True, signal="SIGUSR1")


def test_several_processes_stop_for_a_signal_only_another_one_received():
    control = RunControl(LoopCounters(), preempt=("SIGUSR1",), distributed=True)
    for total in (0.0, 1.0, 0.0, 1.0):  # the sum turns 1 at the second window; the third reads it
        control.flag.reduced(torch.tensor(total))
    assert control.asked and control.at_step() == Stop("preempted", save=True, signal=ANOTHER_PROCESS)


def test_several_processes_do_not_hold_ctrl_c():
    with RunControl(LoopCounters(), distributed=True) as control, control.training(), \
            pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)


def test_a_preemption_no_boundary_answered_ends_the_run_as_preempted():
    """Under several processes a signal may reach one process after the last agreement: the run that ends
    anyway (its last epoch, or an agreed early stop) ends as preempted on that process."""
    control = RunControl(LoopCounters(), preempt=("SIGUSR1",), distributed=True, agree=lambda flag: True)
    with pytest.raises(Preempted), control:
        assert control.at_end() is None
        os.kill(os.getpid(), signal.SIGUSR1)
        assert control.at_end() == Stop("preempted", signal="SIGUSR1")
        assert control.agree() and control.at_epoch(3) == Stop("preempted", signal="SIGUSR1")
        raise control.at_end().error("")


@pytest.mark.parametrize(("outcome", "state"), [
    (Outcome(), "finished"), (Outcome(stopped_early=True), "stopped_early"),
    (Outcome(stopped="interrupted"), "interrupted"), (Outcome(stopped="preempted", stopped_early=True), "preempted"),
    (Outcome(stopped="nonfinite"), "failed")])
def test_the_outcome_names_the_end_state(outcome, state):
    assert outcome.end_state() == state
