"""``trainwise ckpt inspect FILE`` and ``trainwise ckpt convert IN OUT``: look into and clean up checkpoints.

Files are read with ``weights_only=True`` (nothing in them runs); a bad file is one sentence and exit code 2;
``convert`` writes OUT atomically, so OUT is either untouched or complete.
"""

from __future__ import annotations

import argparse
import json
import warnings
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "ckpt",
        help="inspect or convert a checkpoint file",
        description="Inspect or convert checkpoint files safely (weights_only loading; nothing in the file runs).",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    inspect = actions.add_parser(
        "inspect",
        help="what a checkpoint holds: format, contents, wrapper prefixes, tensors",
        description="Show a checkpoint's format, what it holds (weights, optimizer, RNG, step...), wrapper "
        "prefixes, parameter count, dtypes and a table of tensors.",
    )
    inspect.add_argument("file", help="a .pt/.pth/.bin/.ckpt (torch) or .safetensors file")
    inspect.add_argument("--format", choices=("table", "json"), default="table", help="output format (default table)")
    inspect.set_defaults(run=run)
    convert = actions.add_parser(
        "convert",
        help="write a checkpoint's weights as .safetensors or as a clean state dict",
        description="Write the weights found in IN to OUT, without wrapper prefixes (module., _orig_mod., and a "
        "Lightning module's model.): OUT ending in .safetensors is written as safetensors, OUT ending in "
        ".pt/.pth/.bin as a plain torch state dict.",
    )
    convert.add_argument("input", metavar="IN", help="the checkpoint to read")
    convert.add_argument("output", metavar="OUT", help="the file to write (.safetensors, .pt, .pth or .bin)")
    convert.add_argument("--force", action="store_true", help="replace OUT if it exists")
    convert.add_argument("--keep-prefixes", action="store_true", help="keep wrapper prefixes as they are")
    convert.set_defaults(run=run)
    parser.set_defaults(run=_usage(parser))


def _usage(parser: argparse.ArgumentParser) -> Any:
    def run_without_action(args: argparse.Namespace) -> int:
        from trainwise.errors import TrainwiseError

        raise TrainwiseError(
            "name an action: trainwise ckpt inspect FILE or trainwise ckpt convert IN OUT (see trainwise ckpt --help)."
        )

    return run_without_action


def run(args: argparse.Namespace) -> int:
    if args.action == "inspect":
        return _inspect(args)
    return _convert(args)


# -- inspect -------------------------------------------------------------------------------------------------


