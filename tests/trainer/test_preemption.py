"""Preemption in one process: a real SIGTERM (or the SIGUSR1 of Slurm's --signal=USR1@90) sent during fit
finishes the current optimizer step, writes its checkpoint and the log (`end` status `preempted`), tells the
trackers, restores the signal handlers and raises trainwise.Preempted (the CLI exits 143); the resumed run
ends bitwise equal to an uninterrupted one. Before this, SIGTERM ended the process at once (exit -15/143) with
nothing saved since the last checkpoint. The signalled runs are subprocesses: without the handler the signal
ends the process it is sent to. Also: an on_fit_end that raises closes the run first."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from trainwise import Callback, CheckpointManager, Trainer, TrainerConfig, TrainwiseError, read_log
from trainwise.checkpoint import read_checkpoint

# Factories for the Python runs and the CLI runs: 120 samples in batches of 8, windows of 3 (5 steps an epoch).
FACTORIES = textwrap.dedent('''
    import json, os, signal
    import torch
    from torch import nn
    from torch.utils.data import Dataset


    class Digits(Dataset):
        """Sends ``signame`` to its own process when sample number ``send_at`` (counted from 1) is read."""

        def __init__(self, n, seed, send_at=0, signame="SIGTERM"):
            g = torch.Generator().manual_seed(seed)
            self.x = torch.randn(n, 8, generator=g)
            self.y = (self.x[:, 0] > 0).long()
            self.send_at, self.signame, self.reads = send_at, signame, 0

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            self.reads += 1
            if self.reads == self.send_at:
                os.kill(os.getpid(), getattr(signal, self.signame))
            return self.x[i], self.y[i]


    def make_data(send_at=0, signame="SIGTERM"):
        return Digits(120, 0, send_at, signame), Digits(40, 1)


    def make_model():
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


    class SignalAfterStep:
        """Sends ``signame`` to its own process at on_step_end of ``step``: a scheduler's SIGTERM at a known step."""

        def __init__(self, step, signame):
            self.step, self.signame = step, signame

        def on_step_end(self, state):
            if state.step == self.step:
                os.kill(os.getpid(), getattr(signal, self.signame))


    class Notes:
        """A tracker that writes the end state it is told to a file."""

        def __init__(self, path):
            self.path = path

        def log_metrics(self, metrics, step):
            pass

        def finish(self, status):
            with open(self.path, "w") as handle:
                handle.write(status)
''')

SCRIPT = textwrap.dedent('''
    import json, signal, sys
    sys.path.insert(0, sys.argv[1])
    import torch
    from factories import Notes, SignalAfterStep, make_data, make_model
    from trainwise import Preempted, Trainer

    run_dir, step, signame, caught = sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5].split(",")
    torch.set_num_threads(1)
    train, val = make_data()
    trainer = Trainer(epochs=2, batch_size=8, accumulation_steps=3, run_dir=run_dir, progress="off", seed=0,
                      plot=False, preempt_signals=caught, callbacks=[SignalAfterStep(step, signame)],
                      loggers=[Notes(run_dir + "/tracker-end.txt")])
    try:
        trainer.fit(make_model, train, val)
    except Preempted as exc:
        restored = signal.getsignal(getattr(signal, signame)) is signal.SIG_DFL
        print(json.dumps({"stopped": exc.result.stopped, "steps": exc.result.steps, "signal": exc.signal,
                          "message": str(exc), "restored": restored}))
        raise  # uncaught: the process exits 143
