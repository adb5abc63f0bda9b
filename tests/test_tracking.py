"""Trainer(loggers=...): what TensorBoard and MLflow hold after a run, read back with their own readers, and
the logger protocol for any object (hyperparameters, every metric with its step, artifacts, end state)."""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import TensorDataset

from trainwise import Trainer, TrainwiseError, read_log

needs_tensorboard = pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                                       reason="the tensorboard extra is not installed")
needs_mlflow = pytest.mark.skipif(importlib.util.find_spec("mlflow") is None,
                                  reason="the mlflow extra is not installed")


def _data(n=96):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long())


def _trainer(run_dir, **options):
    defaults = dict(epochs=2, batch_size=16, log_every=2, run_dir=str(run_dir), progress="off", seed=0)
    return Trainer(**{**defaults, **options})


class Recorder:
    """A logger object with the whole protocol, keeping what it was sent."""

    def __init__(self):
        self.params, self.metrics, self.artifacts, self.status = None, [], [], None

    def log_hyperparams(self, params):
        self.params = params

    def log_metrics(self, metrics, step):
        self.metrics.append((step, dict(metrics)))

    def log_artifact(self, path):
        self.artifacts.append(Path(path))

    def finish(self, status):
        self.status = status


def _history(recorder, name):
    return [(step, values[name]) for step, values in recorder.metrics if name in values]


def test_a_logger_object_gets_hyperparameters_every_metric_with_its_step_artifacts_and_the_end_state(tmp_path):
    recorder = Recorder()
    result = _trainer(tmp_path / "run", loggers=[recorder]).fit(lambda: nn.Linear(8, 2), _data(), _data(32))
    assert recorder.params["trainer"]["lr"] == 1e-3 and recorder.params["accumulation_steps"] == 1
    assert recorder.params["device"] == "cpu" and recorder.params["world_size"] == 1
    # every epoch record, at the optimizer step it was logged at, with the values FitResult holds
    assert _history(recorder, "val_loss") == [(r["step"], r["val_loss"]) for r in result.history]
    assert _history(recorder, "train_accuracy") == [(r["step"], r["train_accuracy"]) for r in result.history]
    # every log-interval record (log_every=2 of 6 steps an epoch)
    logged = [r for r in read_log(result.run_dir) if r["kind"] == "train"]
    assert _history(recorder, "running_train_loss") == [(r["step"], r["loss"]) for r in logged]
    assert [step for step, _ in _history(recorder, "running_train_loss")] == [2, 4, 6, 8, 10, 12]
    assert {p.name for p in recorder.artifacts} == {"learning_curves.svg", "final-weights.pt"}
    weights = torch.load(result.run_dir / "final-weights.pt", weights_only=True)
    assert torch.equal(weights["weight"], result.model.weight.detach())
    assert recorder.status == "finished"


def test_end_states_stopped_early_interrupted_and_failed(tmp_path):
    recorder = Recorder()
    _trainer(tmp_path / "early", epochs=9, patience=0, lr=10.0, loggers=[recorder]).fit(
        lambda: nn.Linear(8, 2), _data(), _data(32))
    assert recorder.status == "stopped_early"

    class Breaks(nn.Linear):
        def __init__(self, error):
            super().__init__(8, 2)
            self.calls, self.error = 0, error

        def forward(self, x):
            self.calls += 1
            if self.calls == 4:
                raise self.error
            return super().forward(x)

    interrupted = Recorder()
    with pytest.raises(KeyboardInterrupt):
        _trainer(tmp_path / "int", loggers=[interrupted]).fit(Breaks(KeyboardInterrupt()), _data())
    assert interrupted.status == "interrupted" and "final-weights.pt" in {p.name for p in interrupted.artifacts}

    failed = Recorder()
    with pytest.raises(ValueError, match="a bug"):
        _trainer(tmp_path / "fail", loggers=[failed]).fit(Breaks(ValueError("a bug")), _data())
    assert failed.status == "failed" and failed.artifacts == []


def test_a_failing_logger_is_reported_once_and_switched_off_while_training_goes_on(tmp_path):
    class Broken(Recorder):
        calls = 0

        def log_metrics(self, metrics, step):
            Broken.calls += 1
            raise ConnectionError("tracking server unreachable")

    healthy, broken = Recorder(), Broken()
    result = _trainer(tmp_path / "run", loggers=[broken, healthy]).fit(lambda: nn.Linear(8, 2), _data())
    assert result.stopped == "completed" and Broken.calls == 1 and broken.status is None
    assert healthy.status == "finished" and len(_history(healthy, "train_loss")) == 2
    failures = [r for r in read_log(result.run_dir) if r["kind"] == "logger_failed"]
    assert len(failures) == 1 and "tracking server unreachable" in failures[0]["message"]


