"""Experiment tracking: a run's hyperparameters, metrics, artifacts and end state sent to TensorBoard, MLflow
or any object with the logger methods, beside ``metrics.jsonl`` (always written, the record of truth).

Only rank 0 logs. A tracker that fails mid-run is reported once and switched off: training goes on, and
``metrics.jsonl`` still holds every record.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import queue
import re
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from trainwise.errors import TrainwiseError, show
from trainwise.run_folder import MLFLOW, RunFolder

LOGGER_NAMES = ("jsonl", "tensorboard", "mlflow")
END_STATES = ("finished", "stopped_early", "interrupted", "preempted", "failed")
_PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow"}
_NOT_METRICS = ("kind", "step")  # record keys that are not metric values
# Seconds one logger call may take before the logger is switched off (a logger's own ``call_timeout`` overrides).
CALL_TIMEOUT = 60.0


@runtime_checkable
class Logger(Protocol):
    """What a tracker implements: ``log_metrics`` is required; the other three are called when present.

    ``log_hyperparams(params)`` once at the start; ``log_metrics(metrics, step)`` for every logged record
    (``step`` is the optimizer step); ``log_artifact(path)`` for the learning curves and the final weights;
    ``finish(status)`` once, with one of ``finished``, ``stopped_early``, ``interrupted``, ``preempted``, ``failed``.
    """

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...


def split_loggers(loggers: Iterable[Any]) -> tuple[list[str], list[Any]]:
    """The built-in logger names and the user's logger objects of ``Trainer(loggers=...)``, each checked:
    an unknown name, a missing package or an object without ``log_metrics`` is one sentence."""
    if isinstance(loggers, (str, bytes)) or not isinstance(loggers, Iterable):
        loggers = [loggers]
    names: list[str] = []
    objects: list[Any] = []
    for item in loggers:
        if isinstance(item, str):
            if item not in LOGGER_NAMES:
                close = difflib.get_close_matches(item, LOGGER_NAMES, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"use one of {', '.join(LOGGER_NAMES)}."
                raise TrainwiseError(f"unknown logger {show(item, 60)}; {hint}")
            package = _PACKAGES.get(item)
            if package is not None and importlib.util.find_spec(package) is None:
                raise TrainwiseError(
                    f"the {item} logger needs the {package} package; install it with pip install 'trainwise[{item}]'."
                )
            if item not in names:
                names.append(item)
        elif callable(getattr(item, "log_metrics", None)):
            objects.append(item)
        else:
            raise TrainwiseError(
                f"a logger must be one of {', '.join(map(repr, LOGGER_NAMES))} or an object with a "
                f"log_metrics(metrics, step) method, got {type(item).__name__}."
            )
    return names, objects


def open_loggers(names: Sequence[str], objects: Sequence[Any], run_dir: Path, *, resumed_step: int | None) -> list[Any]:
    """The trackers of one run, opened in its run folder; ``resumed_step``: the run continues from that step."""
    opened: list[Any] = []
    for name in names:
        try:
            if name == "tensorboard":  # a folder, or a symlink to one (a bigger disk); anything else refused
                opened.append(TensorBoardLogger(RunFolder(run_dir).tensorboard, resumed_step=resumed_step))
            elif name == "mlflow":
                opened.append(MLflowLogger(run_dir, resumed=resumed_step is not None))
        except TrainwiseError:  # already one sentence naming the fix
            raise
        except Exception as exc:  # an unreachable tracking server, a store MLflow refuses, a read-only folder
            where = " (check MLFLOW_TRACKING_URI)" if name == "mlflow" else ""
            raise TrainwiseError(f"the {name} logger could not start{where}: {type(exc).__name__}: "
                                 f"{show(str(exc), 300)}; fix that or leave {name!r} out of loggers.") from None
    return opened + list(objects)


def metrics_of(record: dict[str, Any]) -> dict[str, float]:
    """The metric values a run-log record carries, under the names trackers show: an epoch record's names
    as they are (``train_loss``, ``val_accuracy``, ``lr``...); a log-interval record's running means as
    ``running_train_<name>``; a callback's metric record as logged."""
    kind = record.get("kind")
    if kind not in ("train", "epoch", "metric"):
        return {}
    values = {}
    for key, value in record.items():
        if key in _NOT_METRICS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if kind == "train" and key not in ("epoch", "lr"):
            key = f"running_train_{key}"
        values[key] = float(value)
    return values


