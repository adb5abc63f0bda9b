"""``trainwise lab``: each fundamental as a small experiment that measures the wrong way and the right way side
by side on real tensors, models and loaders, in seconds on a CPU (docs/labs.md).

A lab measures, it does not assert: :func:`run_lab` returns the figures it measured, one or two sentences that
read them, and ``shown``, whether the effect the fundamental predicts is there (the tests require it, so a lab
can never silently stop demonstrating its point). One module per lab; :data:`LAB_MODULES` lists them in the
order of the fundamentals.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainwise.errors import TrainwiseError

LAB_MODULES = (
    "from_numpy", "recompiles", "unregistered", "eval_mode", "accuracy", "frozen_norm",
    "accumulation", "strict_false", "kept_graph", "seeded_workers", "export_mode", "fp16_underflow",
)


@dataclasses.dataclass(frozen=True)
class Lab:
    """One experiment: its name on the command line, the fundamental (1-12) and the codes it relates to."""

    name: str
    fundamental: int
    title: str
    codes: tuple[str, ...]
    measure: Callable[[], LabResult]
    plot: Callable[[LabResult, Path], Path] | None = None  # draws the result into a folder (matplotlib)


@dataclasses.dataclass
class LabResult:
    """What a lab measured: ``figures`` (numbers, by name), ``reading`` (sentences built from them) and
    ``shown`` (the fundamental's effect is there: the wrong way is off, the right way within tolerance)."""

    figures: dict[str, Any]
    reading: str
    shown: bool
    series: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # for a plot, not printed
    seconds: float = 0.0


def all_labs() -> list[Lab]:
    return [importlib.import_module(f"trainwise.labs.{module}").LAB for module in LAB_MODULES]


def find_lab(name: str) -> Lab:
    labs = {lab.name: lab for lab in all_labs()}
    if name not in labs:
        import difflib

        close = difflib.get_close_matches(name, labs, n=1)
        hint = f"did you mean {close[0]}?" if close else "run trainwise lab to list them."
        raise TrainwiseError(f"no lab named {name!r}; {hint}")
    return labs[name]


def lab_for_code(code: str) -> Lab | None:
    """The lab that demonstrates a doctor or guard code, if any (for ``--explain`` and the guards' messages)."""
    for lab in all_labs():
        if code in lab.codes:
            return lab
    return None


def run_lab(lab: Lab) -> LabResult:
    """Run one lab with torch's RNG restored afterwards (labs seed themselves)."""
    import torch

    state, threads = torch.random.get_rng_state(), torch.get_num_threads()
    torch.set_num_threads(1)  # small models: one thread is faster, and steadier on a busy machine
    started = time.perf_counter()
    try:
        result = lab.measure()
    finally:
        torch.random.set_rng_state(state)
        torch.set_num_threads(threads)
    result.seconds = time.perf_counter() - started
    return result


def save_figure(figure: Any, path: Path) -> Path:
    """Write a matplotlib ``Figure`` (made without pyplot) as a PNG atomically: a failed write leaves an older
    picture intact."""
    from trainwise.files import atomic_write

    return atomic_write(path, lambda file: figure.savefig(file, format="png", dpi=100))


def format_figure(value: Any) -> str:
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.3e}"
        return f"{value:.4f}"
    return str(value)