@pytest.mark.parametrize(("loggers", "message"), [
    (["tensorbord"], "unknown logger 'tensorbord'; did you mean 'tensorboard'?"),
    ([object()], "a logger must be one of 'jsonl', 'tensorboard', 'mlflow' or an object with a log_metrics"),
    ("wandb", "unknown logger 'wandb'; use one of jsonl, tensorboard, mlflow."),
])
def test_a_bad_logger_is_one_sentence_before_anything_is_written(tmp_path, loggers, message):
    with pytest.raises(TrainwiseError) as info:
        _trainer(tmp_path / "run", loggers=loggers)
    assert str(info.value).startswith(message) and not (tmp_path / "run").exists()


def test_a_missing_extra_names_the_install_command(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(TrainwiseError, match=r"needs the mlflow package; install it with pip install 'trainwise"):
        _trainer(tmp_path / "run", loggers=["mlflow"])


def test_the_cli_spelling_of_loggers_is_a_comma_list():
    from trainwise.config import parse_override

    assert parse_override("loggers=jsonl, tensorboard") == ("loggers", ["jsonl", "tensorboard"])
    assert parse_override('loggers=["tensorboard"]') == ("loggers", ["tensorboard"])


@needs_tensorboard
def test_tensorboard_holds_scalars_hyperparameters_the_curves_and_the_end_state(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    pytest.importorskip("matplotlib")
    result = _trainer(tmp_path / "run", loggers=["tensorboard"], plot_format="png").fit(
        lambda: nn.Linear(8, 2), _data(), _data(32))
    events = EventAccumulator(str(result.run_dir / "tensorboard"), size_guidance={"scalars": 0, "images": 0,
                                                                                  "tensors": 0})
    events.Reload()
    val = [(e.step, e.value) for e in events.Scalars("val_loss")]
    assert val == [(r["step"], pytest.approx(r["val_loss"], rel=1e-6)) for r in result.history]
    assert [e.step for e in events.Scalars("running_train_loss")] == [2, 4, 6, 8, 10, 12]
    image = events.Images("learning_curves")[0]
    assert image.encoded_image_string == (result.run_dir / "learning_curves.png").read_bytes()
    hparams = events.PluginTagToContent("hparams")
    start = HParamsPluginData.FromString(hparams["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["trainer.lr"].number_value == pytest.approx(1e-3)
    assert start.hparams["device"].string_value == "cpu"
    texts = {tag: events.Tensors(tag)[-1].tensor_proto.string_val[0].decode() for tag in events.Tags()["tensors"]
             if tag.startswith("end_state")}
    assert list(texts.values()) == ["finished"]


@needs_tensorboard
def test_a_resumed_run_replaces_the_redone_steps_in_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    class InterruptsAt(nn.Linear):
        calls = 0

        def forward(self, x):
            InterruptsAt.calls += 1
            if InterruptsAt.calls == 10:  # step 10, after the step-8 checkpoint and the step-9 log record
                raise KeyboardInterrupt
            return super().forward(x)

    run = tmp_path / "run"
    options = dict(log_every=1, checkpoint_every=4, loggers=["tensorboard"])
    with pytest.raises(KeyboardInterrupt):
        _trainer(run, **options).fit(lambda: InterruptsAt(8, 2), _data())
    _trainer(run, resume="auto", **options).fit(lambda: nn.Linear(8, 2), _data())
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("running_train_loss")] == list(range(1, 13))  # step 9 once, not twice
    assert [e.step for e in events.Scalars("train_loss")] == [6, 12]


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a SQLite store keeps artifacts in ./mlruns
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "trainwise-tests")
    return uri


@needs_mlflow
@pytest.mark.slow
def test_mlflow_holds_params_metric_histories_artifacts_and_the_end_state(tmp_path, mlflow_store):
    from mlflow.tracking import MlflowClient

    # a table keyed by parameter patterns: "backbone.*" is no valid MLflow key, so it goes as one JSON value
    class OddName:  # "@" is no character of an MLflow key: sent as f1_5, the logger stays on
        def on_validation_end(self, state):
            state.log("f1@5", 0.5)

    result = _trainer(tmp_path / "run", loggers=["mlflow"], lr_by_pattern={"bia*": 1e-4},
                      callbacks=[OddName()]).fit(lambda: nn.Linear(8, 2), _data(), _data(32))
    run_id = json.loads((result.run_dir / "mlflow.json").read_text())["run_id"]
    client = MlflowClient(mlflow_store)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["trainwise.end_state"] == "finished"
    assert client.get_experiment(run.info.experiment_id).name == "trainwise-tests"
    assert run.data.params["trainer.batch_size"] == "16" and run.data.params["precision"] == "fp32"
    assert json.loads(run.data.params["trainer.lr_by_pattern"]) == {"bia*": 1e-4}
    assert not [r for r in read_log(result.run_dir) if r["kind"] == "logger_failed"]
    history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "val_loss"))
    assert history == [(r["step"], pytest.approx(r["val_loss"])) for r in result.history]
    assert len(client.get_metric_history(run_id, "running_train_loss")) == 6
    assert [m.value for m in client.get_metric_history(run_id, "f1_5")] == [0.5, 0.5]
    assert {a.path for a in client.list_artifacts(run_id)} == {"learning_curves.svg", "final-weights.pt"}

    # a resume continues the same MLflow run; an interrupt ends it as KILLED
    class Interrupts(nn.Linear):
        def forward(self, x):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _trainer(tmp_path / "run", epochs=3, loggers=["mlflow"], resume="auto", lr_by_pattern={"bia*": 1e-4}).fit(
            Interrupts(8, 2), _data())
    assert json.loads((result.run_dir / "mlflow.json").read_text())["run_id"] == run_id
    assert client.get_run(run_id).info.status == "KILLED"
    assert len(client.search_runs([run.info.experiment_id])) == 1