class TrackedLog:
    """The run log plus the trackers: every record goes to ``metrics.jsonl``, and its metrics to each tracker."""

    def __init__(self, log: Any, trackers: Sequence[Any], *, on_failure: Callable[[str], None]) -> None:
        self._log = log
        self.trackers = list(trackers)
        self._on_failure = on_failure
        self.path = log.path
        self.run_dir = log.run_dir
        self._callers: dict[int, _Caller] = {}

    def write(self, record: dict[str, Any]) -> None:
        self._log.write(record)
        values = metrics_of(record)
        if values:
            step = int(record.get("step", 0))
            self.each("log_metrics", values, step)

    def write_json(self, name: str, payload: dict[str, Any]) -> Path:
        return self._log.write_json(name, payload)

    def settle(self) -> None:
        self._log.settle()

    def each(self, method: str, *args: Any) -> None:
        """Call ``method`` on every tracker that has it; one that raises is reported once and dropped."""
        for tracker in list(self.trackers):
            call = getattr(tracker, method, None)
            if call is None:
                continue
            caller = self._callers.get(id(tracker))
            if caller is None:
                caller = self._callers[id(tracker)] = _Caller(tracker_name(tracker))
            timeout = _call_timeout(tracker)
            try:
                caller.call(call, args, timeout)
            except _Stalled:  # blocked (a hung network call): training must not wait for it forever
                self.trackers.remove(tracker)
                caller.abandon()
                message = (f"the {tracker_name(tracker)} logger has not returned from {method} after {timeout:g} s "
                           "and is switched off (give it a call_timeout attribute to wait longer); metrics.jsonl "
                           "keeps every record.")
                self._log.write({"kind": "logger_failed", "logger": tracker_name(tracker), "message": message})
                self._on_failure(message)
            except Exception as exc:  # a tracker's failure must not end the training it records
                self.trackers.remove(tracker)
                message = (f"the {tracker_name(tracker)} logger failed in {method} ({type(exc).__name__}: "
                           f"{show(str(exc), 200)}) and is switched off; metrics.jsonl keeps every record.")
                self._log.write({"kind": "logger_failed", "logger": tracker_name(tracker), "message": message})
                self._on_failure(message)

    def finish(self, status: str, artifacts: Sequence[Path] = ()) -> None:
        """Send the artifacts and the end state to every tracker, once."""
        for path in artifacts:
            self.each("log_artifact", Path(path))
        self.each("finish", status)
        self.trackers = []
        self._stop_callers()

    def close(self) -> None:
        self._stop_callers()
        self._log.close()

    def _stop_callers(self) -> None:
        for caller in self._callers.values():
            caller.abandon()
        self._callers = {}


class _Stalled(Exception):
    """A logger call that did not return within its timeout."""


def _call_timeout(tracker: Any) -> float:
    value = getattr(tracker, "call_timeout", None)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return CALL_TIMEOUT


class _Caller:
    """One daemon thread per logger that runs its calls one at a time while the training thread waits at most
    the timeout: the call order and the logger's view stay as if called directly, and a call that blocks
    forever costs the run one timeout, not its end (the thread is left behind; daemon, it never holds up exit)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name=f"trainwise-logger-{name}", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            function, args, done, outcome = job
            try:
                outcome.append((True, function(*args)))
            except BaseException as exc:  # handed to the training thread, which decides
                outcome.append((False, exc))
            done.set()

    def call(self, function: Callable[..., Any], args: tuple[Any, ...], timeout: float) -> Any:
        done, outcome = threading.Event(), []
        self._jobs.put((function, args, done, outcome))
        if not done.wait(timeout):
            raise _Stalled
        ok, value = outcome[0]
        if not ok:
            raise value
        return value

    def abandon(self) -> None:
        """End the thread after the call it runs, if any, returns."""
        self._jobs.put(None)


def tracker_name(tracker: Any) -> str:
    return getattr(tracker, "name", None) or type(tracker).__name__


def flat_params(params: dict[str, Any], prefix: str = "") -> dict[str, str | float | int | bool]:
    """Hyperparameters as ``section.option`` keys with scalar values: the sections (``trainer``) are opened,
    deeper tables (``lr_by_pattern``, keyed by user patterns such as ``backbone.*``, which MLflow refuses in a
    key) and lists stay whole, as JSON text; None is text too."""
    flat: dict[str, str | float | int | bool] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and not prefix:
            flat.update(flat_params(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = json.dumps(value, default=str)
    return flat


class TensorBoardLogger:
    """Scalars, hyperparameters (the HParams tab), the learning curves and the end state, in ``log_dir``."""

    name = "tensorboard"

    def __init__(self, log_dir: str | os.PathLike[str], *, resumed_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        _check_writable_folder(Path(log_dir))  # before SummaryWriter's thread starts: it would print a traceback
        # a resumed run redoes the steps after its checkpoint: TensorBoard drops the old events from there
        purge = None if resumed_step is None else resumed_step + 1
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge)
        self._resumed = resumed_step is not None

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        flat = flat_params(params)
        if not self._resumed:
            writer = self.writer._get_file_writer()
            for summary in hparams(flat, {str(params.get("trainer", {}).get("monitor", "val_loss")): 0.0}):
                writer.add_summary(summary)
        self.writer.add_text("config", "\n".join(f"    {k} = {v}" for k, v in flat.items()))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def log_artifact(self, path: Path) -> None:
        if path.suffix.lower() == ".png":
            self.writer._get_file_writer().add_summary(_png_summary(path.stem, path.read_bytes()))
        else:  # TensorBoard shows PNG images only; anything else is named in the text tab
            self.writer.add_text("artifacts", str(path))

    def finish(self, status: str) -> None:
        self.writer.add_text("end_state", status)
        self.writer.close()


def _check_writable_folder(folder: Path) -> None:
    """Create ``folder`` and a probe file in it (removed again): a folder that cannot be made or written, as root
    too (a read-only file system, /sys), is one sentence here instead of a traceback from a writer thread."""
    import secrets

    fix = "make it writable or leave 'tensorboard' out of loggers."
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise TrainwiseError(f"the tensorboard folder {folder} cannot be created because a part of its path is a "
                             f"file; {fix}") from None
    except OSError as exc:
        raise TrainwiseError(f"the tensorboard folder {folder} cannot be created ({exc.strerror or exc}); "
                             f"{fix}") from None
    probe = folder / f".trainwise-probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError as exc:
        raise TrainwiseError(f"the tensorboard folder {folder} is not writable ({exc.strerror or exc}); "
                             f"{fix}") from None
    os.close(fd)
    probe.unlink()  # the file this run just created, nothing else


def _png_summary(tag: str, png: bytes) -> Any:
    """An image summary of PNG bytes as they are (no decoding, so no imaging library is needed)."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    width, height = struct.unpack(">II", png[16:24])  # the IHDR chunk
    image = Summary.Image(height=height, width=width, colorspace=4, encoded_image_string=png)
    return Summary(value=[Summary.Value(tag=tag, image=image)])


