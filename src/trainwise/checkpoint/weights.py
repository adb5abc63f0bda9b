"""Load model weights from any common checkpoint layout, and say exactly what happened.

``load_weights(model, source)`` finds the weights in a raw state dict or under the usual keys
(``state_dict``, ``model_state_dict``, ``model``, ``module``, trainwise's ``state``, nested), reads
``.safetensors`` files and ``save_pretrained`` folders (one file, or shards with their index JSON), and
removes or adds a prefix (``module.`` from DataParallel/DDP, ``_orig_mod.`` from ``torch.compile``, a Lightning
module's ``model.`` attribute, a transformers model's ``base_model_prefix`` such as ``bert.``) only when that
makes more keys match. A peft adapter file (keys without the adapter name, as peft saves them) loads into the
peft model's active adapter. It returns a :class:`LoadReport`; with ``strict=True`` any missing, unexpected or
mis-shaped key raises :class:`WeightsMismatchError` (whose message is the report's table) and nothing is
loaded, with ``strict=False`` the matching keys load and one warning line says how many did not.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import warnings
from collections.abc import Mapping
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import torch

from trainwise.checkpoint.io import (
    atomic_torch_save,
    check_file,
    printable,
    safe_load,
)
from trainwise.errors import TrainwiseError
from trainwise.files import atomic_write_bytes

# Where checkpoints commonly keep the weights, searched in this order (and nested up to a few levels).
WEIGHT_KEYS = ("state_dict", "model_state_dict", "model", "module", "state", "weights", "net", "network")
# Prefixes that wrappers add to every key: DataParallel/DDP, torch.compile, a Lightning module's attribute.
WRAPPER_PREFIXES = ("module.", "_orig_mod.", "model.")
# What a save_pretrained folder holds, read in this order (transformers' names; a single file before shards,
# safetensors before pickles), and what peft's save_pretrained writes for an adapter.
MODEL_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_model.bin")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
_MAX_INDEX_BYTES = 64 * 1024 * 1024  # a shard index of a 1000-layer model is a few MB
_MAX_ROWS = 20  # per kind of problem in the report's table


class WeightsMismatchError(TrainwiseError):
    """``load_weights(strict=True)`` found missing, unexpected or mis-shaped keys; ``.report`` has them all."""

    def __init__(self, report: LoadReport) -> None:
        super().__init__(str(report))
        self.report = report


@dataclasses.dataclass
class LoadReport:
    """What :func:`load_weights` did: where it found the weights, prefixes changed, and every mismatch."""

    source: str
    found_at: str  # e.g. "['state_dict']" or "the top level"
    prefix_changes: list[str]  # e.g. ["removed 'module.'"]
    loaded: list[str]  # model keys that received a tensor
    missing: list[str]  # model keys the checkpoint did not provide
    unexpected: list[str]  # checkpoint keys (as stored) the model has no place for
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]]  # (model key, checkpoint shape, model shape)
    adapter: str | None = None  # the peft adapter an adapter file loaded into (then missing counts its keys only)
    kept: list[str] = dataclasses.field(default_factory=list)  # base model keys an adapter file does not hold
    strict: bool = True  # the mode it was made in (a strict=False report never suggests strict=False)

    @property
    def ok(self) -> bool:
        """True when every model key loaded and every checkpoint key was used."""
        return not (self.missing or self.unexpected or self.mismatched)

    @property
    def not_loaded(self) -> int:
        """Model keys that kept their previous values (missing or mis-shaped)."""
        return len(self.missing) + len(self.mismatched)

    @property
    def fits(self) -> bool:
        """Whether the keys that match are most of the model: at least half of its keys or of its weights'
        elements (an adapter load: of the adapter's). Only then does a strict error suggest ``strict=False``."""
        expected = [*self.loaded, *self.missing, *(key for key, _, _ in self.mismatched)]
        if not self.loaded:
            return False
        if 2 * len(self.loaded) >= len(expected):
            return True

        def size(keys: list[str]) -> int:
            return sum(math.prod(self._model_shapes.get(key, ())) for key in keys)

        return 2 * size(self.loaded) >= size(expected)

    def summary(self) -> str:
        total = len(self.loaded) + self.not_loaded
        parts = []
        if self.missing:
            parts.append(f"{len(self.missing)} missing")
        if self.mismatched:
            parts.append(f"{len(self.mismatched)} with a different shape")
        what = "model keys" if self.adapter is None else f"keys of adapter {printable(self.adapter, 60)!r}"
        text = f"{self.not_loaded} of {total} {what} did not load"
        if parts:
            text += f" ({', '.join(parts)})"
        if self.unexpected:
            n = len(self.unexpected)
            text += f" and {n} checkpoint key{' was' if n == 1 else 's were'} unexpected"
        return text

    def advice(self) -> str:
        """The one thing to do about a load that was not ok ("" when it was): ``strict=False`` only when that
        would load most of the model (see :attr:`fits`), otherwise why the checkpoint does not fit."""
        if self.ok:
            return ""
        if self.fits:
            if self.strict:
                return "pass strict=False to load the keys that match"
            return "the keys that match loaded and the others kept their values"
        total = len(self.loaded) + self.not_loaded
        return self._hint or (
            f"only {len(self.loaded)} of {total} keys match, so the checkpoint is for another kind of model: "
            "compare its keys with the model's in the report's table"
        )

    def to_dict(self) -> dict[str, Any]:
        data = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        for name in [name for name in data if name.startswith("_")]:
            data.pop(name)
        data["mismatched"] = [
            {"key": k, "checkpoint_shape": list(a), "model_shape": list(b)} for k, a, b in self.mismatched
        ]
        data["ok"] = self.ok
        return data

    def __str__(self) -> str:
        head = f"load_weights from {self.source}: {self.summary()}"
        if self.ok and self.adapter is not None:
            head = (
                f"load_weights from {self.source}: all {len(self.loaded)} tensors of adapter "
                f"{printable(self.adapter, 60)!r} loaded ({len(self.kept)} base model keys are not in an adapter "
                "file and kept their values)"
            )
        elif self.ok:
            head = f"load_weights from {self.source}: all {len(self.loaded)} model keys loaded"
        lines = [head + ("." if self.ok else f"; {self.advice()}.")]
        lines.append(f"  weights found at {self.found_at}")
        for change in self.prefix_changes:
            lines.append(f"  prefix: {printable(change, 120)}")
        rows: list[tuple[str, str, str, str]] = []
        rows += _limited([("missing", _key(k), "-", _shape_of(k, self._model_shapes)) for k in self.missing])
        rows += _limited([("unexpected", _key(k), _shape_of(k, self._source_shapes), "-") for k in self.unexpected])
        rows += _limited([("shape", _key(k), _fmt(a), _fmt(b)) for k, a, b in self.mismatched])
        if rows:
            header = ("problem", "key", "checkpoint", "model")
            widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
            for row in [header, *rows]:
                lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        return "\n".join(lines)

    # shapes for the table, filled by load_weights (not part of the dataclass fields)
    _model_shapes: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict, repr=False)
    _source_shapes: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict, repr=False)
    _hint: str = dataclasses.field(default="", repr=False)  # why a checkpoint that barely matches does not fit


