"""Load model weights from any common checkpoint layout, and say exactly what happened.

``load_weights(model, source)`` finds the weights in a raw state dict or under the usual keys
(``state_dict``, ``model_state_dict``, ``model``, ``module``, trainwise's ``state``, nested), reads
``.safetensors`` files, and removes or adds a wrapper prefix (``module.`` from DataParallel/DDP,
``_orig_mod.`` from ``torch.compile``, a Lightning module's ``model.`` attribute) only when that makes more
keys match. It returns a :class:`LoadReport`; with ``strict=True`` any missing, unexpected or mis-shaped key
raises :class:`WeightsMismatchError` (whose message is the report's table) and nothing is loaded, with
``strict=False`` the matching keys load and one warning line says how many did not.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from trainwise.checkpoint.io import (
    SAFETENSORS,
    atomic_torch_save,
    atomic_write_bytes,
    detect_format,
    printable,
    safe_load,
)
from trainwise.errors import TrainwiseError

# Where checkpoints commonly keep the weights, searched in this order (and nested up to a few levels).
WEIGHT_KEYS = ("state_dict", "model_state_dict", "model", "module", "state", "weights", "net", "network")
# Prefixes that wrappers add to every key: DataParallel/DDP, torch.compile, a Lightning module's attribute.
WRAPPER_PREFIXES = ("module.", "_orig_mod.", "model.")
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

    @property
    def ok(self) -> bool:
        """True when every model key loaded and every checkpoint key was used."""
        return not (self.missing or self.unexpected or self.mismatched)

    @property
    def not_loaded(self) -> int:
        """Model keys that kept their previous values (missing or mis-shaped)."""
        return len(self.missing) + len(self.mismatched)

    def summary(self) -> str:
        total = len(self.loaded) + self.not_loaded
        parts = []
        if self.missing:
            parts.append(f"{len(self.missing)} missing")
        if self.mismatched:
            parts.append(f"{len(self.mismatched)} with a different shape")
        text = f"{self.not_loaded} of {total} model keys did not load"
        if parts:
            text += f" ({', '.join(parts)})"
        if self.unexpected:
            n = len(self.unexpected)
            text += f" and {n} checkpoint key{' was' if n == 1 else 's were'} unexpected"
        return text

    def to_dict(self) -> dict[str, Any]:
        data = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        data.pop("_model_shapes")
        data.pop("_source_shapes")
        data["mismatched"] = [
            {"key": k, "checkpoint_shape": list(a), "model_shape": list(b)} for k, a, b in self.mismatched
        ]
        data["ok"] = self.ok
        return data

    def __str__(self) -> str:
        head = f"load_weights from {self.source}: {self.summary()}"
        if self.ok:
            head = f"load_weights from {self.source}: all {len(self.loaded)} model keys loaded"
        lines = [head + ("." if self.ok else "; pass strict=False to load the keys that match.")]
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


def _candidate_source_prefixes(keys: list[str]) -> list[str]:
    candidates = shared_prefixes(keys)
    for prefix in WRAPPER_PREFIXES:  # also strip a wrapper prefix that only some keys carry
        if prefix not in candidates and any(k.startswith(prefix) for k in keys):
            candidates.append(prefix)
    chain = "".join(wrapper_prefixes(keys))
    if chain and chain not in candidates:
        candidates.append(chain)
    return candidates


def _match(
    source_keys: list[str], target_keys: set[str]
) -> tuple[dict[str, str], list[str]]:
    """Map checkpoint keys to model keys, changing prefixes only when that matches strictly more keys."""
    best: tuple[int, int] | None = None
    best_pair = ("", "")
    target_list = sorted(target_keys)
    for drop in _candidate_source_prefixes(source_keys):
        for add in shared_prefixes(target_list):
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


# -- loading and saving --------------------------------------------------------------------------------------


def load_weights(model: torch.nn.Module, source: Any, *, strict: bool = True) -> LoadReport:
    """Load weights into ``model`` from a path (torch or ``.safetensors``), a checkpoint dict or a state dict.

    Files are read with ``weights_only=True`` (see :func:`trainwise.checkpoint.safe_load`). Wrapper prefixes
    are removed or added only when that makes more keys match. ``strict=True``: any mismatch raises
    :class:`WeightsMismatchError` with the report as a table, and the model is left untouched.
    ``strict=False``: the matching, same-shaped tensors load; a warning line counts the rest.
    """
    if not isinstance(model, torch.nn.Module):
        raise TrainwiseError(f"load_weights needs a torch.nn.Module to load into, got {type(model).__name__}.")
    if isinstance(source, (str, os.PathLike)):
        name = str(source)
        loaded = safe_load(source)
    elif isinstance(source, torch.nn.Module):
        name, loaded = f"a {type(source).__name__} module", source.state_dict()
    elif isinstance(source, Mapping):
        name, loaded = "the given mapping", source
    else:
        raise TrainwiseError(
            f"load_weights takes a file path, a state dict or a checkpoint dict, got {type(source).__name__}."
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
    mapping, changes = _match(list(weights), set(target))
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
    missing = [key for key in target if key not in to_load and key not in {m[0] for m in mismatched}]
    report = LoadReport(
        source=name,
        found_at=where,
        prefix_changes=changes,
        loaded=sorted(to_load),
        missing=missing,
        unexpected=unexpected,
        mismatched=mismatched,
    )
    report._model_shapes = {k: tuple(v.shape) for k, v in target.items() if isinstance(v, torch.Tensor)}
    report._source_shapes = {k: tuple(v.shape) for k, v in weights.items() if isinstance(v, torch.Tensor)}
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
        warnings.warn(f"load_weights: {report.summary()}; see the returned LoadReport.", UserWarning, stacklevel=2)
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
    from trainwise import __version__
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


def is_safetensors(path: str | os.PathLike[str]) -> bool:
    return detect_format(path) == SAFETENSORS


__all__ = [
    "LoadReport",
    "WeightsMismatchError",
    "find_weights",
    "is_state_dict",
    "load_weights",
    "safetensors_bytes",
    "save_weights",
    "shared_prefixes",
    "strip_wrapper_prefixes",
    "unloadable_tensor",
    "weights_of",
    "wrapper_prefixes",
]