def _mlflow_key(name: str) -> str:
    """A metric name MLflow accepts (letters, digits, ``_ - . : /`` and spaces): others become ``_``."""
    return re.sub(r"[^\w\-. :/]", "_", name)[:250]


_MLFLOW_STATUS = {"finished": "FINISHED", "stopped_early": "FINISHED", "interrupted": "KILLED", "preempted": "KILLED",
                  "failed": "FAILED"}


class MLflowLogger:
    """One MLflow run per run folder, in the tracking store MLflow defaults to (``MLFLOW_TRACKING_URI`` when
    set) and the experiment ``MLFLOW_EXPERIMENT_NAME`` (default ``Default``); a resume continues the run."""

    name = "mlflow"
    call_timeout = 600.0  # uploading the final weights to a remote server may take minutes

    def __init__(self, run_dir: str | os.PathLike[str], *, resumed: bool = False) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient

        self.run_dir = Path(run_dir)
        self.tracking_uri = mlflow.get_tracking_uri()  # MLFLOW_TRACKING_URI, else MLflow's own default
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self.run_id = self._continued_run() if resumed else None
        self._resumed = self.run_id is not None
        if self.run_id is None:
            experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "Default"
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
            run = self.client.create_run(experiment_id, run_name=self.run_dir.name,
                                         tags={"trainwise.run_dir": str(self.run_dir.resolve())})
            self.run_id = run.info.run_id
            from trainwise.files import atomic_write_json

            names = RunFolder(self.run_dir)  # mlflow.json records this trainwise run's id: see _continued_run
            atomic_write_json(names.file(MLFLOW), {"tracking_uri": self.tracking_uri, "run_id": self.run_id,
                                                             "trainwise_run_id": names.run_id()})
        else:
            self.client.update_run(self.run_id, status="RUNNING")

    def _continued_run(self) -> str | None:
        """The MLflow run this run folder recorded, when it is in this tracking store and mlflow.json names this
        trainwise run's id (one naming another run, or none, starts a new MLflow run: it is never logged into)."""
        try:
            names = RunFolder(self.run_dir)
            saved = json.loads(names.file(MLFLOW).read_text(encoding="utf-8"))
            if saved.get("tracking_uri") != self.tracking_uri:
                return None
            if saved.get("trainwise_run_id") is None or saved.get("trainwise_run_id") != names.run_id():
                return None
            run_id = str(saved["run_id"])
            self.client.get_run(run_id)
        except Exception:  # no file, a damaged one, or a run deleted from the store: start a new run
            return None
        return run_id

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        if self._resumed:  # MLflow parameters cannot change; a resume's differences are in metrics.jsonl
            return
        flat = flat_params(params)
        entries = [Param(key[:250], str(value)[:6000]) for key, value in flat.items()]
        for start in range(0, len(entries), 100):  # MLflow takes at most 100 parameters a batch
            self.client.log_batch(self.run_id, params=entries[start:start + 100])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        entries = [Metric(_mlflow_key(key), value, stamp, step) for key, value in metrics.items()]
        self.client.log_batch(self.run_id, metrics=entries)

    def log_artifact(self, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def finish(self, status: str) -> None:
        self.client.set_tag(self.run_id, "trainwise.end_state", status)
        self.client.set_terminated(self.run_id, status=_MLFLOW_STATUS.get(status, "FINISHED"))
