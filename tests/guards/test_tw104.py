"""TW104 at run time: an eval-mode forward with autograd on whose outputs no backward reaches is reported once;
evaluation under no_grad/inference_mode, and eval-mode forwards that are backpropagated on purpose, are not."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn

import trainwise
from trainwise.guards.tw104_eval_outputs_not_backpropagated import EvalOutputsNotBackpropagated


def make(seed: int = 0, adamw: bool = False) -> tuple[nn.Module, torch.optim.Optimizer, list[torch.Tensor]]:
    """A small MLP (with batch norm), its optimizer and 6 batches of random inputs and targets."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = (torch.optim.AdamW if adamw else torch.optim.SGD)(model.parameters(), lr=0.05)
    data = [(torch.randn(4, 8), torch.randint(0, 3, (4,))) for _ in range(6)]
    return model, optimizer, data


def guarded(loop: Callable[..., object], *, action: str = "warn", adamw: bool = False,
            ) -> tuple[trainwise.Guard, list[warnings.WarningMessage]]:
    """Run ``loop(model, optimizer, data)`` under a TW104-only guard: the guard and the guard warnings."""
    model, optimizer, data = make(adamw=adamw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with trainwise.guard(model, optimizer, action=action, checks=["TW104"]) as guard:
            kept = loop(model, optimizer, data)  # what the loop returns stays alive until the guard closes
        del kept
    return guard, [w for w in caught if issubclass(w.category, trainwise.guards.GuardWarning)]


def train_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, data: list) -> None:
    model.train()
    for x, y in data:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def evaluate_with_grad(model: nn.Module, data: list) -> float:
    model.eval()
    correct = 0
    for x, y in data:
        correct += (model(x).argmax(1) == y).sum().item()  # the mistake: autograd on
    return correct / len(data)


def eval_with_grad(model: nn.Module, optimizer: torch.optim.Optimizer, data: list) -> None:
    for _ in range(2):
        train_epoch(model, optimizer, data)
        evaluate_with_grad(model, data)


def eval_one_batch_with_grad(model: nn.Module, optimizer: torch.optim.Optimizer, data: list) -> None:
    """A single validation batch between epochs, its output dropped at once."""
    for _ in range(2):
        train_epoch(model, optimizer, data)
        evaluate_with_grad(model, data[:1])


def eval_outputs_kept(model: nn.Module, optimizer: torch.optim.Optimizer, data: list) -> list[torch.Tensor]:
    """The evaluation keeps every output (for a metric at the end): the graphs are alive at close."""
    train_epoch(model, optimizer, data)
    model.eval()
    return [model(x) for x, _ in data]


def eval_outputs_kept_while_training(model: nn.Module, optimizer: torch.optim.Optimizer, data: list,
                                     ) -> list[torch.Tensor]:
    """Every evaluation output kept while training goes on: the graphs outlive the next optimizer step."""
    outputs = eval_outputs_kept(model, optimizer, data)
    train_epoch(model, optimizer, data)
    return outputs


def eval_keeps_previous_output(model: nn.Module, optimizer: torch.optim.Optimizer, data: list) -> None:
    """Each evaluation output lives one batch longer (compared with the next): freed unused all the same."""
    train_epoch(model, optimizer, data)
    model.eval()
    previous = None
    for x, _ in data:
        out = model(x)
        if previous is not None:
            _ = (out - previous).abs().max().item()
        previous = out
    del previous, out
    train_epoch(model, optimizer, data)


def eval_no_grad(model: nn.Module, optimizer: torch.optim.Optimizer, data: list) -> None:
    for _ in range(2):
        train_epoch(model, optimizer, data)
        with torch.no_grad():
            evaluate_with_grad(model, data)


def eval_inference_mode(model: nn.Module, optimizer: torch.optim.Optimizer, data: list) -> None:
    for _ in range(2):
        train_epoch(model, optimizer, data)
        with torch.inference_mode():
            evaluate_with_grad(model, data)
        with trainwise.evaluating(model):
            evaluate_with_grad(model, data)
        model.train()


def adversarial(model: nn.Module, optimizer: torch.optim.Optimizer, data: list) -> None:
    """FGSM: the eval-mode forward is backpropagated to the input, then the model trains on the result."""
    for x, y in data:
        model.eval()
        x = x.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(nn.functional.cross_entropy(model(x), y), x)
        model.train()
        optimizer.zero_grad()
        nn.functional.cross_entropy(model((x + 0.1 * grad.sign()).detach()), y).backward()
        optimizer.step()


