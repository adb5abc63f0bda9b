"""Whether a checkpoint can be continued exactly by a run configured as this one.

A checkpoint records the run that wrote it (its options and facts: processes, data size, accumulation,
optimizer, model shapes). A resume compares them with the new run. A change that breaks exact continuation
is refused in one sentence naming each change; ``resume_mismatch="allow"`` continues anyway and logs the
changes. Options that only steer the rest of the run (more epochs, logging, progress) apply silently.

| option or fact | on resume |
|---|---|
| batch_size, effective_batch, accumulation_steps, window | refused: the saved position counts old-size batches |
| seed, world_size, train_samples, train_batches | refused: a different order or shard, so samples skipped or repeated |
| train_data (a hash of the first and last training samples) | refused: other data of the same size |
| loss_fn (its module.qualname; a lambda's also by its code) | refused: the loss would change mid-run |
| count, loss_reduction, ignore_index, precision | refused: the loss or the gradient scaler would change mid-run |
| lr, weight_decay, lr_by_pattern | refused; with allow, not applied: the optimizer's saved values continue |
| optimizer, scheduler (class) | refused; with allow, the new one starts fresh (its saved state is dropped) |
| unfreeze_at | refused: the optimizer's groups would not match |
| parameters (names and shapes) | refused always: the weights cannot load (use load_weights) |
| everything else (epochs, log_every, progress, ...) | applied |
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from trainwise.errors import TrainwiseError, show

# options whose change breaks exact continuation (see the table above)
REFUSED_OPTIONS = (
    "batch_size", "effective_batch", "accumulation_steps", "seed", "count", "loss_reduction", "ignore_index",
    "lr", "weight_decay", "lr_by_pattern", "unfreeze_at",
)
REFUSED_FACTS = ("world_size", "train_samples", "train_batches", "window", "precision", "optimizer", "scheduler",
                 "train_data", "loss_fn")
UNKNOWN_AS_NONE = ("train_data",)  # None: not measured (a stream, an unreadable sample), so compared on nothing
FRESH_WITH_ALLOW = {"optimizer": "optimizer", "scheduler": "scheduler", "precision": "scaler"}
FACTS_KEY = "run"


def run_facts(
    *,
    model: torch.nn.Module,
    optimizer: Any,
    scheduler: Any,
    loader: Any,
    window: int,
    precision: str,
    world_size: int,
    loss_fn: Any = None,
) -> dict[str, Any]:
    """What a checkpoint records about the run beside its options (plain values, for ``weights_only``)."""
    from trainwise.data.loaders import length
    from trainwise.wrappers import unwrap_model

    dataset = getattr(loader, "dataset", None)
    return {
        "world_size": world_size,
        "train_samples": None if dataset is None else length(dataset),
        "train_batches": length(loader),
        "window": window,
        "precision": precision,
        "optimizer": type(optimizer).__name__,
        "scheduler": None if scheduler is None else type(scheduler).__name__,
        "parameters": {name: list(p.shape) for name, p in unwrap_model(model).named_parameters()},
        "train_data": data_fingerprint(dataset),
        "loss_fn": describe_callable(loss_fn),
    }


def data_fingerprint(dataset: Any) -> str | None:
    """A hash of a map-style data set's first and last samples as it returns them (two reads, under a fixed
    seed in forked RNGs so that random transforms repeat and the run's own RNGs do not move); None for a
    stream, an empty set or a sample that cannot be read or hashed."""
    import hashlib
    import random

    from trainwise.data.loaders import length

    size = length(dataset) if dataset is not None else None
    if not size or not hasattr(dataset, "__getitem__"):
        return None
    digest = hashlib.sha256()
    state = random.getstate()
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        np = None  # type: ignore[assignment]
    np_state = np.random.get_state() if np is not None else None
    try:
        with torch.random.fork_rng(devices=[]):  # the CPU generator, restored after
            for index in sorted({0, size - 1}):
                # the CPU generator alone: torch.manual_seed would also reseed CUDA's, which fork_rng(devices=[])
                # does not restore (every run's GPU randomness would start from seed 0, whatever its seed)
                torch.default_generator.manual_seed(0)
                random.seed(0)
                if np is not None:
                    np.random.seed(0)
                _hash_into(digest, dataset[index])
    except Exception:  # a sample we cannot read again or walk: no fingerprint, never a failed run
        return None
    finally:
        random.setstate(state)
        if np is not None:
            np.random.set_state(np_state)
    return digest.hexdigest()[:16]


def _hash_into(digest: Any, value: Any, depth: int = 0) -> None:
    """Feed one sample (tensors, arrays, numbers, strings, bytes, mappings, sequences) into ``digest``."""
    if depth > 20:
        raise ValueError("sample nested too deeply")
    kind = type(value)
    digest.update(f"<{kind.__module__}.{kind.__qualname__}>".encode())
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    elif hasattr(value, "__array__") and hasattr(value, "dtype") and hasattr(value, "tobytes"):  # numpy
        digest.update(f"{value.dtype}{getattr(value, 'shape', ())}".encode() + value.tobytes())
    elif isinstance(value, (str, bytes, int, float, complex, bool)) or value is None:
        digest.update(repr(value).encode())
    elif isinstance(value, Mapping):
        for key in sorted(value, key=repr):
            digest.update(repr(key).encode())
            _hash_into(digest, value[key], depth + 1)
    elif isinstance(value, (list, tuple)):
        digest.update(str(len(value)).encode())
        for item in value:
            _hash_into(digest, item, depth + 1)
    elif hasattr(value, "__dataclass_fields__"):
        for name in value.__dataclass_fields__:
            _hash_into(digest, getattr(value, name), depth + 1)
    # anything else (an image object, a custom class) counts by its type only: repr may hold an address


def describe_callable(function: Any) -> str | None:
    """``module.qualname`` of a loss function or of a loss object's class; a lambda adds a hash of its code
    (not its line, so edits elsewhere in the file do not count); None for the default loss."""
    import functools
    import hashlib

    if function is None:
        return None
    if isinstance(function, functools.partial):
        return f"functools.partial({describe_callable(function.func)})"
    target = function if hasattr(function, "__qualname__") else type(function)
    name = f"{getattr(target, '__module__', None) or ''}.{getattr(target, '__qualname__', type(target).__name__)}"
    code = getattr(function, "__code__", None)
    if code is not None and "<lambda>" in name:
        consts = [c for c in code.co_consts if not hasattr(c, "co_code")]  # a nested code object's repr has an id
        body = code.co_code + repr((consts, code.co_names)).encode()
        name += f" #{hashlib.sha256(body).hexdigest()[:8]}"
    return name.lstrip(".")


def resume_changes(saved: Mapping[str, Any] | None, options: Mapping[str, Any], facts: Mapping[str, Any]) -> dict[
        str, tuple[Any, Any]]:
    """``{key: (old, new)}`` for every refused option or fact that differs between a checkpoint's recorded
    run (``meta["config"]``) and this one; an old checkpoint that recorded nothing is compared on nothing."""
    if not isinstance(saved, Mapping):
        return {}
    changes: dict[str, tuple[Any, Any]] = {}
    for key in REFUSED_OPTIONS:
        if key in saved and _plain(saved[key]) != _plain(options.get(key)):
            changes[key] = (saved[key], options.get(key))
    old_facts = saved.get(FACTS_KEY)
    if isinstance(old_facts, Mapping):
        for key in REFUSED_FACTS:
            if key in UNKNOWN_AS_NONE and (old_facts.get(key) is None or facts.get(key) is None):
                continue
            if key in old_facts and old_facts[key] != facts.get(key):
                changes[key] = (old_facts[key], facts.get(key))
        old, new = old_facts.get("parameters"), facts.get("parameters")
        if isinstance(old, Mapping) and isinstance(new, Mapping) and dict(old) != dict(new):
            changes["parameters"] = (_shapes_differ(old, new), _most_still_fit(old, new))
    return changes


def check_resume(changes: Mapping[str, tuple[Any, Any]], *, mismatch: str, checkpoint: Any) -> list[str]:
    """Raise one sentence for ``changes`` unless ``mismatch="allow"``; returns the entries of the saved state
    to leave unrestored (an optimizer, scheduler or scaler that the new run replaces)."""
    if not changes:
        return []
    if "parameters" in changes:
        differences, fits = changes["parameters"]
        if fits is False:  # the weights that fit would be almost nothing: never suggest loading them
            raise TrainwiseError(
                f"the model does not match {checkpoint}: {differences}, so it shares less than half of its "
                "parameters with the one that wrote it; resume with that model, or start a new run_dir."
            )
        raise TrainwiseError(
            f"the model does not match {checkpoint}: {differences}; resume with the model that "
            "wrote it, or start a new run from the weights that fit with trainwise.load_weights(model, path, "
            "strict=False)."
        )
    listed = "; ".join(f"{key} {show(old, 40)} -> {show(new, 40)}" for key, (old, new) in changes.items())
    if mismatch != "allow":
        raise TrainwiseError(
            f"this run differs from the one that wrote {checkpoint} ({listed}), so it cannot continue it exactly; "
            "restore those options, or pass resume_mismatch='allow' to continue anyway (logged), or start a new "
            "run_dir."
        )
    return [FRESH_WITH_ALLOW[key] for key in changes if key in FRESH_WITH_ALLOW]


def describe(changes: Mapping[str, tuple[Any, Any]]) -> str:
    """The log line for changes continued with ``resume_mismatch="allow"``."""
    kept = [k for k in changes if k in ("lr", "weight_decay", "lr_by_pattern")]
    note = f" ({', '.join(kept)}: the optimizer's saved values continue)" if kept else ""
    listed = "; ".join(f"{key} {show(old, 40)} -> {show(new, 40)}" for key, (old, new) in changes.items())
    return f"resumed a run that differs from the checkpoint's, not exactly: {listed}{note}."


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _most_still_fit(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether the new model's parameters that keep their name and shape are at least half of it, by count or
    by elements (as ``LoadReport.fits``): only then is loading the weights that fit worth suggesting."""
    def size(shape: Any) -> int:
        try:
            return math.prod(int(n) for n in shape)
        except (TypeError, ValueError):
            return 0

    same = [k for k in new if k in old and old[k] == new[k]]
    if 2 * len(same) >= len(new):
        return True
    return 2 * sum(size(new[k]) for k in same) >= sum(size(v) for v in new.values())


def _shapes_differ(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    missing = [k for k in old if k not in new]
    added = [k for k in new if k not in old]
    reshaped = [k for k in old if k in new and list(old[k]) != list(new[k])]
    parts = []
    if reshaped:
        first = reshaped[0]
        parts.append(f"{len(reshaped)} parameter(s) changed shape ({first} {tuple(old[first])} -> {tuple(new[first])})")
    if missing:
        parts.append(f"{len(missing)} missing ({missing[0]}...)" if len(missing) > 1 else f"{missing[0]} missing")
    if added:
        parts.append(f"{len(added)} new ({added[0]}...)" if len(added) > 1 else f"{added[0]} new")
    return ", ".join(parts)
