"""The whole suite's environment: each test gets the process as the previous one left it clean, and a test that
changes the process for the next ones (an environment variable, a determinism switch, the thread count) fails
(as Fabric's suite does). Random number generators are only put back: tests draw from them on purpose."""

from __future__ import annotations

import gc
import os
import random

import numpy as np
import pytest
import torch

# Variables a test may change (put back after it without failing it): pytest's own; PYTHONHASHSEED, which
# seed_everything sets on purpose so that spawned worker processes hash as the parent does; and what torch sets
# for itself when its compiler is first used (torch._inductor: by torch.compile, by
# torch.use_deterministic_algorithms); and what lightning.fabric sets once, when it is first imported (by whichever
# test imports it first, so only a run of some tests alone would fail that test).
_ALLOWED_TO_CHANGE = frozenset({"PYTEST_CURRENT_TEST", "PYTHONHASHSEED", "PYTORCH_NVML_BASED_CUDA_CHECK"})
_TORCH_OWN = ("TORCHINDUCTOR_", "_TORCHINDUCTOR_", "TRITON_")


def _switches() -> dict[str, object]:
    return {
        "torch.use_deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "torch.backends.cudnn.deterministic": torch.backends.cudnn.deterministic,
        "torch.backends.cudnn.benchmark": torch.backends.cudnn.benchmark,
        "torch.get_num_threads": torch.get_num_threads(),
        "torch.get_default_dtype": torch.get_default_dtype(),
        "torch.is_grad_enabled": torch.is_grad_enabled(),
    }


@pytest.fixture(autouse=True)
def _process_left_as_found(request):
    environment = dict(os.environ)
    switches = _switches()
    rng = torch.random.get_rng_state(), np.random.get_state(), random.getstate()
    yield
    torch.random.set_rng_state(rng[0])
    np.random.set_state(rng[1])
    random.setstate(rng[2])
    now = dict(os.environ)
    changed_env = sorted(k for k in set(environment) | set(now)
                         if environment.get(k) != now.get(k) and k not in _ALLOWED_TO_CHANGE
                         and not k.startswith(_TORCH_OWN))
    changed_switches = {k: (v, switches[k]) for k, v in _switches().items() if v != switches[k]}
    # put everything back first, so that one leak does not fail every test after it
    for key in set(environment) | set(now):
        if environment.get(key) == now.get(key) or key == "PYTEST_CURRENT_TEST" or key.startswith(_TORCH_OWN):
            continue  # pytest's and torch's own, which they set for themselves
        if key in environment:
            os.environ[key] = environment[key]
        else:
            os.environ.pop(key, None)
    torch.use_deterministic_algorithms(switches["torch.use_deterministic_algorithms"])
    torch.backends.cudnn.deterministic = switches["torch.backends.cudnn.deterministic"]
    torch.backends.cudnn.benchmark = switches["torch.backends.cudnn.benchmark"]
    torch.set_num_threads(switches["torch.get_num_threads"])
    torch.set_default_dtype(switches["torch.get_default_dtype"])
    torch.set_grad_enabled(switches["torch.is_grad_enabled"])
    leaks = [f"os.environ[{k!r}]: {environment.get(k)!r} -> {now.get(k)!r}" for k in changed_env]
    leaks += [f"{k}: {before!r} -> {after!r}" for k, (after, before) in changed_switches.items()]
    if leaks:
        pytest.fail(f"{request.node.nodeid} changed the process for the tests after it: {'; '.join(leaks)} "
                    "(use monkeypatch, or put it back)", pytrace=False)



def _freeze_what_lives() -> None:
    """Move every object alive now out of the collector's reach (garbage first, so nothing dead is kept)."""
    gc.collect()
    gc.freeze()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection built (every test module, torch, transformers): otherwise each collection walks
    those millions of objects again, in every test that ends in one (trainwise calls gc.collect() after an
    out-of-memory window and before a process group goes): seconds each, in a whole-suite run only."""
    _freeze_what_lives()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """A test that called gc.unfreeze() (one freezes around its own fit) gave back everything: freeze again."""
    if gc.get_freeze_count() == 0:
        _freeze_what_lives()