def _is_folder(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:
        return False


def describe(path: str | Path) -> dict[str, Any]:
    """Everything ``ckpt inspect`` shows, as plain JSON-ready values."""
    import torch

    from trainwise.checkpoint.io import detect_format, name_mismatch, printable, safe_load
    from trainwise.checkpoint.weights import find_weights, read_weights, weight_files, wrapper_prefixes

    path = Path(path)
    files: list[Path] | None = None
    if _is_folder(path) or path.name.endswith(".index.json"):  # save_pretrained's folder, or a shard index
        files = weight_files(path)
        single = len(files) == 1 and not files[0].name.endswith(".index.json") and not path.name.endswith(
            ".index.json") and files[0].parent == path
        fmt = (f"save_pretrained folder ({files[0].name})" if single
               else f"{len(files)} shard{'' if len(files) == 1 else 's'} ({detect_format(files[0])})")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            content = read_weights(path)[1]
    else:
        fmt = detect_format(path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the name-mismatch warning: shown as the "note" row instead
            content = safe_load(path)
    found = find_weights(content)
    weights: Mapping[str, Any] = found[1] if found else {}
    tensors = {k: v for k, v in weights.items() if isinstance(v, torch.Tensor)}
    info: dict[str, Any] = {
        "file": str(path),
        "format": fmt,
        "bytes": sum(f.stat().st_size for f in files) if files is not None else path.stat().st_size,
        "kind": _kind(content, found is not None),
        "holds": _holds(content, found is not None),
        "weights_at": found[0] if found else None,
        "prefixes": wrapper_prefixes(list(tensors)),
        "parameters": sum(t.numel() for t in tensors.values()),
        "tensor_count": len(tensors),
        "dtypes": dict(Counter(str(t.dtype).removeprefix("torch.") for t in tensors.values())),
        "tensors": [
            {"name": k, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
            for k, t in tensors.items()
        ],
    }
    if files is not None:
        info["files"] = [{"name": printable(f.name, 120), "bytes": f.stat().st_size} for f in files]
    mismatch = name_mismatch(path, fmt) if files is None else None
    if mismatch:
        info["note"] = f"this file {mismatch}; it was read by its content"
    if isinstance(content, Mapping) and isinstance(content.get("meta"), Mapping):
        meta = content["meta"]  # written by whoever made the file: shown escaped and cut short
        info["versions"] = {
            k: printable(meta[k], 80) for k in ("trainwise", "torch", "python") if isinstance(meta.get(k), str)
        }
    training = _training(content)
    if training:
        info["training"] = training
    return info


_MAX_EPOCHS = 1000  # epochs of logged metrics kept from a file (a crafted one may claim millions)


def _training(content: Any) -> dict[str, Any] | None:
    """A Trainer checkpoint's position and logged metrics: epoch, step, the history of epoch metrics.

    Everything comes from a file written by someone else: only plain numbers are taken, names are escaped.
    """
    from trainwise.checkpoint.io import printable
    from trainwise.checkpoint.state import is_trainwise_checkpoint

    if not is_trainwise_checkpoint(content):
        return None
    state, meta = content["state"], content.get("meta")
    meta = meta if isinstance(meta, Mapping) else {}
    loop = state.get("loop")
    if not isinstance(loop, Mapping):
        return None  # a checkpoint of trainwise.save_checkpoint, not of the Trainer
    config = meta.get("config") if isinstance(meta.get("config"), Mapping) else {}
    loader = state.get("loader") if isinstance(state.get("loader"), Mapping) else {}
    history = loop.get("history") if isinstance(loop.get("history"), (list, tuple)) else []
    epoch = _number(loop.get("epoch"), integer=True)
    batches = _number(loader.get("batches_done"), integer=True) or 0
    metrics = []
    for entry in history[-_MAX_EPOCHS:]:
        if isinstance(entry, Mapping):
            row = {printable(k, 40): _number(v) for k, v in list(entry.items())[:40] if isinstance(k, str)}
            metrics.append({k: v for k, v in row.items() if v is not None})
    training: dict[str, Any] = {
        # the loop's epoch is the one under way: at an epoch's end, the next one, which has not started
        "epoch": None if epoch is None else (epoch if batches else epoch - 1),
        "epoch_finished": not batches,
        "batches_done": batches,
        "epochs": _number(config.get("epochs"), integer=True),
        "step": _number(meta.get("step"), integer=True),
        "stopped_early": loop.get("stopped_early") is True,
        "monitor": printable(meta["monitor"], 40) if isinstance(meta.get("monitor"), str) else None,
        "metric": _number(meta.get("metric")),
        "metrics": metrics,
    }
    if len(history) > _MAX_EPOCHS:
        training["metrics_left_out"] = len(history) - _MAX_EPOCHS
    return training


def _number(value: Any, *, integer: bool = False) -> Any:
    """``value`` if it is a plain finite number (an int when ``integer``), else None; never a huge integer."""
    import math

    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):
        return value if abs(value) < 2**63 else None
    if integer or not math.isfinite(value):
        return None
    return value


def _kind(content: Any, has_weights: bool) -> str:
    from trainwise.checkpoint.state import is_trainwise_checkpoint
    from trainwise.checkpoint.weights import is_state_dict

    if is_trainwise_checkpoint(content):
        return "trainwise training checkpoint"
    if isinstance(content, Mapping) and "pytorch-lightning_version" in content:
        return "Lightning checkpoint"
    if is_state_dict(content):
        return "state dict"
    if isinstance(content, Mapping):
        return "checkpoint dict" if has_weights else "dict without model weights"
    return type(content).__name__


def _holds(content: Any, has_weights: bool) -> list[str]:
    from trainwise.checkpoint.io import printable
    from trainwise.checkpoint.state import is_trainwise_checkpoint
    from trainwise.checkpoint.weights import is_state_dict

    holds = ["weights"] if has_weights else []
    if not isinstance(content, Mapping) or is_state_dict(content):
        return holds
    entries: Mapping[str, Any] = content
    if is_trainwise_checkpoint(content):
        entries = content["state"]
        if content.get("rng") is not None:
            holds.append("RNG states")
        meta = content.get("meta")
        if isinstance(meta, Mapping) and meta.get("config"):
            holds.append("config")
    labels = 0
    for key, value in entries.items():
        label = _label(printable(key if isinstance(key, str) else f"<{type(key).__name__} key>", 60), value)
        if label and label not in holds:
            labels += 1
            if labels <= _MAX_LABELS:
                holds.append(label)
    if labels > _MAX_LABELS:
        holds.append(f"{labels - _MAX_LABELS} more entries")
    return holds


_MAX_LABELS = 20  # entries named in "holds"; a crafted file may have millions
_MAX_ROWS = 500  # rows of the tensor table (the JSON output lists every tensor)


def _label(key: str, value: Any) -> str | None:
    from trainwise.checkpoint.io import printable
    from trainwise.checkpoint.weights import is_state_dict

    lowered = key.lower()
    if is_state_dict(value):
        return None  # the weights, already listed
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{key}={printable(value, 40)}"
    if isinstance(value, Mapping):
        if "param_groups" in value:
            return "optimizer"
        if "epoch_start" in value and "batches_done" in value:
            return f"data position (batch {printable(value['batches_done'], 40)} of the epoch)"
        if "base_lrs" in value or "last_epoch" in value:
            return "scheduler"
        if "scale" in value and "growth_factor" in value:
            return "gradient scaler"
        if value and all(isinstance(k, str) for k in value) and not any(w in lowered for w in ("optim", "sched")):
            return f"{key} state"
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], Mapping) and "param_groups" in value[0]:
        return "optimizer"
    for word, label in (("optim", "optimizer"), ("sched", "scheduler"), ("scaler", "gradient scaler"),
                        ("rng", "RNG states"), ("hyper", "hyperparameters"), ("config", "config"),
                        ("callback", "callbacks")):
        if word in lowered:
            return label
    return None


