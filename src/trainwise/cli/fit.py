"""``trainwise fit CONFIG.toml``: the Trainer from a TOML file of ``package.module:function`` factories and options.

See docs/fit.md for the file layout; every mistake in the file or the overrides is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import importlib
import inspect
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from trainwise.config import TrainerConfig, parse_override, unknown_option
from trainwise.errors import TrainwiseError, printable, show
from trainwise.run_folder import LOG

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FACTORY_TABLES = ("model", "data", "loss", "optimizer", "scheduler")
TABLES = (*FACTORY_TABLES, "trainer")
REQUIRED_TABLES = ("model", "data")
FACTORY_KEYS = ("factory", "kwargs")
# What each factory is called with before its kwargs (a placeholder is enough to check the signature).
LEADING_ARGS = {"optimizer": ("params",), "scheduler": ("optimizer",)}
# Options that only configure the default optimizer (AdamW), so they would be silently ignored next to [optimizer].
DEFAULT_OPTIMIZER_OPTIONS = ("lr", "weight_decay")


@dataclasses.dataclass
class Factory:
    """One factory table: its ``package.module:function`` spec, keyword arguments and the resolved function."""

    table: str
    spec: str
    kwargs: dict[str, Any]
    function: Callable[..., Any]

    def check(self, *args: Any) -> None:
        """Raise a TrainwiseError if ``args`` plus the kwargs do not fit the function's signature."""
        try:
            signature = inspect.signature(self.function).replace(return_annotation=inspect.Signature.empty)
        except (TypeError, ValueError):  # some builtins have no signature; the call itself will tell
            return
        try:
            signature.bind(*args, **self.kwargs)
        except TypeError as exc:
            raise TrainwiseError(
                f"[{self.table}] kwargs {sorted(self.kwargs)} do not fit {self.spec}{signature}: {exc}."
            ) from None

    def call(self, *args: Any) -> Any:
        """``function(*args, **kwargs)`` after the signature check (errors inside the function propagate; a
        ``sys.exit()`` there is one sentence, so that fit never exits 0 having trained nothing)."""
        self.check(*args)
        try:
            return self.function(*args, **self.kwargs)
        except SystemExit as exc:
            raise TrainwiseError(f"[{self.table}] factory {self.spec} raised {_raised(exc)}; return the object "
                                 "instead of exiting.") from None


@dataclasses.dataclass
class FitConfig:
    """A resolved configuration: the factories that were given and every Trainer option, defaults filled in."""

    path: Path
    factories: dict[str, Factory]
    trainer: TrainerConfig

    def to_dict(self) -> dict[str, Any]:
        """What ``--print-config`` shows (absent optional tables are ``null``)."""
        resolved: dict[str, Any] = {"config": str(self.path), "trainer": self.trainer.to_dict()}
        for table in FACTORY_TABLES:
            factory = self.factories.get(table)
            resolved[table] = None if factory is None else {"factory": factory.spec, "kwargs": factory.kwargs}
        return resolved


# -- command line ----------------------------------------------------------------------------------------


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "fit",
        help="train the model and data named in a TOML file",
        description=(
            "Train with the Trainer from a TOML file that names the model and data factories (and optionally "
            "loss, optimizer, scheduler) as package.module:function, plus [trainer] options. Overrides: "
            "key=value for a Trainer option (epochs=3), table.kwargs.name=value for a factory argument "
            "(model.kwargs.width=16), table.factory=package.module:function."
        ),
    )
    parser.add_argument("config", metavar="CONFIG.toml", help="the configuration file")
    # REMAINDER so that options may also follow the overrides; run() separates them again.
    parser.add_argument("overrides", nargs=argparse.REMAINDER, metavar="key=value", help="overrides")
    _add_options(parser)
    parser.set_defaults(run=run, fit_parser=parser)


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--print-config", action="store_true", help="print the resolved configuration and exit")
    parser.add_argument("--json", action="store_true", help="print one JSON summary as the last line")


def _split_options(args: argparse.Namespace) -> None:
    """Move options written among the overrides (``fit c.toml epochs=1 --json``) onto ``args``."""
    options = argparse.ArgumentParser(add_help=False)
    _add_options(options)
    _, rest = options.parse_known_args(args.overrides, namespace=args)
    for item in rest:
        if item in ("-h", "--help"):
            args.fit_parser.print_help()
            raise SystemExit(0)
        if item.startswith("-"):
            args.fit_parser.error(f"unrecognized arguments: {item}")
    args.overrides = rest


