"""``trainwise fit CONFIG.toml``: placeholder registration, implemented in the next step."""

from __future__ import annotations

from typing import Any


def register(sub: Any) -> None:
    pass
