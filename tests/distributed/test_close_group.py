"""Closing a process group trainwise made: a DDP wrapper it made that is still alive, if only in a reference cycle,
is collected before the group goes (one alive into interpreter exit aborts gloo); with none alive, no full
collection (0.4 s with a big heap) is paid."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.distributed as dist
from torch import nn

from trainwise.distributed import DistributedInfo, close_distributed, wrap_ddp


@pytest.fixture
def group(tmp_path, monkeypatch):
    """A one-process gloo group, as ``init_distributed`` makes one (``created=True``); destroy_process_group
    records whether a DDP wrapper of the test was still alive when it ran."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    seen: dict[str, object] = {"alive at destroy": None, "wrapper": lambda: None}
    real_destroy = dist.destroy_process_group

    def destroy(*args, **kwargs):
        seen["alive at destroy"] = seen["wrapper"]() is not None
        return real_destroy(*args, **kwargs)

    monkeypatch.setattr(dist, "destroy_process_group", destroy)
    yield seen
    if dist.is_initialized():
        real_destroy()


class _Cycle:
    def __init__(self, wrapper: nn.Module) -> None:
        self.wrapper, self.me = wrapper, self


def test_a_wrapper_held_only_by_a_cycle_is_collected_before_the_group_goes(group):
    wrapper = wrap_ddp(nn.Linear(4, 2), torch.device("cpu"))
    group["wrapper"] = weakref.ref(wrapper)
    _Cycle(wrapper)  # unreachable now, and alive until a collection
    del wrapper
    assert group["wrapper"]() is not None
    close_distributed(DistributedInfo(0, 1, 0, created=True))
    assert group["alive at destroy"] is False and not dist.is_initialized()


def test_no_full_collection_when_no_wrapper_is_alive(group, monkeypatch):
    wrapper = wrap_ddp(nn.Linear(4, 2), torch.device("cpu"))
    wrapper(torch.randn(3, 4)).sum().backward()
    del wrapper  # what the Trainer does before it closes the group: nothing holds it any more
    collections = []
    real = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *args: collections.append(args) or real(*args))
    close_distributed(DistributedInfo(0, 1, 0, created=True))
    assert collections == [] and not dist.is_initialized()
