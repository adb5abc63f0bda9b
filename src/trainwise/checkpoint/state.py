"""The full training state: captured from live objects, saved atomically, restored in place.

As Lightning Fabric does, a checkpoint is described by a dict of the live objects::

    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "loader": loader, "epoch": 3}
    save_checkpoint("ckpt.pt", state, config=config)          # at an optimizer-step boundary
    extra = load_checkpoint("ckpt.pt", state)                 # restores every object in place

Anything with ``state_dict()``/``load_state_dict()`` (optimizers, schedulers, ``GradScaler``, the
``GradientAccumulator``, a :class:`~trainwise.data.ResumableLoader`, early stopping, metrics)
is saved through those methods; a model is always saved from the unwrapped module (no ``module.`` or
``_orig_mod.`` prefix); plain values (epoch, step) are saved as they are and written back into the dict.
Every global RNG (Python, NumPy, torch CPU and CUDA) is saved with the state and restored by default, so
dropout and augmentations continue exactly when the checkpoint was taken at a step boundary.
"""

from __future__ import annotations

import collections
import os
import platform
import time
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainwise._version import __version__
from trainwise.checkpoint.io import safe_load
from trainwise.errors import TrainwiseError, printable, show
from trainwise.files import PendingWrite, write_temporary
from trainwise.seeding import get_rng_state, set_rng_state
from trainwise.wrappers import unwrap_model

FORMAT_KEY = "trainwise_checkpoint"
FORMAT_VERSION = 1


def capture_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """Plain, ``weights_only``-loadable values for every entry of ``state`` (objects through ``state_dict()``)."""
    if not isinstance(state, Mapping):
        raise TrainwiseError(f"the checkpoint state must be a dict of name -> object, got {type(state).__name__}.")
    captured: dict[str, Any] = {}
    for name, value in state.items():
        if not isinstance(name, str):
            raise TrainwiseError(f"checkpoint state keys must be strings, got {name!r}.")
        if isinstance(value, torch.nn.Module):
            captured[name] = unwrap_model(value).state_dict()
        elif _is_stateful(value):
            if not callable(getattr(value, "load_state_dict", None)):
                raise TrainwiseError(
                    f"state[{name!r}] ({type(value).__name__}) has state_dict() but no load_state_dict(), so it "
                    "could not be resumed; add load_state_dict or save its values instead."
                )
            captured[name] = value.state_dict()
        else:
            captured[name] = value
    return captured


def restore_state(
    state: MutableMapping[str, Any], saved: Mapping[str, Any], *, strict: bool = True
) -> dict[str, Any]:
    """Load ``saved`` (what :func:`capture_state` returned) into the live objects of ``state``, in place.

    Modules load strictly through :func:`~trainwise.checkpoint.weights.load_weights` (a mismatch raises its
    table); stateful objects through ``load_state_dict``; plain values replace the entries of ``state``.
    Returns the saved entries that ``state`` has no key for. With ``strict=True`` a key of ``state`` that the
    checkpoint lacks is an error.
    """
    from trainwise.checkpoint.weights import load_weights

    saved = _folded_groups(state, saved)
    missing = [name for name in state if name not in saved]
    if missing and strict:
        raise TrainwiseError(
            f"the checkpoint has no {', '.join(map(repr, missing))} (it has {', '.join(map(repr, saved))}); "
            "remove those entries from the state or pass strict=False."
        )
    for name, target in list(state.items()):
        if name not in saved:
            continue
        value = saved[name]
        if isinstance(target, torch.nn.Module):
            load_weights(unwrap_model(target), value, strict=True)
        elif _is_stateful(target):
            try:
                target.load_state_dict(value)
            except TrainwiseError:
                raise
            except (KeyError, IndexError, TypeError, ValueError, AttributeError, RuntimeError) as exc:
                raise TrainwiseError(
                    f"the checkpoint's {name!r} entry does not fit this {type(target).__name__} "
                    f"({type(exc).__name__}: {printable(exc, 160)}); resume from a checkpoint of the same setup."
                ) from None
        else:
            state[name] = value
    return {name: value for name, value in saved.items() if name not in state}


