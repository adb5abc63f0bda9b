"""fp16 with accumulation wastes no steps: gradients keep the magnitude of ``loss / steps`` (issue 11, item 7).

Backpropagating ``loss * count`` made gradients ``count`` times larger than the usual ``loss / steps``, so a
GradScaler backed off (skipping windows) where the usual recipe did not. The accumulator now scales by
``count / expected`` and divides by ``total / expected`` at the step: same magnitudes, same exact result.
"""

import gc
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from trainwise import GradientAccumulator

STEPS, MICRO, WINDOWS = 4, 64, 12


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 10))


def _batches():
    g = torch.Generator().manual_seed(1)  # large inputs: confident, often wrong predictions, large gradients
    return [
        (torch.randn(MICRO, 32, generator=g) * 3, torch.randint(0, 10, (MICRO,), generator=g))
        for _ in range(STEPS * WINDOWS)
    ]


def _loss(model, x, y):
    with torch.autocast("cpu", dtype=torch.float16):
        return F.cross_entropy(model(x), y)


def _scaler():
    return torch.amp.GradScaler("cpu", init_scale=65536.0)


def _skips_by_hand(times_count):
    """A hand-written fp16 loop: ``loss / steps`` (the usual recipe), or ``loss * count`` and a division by
    the window's total count at the step (the former scheme)."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = _scaler()
    batches, skipped = _batches(), 0
    for w in range(WINDOWS):
        window = batches[w * STEPS : (w + 1) * STEPS]
        for x, y in window:
            loss = _loss(model, x, y)
            scaler.scale(loss * len(y) if times_count else loss / STEPS).backward()
        scaler.unscale_(optimizer)
        if times_count:
            for p in model.parameters():
                p.grad /= sum(len(y) for _, y in window)
        before = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        skipped += scaler.get_scale() < before
    return skipped


def _skips_trainwise(accumulator_class=GradientAccumulator):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    accumulator = accumulator_class(optimizer, steps=STEPS, scaler=_scaler())
    for x, y in _batches():
        accumulator.backward(_loss(model, x, y), count=len(y))
        if accumulator.window_full:
            accumulator.step()
    assert accumulator.windows == WINDOWS
    return accumulator.skipped_steps


def test_fp16_scaler_skips_no_more_windows_than_loss_over_steps():
    naive = _skips_by_hand(times_count=False)
    times_count = _skips_by_hand(times_count=True)  # for contrast
    assert times_count > naive  # the run is one where magnitudes matter
    assert _skips_trainwise() <= naive


def test_accumulated_gradients_have_the_magnitude_of_loss_over_steps():
    batches = _batches()[:STEPS]
    naive = _model()
    for x, y in batches:
        (F.cross_entropy(naive(x), y) / STEPS).backward()
    model = _model()
    accumulator = GradientAccumulator(torch.optim.SGD(model.parameters(), lr=0.1), steps=STEPS)
    for x, y in batches:
        accumulator.backward(F.cross_entropy(model(x), y), count=len(y))
    for got, expected in zip([p.grad for p in model.parameters()], [p.grad for p in naive.parameters()]):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-8)  # before the step's division


class _Capture(torch.optim.Optimizer):
    def __init__(self, params):
        super().__init__(params, {})
        self.captured = []

    def step(self, closure=None):
        self.captured.append([p.grad.clone() for g in self.param_groups for p in g["params"]])


def _small(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 5))


def _assert_full_batch(got, loss_fn):
    reference = _small()
    loss_fn(reference).backward()
    for a, b in zip(got, [p.grad for p in reference.parameters()], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("distributed", [False, True])  # True without a process group: the reference path
def test_fp32_exact_with_unequal_sizes_over_several_windows(distributed):
    x, y = torch.randn(60, 6), torch.randint(0, 5, (60,))
    windows = [[(0, 10), (10, 13), (13, 23)], [(23, 24), (24, 40), (40, 47)], [(47, 60)]]  # the last is short
    model = _small()
    optimizer = _Capture(model.parameters())
    accumulator = GradientAccumulator(optimizer, steps=3, distributed=distributed)
    for parts in windows:
        for start, end in parts:
            accumulator.backward(F.cross_entropy(model(x[start:end]), y[start:end]), count=end - start)
        accumulator.step()
    for parts, got in zip(windows, optimizer.captured, strict=True):
        window = slice(parts[0][0], parts[-1][1])
        _assert_full_batch(got, lambda m, w=window: F.cross_entropy(m(x[w]), y[w]))


@pytest.mark.parametrize("distributed", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_fp32_exact_with_token_counts_over_several_windows(distributed, reduction):
    inputs = torch.randn(8, 5, 6)
    targets = torch.randint(0, 5, (8, 5))
    targets[0] = -100  # the first micro-batch of the first window has no real token (a sum loss of 0)
    targets[2, 1:] = -100
    targets[5, 2:] = -100
    targets[6, :4] = -100
    windows = [[(0, 1), (1, 3)], [(3, 6), (6, 8)]]
    model = _small()
    optimizer = _Capture(model.parameters())
    accumulator = GradientAccumulator(optimizer, steps=2, distributed=distributed)
    for parts in windows:
        for start, end in parts:
            t = targets[start:end].reshape(-1)
            if reduction == "mean" and not (t != -100).any():
                continue  # a mean over no token is NaN; a loop would skip such a micro-batch
            loss = F.cross_entropy(model(inputs[start:end]).reshape(-1, 5), t, reduction=reduction)
            accumulator.backward(loss, count=(t != -100).sum(), reduction=reduction)
        accumulator.step()
    for parts, got in zip(windows, optimizer.captured, strict=True):
        w = slice(parts[0][0], parts[-1][1])
        _assert_full_batch(got, lambda m, w=w: F.cross_entropy(m(inputs[w]).reshape(-1, 5), targets[w].reshape(-1)))


# DDP: per process and window, micro-batches of different sizes; the windows' global counts differ, so the
# second window's expected count (from the first window's all-reduce) is not the first's.
SPLITS = {0: [[(0, 5), (5, 8)], [(17, 18), (18, 26)]], 1: [[(8, 10), (10, 17)], [(26, 29), (29, 30)]]}
WINDOW_SLICES = [slice(0, 17), slice(17, 30)]


def _ddp_data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(30, 6, generator=g), torch.randint(0, 5, (30,), generator=g)


def _ddp_worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        model = nn.parallel.DistributedDataParallel(_small())
        optimizer = _Capture(model.parameters())
        accumulator = GradientAccumulator(optimizer, steps=2, distributed=True)
        x, y = _ddp_data()
        for window in SPLITS[rank]:
            for index, (start, end) in enumerate(window):
                with accumulator.sync_context(model, last=index == 1):
                    accumulator.backward(F.cross_entropy(model(x[start:end]), y[start:end]), count=end - start)
            accumulator.step()
        if rank == 0:
            torch.save(optimizer.captured, out)
        # the DDP wrapper and its reducer go before the process group, and neither process leaves the group while
        # the other still talks to it: else a teardown SIGABRT ("terminate called without an active exception")
        del model, optimizer, accumulator
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ddp_unequal_counts_exact_in_every_window(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = str(tmp_path / "grads.pt")
    mp.spawn(_ddp_worker, args=(port, out), nprocs=2, join=True)
    x, y = _ddp_data()
    for window, got in zip(WINDOW_SLICES, torch.load(out), strict=True):
        _assert_full_batch(got, lambda m, w=window: F.cross_entropy(m(x[w]), y[w]))
