"""The conformance suite's environment: no test can reach the Hub, and torch's global state is restored.
The tiny models of the real libraries are in hf_models.py (a conftest module cannot be imported by name:
tests/checkpoint/ has one too).

Every test in tests/ecosystem/ imports the real ``transformers``, ``datasets``, ``peft``, ``accelerate`` or
``lightning`` (the ``ecosystem`` extra; ``dev`` includes it), never a look-alike class.
"""

from __future__ import annotations

import os

import pytest
import torch

# set before transformers or datasets are imported: no test may reach the Hub, and none needs to
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


@pytest.fixture(autouse=True)
def _restore_torch_state():
    """Leave torch's RNG, threads and determinism switches as they were."""
    rng = torch.random.get_rng_state()
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    yield
    torch.random.set_rng_state(rng)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)