def _folded_groups(state: Mapping[str, Any], saved: Mapping[str, Any]) -> Mapping[str, Any]:
    """``saved`` with each optimizer's state regrouped as its live optimizer's folded groups, and its schedulers'
    per-group lists with it (a checkpoint of a trainwise that did not fold the no-decay groups of an optimizer
    without weight decay, :func:`trainwise.freezing.fold_equal_groups`)."""
    from trainwise.freezing import saved_groups_like
    from trainwise.schedulers import fold_schedule_state

    folds: dict[int, tuple[list[int], int]] = {}
    changed = dict(saved)
    for name, target in state.items():
        if isinstance(target, torch.optim.Optimizer) and name in saved:
            changed[name], kept = saved_groups_like(saved[name], target)
            if kept is not None:
                folds[id(target)] = (kept, len(saved[name]["param_groups"]))
    if not folds:
        return saved
    for name, target in state.items():
        fold = folds.get(id(getattr(target, "optimizer", None)))
        if fold is not None and name in saved and not isinstance(target, torch.optim.Optimizer):
            changed[name] = fold_schedule_state(saved[name], *fold)
    return changed


def save_checkpoint(
    path: str | os.PathLike[str],
    state: Mapping[str, Any],
    *,
    config: Mapping[str, Any] | None = None,
    rng: bool = True,
    meta: Mapping[str, Any] | None = None,
) -> Path:
    """Save the full training state to ``path`` atomically; it loads back with ``weights_only=True``.

    ``config`` (plain values) and the trainwise, torch and Python versions are stored beside the state;
    ``rng=True`` stores every global RNG state. Call it at an optimizer-step boundary. An entry that
    ``weights_only`` loading would refuse (a NumPy array, a custom object) is refused here, at save time.
    """
    return write_checkpoint_temporary(path, state, config=config, rng=rng, meta=meta).commit()


def write_checkpoint_temporary(
    path: str | os.PathLike[str],
    state: Mapping[str, Any],
    *,
    config: Mapping[str, Any] | None = None,
    rng: bool = True,
    meta: Mapping[str, Any] | None = None,
) -> PendingWrite:
    """:func:`save_checkpoint` up to its commit: the state serialised now (a snapshot of this moment) into a
    temporary file beside ``path``; ``commit()`` (fsync and rename) may then run on another thread."""
    import torch

    checkpoint = {
        FORMAT_KEY: FORMAT_VERSION,
        "meta": {
            "trainwise": __version__,
            "torch": str(torch.__version__),
            "python": platform.python_version(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "config": dict(config) if config is not None else None,
            **(dict(meta) if meta else {}),
        },
        "state": capture_state(state),
        "rng": encode_rng_state(get_rng_state()) if rng else None,
    }

    def write(file: Any) -> None:
        try:
            torch.save(checkpoint, file)
        except OSError:  # a full disk, a lost mount: not the state's fault
            raise
        except Exception as exc:  # pickling a lambda, a lock, an open file...
            written = _os_error_in(exc)
            if written is not None:  # torch's writer reports a failed file.write as a RuntimeError
                raise written from None
            raise TrainwiseError(
                f"the checkpoint state could not be serialised ({exc}); keep only tensors, numbers, strings, "
                "lists and dicts in it."
            ) from None
        file.flush()
        bad = [] if _only_plain_values(checkpoint) else _unsafe_globals_in(file.name)
        if bad:
            raise TrainwiseError(
                f"the checkpoint state holds {', '.join(bad[:3])}, which weights_only loading refuses; convert "
                "it to tensors or plain Python values before saving."
            )

    return write_temporary(path, write)


def _os_error_in(exc: BaseException) -> OSError | None:
    """The OSError (a full disk...) behind ``exc``, following its cause and context, or None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


_PLAIN_SCALARS = (str, int, float, bool, type(None), bytes, torch.dtype, torch.Size)


def _only_plain_values(value: Any, depth: int = 0) -> bool:
    """True when ``value`` holds only dicts, lists, tuples, plain scalars and ordinary dense tensors, all of which
    ``weights_only`` loading accepts: then the saved file need not be read back for its globals (about a
    millisecond a save). Anything else (or nesting deeper than 64) says False, and the file is checked."""
    if depth > 64:
        return False
    kind = type(value)
    if kind in _PLAIN_SCALARS:
        return True
    if kind is dict or kind is collections.OrderedDict:
        return all(type(k) in _PLAIN_SCALARS and _only_plain_values(v, depth + 1) for k, v in value.items())
    if kind is list or kind is tuple:
        return all(_only_plain_values(v, depth + 1) for v in value)
    if kind is torch.Tensor or kind is torch.nn.Parameter:
        return value.layout is torch.strided and not value.is_quantized
    return False


def _unsafe_globals_in(path: str) -> list[str]:
    return list(torch.serialization.get_unsafe_globals_in_checkpoint(path))


def load_checkpoint(
    path: str | os.PathLike[str],
    state: MutableMapping[str, Any] | None = None,
    *,
    strict: bool = True,
    rng: bool = True,
    map_location: Any = "cpu",
) -> dict[str, Any]:
    """Read a checkpoint safely and restore it into ``state`` in place (see :func:`restore_state`).

    Restores the global RNG states too when ``rng=True`` (do it last, right before training continues).
    Returns what was not restored into ``state``: the unclaimed entries plus ``"meta"`` (versions, config).
    With ``state=None`` it only reads: the whole saved state comes back, nothing is restored.
    """
    checkpoint = read_checkpoint(path, map_location=map_location)
    return restore_checkpoint(checkpoint, state, strict=strict, rng=rng)


def restore_checkpoint(
    checkpoint: Mapping[str, Any],
    state: MutableMapping[str, Any] | None = None,
    *,
    strict: bool = True,
    rng: bool = True,
) -> dict[str, Any]:
    """:func:`load_checkpoint` for a checkpoint already read with :func:`read_checkpoint`."""
    saved = checkpoint["state"]
    if state is None:
        return {**saved, "meta": checkpoint.get("meta", {}), "rng": checkpoint.get("rng")}
    rest = restore_state(state, saved, strict=strict)
    if rng and checkpoint.get("rng") is not None:
        _restore_rng(checkpoint["rng"])
    rest["meta"] = checkpoint.get("meta", {})
    return rest


def read_checkpoint(path: str | os.PathLike[str], *, map_location: Any = "cpu") -> dict[str, Any]:
    """The raw content of a trainwise checkpoint file; any other file is a one-sentence error."""
    checkpoint = safe_load(path, map_location=map_location)
    if not is_trainwise_checkpoint(checkpoint):
        raise TrainwiseError(
            f"{path} is not a trainwise training checkpoint; load model weights from it with "
            "trainwise.load_weights(model, path) instead."
        )
    version = checkpoint[FORMAT_KEY]
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise TrainwiseError(
            f"{path} is damaged: its checkpoint format is {show(version, 40)}, not a version number."
        )
    if version > FORMAT_VERSION:
        raise TrainwiseError(
            f"{path} was written by a newer trainwise (checkpoint format {version!r}, this one reads up to "
            f"{FORMAT_VERSION}); upgrade trainwise to resume from it."
        )
    return checkpoint


def _restore_rng(encoded: Any) -> None:
    """Set every global RNG from a checkpoint's ``rng`` entry, or none of them if the entry is damaged."""
    before = get_rng_state()
    try:
        if not isinstance(encoded, Mapping):
            raise TypeError(f"expected a dict, got {type(encoded).__name__}")
        set_rng_state(decode_rng_state(encoded))
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, RuntimeError) as exc:
        set_rng_state(before)
        raise TrainwiseError(
            f"the checkpoint's rng entry is damaged ({type(exc).__name__}: {printable(exc, 160)}); "
            "load it with rng=False to keep the current random state, or use an earlier checkpoint."
        ) from None