def run(args: argparse.Namespace) -> int:
    from trainwise.cli import interrupted

    _split_options(args)
    path = Path(args.config)
    with search_path(path):
        config = load_config(path, args.overrides)
        if args.print_config:
            print(json.dumps(config.to_dict(), indent=2, sort_keys=True, default=str))
            return 0
        summary = train(config)
    if args.json:
        print(json.dumps(summary))
    else:
        print(_summary_line(summary))
    if summary["stopped"] == "interrupted":  # Ctrl-C: the summary of what was done, then exit code 130
        sys.stdout.flush()
        return interrupted("fit", summary["run_dir"])
    if summary["stopped"] == "preempted":
        sys.stdout.flush()
        return preempted("fit", summary["run_dir"])
    return 0


def preempted(command: str, run_dir: Any) -> int:
    """Say that ``command`` was preempted and where its checkpoint is, in one line; the exit code 143."""
    from trainwise.interrupts import PREEMPTED_EXIT_CODE

    print(f"trainwise {command}: preempted; what was logged, and the checkpoint that resume=auto continues from, is "
          f"in {run_dir}.", file=sys.stderr)
    return PREEMPTED_EXIT_CODE


def _summary_line(summary: dict[str, Any]) -> str:
    if summary["val_accuracy"] is not None:
        metrics = f"validation accuracy {summary['val_accuracy']:.4f}"
        if summary["val_loss"] is not None:
            metrics += f", loss {summary['val_loss']:.4f}"
    elif summary["val_loss"] is not None:
        metrics = f"validation loss {summary['val_loss']:.4f}"
    elif summary["train_loss"] is not None:
        metrics = f"training loss {summary['train_loss']:.4f}"
    else:
        metrics = "no epoch finished"
    return (
        f"{metrics} after {summary['epochs']} epochs in {summary['seconds']:.1f} s on {summary['device']} "
        f"({summary['stopped']}); log in {os.path.join(summary['run_dir'], LOG)}"
    )


# -- reading and resolving the file ----------------------------------------------------------------------


def read_toml(path: Path) -> dict[str, Any]:
    """The parsed TOML file; a missing, unreadable or invalid file is a TrainwiseError."""
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise TrainwiseError(f"config file {str(path)!r} not found.") from None
    except OSError as exc:
        raise TrainwiseError(f"cannot read config file {str(path)!r}: {exc.strerror or exc}.") from None
    except UnicodeDecodeError:
        raise TrainwiseError(f"config file {str(path)!r} is not UTF-8 text.") from None
    except tomllib.TOMLDecodeError as exc:
        raise TrainwiseError(f"config file {str(path)!r} is not valid TOML: {exc}.") from None
    except ValueError as exc:  # an integer of more than 4300 digits: Python refuses to convert it
        raise TrainwiseError(f"config file {str(path)!r} has a value Python cannot read ({exc}).") from None
    except RecursionError:  # thousands of nested arrays or inline tables: tomllib recurses once per level
        raise TrainwiseError(
            f"config file {str(path)!r} nests arrays or tables too deeply to read; flatten its values."
        ) from None


def load_config(path: Path, overrides: Sequence[str] = ()) -> FitConfig:
    """Read ``path``, apply ``overrides`` and resolve every factory (imported and checked, not called)."""
    raw = read_toml(path)
    _check_tables(raw)
    explicit = set(raw.get("trainer", {}))
    for text in overrides:
        explicit.update(apply_override(raw, text))
    for table in REQUIRED_TABLES:
        if table not in raw:
            raise TrainwiseError(
                f'{str(path)!r} has no [{table}] table; add one with factory = "package.module:function".'
            )
    trainer_table = raw.get("trainer", {})
    unknown_option(trainer_table, where="[trainer] option")
    trainer = TrainerConfig(**trainer_table)
    factories = {table: _factory(table, raw[table]) for table in FACTORY_TABLES if table in raw}
    if "optimizer" in factories:
        for name in DEFAULT_OPTIMIZER_OPTIONS:
            if name in explicit:
                raise TrainwiseError(
                    f"{name} configures only the default optimizer (AdamW); with an [optimizer] table, set it "
                    f"in its kwargs instead (optimizer.kwargs.{name}=...)."
                )
    for table, factory in factories.items():
        factory.check(*LEADING_ARGS.get(table, ()))
    return FitConfig(path=path, factories=factories, trainer=trainer)


def _closest(name: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1)
    return f"did you mean {close[0]!r}?" if close else f"expected one of {', '.join(choices)}."


