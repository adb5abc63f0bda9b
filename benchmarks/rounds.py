"""What the benchmark scripts share: interleaved rounds of fresh processes and the median-and-spread summary.

Each round runs every side once, in an order shuffled by a seeded generator, so that a slow minute of a shared
machine falls on all sides alike; the ratios are taken round by round.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any


def summary(values: list[float]) -> dict[str, float]:
    """Median, extremes and spread ((max - min) / median) of one figure over the rounds."""
    median = statistics.median(values)
    return {"median": median, "min": min(values), "max": max(values),
            "spread": (max(values) - min(values)) / median if median else float("nan")}


def interleaved(sides: list[str], repeats: int, seed: int, run: Callable[[str], dict[str, Any]], *,
                quiet: bool) -> tuple[dict[str, list[dict[str, Any]]], list[float], float]:
    """``run(side)`` for every side in each of ``repeats`` rounds, shuffled per round: the results by side, the
    1-minute load average before and after, and the seconds it all took."""
    order = random.Random(seed)
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    load = [os.getloadavg()[0]] if hasattr(os, "getloadavg") else []
    started = time.perf_counter()
    for repeat in range(repeats):
        group = list(sides)
        order.shuffle(group)
        for side in group:
            runs[side].append(run(side))
        if not quiet:
            done = time.perf_counter() - started
            print(f"  round {repeat + 1}/{repeats} done ({done:.0f} s)", file=sys.stderr, flush=True)
    if load:
        load.append(os.getloadavg()[0])
    return runs, load, time.perf_counter() - started


def child_result(command: list[str], *, threads: int, mark: str, label: str) -> dict[str, Any]:
    """Run one measured side in a fresh process limited to ``threads`` and return the JSON it printed after
    ``mark`` (its last such line, among whatever the side itself prints); a failed child ends the benchmark."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    results = [line for line in done.stdout.splitlines() if line.startswith(mark)]
    if done.returncode != 0 or not results:
        raise SystemExit(f"child {label} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(results[-1][len(mark):])