''')


@pytest.fixture
def factories(tmp_path: Path) -> Path:
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "factories.py").write_text(FACTORIES)
    (folder / "script.py").write_text(SCRIPT)
    return folder


def _fit_here(folder: Path, run_dir: Path, *, resume: str | None = None) -> dict[str, torch.Tensor]:
    """The same run in this process, without a signal; the final weights."""
    sys.path.insert(0, str(folder))
    try:
        import factories as module

        train, val = module.make_data()
        result = Trainer(epochs=2, batch_size=8, accumulation_steps=3, run_dir=str(run_dir), progress="off", seed=0,
                         plot=False, resume=resume).fit(module.make_model, train, val)
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("factories", None)
    assert result.stopped == "completed" and result.steps == 10
    return result.model.state_dict()


def _python(folder: Path, run_dir: Path, step: int, signame: str, caught: str = "SIGTERM"):
    return subprocess.run([sys.executable, str(folder / "script.py"), str(folder), str(run_dir), str(step), signame,
                           caught], capture_output=True, text=True, timeout=120)


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.slow
@pytest.mark.parametrize(("signame", "caught"), [("SIGTERM", "SIGTERM"), ("SIGUSR1", "SIGTERM,SIGUSR1")])
def test_a_preemption_signal_checkpoints_the_step_raises_preempted_and_the_resume_is_exact(
        factories, tmp_path, signame, caught):
    run = tmp_path / "cut"
    done = _python(factories, run, 7, signame, caught)  # step 7: epoch 2, mid-epoch
    assert done.returncode == 143, done.stdout + done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["stopped"] == "preempted" and seen["steps"] == 7 and seen["signal"] == signame
    assert seen["restored"]  # the program's handlers are back after fit
    assert f"preempted by {signame} at step 7; its checkpoint at step 7 resumes it" in seen["message"]
    assert CheckpointManager(run).latest().name == "ckpt-step000000007.pt"
    records = read_log(run)
    assert [r["kind"] for r in records][-2:] == ["preempted", "end"]
    assert records[-1]["status"] == "preempted" and records[-1]["step"] == 7
    assert (run / "tracker-end.txt").read_text() == "preempted"
    resumed = _fit_here(factories, run, resume="auto")
    _equal(resumed, _fit_here(factories, tmp_path / "full"))


def test_a_signal_not_in_preempt_signals_keeps_its_default_action(factories, tmp_path):
    done = _python(factories, tmp_path / "cut", 2, "SIGUSR1", "SIGTERM")
    assert done.returncode == -signal.SIGUSR1  # ended by the signal, as without trainwise


CONFIG = textwrap.dedent('''
    [model]
    factory = "factories:make_model"

    [data]
    factory = "factories:make_data"
    kwargs = {{ send_at = {send_at} }}

    [trainer]
    epochs = 2
    batch_size = 8
    accumulation_steps = 3
    progress = "off"
    plot = false
    run_dir = "{run_dir}"