def is_trainwise_checkpoint(obj: Any) -> bool:
    return isinstance(obj, Mapping) and FORMAT_KEY in obj and isinstance(obj.get("state"), Mapping)


# -- RNG states that load with weights_only=True -------------------------------------------------------------


def encode_rng_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`trainwise.seeding.get_rng_state` output with NumPy's state as tensors (``weights_only`` refuses
    arrays)."""
    kind, keys, pos, has_gauss, cached = state["numpy"]
    encoded = dict(state)
    version, words, gauss = state["python"]
    # one tensor, not 625 pickled ints: a checkpoint is serialised several times faster
    encoded["python"] = (version, torch.tensor(words, dtype=torch.int64), gauss)
    encoded["numpy"] = {
        "kind": str(kind),
        "keys": torch.from_numpy(np.asarray(keys, dtype=np.uint32).astype(np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }
    return encoded


def decode_rng_state(encoded: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`encode_rng_state`, ready for :func:`trainwise.seeding.set_rng_state`."""
    state = dict(encoded)
    numpy_state = encoded["numpy"]
    if isinstance(numpy_state, Mapping):
        state["numpy"] = (
            numpy_state["kind"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    python_state = encoded["python"]
    if isinstance(python_state, (list, tuple)):  # tuples may come back as lists from other writers
        words = python_state[1]
        words = tuple(words.tolist()) if isinstance(words, torch.Tensor) else tuple(words)
        state["python"] = (python_state[0], words, python_state[2])
    return state


def _is_stateful(value: Any) -> bool:
    return callable(getattr(value, "state_dict", None)) and not isinstance(value, type)


__all__ = [
    "capture_state",
    "decode_rng_state",
    "encode_rng_state",
    "is_trainwise_checkpoint",
    "load_checkpoint",
    "read_checkpoint",
    "restore_checkpoint",
    "restore_state",
    "save_checkpoint",
]
