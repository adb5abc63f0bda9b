"""The Trainer's plain-valued options, typed and validated in one place (used by the API and the CLI)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import re
import typing
from typing import Any, Literal

from trainwise.errors import TrainwiseError, show

_INT64 = 2**63  # integers must fit in torch's and NumPy's int64
_MAX_SEED = 2**32 - 1  # NumPy's limit (trainwise.seeding checks it again)


@dataclasses.dataclass
class TrainerConfig:
    """Every Trainer option that is a plain value (objects such as the optimizer are passed separately)."""

    epochs: int = 10  # passes over the training data
    lr: float = 1e-3  # learning rate of the default optimizer (AdamW)
    weight_decay: float = 0.01  # of the default optimizer
    batch_size: int | Literal["auto"] = 32  # micro-batch size; "auto": the largest that fits effective_batch
    effective_batch: int | None = None  # samples per optimizer step; a multiple of batch_size
    accumulation_steps: int | None = None  # micro-batches per optimizer step (alternative to effective_batch)
    eval_batch_size: int | None = None  # defaults to batch_size
    drop_last: bool = False  # drop a short last training batch (several processes: the batches short of a step)
    max_grad_norm: float | None = None  # clip the global gradient norm (after unscaling)
    device: str = "auto"  # auto: cuda, then mps, then cpu
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    seed: int = 0
    deterministic: bool = False  # deterministic kernels (slower on GPU)
    num_workers: int = 0  # DataLoader worker processes when fit() is given a Dataset
    compile: bool = False  # torch.compile the model (opt-in; eager stays the default)
    run_dir: str | None = None  # default: runs/<date>-<time>
    log_every: int = 50  # optimizer steps between metric reads (one host sync each)
    progress: Literal["auto", "bar", "lines", "off"] = "auto"
    nonfinite: Literal["stop", "skip"] = "stop"  # what a NaN/inf loss does
    accuracy: Literal["auto", "on", "off"] = "auto"  # classification accuracy from logits and class targets
    loss_reduction: Literal["mean", "sum"] = "mean"  # how loss_fn reduces over items
    count: Literal["auto", "samples", "tokens"] = "auto"  # what the loss averages over (auto: from the first batch)
    ignore_index: int = -100  # target value that is not counted as a token
    lr_by_pattern: dict[str, float] | None = None  # learning rate per glob of parameter names
    unfreeze_at: dict[int, list[str]] | None = None  # epoch -> patterns to unfreeze at its start
    patience: int | None = None  # early stopping: epochs without improvement before stopping
    monitor: str = "val_loss"  # the metric early stopping and "best epoch" follow
    mode: Literal["auto", "min", "max"] = "auto"  # auto: max for accuracy-like names, min otherwise
    min_delta: float = 0.0  # smallest change that counts as an improvement
    keep_best: Literal["memory", "disk"] = "memory"  # where early stopping keeps the best weights
    diagnose: bool = True  # report the onset of overfitting once
    guards: Literal["warn", "raise", "off"] = "warn"  # runtime checks of the doctor's codes (trainwise.guard)
    train_norm_stats: bool = False  # let norm layers whose parameters are all frozen update running statistics
    plot: bool = True  # learning curves in the run folder at the end of fit
    plot_format: Literal["svg", "png"] = "svg"  # svg: trainwise's own, in milliseconds; png: matplotlib
    resume: str | None = None  # "auto": the newest complete checkpoint in run_dir; or a checkpoint path
    resume_mismatch: Literal["refuse", "allow"] = "refuse"  # a resume whose run differs: refused, or logged
    overwrite: bool = False  # a run_dir holding another run: moved aside (never deleted) instead of refused
    checkpoint_every: int | None = None  # optimizer steps between mid-epoch checkpoints (one per epoch always)
    keep_last: int = 2  # checkpoints kept besides the best
    checkpoints: bool = True  # write checkpoints to run_dir/checkpoints
    distributed: Literal["auto", "ddp", "fsdp", "off"] = "auto"  # under torchrun: auto/ddp wrap in DDP, fsdp shards
    dist_timeout: float = 300.0  # seconds a collective waits for another process before raising (a dead rank)
    # signals that stop fit at the next optimizer step with a checkpoint (a scheduler's SIGTERM; Slurm's USR1)
    preempt_signals: list[str] = dataclasses.field(default_factory=lambda: ["SIGTERM"])
    loggers: list[str] = dataclasses.field(default_factory=lambda: ["jsonl"])  # + "tensorboard", "mlflow"

    def __post_init__(self) -> None:
        hints = _type_hints()
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            setattr(self, field.name, _check_type(field.name, value, hints[field.name]))
        if not 0 <= self.seed <= _MAX_SEED:
            raise TrainwiseError(f"seed must be an integer between 0 and {_MAX_SEED}, got {self.seed}.")
        for name in ("epochs", "batch_size", "log_every", "keep_last"):
            if getattr(self, name) != "auto" and getattr(self, name) < 1:
                raise TrainwiseError(f"{name} must be at least 1, got {getattr(self, name)}.")
        for name in ("effective_batch", "accumulation_steps", "eval_batch_size", "checkpoint_every"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise TrainwiseError(f"{name} must be at least 1 or unset, got {value}.")
        if self.effective_batch is not None and self.accumulation_steps is not None:
            raise TrainwiseError("set effective_batch or accumulation_steps, not both.")
        if self.batch_size == "auto" and self.effective_batch is None:
            raise TrainwiseError("batch_size='auto' needs effective_batch, the samples per optimizer step it keeps "
                                 "while it finds the micro-batch that fits; set effective_batch too.")
        if self.num_workers < 0:
            raise TrainwiseError(f"num_workers must be 0 or more, got {self.num_workers}.")
        if self.num_workers > max_workers():
            raise TrainwiseError(
                f"num_workers={self.num_workers} is more than {max_workers()} (4 per CPU core here, at least 8): "
                "each worker is a process holding a copy of the dataset, so use at most that many."
            )
        if self.lr <= 0:
            raise TrainwiseError(f"lr must be positive, got {self.lr}.")
        if self.patience is not None and self.patience < 0:
            raise TrainwiseError(f"patience must be 0 or more, or unset, got {self.patience}.")
        if self.min_delta < 0:
            raise TrainwiseError(f"min_delta must be 0 or more, got {self.min_delta}.")
        if self.unfreeze_at is not None:
            self.unfreeze_at = {int(k): list(v) for k, v in self.unfreeze_at.items()}
        if not 0 < self.dist_timeout <= _MAX_TIMEOUT:
            raise TrainwiseError(
                f"dist_timeout must be a positive number of seconds up to {_MAX_TIMEOUT:.0f}, got {self.dist_timeout}."
            )
        if self.overwrite and self.run_dir is not None:
            from trainwise.runlog import refuse_overwriting_the_current_folder

            refuse_overwriting_the_current_folder(self.run_dir)
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise TrainwiseError(f"max_grad_norm must be positive or unset, got {self.max_grad_norm}.")
        from trainwise.interrupts import preempt_signal_names
        from trainwise.tracking import split_loggers

        self.preempt_signals = preempt_signal_names(self.preempt_signals)  # SIGUSR1 or USR1; catchable ones

        self.loggers = split_loggers(self.loggers)[0]  # known names, their packages installed

    def check_processes(self, kind: Literal["single", "ddp", "fsdp"]) -> None:
        """Refuse, in one sentence, an option the processes that train cannot honour; ``kind`` is the strategy's
        name, known only once ``fit`` has joined torchrun's processes (one process honours every option)."""
        if kind == "single":
            return
        if self.unfreeze_at:  # DDP and FSDP fix the trainable parameters when they wrap
            raise TrainwiseError(
                "unfreeze_at is not supported with several processes; run each unfreezing phase as its own fit()."
            )
        if kind == "fsdp" and self.batch_size == "auto":
            raise TrainwiseError("batch_size='auto' is not supported with distributed='fsdp'; set batch_size to "
                                 "a micro-batch that fits, with effective_batch.")

    @classmethod
    def option_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> TrainerConfig:
        unknown_option(changes)
        return dataclasses.replace(self, **changes)


