"""What the framework adapters share: the guards' findings counted per code, as the metrics a logger takes."""

from __future__ import annotations

import collections
from collections.abc import Iterable

from trainwise.guards.core import Guard

PREFIX = "trainwise/"  # the metrics are named trainwise/TW102, trainwise/TW108...


class FindingCounts:
    """The findings of one or more guards, counted per code (one per code and place, as the guard reports
    them), and which of those counts a logger has not been sent yet."""

    def __init__(self, guards: Iterable[Guard] = ()) -> None:
        self.guards = list(guards)
        self._sent: dict[str, float] = {}

    def metrics(self) -> dict[str, float]:
        """``{"trainwise/TW108": 1.0, ...}``: the places found so far per code; empty while nothing is found."""
        counts = collections.Counter(f.code for guard in self.guards for f in guard.findings)
        return {f"{PREFIX}{code}": float(n) for code, n in sorted(counts.items())}

    def unsent(self) -> dict[str, float]:
        """The metrics whose count changed since the last call to ``sent``."""
        return {name: n for name, n in self.metrics().items() if self._sent.get(name) != n}

    def sent(self, metrics: dict[str, float]) -> None:
        """Note ``metrics`` as logged."""
        self._sent.update(metrics)