def frozen_norm_finetune(model: nn.Module, optimizer: torch.optim.Optimizer, data: list) -> None:
    """Fine-tuning with batch norm frozen: the whole run is in eval mode and every forward backpropagated."""
    model.eval()
    for x, y in data:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def eval_output_used_by_a_later_backward(model: nn.Module, optimizer: torch.optim.Optimizer, data: list) -> None:
    """An eval-mode output that enters the loss of the following training forward (a consistency term)."""
    for x, y in data:
        model.eval()
        anchor = model(x)
        model.train()
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y) + 0.1 * anchor.pow(2).mean()
        loss.backward()
        optimizer.step()


@pytest.mark.parametrize("loop", [eval_with_grad, eval_one_batch_with_grad, eval_outputs_kept,
                                  eval_outputs_kept_while_training])
def test_unused_eval_graph_is_reported_once(loop: Callable[..., None]) -> None:
    guard, caught = guarded(loop)
    assert [(f.code, f.where) for f in guard.findings] == [("TW104", "(the model)")]
    assert "no_grad" in guard.findings[0].message and "evaluating" in guard.findings[0].message
    assert [w.message.code for w in caught] == ["TW104"]


@pytest.mark.parametrize(("loop", "step"), [
    (eval_with_grad, 6),  # at the second evaluation batch: the first one's graph was freed unused
    (eval_outputs_kept, 6),  # at close: the graphs are alive and were never backpropagated
    (eval_outputs_kept_while_training, 7),  # at the first forward after the next optimizer step
    (eval_keeps_previous_output, 6),  # at the third evaluation batch, once the first one's graph is freed
])
def test_reported_as_soon_as_known(loop: Callable[..., None], step: int) -> None:
    guard, _ = guarded(loop)
    assert guard.findings[0].step == step


def test_raise_action_raises() -> None:
    with pytest.raises(trainwise.guards.GuardError) as info:
        guarded(eval_with_grad, action="raise")
    assert info.value.code == "TW104"


def training_outputs_unused(model: nn.Module, optimizer: torch.optim.Optimizer, data: list) -> None:
    """Training-mode forwards whose outputs are dropped (features for a log): not an evaluation."""
    for x, y in data:
        model.train()
        _ = model(x).norm().detach()
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


@pytest.mark.parametrize("loop", [training_outputs_unused, eval_no_grad, eval_inference_mode, adversarial,
                                  frozen_norm_finetune, eval_output_used_by_a_later_backward])
def test_near_misses_stay_silent(loop: Callable[..., None]) -> None:
    guard, caught = guarded(loop, adamw=True)
    assert guard.findings == [] and caught == []


def test_close_removes_every_hook_and_outputs_are_untouched() -> None:
    model, optimizer, data = make()
    x, _ = data[0]
    model.eval()
    with torch.no_grad():
        expected = model(x)
    guard = trainwise.guard(model, optimizer, checks=["TW104"])
    out = model(x)
    check = next(c for c in guard.checks if isinstance(c, EvalOutputsNotBackpropagated))
    assert len(check._pending) == 1
    assert torch.equal(out, expected) and out.requires_grad
    seen = check._pending[0][1]
    guard.close(check=False)  # as after a failed loop: no last check, the hooks and references dropped
    assert guard.findings == [] and check._pending == []
    out.sum().backward()
    assert not seen.backpropagated  # the pre-hook on the output's grad_fn was removed too
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks
    assert torch.equal(model(x), expected)


def test_guarded_run_ends_with_the_same_weights() -> None:
    def train(use_guard: bool) -> list[torch.Tensor]:
        model, optimizer, data = make(seed=1, adamw=True)
        guard = trainwise.guard(model, optimizer, checks=["TW104"]) if use_guard else None
        frozen_norm_finetune(model, optimizer, data)
        adversarial(model, optimizer, data)
        if guard is not None:
            guard.close()
            assert guard.findings == []
        return [t.detach().clone() for t in (*model.parameters(), *model.buffers())]

    for plain, watched in zip(train(False), train(True)):
        assert torch.equal(plain, watched)


def test_failed_loop_reports_nothing_more() -> None:
    model, optimizer, data = make()
    with pytest.raises(KeyError), trainwise.guard(model, optimizer, checks=["TW104"]) as guard:
        model.eval()
        kept = model(data[0][0])
        raise KeyError(kept.shape)
    assert guard.findings == []
