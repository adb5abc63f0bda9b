"""What a callback reaches (issue 47, item 2): a view of the run (step, epoch, metrics, history, model,
optimizer, run folder, ``log``, ``request_stop``) and nothing else; the built-in policies built with the parts
they use; the strategy typed by a Protocol; the option combinations a strategy cannot honour refused by the
configuration; the run built from a typed spec; one epoch counter, one owner of the latest metrics, one writer of
the end record."""

from __future__ import annotations

import ast
import inspect
import json
import typing
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import trainwise.run as run_module
from trainwise import Callback, Trainer, TrainerConfig, TrainwiseError, read_log
from trainwise.callbacks import LatestMetrics, TrainingState
from trainwise.checkpoint import CheckpointManager, read_checkpoint
from trainwise.checkpoint.resume import LoopCounters
from trainwise.distributed import DistributedInfo
from trainwise.run_control import Outcome, RunControl
from trainwise.strategy import DDP, FSDP, SingleProcess, Strategy

SRC = Path(__file__).resolve().parents[2] / "src" / "trainwise"


def _data(n: int = 96) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long())


def _trainer(tmp_path: Path, **options: typing.Any) -> Trainer:
    defaults = dict(epochs=3, batch_size=16, log_every=2, run_dir=str(tmp_path / "run"), progress="off", seed=0,
                    plot=False)
    return Trainer(**{**defaults, **options})


class Reader(Callback):
    """A user's callback that reads only the documented fields, and keeps the view it was given."""

    def __init__(self) -> None:
        self.seen: list[tuple[typing.Any, ...]] = []
        self.view: typing.Any = None

    def on_fit_start(self, state):
        self.view = state
        self.seen.append(("fit_start", state.epoch, state.step, len(state.history), dict(state.metrics)))

    def on_step_end(self, state):
        self.seen.append(("step_end", state.epoch, state.step, len(state.history), dict(state.metrics)))

    def on_epoch_end(self, state):
        self.seen.append(("epoch_end", state.epoch, state.step, [dict(r) for r in state.history],
                          dict(state.metrics)))

    def on_fit_end(self, state):
        self.seen.append(("fit_end", state.epoch, state.step, [dict(r) for r in state.history], state.status))


def test_the_view_has_no_fit_and_holds_only_the_parts_it_shows(tmp_path):
    reader = Reader()
    _trainer(tmp_path, epochs=1, callbacks=[reader]).fit(lambda: nn.Linear(8, 2), _data(), _data(32))
    view = reader.view
    assert isinstance(view, TrainingState)
    assert not hasattr(view, "fit")
    # what it holds: the owners of what it shows, never the run (Fit), its folder, loop or strategy
    owners = (LoopCounters, LatestMetrics, nn.Module, torch.optim.Optimizer, Path, RunControl, Outcome, int, dict)
    held = vars(view)
    assert all(isinstance(value, owners) or (callable(value) and not hasattr(value, "__self__"))
               for value in held.values()), {name: type(value).__name__ for name, value in held.items()}
    public = {name for name in dir(view) if not name.startswith("_")}
    assert public == {"epoch", "epochs", "step", "metrics", "history", "model", "optimizer", "run_dir", "status",
                      "stop_reason", "stop_message", "log", "request_stop", "take_logged"}


def test_a_callback_reading_step_epoch_history_and_metrics_sees_the_run(tmp_path):
    reader = Reader()
    result = _trainer(tmp_path, callbacks=[reader]).fit(lambda: nn.Linear(8, 2), _data(), _data(32))
    records = read_log(tmp_path / "run")
    assert reader.seen[0] == ("fit_start", 1, 0, 0, {})
    # each step: the epoch it is in, the steps taken, and the last log interval's values (those metrics.jsonl has)
    steps = [s for s in reader.seen if s[0] == "step_end"]
    assert [s[2] for s in steps] == list(range(1, 19))  # 6 batches a window each, 3 epochs
    assert [s[1] for s in steps] == [1] * 6 + [2] * 6 + [3] * 6
    train = {r["step"]: {k: v for k, v in r.items() if k not in ("kind", "epoch", "step", "lr")}
             for r in records if r["kind"] == "train"}
    for _, epoch, step, finished, metrics in steps:
        assert finished == epoch - 1
        if step in train:
            assert metrics == train[step]
    # each epoch's end: the epoch just recorded, whose record the metrics are, as FitResult.history holds it
    ends = [s for s in reader.seen if s[0] == "epoch_end"]
    assert [s[1] for s in ends] == [1, 2, 3] and [s[2] for s in ends] == [6, 12, 18]
    for index, (_, epoch, _, history, metrics) in enumerate(ends):
        assert history == result.history[:epoch] and metrics == result.history[index]
    assert reader.seen[-1] == ("fit_end", 3, 18, result.history, "finished")  # the last epoch trained
    # the one epoch counter: the last checkpoint (the epoch's end) still records the epoch a resume starts in
    last = read_checkpoint(CheckpointManager(tmp_path / "run").latest())
    assert last["state"]["loop"]["epoch"] == 4


