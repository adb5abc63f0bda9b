"""The run folder: a JSON-lines log of every logged metric, flushed line by line so a kill keeps it."""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from pathlib import Path
from typing import Any


def default_run_dir(root: str | os.PathLike[str] = "runs") -> Path:
    """``runs/YYYYmmdd-HHMMSS`` (with a suffix if that folder already exists)."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path(root) / stamp
    suffix = 1
    while path.exists():
        suffix += 1
        path = Path(root) / f"{stamp}-{suffix}"
    return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep them readable
    return value


class RunLog:
    """Append-only ``metrics.jsonl``; each record is written and flushed immediately."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self._file = self.path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps({k: _jsonable(v) for k, v in record.items()}, sort_keys=False)
        self._file.write(line + "\n")
        self._file.flush()

    def write_json(self, name: str, payload: dict[str, Any]) -> Path:
        """Write a small JSON file in the run folder atomically (temp file, then rename)."""
        from trainwise.checkpoint.io import atomic_write_json

        return atomic_write_json(self.run_dir / name, payload, sort_keys=False)

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def read_log(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read back a ``metrics.jsonl`` file (a run folder or the file itself)."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            records.append(json.loads(line))
    return records