def _inspect(args: argparse.Namespace) -> int:
    info = describe(args.file)
    if args.format == "json":
        print(json.dumps(info))
        return 0
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from trainwise.checkpoint.io import printable

    def cell(value: Any, limit: int | None = 200) -> Text:
        return Text(printable(value, limit))  # plain text: no markup, no control characters from the file

    class _Console(Console):
        def on_broken_pipe(self) -> None:  # rich exits 1; the CLI ends a closed pipe quietly with 0 (cli.main)
            self.quiet = True
            raise BrokenPipeError

    console = _Console(highlight=False)
    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("file", cell(info["file"], None))
    summary.add_row("format", cell(f"{info['format']} ({info['bytes']:,} bytes)"))
    if len(info.get("files", ())) > 1:
        summary.add_row("shards", cell(", ".join(f"{f['name']} ({f['bytes']:,} bytes)" for f in info["files"]), 2000))
    if info.get("note"):
        summary.add_row("note", cell(info["note"]))
    summary.add_row("kind", cell(info["kind"]))
    summary.add_row("holds", cell(", ".join(info["holds"]) or "nothing trainwise recognises", 2000))
    summary.add_row("weights at", cell(info["weights_at"] or "-"))
    summary.add_row("wrapper prefixes", cell(", ".join(repr(p) for p in info["prefixes"]) or "none"))
    summary.add_row("parameters", cell(f"{info['parameters']:,} in {info['tensor_count']} tensors (buffers included)"))
    summary.add_row("dtypes", cell(", ".join(f"{d} x{n}" for d, n in info["dtypes"].items()) or "-", 2000))
    for name, version in info.get("versions", {}).items():
        summary.add_row(f"{name} version", cell(version))
    training = info.get("training")
    if training:
        summary.add_row("epoch", cell(_epoch_text(training)))
        summary.add_row("step", cell("-" if training["step"] is None else f"{training['step']:,} optimizer steps"))
        if training["monitor"] and training["metric"] is not None:
            summary.add_row("monitored", cell(f"{training['monitor']} {_metric_text(training['metric'])}"))
    console.print(summary)
    if training and training["metrics"]:
        for line in _metrics_lines(training):
            console.print(cell(line, 2000))
    if info["tensors"]:
        table = Table(title="tensors", title_justify="left")
        table.add_column("name")
        table.add_column("shape", justify="right")
        table.add_column("dtype")
        for row in info["tensors"][:_MAX_ROWS]:
            shape = "(" + ", ".join(map(str, row["shape"])) + ")"
            table.add_row(cell(row["name"], 120), cell(shape), cell(row["dtype"]))
        if len(info["tensors"]) > _MAX_ROWS:
            table.add_row(cell(f"... and {len(info['tensors']) - _MAX_ROWS:,} more (--format json lists them all)"))
        console.print(table)
    return 0