def _limited(rows: list[tuple[str, str, str, str]]) -> list[tuple[str, str, str, str]]:
    if len(rows) <= _MAX_ROWS:
        return rows
    return [*rows[:_MAX_ROWS], (rows[0][0], f"... and {len(rows) - _MAX_ROWS} more", "", "")]


def _key(key: str) -> str:
    """A checkpoint key as shown in a message: control characters escaped, at most 120 characters."""
    return printable(key, 120)


def _shape_of(key: str, shapes: dict[str, tuple[int, ...]]) -> str:
    return _fmt(shapes[key]) if key in shapes else "?"


def _fmt(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


# -- finding the weights -------------------------------------------------------------------------------------


def is_state_dict(obj: Any) -> bool:
    """A non-empty mapping of string keys to tensors (``_extra_state`` entries may hold anything)."""
    if not isinstance(obj, Mapping) or not obj:
        return False
    tensors = 0
    for key, value in obj.items():
        if not isinstance(key, str):
            return False
        if isinstance(value, torch.Tensor):
            tensors += 1
        elif not key.endswith("_extra_state"):
            return False
    return tensors > 0


def find_weights(obj: Any, *, depth: int = 4) -> tuple[str, Mapping[str, Any]] | None:
    """``(where, state_dict)`` for the model weights inside a loaded checkpoint, or None if there are none."""
    if is_state_dict(obj):
        return "the top level", obj
    found = _search(obj, [], depth)
    if found is None:
        return None
    path, weights = found
    return "".join(f"[{key!r}]" for key in path), weights


def _search(obj: Any, path: list[str], depth: int) -> tuple[list[str], Mapping[str, Any]] | None:
    if not isinstance(obj, Mapping) or depth <= 0:
        return None
    for key in WEIGHT_KEYS:
        if key in obj:
            value = obj[key]
            if is_state_dict(value):
                return [*path, key], value
            found = _search(value, [*path, key], depth - 1)
            if found is not None:
                return found
    return None


def shared_prefixes(keys: list[str], *, max_depth: int = 3) -> list[str]:
    """Prefixes of whole dotted components that every key starts with, shortest first (``""`` included)."""
    prefixes = [""]
    if not keys:
        return prefixes
    split = [key.split(".") for key in keys]
    for depth in range(1, max_depth + 1):
        first = split[0][:depth]
        if len(split[0]) <= depth or not all(len(p) > depth and p[:depth] == first for p in split):
            break
        prefixes.append(".".join(first) + ".")
    return prefixes


def wrapper_prefixes(keys: list[str]) -> list[str]:
    """The chain of wrapper prefixes (``module.``, ``_orig_mod.``, ``model.``) that every key starts with."""
    found: list[str] = []
    rest = list(keys)
    while rest:
        for prefix in WRAPPER_PREFIXES:
            if all(key.startswith(prefix) and len(key) > len(prefix) for key in rest):
                found.append(prefix)
                rest = [key[len(prefix):] for key in rest]
                break
        else:
            break
    return found


def strip_wrapper_prefixes(weights: Mapping[str, Any], *, lightning: bool = False) -> tuple[dict[str, Any], list[str]]:
    """Remove ``module.``/``_orig_mod.`` (and with ``lightning=True`` ``model.``) shared by every key."""
    allowed = WRAPPER_PREFIXES if lightning else ("module.", "_orig_mod.")
    stripped: list[str] = []
    keys = list(weights)
    while keys:
        prefix = next((p for p in allowed if all(k.startswith(p) and len(k) > len(p) for k in keys)), None)
        if prefix is None:
            break
        stripped.append(prefix)
        keys = [k[len(prefix):] for k in keys]
    cut = sum(map(len, stripped))
    return {key[cut:]: value for key, value in weights.items()}, stripped


def _candidate_source_prefixes(keys: list[str], base_prefix: str = "") -> list[str]:
    candidates = shared_prefixes(keys)
    for prefix in (*WRAPPER_PREFIXES, base_prefix):  # also strip a prefix that only some keys carry
        if prefix and prefix not in candidates and any(k.startswith(prefix) for k in keys):
            candidates.append(prefix)
    chain = "".join(wrapper_prefixes(keys))
    if chain and chain not in candidates:
        candidates.append(chain)
    if base_prefix:  # a wrapper around a task model: "module." + "bert."
        for prefix in list(candidates):
            joined = prefix + base_prefix
            if prefix and joined not in candidates and any(k.startswith(joined) for k in keys):
                candidates.append(joined)
    return candidates


def _candidate_target_prefixes(keys: list[str], base_prefix: str = "") -> list[str]:
    candidates = shared_prefixes(keys)
    if base_prefix:  # a bare base model's file into its task model: only the base model's keys carry "bert."
        for prefix in list(candidates):
            if prefix + base_prefix not in candidates and any(k.startswith(prefix + base_prefix) for k in keys):
                candidates.append(prefix + base_prefix)
    return candidates


def _match(
    source_keys: list[str], target_keys: set[str], *, base_prefix: str = ""
) -> tuple[dict[str, str], list[str]]:
    """Map checkpoint keys to model keys, changing prefixes only when that matches strictly more keys."""
    best: tuple[int, int] | None = None
    best_pair = ("", "")
    target_list = sorted(target_keys)
    for drop in _candidate_source_prefixes(source_keys, base_prefix):
        for add in _candidate_target_prefixes(target_list, base_prefix):
            mapped = {(add + key[len(drop):]) if key.startswith(drop) else key for key in source_keys}
            score = (len(mapped & target_keys), -(len(drop) + len(add)))
            if best is None or score > best:
                best, best_pair = score, (drop, add)
    drop, add = best_pair
    mapping = {key: (add + key[len(drop):]) if key.startswith(drop) else key for key in source_keys}
    changes = []
    if drop:
        changes.append(f"removed {drop!r}")
    if add:
        changes.append(f"added {add!r}")
    return mapping, changes


def base_model_prefix(model: torch.nn.Module) -> str:
    """``"bert."`` for a transformers model whose base model is ``model.bert`` (its ``base_model_prefix``), or ""."""
    from trainwise.wrappers import unwrap_model

    try:
        prefix = getattr(unwrap_model(model), "base_model_prefix", "")
    except Exception:  # a __getattr__ that raises something other than AttributeError
        return ""
    if isinstance(prefix, str) and prefix and all(part.isidentifier() for part in prefix.split(".")):
        return prefix + "."
    return ""


# -- peft adapters -------------------------------------------------------------------------------------------


def active_adapter(model: torch.nn.Module) -> str | None:
    """The name of the one active peft adapter of ``model`` (a ``PeftModel``, or a transformers model with an
    adapter added), found by its attributes so that peft is never imported; None for any other model."""
    from trainwise.wrappers import unwrap_model

    core = unwrap_model(model)
    try:
        config = getattr(core, "peft_config", None)
        if not isinstance(config, Mapping) or not config:
            return None
        active = getattr(core, "active_adapters", None) or getattr(core, "active_adapter", None)
        if callable(active):
            active = active()
    except Exception:  # a property that raises (peft refuses some calls with several adapters active)
        return None
    if isinstance(active, (list, tuple)) and len(active) == 1:
        active = active[0]
    return active if isinstance(active, str) and active in config else None


def _without_adapter_name(key: str, adapter: str) -> str:
    """A model key as peft saves it: ``q_proj.lora_A.default.weight`` -> ``q_proj.lora_A.weight`` (the adapter
    name removed where it is the last or the second to last component, as peft's own rule does)."""
    if key.endswith("." + adapter):
        return key[: -len(adapter) - 1]
    head, _, last = key.rpartition(".")
    if head.endswith("." + adapter):
        return f"{head[: -len(adapter) - 1]}.{last}"
    return key


def adapter_keys(model: torch.nn.Module, target: Mapping[str, Any], adapter: str) -> dict[str, str]:
    """``{key as peft saves it: model key}`` for every tensor of ``adapter`` in a peft model.

    As peft's ``get_peft_model_state_dict``/``set_peft_model_state_dict`` do: the tensors of its tuner layers
    (each layer's ``adapter_layer_names``, its ``base_layer`` excluded) with the adapter name removed, and the
    modules that ``modules_to_save`` copies, through their own ``adapter_state_dict_load_map``.
    """
    aliases: dict[str, str] = {}
    tuners: set[str] = set()
    auxiliary: list[str] = []
    for name, module in model.named_modules():
        load_map = getattr(type(module), "adapter_state_dict_load_map", None)
        if callable(load_map):
            auxiliary.append(name + ".")
            try:
                saved = module.adapter_state_dict_load_map(adapter)
            except Exception:
                continue
            for key, stored in saved.items() if isinstance(saved, Mapping) else ():
                if f"{name}.{stored}" in target and f"{name}.{key}" not in target:
                    aliases[f"{name}.{key}"] = f"{name}.{stored}"
            continue
        names = getattr(type(module), "adapter_layer_names", None)
        if isinstance(names, tuple):
            tuners.update(f"{name}.{attr}" if name else attr for attr in names if isinstance(attr, str))
    for key in target:
        parts = key.split(".")
        if not any(".".join(parts[:i]) in tuners for i in range(1, len(parts))):
            continue
        if any(key.startswith(prefix) for prefix in auxiliary):  # a tuner inside a copied module: peft skips it
            continue
        alias = _without_adapter_name(key, adapter)
        if alias != key and alias not in target:
            aliases[alias] = key
    return aliases


def _looks_like_adapter(keys: list[str]) -> bool:
    return any(part.startswith("lora_") for key in keys[:10_000] for part in key.split("."))


# -- reading files and folders -------------------------------------------------------------------------------


def read_weights(path: str | os.PathLike[str], *, adapter: bool = False) -> tuple[str, Any]:
    """``(name, contents)`` of a weights file, a shard index (``*.index.json``) or a ``save_pretrained`` folder.

    A folder is read through the first of :data:`MODEL_FILES` it holds (with ``adapter=True``, a peft
    adapter's :data:`ADAPTER_FILES` first). Every file is read with :func:`~trainwise.checkpoint.safe_load`.
    """
    path = Path(path)
    try:
        is_folder = path.is_dir()
    except OSError:  # a folder on the way that may not be searched: safe_load says so in one sentence
        is_folder = False
    if is_folder:
        path = _weights_in_folder(path, adapter=adapter)
    if path.name.endswith(".index.json"):
        return read_sharded(path)
    return str(path), safe_load(path)


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError as exc:
        raise TrainwiseError(f"{path} could not be read ({exc.strerror or exc}); check its permissions.") from None


def _weights_in_folder(folder: Path, *, adapter: bool) -> Path:
    order = (*ADAPTER_FILES, *MODEL_FILES) if adapter else MODEL_FILES
    for name in order:
        if _is_file(folder / name):
            return folder / name
    adapters = [name for name in ADAPTER_FILES if _is_file(folder / name)]
    if adapters:
        raise TrainwiseError(
            f"{folder} holds a peft adapter ({adapters[0]}) and no model weights; load it into the peft model it "
            "was trained with, e.g. load_weights(peft.get_peft_model(model, LoraConfig(...)), folder)."
        )
    others: list[str] = []
    try:
        with os.scandir(folder) as entries:
            for count, entry in enumerate(entries):
                if count >= 10_000 or len(others) >= 3:
                    break
                if entry.name.lower().endswith(_WEIGHT_SUFFIXES):
                    others.append(printable(entry.name, 80))
    except OSError as exc:
        raise TrainwiseError(f"{folder} could not be read ({exc.strerror or exc}); check its permissions.") from None
    looked = ", ".join(order)
    if others:
        raise TrainwiseError(
            f"{folder} is a folder without {looked}; pass one of its files instead, e.g. {str(folder / others[0])!r}."
        )
    raise TrainwiseError(
        f"{folder} is a folder without model weights (none of {looked}); pass the folder save_pretrained wrote, "
        "or a weights file."
    )


def _is_file_name(name: str) -> bool:
    """A plain file name in the index's own folder: no folder part, no ``..``, no drive, no NUL."""
    return (
        bool(name) and name not in (".", "..") and "\x00" not in name
        and PurePosixPath(name).name == name and PureWindowsPath(name).name == name
    )


def read_sharded(index: str | os.PathLike[str]) -> tuple[str, dict[str, Any]]:
    """The tensors of a sharded checkpoint: the index JSON's ``weight_map`` names each tensor's shard file.

    The index may be hostile: a shard must be a plain file name inside the index's folder (``../x`` and
    absolute paths are refused), every listed shard must exist and hold the tensors listed for it, and no
    tensor may come from two shards. Nothing is read from any shard until the whole index has been checked.
    """
    index = Path(index)
    folder, shards = _checked_shards(index)
    weights: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for shard, keys in shards.items():
        loaded = safe_load(folder / shard)
        if not is_state_dict(loaded):
            raise TrainwiseError(
                f"{folder / printable(shard, 120)} (a shard listed in {index.name}) is not a state dict of "
                "tensors; use the folder as save_pretrained wrote it."
            )
        lost = [key for key in keys if key not in loaded]
        if lost:
            raise TrainwiseError(
                f"{index} puts {_key(lost[0])!r} in {printable(shard, 120)!r}, which does not hold it; the index "
                "and the shards do not belong together, so use the folder as save_pretrained wrote it."
            )
        for key, value in loaded.items():
            if key in weights:
                raise TrainwiseError(
                    f"{_key(key)!r} is in two shards of {index} ({printable(origin[key], 120)!r} and "
                    f"{printable(shard, 120)!r}), so which one to load is unknown; use the folder as "
                    "save_pretrained wrote it."
                )
            weights[key], origin[key] = value, shard
    return f"{index} ({len(shards)} shard{'' if len(shards) == 1 else 's'})", weights


def weight_files(path: str | os.PathLike[str]) -> list[Path]:
    """The files :func:`read_weights` reads for ``path``: the file itself, the one a ``save_pretrained`` folder
    holds, or the shards a shard index lists (checked as :func:`read_sharded` checks them, nothing loaded)."""
    path = Path(path)
    try:
        is_folder = path.is_dir()
    except OSError:
        is_folder = False
    if is_folder:
        path = _weights_in_folder(path, adapter=False)
    if path.name.endswith(".index.json"):
        folder, shards = _checked_shards(path)
        return [folder / shard for shard in shards]
    return [check_file(path)]


def _checked_shards(index: Path) -> tuple[Path, dict[str, list[str]]]:
    """The folder of a shard index and its shards (file name -> tensor names), every name and file checked."""
    index = check_file(index)
    folder = index.parent
    try:
        size = index.stat().st_size
        if size > _MAX_INDEX_BYTES:
            raise TrainwiseError(
                f"{index} is {size:,} bytes, too large for a shard index; use the index that came with the model."
            )
        data = json.loads(index.read_bytes())
    except OSError as exc:
        raise TrainwiseError(f"{index} could not be read ({exc.strerror or exc}); check its permissions.") from None
    except (ValueError, RecursionError):
        raise TrainwiseError(
            f"{index} is not valid JSON, so the shards it lists are unknown; use the index that came with the model."
        ) from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if (
        not isinstance(weight_map, dict) or not weight_map
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items())
    ):
        raise TrainwiseError(
            f"{index} has no weight_map of tensor names to shard files, so it is not a shard index; use the "
            "index that came with the model."
        )
    shards: dict[str, list[str]] = {}
    for key, shard in weight_map.items():
        if not _is_file_name(shard):
            raise TrainwiseError(
                f"{index} lists the shard {printable(shard, 120)!r} for {_key(key)!r}, which is not a file in the "
                "index's folder, so nothing was read; use the index that came with the model."
            )
        shards.setdefault(shard, []).append(key)
    absent = [shard for shard in shards if not _is_file(folder / shard)]
    if absent:
        more = f" and {len(absent) - 1} more" if len(absent) > 1 else ""
        raise TrainwiseError(
            f"{index} lists the shard {printable(absent[0], 120)!r}{more}, which {folder} does not hold; the "
            "folder is incomplete, so copy or download the missing shards."
        )
    return folder, shards