@functools.cache
def _type_hints() -> dict[str, Any]:
    """The options' types, evaluated once (the annotations are strings: evaluating them took a millisecond of
    every Trainer's construction)."""
    return typing.get_type_hints(TrainerConfig)


def max_workers() -> int:
    """The most DataLoader workers trainwise starts: 4 per usable CPU core, at least 8.

    More workers than that never speed loading up and can exhaust processes and memory (a typo such as
    100000 spawns until the machine stalls).
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    return max(8, 4 * cores)


_MAX_TIMEOUT = 86_400.0 * 999_999_999  # datetime.timedelta's largest, which torch.distributed takes


def unknown_option(values: dict[str, Any], *, where: str = "Trainer option",
                   error: type[TrainwiseError] = TrainwiseError) -> None:
    """Reject names that are not options, suggesting the closest valid one."""
    names = TrainerConfig.option_names()
    for key in values:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid options: {', '.join(names)}."
            raise error(f"unknown {where} {show(key, 100)}{hint}")


def _check_type(name: str, value: Any, hint: Any) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or (origin is not None and type(None) in args):  # X | None, int | Literal[...]
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _check_type(name, value, inner[0])
        for hint in inner:
            try:
                return _check_type(name, value, hint)
            except TrainwiseError:
                continue
        kinds = " or ".join(_KIND_NAMES.get(h, "") or ", ".join(map(repr, typing.get_args(h))) for h in inner)
        raise TrainwiseError(f"{name} must be {kinds}, got {show(value)}.")
    if origin is Literal:
        if value not in args:
            raise TrainwiseError(f"{name} must be one of {', '.join(map(repr, args))}, got {show(value)}.")
        return value
    if origin is dict:
        key_type, value_type = args
        if not isinstance(value, dict):
            raise TrainwiseError(f"{name} must be a table (dict), got {show(value)}.")
        checked = {}
        for key, item in value.items():
            if key_type is int and isinstance(key, str):
                key = _int_key(key)  # TOML table keys are strings
            checked_key = _check_type(f"{name} key", key, key_type)
            checked[checked_key] = _check_type(f"{name}[{show(key, 60)}]", item, value_type)
        return checked
    if origin is list:
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise TrainwiseError(f"{name} must be a list, got {show(value)}.")
        return [_check_type(f"{name} item", item, args[0]) for item in value]
    if hint is bool:
        if not isinstance(value, bool):
            raise TrainwiseError(f"{name} must be true or false, got {show(value)}.")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TrainwiseError(f"{name} must be an integer, got {show(value)}.")
        if not -_INT64 <= value < _INT64:
            raise TrainwiseError(f"{name} must fit in 64 bits (at most {_INT64 - 1}), got {show(value)}.")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TrainwiseError(f"{name} must be a number, got {show(value)}.")
        try:
            number = float(value)
        except OverflowError:  # an integer too large for a float
            number = math.inf
        if not math.isfinite(number):
            raise TrainwiseError(f"{name} must be a finite number, got {show(value)}.")
        return number
    if hint is str:
        if not isinstance(value, str):
            raise TrainwiseError(f"{name} must be a string, got {show(value)}.")
        return value
    return value


_KIND_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _int_key(key: str) -> Any:
    """``"3"`` -> 3 for tables keyed by integers (TOML keys are strings); anything else stays as it is."""
    text = key.strip()
    return int(text) if re.fullmatch(r"-?[0-9]{1,30}", text) else key


def parse_override(text: str) -> tuple[str, Any]:
    """Parse ``key=value`` into a typed value for that option (``none`` unsets an optional one)."""
    if "=" not in text:
        raise TrainwiseError(f"override {show(text)} is not key=value; write it like epochs=5.")
    key, raw = (part.strip() for part in text.split("=", 1))
    unknown_option({key: None})
    hint = typing.get_type_hints(TrainerConfig)[key]
    return key, _parse_value(key, raw, hint)


def _parse_value(name: str, raw: str, hint: Any) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or (origin is not None and type(None) in args):
        if type(None) in args and raw.lower() in ("none", "null", ""):
            return None
        inner = [a for a in args if a is not type(None)]
        words = [h for h in inner if typing.get_origin(h) is Literal and raw in typing.get_args(h)]
        if words:  # batch_size=auto
            return raw
        if len(inner) > 1:
            try:
                return _parse_value(name, raw, inner[0])
            except TrainwiseError:
                return _check_type(name, raw, hint)  # the sentence naming every form
        return _parse_value(name, raw, inner[0])
    if origin is Literal:
        return _check_type(name, raw, hint)
    if origin is list and not raw.lstrip().startswith("["):  # loggers=tensorboard,mlflow
        return _check_type(name, [item.strip() for item in raw.split(",") if item.strip()], hint)
    if origin in (dict, list):
        return _check_type(name, _toml_value(name, raw), hint)
    try:
        if hint is bool:
            lowered = raw.lower()
            if lowered in ("true", "1", "yes", "on"):
                return True
            if lowered in ("false", "0", "no", "off"):
                return False
            raise ValueError(raw)
        if hint is int:
            return int(raw)
        if hint is float:
            return float(raw)
    except ValueError:
        kind = {bool: "true or false", int: "an integer", float: "a number"}[hint]
        raise TrainwiseError(f"{name} must be {kind}, got {show(raw)}.") from None
    return raw


def _toml_value(name: str, raw: str) -> Any:
    """A table or list written inline in TOML syntax: ``'{"backbone.*" = 1e-4}'`` or ``'[1, 2]'``."""
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        return tomllib.loads(f"value = {raw}")["value"]
    except ValueError:  # TOMLDecodeError, or an integer of more than 4300 digits
        raise TrainwiseError(
            f"{name} must be written as an inline TOML table or list, like {{\"backbone.*\" = 1e-4}}; got "
            f"{show(raw)}."
        ) from None
