"""Per-step work of the Trainer and the guards, counted (not timed): no host synchronisation per step, and no
more than a couple of torch operations over the loop a user would write."""

from __future__ import annotations

import sys
import tempfile
import warnings

import pytest
import torch
from benchmark_scripts import load_benchmark
from torch.optim.optimizer import register_optimizer_step_post_hook

step_work = load_benchmark("step_work", register=False)
overhead = sys.modules.get("overhead") or load_benchmark("overhead", register=False)

SYNCS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")


@pytest.mark.parametrize("side", ["trainer", "trainer-off", "guard"])
def test_no_host_sync_between_log_intervals(side, monkeypatch):
    """Every way Python reads a tensor's value from trainwise's code, counted between optimizer steps 8 and 56
    of an epoch: only the log interval's reads (step 50, log_every=50) may happen there. The metrics run their
    accelerator path (on the CPU they read each step's loss and correct count, which waits for nothing)."""
    import trainwise.metrics

    monkeypatch.setattr(trainwise.metrics, "HOST_READ_DEVICES", frozenset())
    window = step_work._Window()
    reads: list[str] = []
    for name in SYNCS:
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            # reads by trainwise (torch's Adam reads its CPU step counters with .item(): never a device sync)
            if window.counting and "/trainwise/" in sys._getframe(1).f_code.co_filename.replace("\\", "/"):
                reads.append(f"{_name} at {sys._getframe(1).f_code.co_name}")
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    handle = register_optimizer_step_post_hook(window)
    try:
        with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            options = overhead.RunOptions(epochs=1, batch_size=64, seed=0, log_every=50, folder=folder)
            runner = overhead.RUNNERS["minimal" if side == "guard" else side]
            if side == "guard":  # the guard in a loop that itself reads no value per step
                runner = _guarded_loop
            runner(overhead._model("small", 0), overhead._data("small", 0), options, overhead.Stopwatch())
    finally:
        handle.remove()
    window_steps = step_work.LAST - step_work.FIRST
    assert len(reads) <= 3, f"{side} read tensor values {len(reads)} times in {window_steps} steps: {reads}"


def _guarded_loop(model, dataset, options, watch):
    import trainwise

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(dataset, batch_size=options.batch_size)
    with trainwise.guard(model, optimizer, check_every=options.log_every):
        for inputs, targets in loader:
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(inputs), targets).backward()
            optimizer.step()
    return model


def test_the_counter_sees_a_read_per_step(monkeypatch):
    """The near miss: a trainwise metric read every step (as a loop printing its value would) is counted."""
    from trainwise.metrics import MetricSet

    window = step_work._Window()
    reads = []
    real = torch.Tensor.tolist

    def counted(self):
        if window.counting and "trainwise" in sys._getframe(1).f_code.co_filename:
            reads.append(1)
        return real(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    handle = register_optimizer_step_post_hook(window)
    model = overhead._model("small", 0)
    optimizer = torch.optim.AdamW(model.parameters())
    metrics = MetricSet()
    try:
        for inputs, targets in torch.utils.data.DataLoader(overhead._data("small", 0), batch_size=64):
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            metrics.mean("loss").update(loss, len(targets))
            metrics.compute()  # a read per step
    finally:
        handle.remove()
    assert len(reads) >= step_work.LAST - step_work.FIRST - 1


@pytest.mark.slow
def test_trainer_adds_few_torch_operations_per_step():
    report = step_work.measure(["minimal", "trainer-off", "trainer"])
    sides = report["sides"]
    # everything optional off: the loss kept for the epoch's mean (detach, add) and the amortised log-interval
    # check; the defaults add the accuracy count (argmax, eq, ne, stack, sum, add) and the gradient check
    assert sides["trainer-off"]["added_operations"] <= 2.5, sides["trainer-off"]
    assert sides["trainer"]["added_operations"] <= 9, sides["trainer"]


@pytest.mark.slow
def test_a_trainer_with_the_users_optimizer_adds_few_python_calls_per_step():
    """Everything optional off, the user's own Adam: an (inputs, targets) batch under the default conventions is
    the model's call and cross-entropy (10 calls: the batch moved to the device, the autocast context), the
    accumulator's one arithmetic (11: the window's end, its sync context, the weighted backward, the step), the
    step's own parts (5), the loss counted (2) and the Trainer's loop (4): 33 calls a step over the minimal
    loop's (10 while this case had a copy of the arithmetic of its own); the time is held by the benchmarks."""
    report = step_work.measure(["minimal", "minimal-adam", "trainer-adam-off"])
    sides = report["sides"]
    added = sides["trainer-adam-off"]["calls"] - sides["minimal-adam"]["calls"]
    assert added <= 35, sides["trainer-adam-off"]