def test_a_resumed_run_shows_the_callbacks_where_it_starts_and_ends(tmp_path):
    _trainer(tmp_path, epochs=2).fit(lambda: nn.Linear(8, 2), _data(), _data(32))
    reader = Reader()
    result = _trainer(tmp_path, epochs=3, resume="auto", callbacks=[reader]).fit(
        lambda: nn.Linear(8, 2), _data(), _data(32))
    assert reader.seen[0][:4] == ("fit_start", 3, 12, 2)
    assert reader.seen[-1] == ("fit_end", 3, 18, result.history, "finished")


def test_no_policy_or_callback_reaches_through_a_run():
    for name in ("policies.py", "callbacks.py"):
        tree = ast.parse((SRC / name).read_text(encoding="utf-8"))
        reaching = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "fit"]
        assert reaching == [], f"{name} reads .fit at lines {reaching}"


def test_the_latest_metrics_have_one_owner():
    """Only LatestMetrics.publish writes what callbacks see as state.metrics; nothing assigns a run's ``latest``."""
    assigned = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr == "latest":
                    assigned.append(f"{path.name}:{node.lineno}")
    assert assigned == []
    assert [f.name for f in run_module.dataclasses.fields(run_module.Fit) if f.name == "epoch"] == []


# -- the strategy: a Protocol, checked against the three implementations ----------------------------------------