def _check_tables(raw: dict[str, Any]) -> None:
    for name, value in raw.items():
        if name not in TABLES:
            if name in TrainerConfig.option_names():
                raise TrainwiseError(f"{name!r} is a Trainer option; put it under [trainer].")
            raise TrainwiseError(f"unknown table [{name}]; {_closest(name, TABLES)}")
        if not isinstance(value, dict):
            raise TrainwiseError(f"{name!r} must be a table ([{name}]), got {type(value).__name__}.")
    for table in FACTORY_TABLES:
        for key in raw.get(table, {}):
            if key not in FACTORY_KEYS:
                raise TrainwiseError(f"unknown key {key!r} in [{table}]; {_closest(key, FACTORY_KEYS)}")


def apply_override(raw: dict[str, Any], text: str) -> set[str]:
    """Apply one ``key=value`` override to the parsed file; returns the Trainer option it set, if any."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or "." not in key:
        name, typed = parse_override(text)  # a Trainer option (rejects unknown names with the closest one)
        raw.setdefault("trainer", {})[name] = typed
        return {name}
    table, _, rest = key.partition(".")
    if table not in TABLES:
        raise TrainwiseError(f"override {key!r}: unknown table {table!r}; {_closest(table, TABLES)}")
    if table == "trainer":
        return apply_override(raw, f"{rest}={value}")
    field, _, name = rest.partition(".")
    if field not in FACTORY_KEYS:
        raise TrainwiseError(f"override {key!r}: unknown key {field!r}; {_closest(field, FACTORY_KEYS)}")
    entry = raw.setdefault(table, {})
    if field == "factory" and not name:
        entry["factory"] = value.strip()
    elif field == "kwargs" and name and "." not in name:
        kwargs = entry.setdefault("kwargs", {})
        if not isinstance(kwargs, dict):
            raise TrainwiseError(f"[{table}] kwargs must be a table, got {type(kwargs).__name__}.")
        kwargs[name] = _toml_value(value)
    else:
        raise TrainwiseError(
            f"override {key!r} is not {table}.factory=package.module:function or {table}.kwargs.NAME=value."
        )
    return set()


def _toml_value(text: str) -> Any:
    """A value written as in TOML (``16``, ``0.9``, ``true``, ``[1, 2]``, ``"x"``); anything else is a string."""
    try:
        return tomllib.loads(f"value = {text.strip()}")["value"]
    except tomllib.TOMLDecodeError:
        return text.strip()
    except ValueError as exc:  # an integer of more than 4300 digits
        raise TrainwiseError(f"override value {show(text.strip(), 40)} cannot be read ({exc}).") from None
    except RecursionError:  # thousands of nested brackets
        raise TrainwiseError(f"override value {show(text.strip(), 40)} nests too deeply to read; flatten it.") from None


def _factory(table: str, entry: dict[str, Any]) -> Factory:
    spec = entry.get("factory")
    if spec is None:
        raise TrainwiseError(f'[{table}] has no factory; add factory = "package.module:function".')
    if not isinstance(spec, str):
        raise TrainwiseError(f'[{table}] factory must be a string "package.module:function", got {spec!r}.')
    kwargs = entry.get("kwargs", {})
    if not isinstance(kwargs, dict):
        raise TrainwiseError(f"[{table}] kwargs must be a table such as {{ width = 16 }}, got {kwargs!r}.")
    return Factory(table=table, spec=spec, kwargs=dict(kwargs), function=import_factory(spec, table=table))


@contextlib.contextmanager
def search_path(config_path: Path) -> Iterator[None]:
    """Put the config file's folder and the current directory first on ``sys.path`` for the block."""
    added = []
    for folder in (str(Path.cwd()), str(config_path.resolve().parent)):  # inserted at 0: the file's folder wins
        if folder not in sys.path:
            sys.path.insert(0, folder)
            added.append(folder)
    try:
        yield
    finally:
        for folder in added:
            with contextlib.suppress(ValueError):
                sys.path.remove(folder)