# -- loading and saving --------------------------------------------------------------------------------------


def load_weights(model: torch.nn.Module, source: Any, *, strict: bool = True) -> LoadReport:
    """Load weights into ``model`` from a path (torch, ``.safetensors``, a shard index or a ``save_pretrained``
    folder), a checkpoint dict or a state dict.

    Files are read with ``weights_only=True`` (see :func:`trainwise.checkpoint.safe_load`). Wrapper prefixes
    and the model's ``base_model_prefix`` are removed or added only when that makes more keys match. A peft
    adapter (the active adapter's tensors, with or without its name in the keys, and not most of the base
    model's) loads into a peft model's active adapter; its missing base weights are not a mismatch.
    ``strict=True``: any mismatch raises :class:`WeightsMismatchError` with the report as a table, and the model
    is left untouched. ``strict=False``: the matching, same-shaped tensors load; a warning line counts the rest.
    """
    if not isinstance(model, torch.nn.Module):
        raise TrainwiseError(f"load_weights needs a torch.nn.Module to load into, got {type(model).__name__}.")
    adapter = active_adapter(model)
    if isinstance(source, (str, os.PathLike)):
        name, loaded = read_weights(source, adapter=adapter is not None)
    elif isinstance(source, torch.nn.Module):
        name, loaded = f"a {type(source).__name__} module", source.state_dict()
    elif isinstance(source, Mapping):
        name, loaded = "the given mapping", source
    else:
        raise TrainwiseError(
            "load_weights takes a file path, a state dict, a checkpoint dict or a save_pretrained folder, got "
            f"{type(source).__name__}."
        )
    found = find_weights(loaded)
    if found is None:
        top = list(loaded)[:8] if isinstance(loaded, Mapping) else []
        keys = [printable(k if isinstance(k, str) else f"<{type(k).__name__} key>", 60) for k in top]
        raise TrainwiseError(
            f"no model weights found in {name} (top-level keys: {', '.join(map(repr, keys)) or 'none'}); pass the "
            "state dict itself, e.g. load_weights(model, checkpoint['my_key'])."
        )
    where, weights = found
    target = model.state_dict()
    aliases = adapter_keys(model, target, adapter) if adapter is not None else {}
    mapping, changes = _match(list(weights), set(target) | set(aliases), base_prefix=base_model_prefix(model))
    mapping = {key: mapped if mapped in target else aliases.get(mapped, mapped) for key, mapped in mapping.items()}
    to_load: dict[str, Any] = {}
    unexpected: list[str] = []
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []
    for key, value in weights.items():
        model_key = mapping[key]
        if model_key not in target:
            unexpected.append(key)
            continue
        expected = target[model_key]
        if isinstance(value, torch.Tensor) and isinstance(expected, torch.Tensor) and value.shape != expected.shape:
            mismatched.append((model_key, tuple(value.shape), tuple(expected.shape)))
            continue
        problem = unloadable_tensor(key, value, expected)
        if problem:
            raise TrainwiseError(f"{name}: {problem}")
        to_load[model_key] = value
    shaped = {m[0] for m in mismatched}
    provided = set(to_load) | shaped
    own = set(aliases.values())
    base = [key for key in target if key not in own]
    is_adapter_load = bool(own & provided) and 2 * sum(key in provided for key in base) < len(base)
    missing = [key for key in target if key not in provided and (key in own or not is_adapter_load)]
    report = LoadReport(
        source=name,
        found_at=where,
        prefix_changes=changes,
        loaded=sorted(to_load),
        missing=missing,
        unexpected=unexpected,
        mismatched=mismatched,
        adapter=adapter if is_adapter_load else None,
        kept=[key for key in base if key not in provided] if is_adapter_load else [],
        strict=strict,
    )
    report._model_shapes = {k: tuple(v.shape) for k, v in target.items() if isinstance(v, torch.Tensor)}
    report._source_shapes = {k: tuple(v.shape) for k, v in weights.items() if isinstance(v, torch.Tensor)}
    adapter_file = not report.ok and adapter is None and _looks_like_adapter(list(weights))
    if adapter_file and not _looks_like_adapter(list(target)):
        report._hint = (
            "the checkpoint holds peft adapter weights (lora_ keys), so load it into the peft model it was "
            "trained with, e.g. load_weights(peft.get_peft_model(model, LoraConfig(...)), path)"
        )
    if strict and not report.ok:
        raise WeightsMismatchError(report)
    if to_load:
        try:
            model.load_state_dict(to_load, strict=False)  # noqa: TW302 (the report above already compared the keys)
        except RuntimeError as exc:  # a dtype or layout torch cannot copy (checked above where we can)
            detail = printable(" ".join(str(exc).split()), 300)
            raise TrainwiseError(
                f"{name}: torch could not copy the weights into the model ({detail}); some tensors may have "
                "loaded, so load a checkpoint saved from this kind of model."
            ) from None
    if not report.ok:
        warnings.warn(
            f"load_weights: {report.summary()}; "
            f"{report.advice() if not report.fits else 'see the returned LoadReport'}.",
            UserWarning,
            stacklevel=2,
        )
    return report


