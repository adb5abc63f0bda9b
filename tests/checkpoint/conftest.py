"""Fixtures for the checkpoint tests (helpers live in ckpt_helpers.py, importable by name)."""

from __future__ import annotations

import pytest
import torch
from ckpt_helpers import Net


@pytest.fixture
def net() -> Net:
    torch.manual_seed(0)
    return Net()