def import_factory(spec: str, *, table: str = "factory") -> Callable[..., Any]:
    """The callable named by ``package.module:function`` (a dotted attribute path after the colon is allowed)."""
    module_name, sep, attribute = spec.partition(":")
    module_name, attribute = module_name.strip(), attribute.strip()
    if not sep or not module_name or not attribute:
        raise TrainwiseError(
            f"[{table}] factory {spec!r} must be written package.module:function, e.g. trainwise.demo:make_model."
        )
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == module_name or module_name.startswith(missing + "."):
            raise TrainwiseError(
                f"[{table}] factory {spec!r}: no module named {missing!r} (searched sys.path, the config "
                f"file's folder and the current directory {os.getcwd()})."
            ) from None
        raise TrainwiseError(
            f"[{table}] factory {spec!r}: module {module_name!r} imports {missing!r}, which is not installed."
        ) from None
    except SyntaxError as exc:  # the line is the module's (or a module it imports), as Python reports it
        where = f"{Path(exc.filename or module_name).name}:{exc.lineno}" if exc.lineno else module_name
        raise TrainwiseError(
            f"[{table}] factory {spec!r}: module {module_name!r} has a syntax error at {where} "
            f"({printable(exc.msg, 100)}); fix that line."
        ) from None
    except (Exception, SystemExit) as exc:  # raised at import; sys.exit() there must not end fit with "success"
        raise TrainwiseError(
            f"[{table}] factory {spec!r}: importing module {module_name!r} raised {_raised(exc)}; fix the "
            "module so that importing it only defines its functions."
        ) from None
    owner = module_name
    for part in attribute.split("."):
        if not hasattr(target, part):
            names = [n for n in dir(target) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "."
            raise TrainwiseError(f"[{table}] factory {spec!r}: {owner!r} has no attribute {part!r}{hint}")
        target = getattr(target, part)
        owner = f"{owner}.{part}"
    if not callable(target):
        raise TrainwiseError(f"[{table}] factory {spec!r} is a {type(target).__name__}, not a function or class.")
    return target


def _raised(exc: BaseException) -> str:
    """``ValueError ('bad') at mod.py:3``: the exception and the deepest line of the user's code it passed."""
    import sysconfig
    import traceback

    if isinstance(exc, SystemExit):
        what = f"SystemExit (sys.exit({printable(repr(exc.code), 40)}))"
    else:
        message = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        what = type(exc).__name__ + (f" ({printable(repr(message), 200)})" if message else "")
    library = tuple(str(Path(p).resolve()) for p in {sysconfig.get_paths()[k] for k in ("stdlib", "purelib",
                                                                                          "platlib")})
    ours = str(Path(__file__).resolve().parents[1])  # trainwise itself: the import call, not the user's line
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith("<") and not str(Path(f.filename).resolve()).startswith(ours)]
    own = [f for f in frames if not str(Path(f.filename).resolve()).startswith(library)] or frames
    return what + (f" at {Path(own[-1].filename).name}:{own[-1].lineno}" if own else "")


# -- training --------------------------------------------------------------------------------------------


def _check_not_a_list_of_datasets(data: Any, spec: str) -> None:
    """A list holding datasets or loaders is a (train, val) pair written with brackets: say so, not train on it."""
    from torch.utils.data import DataLoader, Dataset

    if isinstance(data, list) and data and all(isinstance(item, (Dataset, DataLoader)) for item in data):
        kinds = ", ".join(type(item).__name__ for item in data[:3]) + (", ..." if len(data) > 3 else "")
        fix = "return the tuple (train, val) instead"
        if len(data) != 2:
            fix = "return the tuple (train, val) or the training data alone"
        raise TrainwiseError(
            f"[data] factory {spec} returned a list ({kinds}), which would be taken as the training samples "
            f"themselves; {fix}."
        )


def build(config: FitConfig) -> tuple[Any, Any, Any, Any]:
    """Call the factories: ``(model, train_data, val_data, trainer)``; seeds first so the weights repeat."""
    import torch

    from trainwise.seeding import seed_everything
    from trainwise.trainer import Trainer

    seed_everything(config.trainer.seed)
    factories = config.factories
    data = factories["data"].call()
    _check_not_a_list_of_datasets(data, factories["data"].spec)
    if isinstance(data, tuple):
        if len(data) != 2:
            raise TrainwiseError(
                f"[data] factory {factories['data'].spec} returned a tuple of {len(data)}; return (train, val) "
                "or the training data alone."
            )
        train_data, val_data = data
    else:
        train_data, val_data = data, None
    model = factories["model"].call()
    if not isinstance(model, torch.nn.Module):
        raise TrainwiseError(
            f"[model] factory {factories['model'].spec} returned a {type(model).__name__}, not a torch.nn.Module."
        )
    objects: dict[str, Any] = {}
    if "loss" in factories:
        loss_fn = factories["loss"].call()
        if not callable(loss_fn):
            raise TrainwiseError(
                f"[loss] factory {factories['loss'].spec} returned a {type(loss_fn).__name__}, not a callable "
                "loss_fn(outputs, targets)."
            )
        objects["loss_fn"] = loss_fn
    if "optimizer" in factories:
        objects["optimizer"] = factories["optimizer"].call
    if "scheduler" in factories:
        objects["scheduler"] = factories["scheduler"].call
    trainer = Trainer.from_config(config.trainer, **objects)
    return model, train_data, val_data, trainer