def unloadable_tensor(key: str, value: Any, expected: Any = None) -> str | None:
    """Why ``value`` (stored under ``key``) cannot become a model's weight, or None: a meta tensor has no data,
    a sparse tensor cannot be copied into a dense parameter (nor stored in safetensors)."""
    if not isinstance(value, torch.Tensor):
        return None
    shown = repr(_key(key))
    if value.is_meta:
        return (
            f"{shown} is a meta tensor, which has no data (it was saved from a model that was never "
            "materialised); save the weights after they are created or loaded, and load that file."
        )
    if value.layout != torch.strided and not (isinstance(expected, torch.Tensor) and expected.layout == value.layout):
        layout = str(value.layout).removeprefix("torch.")
        kind = f"a sparse tensor ({layout})" if "sparse" in layout else f"a tensor of layout {layout}"
        return (
            f"{shown} is {kind}, which a dense weight cannot take and safetensors cannot store; convert it first "
            f"with weights[{shown}] = weights[{shown}].to_dense()."
        )
    return None


def weights_of(model_or_weights: Any) -> dict[str, torch.Tensor]:
    """A clean CPU state dict: a module's (unwrapped), or a mapping's with wrapper prefixes removed."""
    from trainwise.wrappers import unwrap_model

    if isinstance(model_or_weights, torch.nn.Module):
        return dict(unwrap_model(model_or_weights).state_dict())
    if is_state_dict(model_or_weights):
        weights, _ = strip_wrapper_prefixes(model_or_weights)
        return weights
    raise TrainwiseError(
        f"expected a torch.nn.Module or a state dict of tensors, got {type(model_or_weights).__name__}."
    )