def _members(protocol: type) -> dict[str, typing.Any]:
    names = set(typing.get_type_hints(protocol)) | {
        n for n, v in vars(protocol).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    return {name: inspect.getattr_static(protocol, name, None) for name in sorted(names)}


@pytest.mark.parametrize("implementation", [SingleProcess, DDP, FSDP])
def test_each_strategy_satisfies_the_protocol(implementation):
    """A static-style check: every member of Strategy exists on the class with the same kind (attribute, property
    or method) and, for a method, the same parameters, annotations and return type."""
    hints = typing.get_type_hints(Strategy)
    for name, declared in _members(Strategy).items():
        assert hasattr(implementation, name) or name in ("device", "info"), f"{implementation.__name__}.{name}"
        found = inspect.getattr_static(implementation, name, None)
        if isinstance(declared, property):
            assert isinstance(found, property), f"{implementation.__name__}.{name} is not a property"
        elif callable(declared):
            assert inspect.signature(found) == inspect.signature(declared), f"{implementation.__name__}.{name}"
        elif name in ("device", "info"):  # set by __init__
            assert name in inspect.signature(implementation.__init__).parameters
        else:
            value = getattr(implementation, name)
            assert value in typing.get_args(hints[name]) if typing.get_origin(hints[name]) is typing.Literal \
                else isinstance(value, hints[name]), f"{implementation.__name__}.{name} = {value!r}"
    instance = implementation(torch.device("cpu"), DistributedInfo())
    assert isinstance(instance.device, torch.device) and isinstance(instance.info, DistributedInfo)
    assert not hasattr(instance, "check")  # the options' combinations are the configuration's (check_processes)


def test_the_strategy_is_typed_by_the_protocol_everywhere():
    """No annotation in trainwise names an implementation (SingleProcess, DDP, FSDP) as a type."""
    named = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            annotations = [node.annotation] if isinstance(node, (ast.AnnAssign, ast.arg)) else []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
                annotations.append(node.returns)
            for annotation in annotations:
                if annotation is None:
                    continue
                for part in ast.walk(annotation):
                    if isinstance(part, ast.Name) and part.id in ("SingleProcess", "DDP", "FSDP"):
                        named.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert named == []
    assert typing.get_type_hints(run_module.Fit)["strategy"] is Strategy
    assert typing.get_type_hints(run_module.connect)["return"] is Strategy


# -- the options a strategy cannot honour: the configuration says so -------------------------------------------

UNFREEZE = "unfreeze_at is not supported with several processes; run each unfreezing phase as its own fit()."
AUTO_FSDP = ("batch_size='auto' is not supported with distributed='fsdp'; set batch_size to a micro-batch that "
             "fits, with effective_batch.")


@pytest.mark.parametrize(("kind", "options", "message"), [
    ("ddp", {"unfreeze_at": {2: ["0.*"]}}, UNFREEZE),
    ("fsdp", {"unfreeze_at": {2: ["0.*"]}, "batch_size": "auto", "effective_batch": 32}, UNFREEZE),
    ("fsdp", {"batch_size": "auto", "effective_batch": 32}, AUTO_FSDP),
    ("ddp", {"batch_size": "auto", "effective_batch": 32}, None),
    ("single", {"unfreeze_at": {2: ["0.*"]}, "batch_size": "auto", "effective_batch": 32}, None),
])
def test_the_configuration_refuses_what_the_processes_cannot_honour(kind, options, message):
    config = TrainerConfig(**options)
    if message is None:
        config.check_processes(kind)
        return
    with pytest.raises(TrainwiseError) as info:
        config.check_processes(kind)
    assert str(info.value) == message


@pytest.mark.parametrize(("implementation", "options", "message"), [
    (DDP, {"unfreeze_at": {2: ["0.*"]}}, UNFREEZE),
    (FSDP, {"batch_size": "auto", "effective_batch": 32}, AUTO_FSDP),
])
def test_fit_under_several_processes_refuses_them_before_writing(tmp_path, monkeypatch, implementation, options,
                                                                 message):
    """``fit`` under two processes (the strategy connect() would return under torchrun, without a process group):
    the sentence, nothing written, the run folder free for the next run."""
    monkeypatch.setattr(run_module, "connect", lambda kind, device, timeout: implementation(
        torch.device("cpu"), DistributedInfo(rank=0, world_size=2)))
    with pytest.raises(TrainwiseError) as info:
        _trainer(tmp_path, **options).fit(lambda: nn.Linear(8, 2), _data())
    assert str(info.value) == message
    assert not (tmp_path / "run").exists()
    monkeypatch.undo()
    assert _trainer(tmp_path, epochs=1).fit(lambda: nn.Linear(8, 2), _data()).steps == 6


# -- the run is built from a typed spec ---------------------------------------------------------------------------


def test_start_run_takes_a_typed_spec_not_the_trainer():
    hints = typing.get_type_hints(run_module.start_run)
    assert hints["spec"] is run_module.RunSpec
    assert typing.get_type_hints(run_module.RunSpec)["config"] is TrainerConfig
    tree = ast.parse(inspect.getsource(run_module))
    names = [node.lineno for node in ast.walk(tree) if (isinstance(node, ast.Name) and node.id == "trainer")
             or (isinstance(node, ast.arg) and node.arg == "trainer")]
    assert names == [], f"run.py names a trainer at lines {names}"


def test_the_end_record_names_the_callbacks_in_one_place(tmp_path):
    """The run folder writes the end record as the run made it; the callback fields are the run's to add."""
    from trainwise.run_folder import RunFolder

    assert not hasattr(RunFolder, "callbacks_ended")

    class Broken(Callback):
        def on_fit_end(self, state):
            raise ValueError("no report")

    class AlsoBroken(Callback):
        def on_fit_end(self, state):
            raise KeyError("no bucket")

    with pytest.raises(ValueError, match="no report"):
        _trainer(tmp_path, epochs=1, callbacks=[Broken(), AlsoBroken()]).fit(lambda: nn.Linear(8, 2), _data())
    end = read_log(tmp_path / "run")[-1]
    assert {k: end[k] for k in ("kind", "status", "callback", "also_failed")} == {
        "kind": "end", "status": "failed", "callback": "Broken.on_fit_end",
        "also_failed": [{"callback": "AlsoBroken.on_fit_end", "error": "KeyError: 'no bucket'"}]}
    assert end["error"] == "ValueError: no report"
    lines = (tmp_path / "run" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    assert sum(json.loads(line)["kind"] == "end" for line in lines) == 1