def _epoch_text(training: Mapping[str, Any]) -> str:
    epoch, total = training["epoch"], training["epochs"]
    if epoch is None:
        return "-"
    of = f" of {total}" if total else ""
    if not training["epoch_finished"]:
        return f"{epoch}{of}, in progress ({training['batches_done']:,} batches done)"
    if epoch == 0:
        return f"0{of} (no epoch finished yet)"
    return f"{epoch}{of}, finished" + (" (stopped early)" if training["stopped_early"] else "")


def _metric_text(value: Any) -> str:
    if isinstance(value, int):
        return f"{value:,}"
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return f"{value:.3e}"
    return f"{value:.4f}"


def _metrics_lines(training: Mapping[str, Any]) -> list[str]:
    """The logged metrics, one line per finished epoch (the last ones when there are many)."""
    rows = training["metrics"]
    shown = rows[-_MAX_ROWS:]
    earlier = len(rows) - len(shown) + training.get("metrics_left_out", 0)
    left_out = f" (the last {len(shown):,} epochs; {earlier:,} earlier ones left out)" if earlier else ""
    lines = [f"logged metrics{left_out}"]
    for row in shown:
        where = [f"step {row['step']:,}"] if isinstance(row.get("step"), int) else []
        if row.get("seconds") is not None:
            where.append(f"{row['seconds']:.1f} s")
        values = []
        for name, value in row.items():
            if name in ("epoch", "step", "seconds"):
                continue
            values.append(f"{name} {value:.1e}" if name == "lr" else f"{name} {_metric_text(value)}")
        at = f" ({', '.join(where)})" if where else ""
        lines.append(f"  epoch {row.get('epoch', '?')}{at}: {', '.join(values) or '-'}")
    return lines


# -- convert -------------------------------------------------------------------------------------------------


def _convert(args: argparse.Namespace) -> int:
    import torch

    from trainwise.checkpoint.io import atomic_torch_save, check_file, safe_load
    from trainwise.checkpoint.weights import (
        find_weights,
        safetensors_bytes,
        strip_wrapper_prefixes,
        unloadable_tensor,
    )
    from trainwise.errors import DiskWriteError, TrainwiseError
    from trainwise.files import atomic_write_bytes

    source, target = Path(args.input), Path(args.output)
    check_file(source)
    suffix = target.suffix.lower()
    if suffix != ".safetensors" and suffix not in WEIGHT_SUFFIXES:
        raise TrainwiseError(
            f"OUT must end in .safetensors or {', '.join(WEIGHT_SUFFIXES)} to choose the format, got {target.name!r}."
        )
    if target.is_dir():
        raise TrainwiseError(f"OUT {target} is a directory; give a file name inside it.")
    if target.exists() and not args.force:
        raise TrainwiseError(f"OUT {target} already exists; pass --force to replace it, or choose another name.")
    if not target.parent.is_dir():
        raise TrainwiseError(f"folder {target.parent} does not exist; create it first.")
    content = safe_load(source)
    found = find_weights(content)
    if found is None:
        raise TrainwiseError(f"{source} holds no model weights to convert (no state dict of tensors found in it).")
    where, weights = found
    tensors = {k: v for k, v in weights.items() if isinstance(v, torch.Tensor)}
    for key, value in tensors.items():  # sparse tensors are refused by safetensors_bytes, kept in a .pt file
        if value.is_meta or suffix == ".safetensors":
            problem = unloadable_tensor(key, value)
            if problem:
                raise TrainwiseError(f"{source}: {problem}")
    lightning = isinstance(content, Mapping) and "pytorch-lightning_version" in content
    stripped: list[str] = []
    if not args.keep_prefixes:
        tensors, stripped = strip_wrapper_prefixes(tensors, lightning=lightning)
    try:
        if suffix == ".safetensors":
            atomic_write_bytes(target, safetensors_bytes(tensors))
        else:
            atomic_torch_save({k: v.detach().cpu() for k, v in tensors.items()}, target)
    except DiskWriteError:
        raise
    except OSError as exc:
        raise TrainwiseError(
            f"could not write {target} ({exc.strerror or exc}); check the folder's permissions."
        ) from None
    dropped = len(weights) - len(tensors)
    note = f"removed prefix {' '.join(repr(p) for p in stripped)}" if stripped else "no wrapper prefix"
    extra = f"; dropped {dropped} non-tensor entries" if dropped else ""
    origin = f"{source}{where}" if where != "the top level" else str(source)
    print(f"wrote {target}: {len(tensors)} tensors from {origin}, {note}{extra}")
    return 0
