"""The default optimizer: AdamW over the trainable parameter groups, with torch's fused kernel where it applies."""

import torch
import torch.nn.functional as F
from torch import nn

import trainwise as tw
from trainwise import GradientAccumulator


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 3))


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int = 30) -> None:
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        inputs, targets = torch.randn(16, 6, generator=generator), torch.randint(0, 3, (16,), generator=generator)
        F.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def test_default_optimizer_uses_the_fused_kernel_and_trains_as_the_unfused_adamw():
    fused_model, plain_model = _model(), _model()
    optimizer = tw.build_optimizer(fused_model, lr=1e-2, weight_decay=0.1)
    assert isinstance(optimizer, torch.optim.AdamW)
    assert len(optimizer.param_groups) == 2  # no weight decay on biases and the norm's weight
    assert all(group["fused"] for group in optimizer.param_groups)
    plain = torch.optim.AdamW(tw.param_groups(plain_model, weight_decay=0.1), lr=1e-2, weight_decay=0.1)
    assert not any(group["fused"] for group in plain.param_groups)
    _train(fused_model, optimizer)
    _train(plain_model, plain)
    for a, b in zip(fused_model.parameters(), plain_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # the same update, up to rounding


def test_parameters_without_a_fused_kernel_get_torchs_default():
    class TaggedParameter(nn.Parameter):  # a tensor subclass, as sharded or quantised parameters are
        pass

    model = nn.Linear(4, 2)
    model.weight = TaggedParameter(model.weight.detach().clone())
    assert not any(group["fused"] for group in tw.build_optimizer(model).param_groups)

    double = nn.Linear(4, 2).double()  # float64 has the kernel
    assert all(group["fused"] for group in tw.build_optimizer(double).param_groups)


def test_fused_default_under_a_grad_scaler_skips_non_finite_steps():
    model = _model()
    optimizer = tw.build_optimizer(model, lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    accumulator = GradientAccumulator(optimizer, steps=1, scaler=scaler, max_grad_norm=1.0)
    inputs, targets = torch.randn(4, 6), torch.randint(0, 3, (4,))
    accumulator.backward(F.cross_entropy(model(inputs), targets), count=4)
    assert accumulator.step() is True
    before = [p.detach().clone() for p in model.parameters()]
    accumulator.backward(F.cross_entropy(model(inputs), targets) * float("inf"), count=4)
    assert accumulator.step() is False
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert scaler.get_scale() < 2.0**10
    accumulator.backward(F.cross_entropy(model(inputs), targets), count=4)
    assert accumulator.step() is True
    assert not any(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