def save_weights(model_or_weights: Any, path: str | os.PathLike[str]) -> Path:
    """Save a model's weights (unwrapped, no prefixes) atomically as ``.safetensors`` or a torch state dict.

    The format follows the suffix: ``.safetensors`` needs the optional ``safetensors`` package; anything
    else (``.pt``, ``.pth``, ``.bin``) is a plain ``torch.save`` of the state dict.
    """
    path = Path(path)
    weights = {k: v for k, v in weights_of(model_or_weights).items() if isinstance(v, torch.Tensor)}
    if path.suffix == ".safetensors":
        return atomic_write_bytes(path, safetensors_bytes(weights))
    return atomic_torch_save({k: v.detach().cpu() for k, v in weights.items()}, path)


def safetensors_bytes(weights: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> bytes:
    """Serialise tensors to safetensors bytes; tensors that share memory (tied weights) are copied apart."""
    from trainwise._version import __version__
    from trainwise.checkpoint.io import _safetensors_torch

    st = _safetensors_torch()
    seen: set[tuple[int, int]] = set()
    plain: dict[str, torch.Tensor] = {}
    for key, value in weights.items():
        problem = unloadable_tensor(key, value)
        if problem:
            raise TrainwiseError(problem)
        tensor = value.detach().cpu().contiguous()
        storage = (tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes())
        if storage in seen or tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
            tensor = tensor.clone()
        seen.add((tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes()))
        plain[key] = tensor
    meta = {"format": "pt", "writer": f"trainwise {__version__}", **(dict(metadata) if metadata else {})}
    try:
        return st.save(plain, metadata=meta)
    except Exception as exc:  # a dtype safetensors has no code for, a non-string key...
        raise TrainwiseError(
            f"the weights could not be written as safetensors ({printable(str(exc).strip(), 200)}); write a .pt "
            "file instead, or convert those tensors to a plain dtype first."
        ) from None


__all__ = [
    "ADAPTER_FILES",
    "MODEL_FILES",
    "LoadReport",
    "WeightsMismatchError",
    "active_adapter",
    "adapter_keys",
    "base_model_prefix",
    "find_weights",
    "is_state_dict",
    "load_weights",
    "read_sharded",
    "read_weights",
    "safetensors_bytes",
    "save_weights",
    "shared_prefixes",
    "strip_wrapper_prefixes",
    "unloadable_tensor",
    "weights_of",
    "wrapper_prefixes",
]