def train(config: FitConfig) -> dict[str, Any]:
    """Build everything, record the resolved configuration in the run folder as fit.json, train; a summary."""
    from trainwise.files import atomic_write_json
    from trainwise.interrupts import Preempted
    from trainwise.runlog import default_run_dir, prepare_run_folder

    if config.trainer.run_dir is None:  # resolve it now so that fit.json lands in the same folder
        config = dataclasses.replace(config, trainer=config.trainer.replace(run_dir=str(default_run_dir())))
    model, train_data, val_data, trainer = build(config)
    run_dir = Path(config.trainer.run_dir or "")
    from trainwise.run_folder import FIT, RunFolder

    # under torchrun process 0 alone prepares the folder (the others would hold its lock while process 0 takes
    # it); the Trainer then makes every process agree on it
    if os.environ.get("RANK", "0") == "0":
        # refused (or moved aside) before fit.json is written over another run's
        prepare_run_folder(run_dir, resume=config.trainer.resume, overwrite=config.trainer.overwrite)
        fit_json = RunFolder(run_dir).file(FIT)  # a symlink, FIFO or directory there: refused, never written through
        if not config.trainer.resume:
            atomic_write_json(fit_json, config.to_dict())
        elif not fit_json.exists():  # a resume keeps the run's own record; one without any writes it once the
            # Trainer has compared the run it continues (a refused resume leaves the folder as it was)
            trainer.callbacks.append(_WriteOnStart(fit_json, config.to_dict()))
    try:
        result = trainer.fit(model, train_data, val_data)
    except KeyboardInterrupt as exc:  # Ctrl-C: the Trainer saved the log and a checkpoint, and says what it did
        result = getattr(exc, "result", None)
        if result is None:
            raise
    except Preempted as exc:  # SIGTERM (preempt_signals): the same, then exit code 143
        result = exc.result
    except (RuntimeError, ValueError, IndexError) as exc:
        if isinstance(exc, TrainwiseError) or not _SHAPE_ERROR.search(str(exc)):
            raise  # a bug in the factories' code, not a mismatch: its traceback says where
        raise TrainwiseError(_shape_message(exc, config)) from None
    return summarize(result)


class _WriteOnStart:
    """A callback that writes fit.json at ``on_fit_start``: after a resume's comparison, before training."""

    def __init__(self, path: Path, payload: dict[str, Any]) -> None:
        self.path, self.payload = path, payload

    def on_fit_start(self, state: Any) -> None:
        from trainwise.files import atomic_write_json

        atomic_write_json(self.path, self.payload)


# What torch says when a batch does not fit the model or the loss (shapes, channels, batch sizes, class ids).
_SHAPE_ERROR = re.compile(
    r"shapes cannot be multiplied|size mismatch|must match the size of tensor|expected input\[|to have \d+ channels|"
    r"Expected input batch_size|Target size|must be the same as input size|Dimension out of range|is out of bounds|"
    r"Expected (?:\d+D|3D|4D|2D)|but got input of size|Expected target size|invalid for input of size"
)


def _shape_message(exc: BaseException, config: FitConfig) -> str:
    """One sentence for a batch that does not fit the model or the loss, naming the line of the user's code."""
    import traceback

    reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    where = ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        parts = Path(frame.filename).parts
        if "torch" not in parts and "trainwise" not in parts:  # the deepest frame in the user's own code
            where = f" at {Path(frame.filename).name}:{frame.lineno}"
            break
    return (
        f"the data of [data] {config.factories['data'].spec} does not fit the model of [model] "
        f"{config.factories['model'].spec} ({type(exc).__name__}{where}: {printable(reason, 300)}); make the "
        "batches' shapes (and the loss's targets) match what the model takes."
    )


def summarize(result: Any) -> dict[str, Any]:
    """The JSON summary of a :class:`~trainwise.trainer.FitResult` that ``fit`` (and an interrupted ``demo``) print."""
    last = result.last
    return {
        "val_accuracy": last.get("val_accuracy"),
        "val_loss": last.get("val_loss"),
        "train_loss": last.get("train_loss"),
        "epochs": len(result.history),
        "steps": result.steps,
        "seconds": round(result.seconds, 3),
        "run_dir": str(result.run_dir),
        "device": result.device,
        "precision": result.precision,
        "stopped": result.stopped,
    }