''')


def _cli(folder: Path, run_dir: Path, *extra: str, send_at: int = 0):
    config = folder / f"fit-{send_at}-{len(extra)}.toml"
    config.write_text(CONFIG.format(send_at=send_at, run_dir=run_dir))
    cli = Path(sys.executable).with_name("trainwise")
    return subprocess.run([str(cli), "fit", str(config), "--json", *extra], capture_output=True, text=True,
                          timeout=120, cwd=folder)


def _final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return read_checkpoint(CheckpointManager(run_dir).latest())["state"]["model"]


@pytest.mark.slow
def test_fit_cli_exits_143_on_sigterm_and_resume_auto_ends_bitwise_equal(factories, tmp_path):
    cut, full = tmp_path / "cut", tmp_path / "full"
    # sample 200 is read in epoch 2's batch 10 (120 a epoch): the window of batches 10-12 steps, step 8
    done = _cli(factories, cut, send_at=200)
    assert done.returncode == 143, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["stopped"] == "preempted" and summary["steps"] == 8
    assert done.stderr.strip().splitlines() == [f"trainwise fit: preempted; what was logged, and the checkpoint "
                                                f"that resume=auto continues from, is in {cut}."]
    assert CheckpointManager(cut).latest().name == "ckpt-step000000008.pt"
    assert read_log(cut)[-1]["status"] == "preempted"
    resumed = _cli(factories, cut, "resume=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _cli(factories, full).returncode == 0
    _equal(_final_weights(cut), _final_weights(full))


@pytest.mark.parametrize(("names", "message"), [
    (["SIGKILL"], "no process can catch"),
    (["SIGINT"], "Ctrl-C already stops"),
    (["SIGNOPE"], "no signal here"),
])
def test_a_preempt_signal_that_cannot_work_is_one_sentence(names, message):
    with pytest.raises(TrainwiseError, match=message):
        TrainerConfig(preempt_signals=names)


def test_preempt_signals_are_spelt_as_signal_names():
    assert TrainerConfig(preempt_signals=("TERM", "usr1", "SIGTERM")).preempt_signals == ["SIGTERM", "SIGUSR1"]
    assert Trainer(preempt_signals=[]).config.preempt_signals == []
    assert TrainerConfig().preempt_signals == ["SIGTERM"]


class RaisesAtTheEnd(Callback):
    def on_fit_start(self, state):
        self.optimizer = state.optimizer

    def on_fit_end(self, state):
        raise ValueError("the report could not be sent")


def test_an_on_fit_end_that_raises_closes_the_run_first(tmp_path):
    """Before: the error escaped before the run was closed: the log said finished, the guards' hooks stayed on
    the model and the optimizer, and the last checkpoint could still be a temporary file being written."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    data = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())
    run, callback = tmp_path / "run", RaisesAtTheEnd()
    with pytest.raises(ValueError, match="the report could not be sent"):
        # 16 steps: the guards watch the forwards of every 8th step, so their model hooks are on at the end
        Trainer(epochs=2, batch_size=8, run_dir=str(run), progress="off", plot=False,
                callbacks=[callback]).fit(model, data)
    end = read_log(run)[-1]
    assert end["kind"] == "end" and end["status"] == "failed"
    assert end["callback"] == "RaisesAtTheEnd.on_fit_end" and "the report could not be sent" in end["error"]
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())  # the guards are removed
    assert not callback.optimizer._optimizer_step_pre_hooks and not callback.optimizer._optimizer_step_post_hooks
    assert CheckpointManager(run).latest().name == "ckpt-step000000016.pt"
    assert not [p.name for p in (run / "checkpoints").iterdir() if "tmp" in p.name]  # written whole


ENDING = textwrap.dedent('''
    import json, os, signal, sys
    sys.path.insert(0, sys.argv[1])
    import torch
    from factories import Notes, SignalAfterStep, make_data, make_model
    from trainwise import Preempted, Trainer


    class SignalAtTheEnd:
        """Sends SIGTERM to its own process from on_fit_end: while the run writes its end state."""

        def on_fit_end(self, state):
            os.kill(os.getpid(), signal.SIGTERM)


    run_dir, step = sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    train, val = make_data()
    callbacks = [SignalAtTheEnd()] + ([SignalAfterStep(step, "SIGTERM")] if step else [])
    trainer = Trainer(epochs=2, batch_size=8, accumulation_steps=3, run_dir=run_dir, progress="off", seed=0,
                      plot=False, callbacks=callbacks, loggers=[Notes(run_dir + "/tracker-end.txt")])
    try:
        result = trainer.fit(make_model, train, val)
        print(json.dumps({"stopped": result.stopped, "steps": result.steps}), flush=True)
    except Preempted as exc:
        print(json.dumps({"stopped": exc.result.stopped, "steps": exc.result.steps}), flush=True)
        raise
    print("after fit", flush=True)
''')


def _ending(folder: Path, run_dir: Path, step: int) -> subprocess.CompletedProcess:
    (folder / "ending.py").write_text(ENDING)
    return subprocess.run([sys.executable, str(folder / "ending.py"), str(folder), str(run_dir), str(step)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_a_second_sigterm_while_the_run_writes_its_end_state_is_ignored(factories, tmp_path):
    """Before: the handlers were put back before the end record and the trackers' finish were written, so a
    scheduler's repeated SIGTERM there killed the process with the log and trackers never told."""
    run = tmp_path / "run"
    done = _ending(factories, run, 7)
    assert done.returncode == 143, done.stdout + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"stopped": "preempted", "steps": 7}
    end = read_log(run)[-1]
    assert end["kind"] == "end" and end["status"] == "preempted" and end["step"] == 7
    assert (run / "tracker-end.txt").read_text() == "preempted"
    assert CheckpointManager(run).latest().name == "ckpt-step000000007.pt"


@pytest.mark.slow
def test_a_sigterm_while_a_finished_run_closes_ends_the_process_once_the_run_is_closed(factories, tmp_path):
    """A SIGTERM that arrives after the last step is not lost: the run is closed first (end record, trackers,
    the last checkpoint whole), then the signal takes its default action."""
    run = tmp_path / "run"
    done = _ending(factories, run, 0)
    assert done.returncode == -signal.SIGTERM, done.stdout + done.stderr[-3000:]
    assert "after fit" not in done.stdout
    end = read_log(run)[-1]
    assert end["kind"] == "end" and end["status"] == "finished" and end["step"] == 10
    assert (run / "tracker-end.txt").read_text() == "finished"
    assert CheckpointManager(run).latest().name == "ckpt-step000000010.pt"
    assert not [p.name for p in (run / "checkpoints").iterdir() if "tmp" in p.name]
