"""Accumulated gradients equal the gradient of the whole effective batch (fp32, rtol 1e-5)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainwise import GradientAccumulator, TrainwiseError, accumulation_steps


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 5))


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


def _assert_close(a, b):
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-7)


class _Identity(torch.optim.Optimizer):
    """An optimizer that steps nothing, so that gradients can be read before zero_grad."""

    def __init__(self, params):
        super().__init__(params, {})
        self.captured = None

    def step(self, closure=None):
        self.captured = [p.grad.clone() for g in self.param_groups for p in g["params"]]


def test_mean_loss_unequal_micro_batches():
    x, y = torch.randn(23, 6), torch.randint(0, 5, (23,))
    ref = _model()
    F.cross_entropy(ref(x), y).backward()
    model = _model()
    opt = _Identity(model.parameters())
    acc = GradientAccumulator(opt, steps=3)
    for part in (slice(0, 10), slice(10, 13), slice(13, 23)):  # 10, 3 and 10 samples
        acc.backward(F.cross_entropy(model(x[part]), y[part]), count=len(y[part]))
    assert acc.window_full
    assert acc.step()
    _assert_close(opt.captured, _grads(ref))
    assert all(p.grad is None for p in model.parameters())  # zero_grad(set_to_none=True)


def test_token_sum_loss_with_varying_token_counts():
    # a "sequence" loss: targets with ignore_index padding, different numbers of real tokens per micro-batch
    logits_in = torch.randn(4, 7, 6)
    targets = torch.randint(0, 5, (4, 7))
    targets[0, 3:] = -100
    targets[1, 1:] = -100
    targets[3, 6:] = -100
    ref = _model()
    F.cross_entropy(ref(logits_in).reshape(-1, 5), targets.reshape(-1), ignore_index=-100).backward()
    model = _model()
    opt = _Identity(model.parameters())
    acc = GradientAccumulator(opt, steps=2)
    for part in (slice(0, 2), slice(2, 4)):
        t = targets[part]
        loss_sum = F.cross_entropy(model(logits_in[part]).reshape(-1, 5), t.reshape(-1), reduction="sum")
        acc.backward(loss_sum, count=(t != -100).sum(), reduction="sum")
    acc.step()
    _assert_close(opt.captured, _grads(ref))


def test_token_mean_loss_weighted_by_token_count():
    logits_in = torch.randn(4, 5, 6)
    targets = torch.randint(0, 5, (4, 5))
    targets[:2, 1:] = -100  # first micro-batch: 2 tokens, second: 10
    ref = _model()
    F.cross_entropy(ref(logits_in).reshape(-1, 5), targets.reshape(-1)).backward()
    model = _model()
    opt = _Identity(model.parameters())
    acc = GradientAccumulator(opt, steps=2)
    for part in (slice(0, 2), slice(2, 4)):
        t = targets[part]
        loss = F.cross_entropy(model(logits_in[part]).reshape(-1, 5), t.reshape(-1))  # mean over its tokens
        acc.backward(loss, count=(t != -100).sum())
    acc.step()
    _assert_close(opt.captured, _grads(ref))


def test_short_last_window_equals_its_own_full_batch():
    x, y = torch.randn(50, 6), torch.randint(0, 5, (50,))
    micro, steps = 8, 4  # windows of 32 then 18 (micro-batches 8, 8, 2)
    model = _model()
    opt = _Identity(model.parameters())
    acc = GradientAccumulator(opt, steps=steps)
    captured = []
    batches = [(x[i : i + micro], y[i : i + micro]) for i in range(0, 50, micro)]
    for i, (xb, yb) in enumerate(batches):
        acc.backward(F.cross_entropy(model(xb), yb), count=len(yb))
        if acc.window_full or i == len(batches) - 1:
            acc.step()
            captured.append(opt.captured)
    assert len(captured) == 2
    for window, got in zip((slice(0, 32), slice(32, 50)), captured, strict=True):
        ref = _model()
        F.cross_entropy(ref(x[window]), y[window]).backward()
        _assert_close(got, _grads(ref))


def test_one_step_per_window_and_scheduler_per_optimizer_step():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    steps_taken = []
    opt.register_step_post_hook(lambda *a: steps_taken.append(1))
    acc = GradientAccumulator(opt, steps=4, scheduler=sched)
    for i in range(10):
        acc.backward(F.cross_entropy(model(torch.randn(3, 6)), torch.randint(0, 5, (3,))), count=3)
        if acc.window_full or i == 9:
            acc.step()
    assert len(steps_taken) == 3 and acc.optimizer_steps == 3
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)


def test_clipping_happens_on_normalised_gradients():
    model = _model()
    opt = _Identity(model.parameters())
    acc = GradientAccumulator(opt, steps=2, max_grad_norm=1e-3)
    for _ in range(2):
        acc.backward(F.cross_entropy(model(torch.randn(16, 6)), torch.randint(0, 5, (16,))) * 100, count=16)
    acc.step()
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in opt.captured]))
    assert norm <= 1e-3 * (1 + 1e-4)
    assert acc.last_grad_norm > 1e-3


def test_skip_nonfinite_skips_the_step():
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    acc = GradientAccumulator(opt, steps=1, skip_nonfinite=True)
    loss = F.cross_entropy(model(torch.randn(4, 6)), torch.randint(0, 5, (4,))) * float("nan")
    acc.backward(loss, count=4)
    assert acc.step() is False
    assert acc.skipped_steps == 1 and acc.optimizer_steps == 0
    for a, b in zip(before, model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_fp16_scaler_unscales_before_clipping_and_skips_inf():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    acc = GradientAccumulator(opt, steps=1, scaler=scaler, max_grad_norm=1.0)
    acc.backward(F.cross_entropy(model(torch.randn(4, 6)), torch.randint(0, 5, (4,))), count=4)
    assert acc.step() is True
    assert acc.last_grad_norm < 100  # measured after unscaling, not at 2**10 times the true norm
    before = [p.detach().clone() for p in model.parameters()]
    acc.backward(F.cross_entropy(model(torch.randn(4, 6)), torch.randint(0, 5, (4,))) * float("inf"), count=4)
    assert acc.step() is False
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert scaler.get_scale() < 2.0**10


@pytest.mark.parametrize(
    "effective, micro, expected", [(64, 16, 4), (32, 32, 1), (30, 7, None), (0, 4, None), (8, -1, None)]
)
def test_accumulation_steps(effective, micro, expected):
    if expected is None:
        with pytest.raises(TrainwiseError):
            accumulation_steps(effective, micro)
    else:
        assert accumulation_steps(effective, micro) == expected


def test_effective_batch_not_divisible_names_the_fix():
    with pytest.raises(TrainwiseError, match=r"does not divide the effective batch 64; use a micro-batch .* 16"):
        accumulation_steps(64, 24)


@pytest.mark.parametrize(
    "loss, match",
    [
        (torch.ones(3, requires_grad=True), "scalar tensor, got shape"),
        (1.5, "got a float"),
        (torch.tensor(1.0), "does not require grad"),
    ],
)
def test_bad_losses(loss, match):
    acc = GradientAccumulator(torch.optim.SGD(_model().parameters(), lr=0.1))
    with pytest.raises(TrainwiseError, match=match):
        acc.backward(loss, count=1)


def test_step_without_backward_is_an_error():
    acc = GradientAccumulator(torch.optim.SGD(_model().parameters(), lr=0.1))
    with pytest.raises(TrainwiseError, match="call backward"):
        acc.step()
