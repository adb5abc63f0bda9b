"""Seeding and determinism: one call seeds every RNG, deterministic kernels, the global RNG states for
checkpoints (seeded loaders, whose workers repeat bit for bit: :mod:`trainwise.data.seeding`)."""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from trainwise.errors import TrainwiseError

_MAX_SEED = 2**32 - 1


def seed_everything(seed: int, *, deterministic: bool = False) -> int:
    """Seed Python, NumPy and torch (CPU and every CUDA device); optionally make kernels deterministic.

    ``deterministic=True`` also calls ``torch.use_deterministic_algorithms(True)``, turns cuDNN benchmarking
    off and cuDNN determinism on, and sets ``CUBLAS_WORKSPACE_CONFIG`` (needed by deterministic cuBLAS).
    ``deterministic=False`` leaves those switches as they are. Returns the seed so that it can be logged.
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= _MAX_SEED:
        raise TrainwiseError(f"seed must be an integer between 0 and {_MAX_SEED}, got {seed!r}.")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    os.environ["PYTHONHASHSEED"] = str(seed)  # inherited by spawned worker processes
    if deterministic:
        set_deterministic(True)
    return seed


def set_deterministic(enabled: bool) -> None:
    """Switch deterministic kernels on or off (torch, cuDNN, cuBLAS workspace)."""
    if enabled:
        # cuBLAS reads this when its handle is created; setting it before the first matmul is enough.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(enabled)
    torch.backends.cudnn.deterministic = enabled
    if enabled:
        torch.backends.cudnn.benchmark = False  # autotuning may pick a different kernel each run


@contextlib.contextmanager
def determinism_restored() -> Iterator[None]:
    """Put torch's and cuDNN's determinism switches (and ``CUBLAS_WORKSPACE_CONFIG``) back as they were on exit
    (``deterministic=True`` in one ``fit`` holds for that fit only)."""
    algorithms = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    cudnn = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    workspace = os.environ.get("CUBLAS_WORKSPACE_CONFIG")  # set_deterministic(True) sets it when it is unset
    try:
        yield
    finally:
        if workspace is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = workspace
        # only when changed: torch.use_deterministic_algorithms imports torch._inductor (about a second)
        if (torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled()) != algorithms:
            torch.use_deterministic_algorithms(algorithms[0], warn_only=algorithms[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn


def get_rng_state() -> dict[str, Any]:
    """Every global RNG state (Python, NumPy, torch CPU and CUDA), for checkpoints."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`get_rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