def _ddp_worker(rank: int, port: int, run_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        recorder = Recorder()

        class StopOnRank0:  # only rank 0 asks: every rank must stop after the same epoch
            def on_epoch_end(self, state):
                if rank == 0:
                    state.request_stop("rank 0 has seen enough")

        result = Trainer(epochs=3, batch_size=8, run_dir=run_dir, progress="off", device="cpu", loggers=[recorder],
                         dist_timeout=60, callbacks=[StopOnRank0()]).fit(lambda: nn.Linear(8, 2), _data(32))
        Path(run_dir, f"logged-by-rank-{rank}.json").write_text(json.dumps(
            {"metrics": len(recorder.metrics), "status": recorder.status, "epochs": len(result.history)}))
        gc.collect()  # a DDP wrapper in a reference cycle goes before the process group (a teardown SIGABRT)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_only_rank_0_logs_and_its_stop_request_stops_every_process(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    run_dir = str(tmp_path / "run")
    mp.spawn(_ddp_worker, args=(port, run_dir), nprocs=2, join=True)
    logged = [json.loads(Path(run_dir, f"logged-by-rank-{rank}.json").read_text()) for rank in (0, 1)]
    assert logged[0]["metrics"] > 0 and logged[0]["status"] == "stopped_early" and logged[0]["epochs"] == 1
    assert logged[1] == {"metrics": 0, "status": None, "epochs": 1}


@needs_mlflow
@pytest.mark.slow
def test_a_tracking_store_that_cannot_start_is_one_sentence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "file:./mlruns")  # MLflow 3 refuses a file store by default
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(TrainwiseError) as info:
        _trainer(tmp_path / "run", loggers=["mlflow"]).fit(lambda: nn.Linear(8, 2), _data())
    assert str(info.value).startswith("the mlflow logger could not start (check MLFLOW_TRACKING_URI): ")
    assert read_log(tmp_path / "run")[-1]["status"] == "failed"


def test_from_config_keeps_the_logger_names_and_adds_logger_objects(tmp_path):
    from trainwise import TrainerConfig

    recorder = Recorder()
    trainer = Trainer.from_config(TrainerConfig(loggers=["jsonl"], epochs=1, run_dir=str(tmp_path / "run"),
                                                progress="off"), loggers=[recorder])
    assert trainer.config.loggers == ["jsonl"] and trainer.logger_objects == [recorder]
    trainer.fit(lambda: nn.Linear(8, 2), _data())
    assert recorder.status == "finished"


def test_a_logger_that_blocks_costs_one_timeout_and_is_switched_off(tmp_path):
    """A real blocking logger (log_metrics waits on an event nobody sets): before, fit never returned."""
    import threading
    import time

    release = threading.Event()

    class Blocks(Recorder):
        call_timeout = 0.5
        calls = 0

        def log_metrics(self, metrics, step):
            Blocks.calls += 1
            release.wait(60)  # a hung network call

    blocked, healthy = Blocks(), Recorder()
    started = time.monotonic()
    try:
        result = _trainer(tmp_path / "run", loggers=[blocked, healthy]).fit(lambda: nn.Linear(8, 2), _data())
        seconds = time.monotonic() - started
    finally:
        release.set()
    assert result.stopped == "completed" and seconds < 20, seconds
    assert Blocks.calls == 1 and blocked.status is None  # never called again, not even finish
    assert healthy.status == "finished" and len(_history(healthy, "train_loss")) == 2
    failures = [r for r in read_log(result.run_dir) if r["kind"] == "logger_failed"]
    assert len(failures) == 1 and "has not returned from log_metrics after 0.5 s" in failures[0]["message"]


def test_logger_calls_run_in_order_one_at_a_time(tmp_path):
    import threading

    class Order(Recorder):
        def __init__(self):
            super().__init__()
            self.threads = set()

        def log_metrics(self, metrics, step):
            self.threads.add(threading.current_thread().name)
            super().log_metrics(metrics, step)

    order = Order()
    _trainer(tmp_path / "run", loggers=[order]).fit(lambda: nn.Linear(8, 2), _data())
    steps = [step for step, _ in order.metrics]
    assert steps == sorted(steps) and len(order.threads) == 1 and order.status == "finished"
