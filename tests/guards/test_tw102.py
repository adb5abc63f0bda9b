"""TW102 at run time: a loss kept with its graph across optimizer steps is found within two steps; a loop that
keeps numbers, detached tensors or no-grad outputs, or accumulates gradients, is not."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn

import trainwise
from trainwise.guards.tw102_graph_kept import GraphKeptAcrossSteps

Loop = Callable[[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor], None]


def make(seed: int = 0, adamw: bool = False) -> tuple[nn.Module, torch.optim.Optimizer, list[torch.Tensor]]:
    """A small MLP, its optimizer and 8 batches of random inputs and targets."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = (torch.optim.AdamW if adamw else torch.optim.SGD)(model.parameters(), lr=0.05)
    data = [(torch.randn(4, 8), torch.randint(0, 3, (4,))) for _ in range(8)]
    return model, optimizer, data


def guarded(loop: Callable[..., object], *, action: str = "warn", steps: int = 8, adamw: bool = False,
            ) -> tuple[trainwise.Guard, list[warnings.WarningMessage]]:
    """Run ``loop(model, optimizer, data)`` under a TW102-only guard: the guard and the guard warnings."""
    model, optimizer, data = make(adamw=adamw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with trainwise.guard(model, optimizer, action=action, checks=["TW102"]) as guard:
            loop(model, optimizer, data[:steps])
    return guard, [w for w in caught if issubclass(w.category, trainwise.guards.GuardWarning)]


def step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One plain training step; returns the loss (with its graph)."""
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def running_total(model: nn.Module, optimizer: torch.optim.Optimizer, data: list) -> None:
    total = 0.0
    for x, y in data:
        total += step(model, optimizer, x, y)  # the mistake


def running_total_item(model: nn.Module, optimizer: torch.optim.Optimizer, data: list) -> None:
    total = 0.0
    for x, y in data:
        total += step(model, optimizer, x, y).item()


def list_append(model: nn.Module, optimizer: torch.optim.Optimizer, data: list) -> None:
    losses = []
    for x, y in data:
        losses.append(step(model, optimizer, x, y))  # the mistake


def list_append_detached(model: nn.Module, optimizer: torch.optim.Optimizer, data: list) -> None:
    losses = []
    for x, y in data:
        losses.append(step(model, optimizer, x, y).detach())


def dict_of_outputs(model: nn.Module, optimizer: torch.optim.Optimizer, data: list) -> None:
    outputs = {}
    for i, (x, y) in enumerate(data):
        optimizer.zero_grad()
        outputs[i] = model(x)  # the mistake: never backpropagated, activations kept
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def no_grad_outputs(model: nn.Module, optimizer: torch.optim.Optimizer, data: list) -> None:
    outputs = []
    for x, y in data:
        step(model, optimizer, x, y)
        with torch.no_grad():
            outputs.append(model(x))


def accumulation(model: nn.Module, optimizer: torch.optim.Optimizer, data: list) -> None:
    """Gradient accumulation over 2 micro-batches, every loss kept until the step."""
    for start in range(0, len(data), 2):
        losses = []
        for x, y in data[start:start + 2]:
            loss = nn.functional.cross_entropy(model(x), y) / 2
            loss.backward()
            losses.append(loss)
        optimizer.step()
        optimizer.zero_grad()


def keep_last_one(model: nn.Module, optimizer: torch.optim.Optimizer, data: list) -> None:
    """Keeps the previous step's loss alive for one more step (logging a delta): not a leak."""
    previous = None
    for x, y in data:
        loss = step(model, optimizer, x, y)
        if previous is not None:
            _ = (loss - previous).detach()
        previous = loss


@pytest.mark.parametrize("loop", [running_total, list_append, dict_of_outputs])
def test_kept_graph_is_reported_once_within_two_steps(loop: Callable[..., None]) -> None:
    guard, caught = guarded(loop)
    assert [(f.code, f.where) for f in guard.findings] == [("TW102", "(the model)")]
    assert guard.findings[0].step == 3  # the forward before step 1, seen after step 3
    assert ".item()" in guard.findings[0].message and ".detach()" in guard.findings[0].message
    assert [w.message.code for w in caught] == ["TW102"]


def test_sampled_steps_are_tagged_and_a_late_leak_is_found_at_the_next_sampled_step() -> None:
    # a sampled step costs tens of microseconds (cold code beside the loop's own): the forwards of steps 0, 32, 64,
    # 128... are tagged, since a loop that keeps graphs keeps them every step; one that starts keeping them at
    # step 3 is found from step 32's forward
    from trainwise.guards.check import sample_gap

    sample = sample_gap(0)
    assert sample == 32 and sample % 8 == 0  # a multiple of forward_every=8, the Trainer's: its forwards are hooked
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    tagged, kept = [], []
    with trainwise.guard(model, optimizer, action="record", checks=["TW102"]) as guard:
        for i in range(2 * sample):
            optimizer.zero_grad()
            output = model(torch.randn(4, 8))
            tagged.append(bool(output.grad_fn.metadata))  # the token sits on the output's autograd node
            loss = nn.functional.cross_entropy(output, torch.randint(0, 3, (4,)))
            loss.backward()
            optimizer.step()
            if i >= 3:
                kept.append(loss)  # the mistake, from the fourth step on
    assert [i for i, t in enumerate(tagged) if t] == [0, sample]
    # the forward before step 33, judged after step 35
    assert [(f.code, f.step) for f in guard.findings] == [("TW102", sample + 3)]
    assert f"before step {sample + 1}" in guard.findings[0].message


def test_the_sampled_steps_thin_out_as_the_run_goes_on_and_a_late_leak_is_still_found() -> None:
    """Steps 0, 32, 64, 128, 256, then one in 256 (512, 768...): every one a multiple of 8, and a run that starts
    keeping graphs at step 300 is found from step 512's forward."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    tagged, kept = [], []
    x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
    with trainwise.guard(model, optimizer, action="record", checks=["TW102"]) as guard:
        for i in range(800):
            optimizer.zero_grad()
            output = model(x)
            tagged.append(bool(output.grad_fn.metadata))
            loss = nn.functional.cross_entropy(output, y)
            loss.backward()
            optimizer.step()
            if i >= 300:
                kept.append(loss)
    assert [i for i, t in enumerate(tagged) if t] == [0, 32, 64, 128, 256, 512]  # reported: no sample after
    assert [(f.code, f.step) for f in guard.findings] == [("TW102", 515)]


def test_message_counts_the_kept_graphs() -> None:
    def two_kept_per_step(model: nn.Module, optimizer: torch.optim.Optimizer, data: list) -> None:
        outputs = []
        for x, y in data:
            optimizer.zero_grad()
            outputs += [model(x), model(x)]  # two forwards a step, both kept
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()

    guard, _ = guarded(two_kept_per_step)
    assert "(2 forward graph(s)" in guard.findings[0].message


def test_raise_action_raises_at_the_step() -> None:
    with pytest.raises(trainwise.guards.GuardError) as info:
        guarded(list_append, action="raise")
    assert info.value.code == "TW102" and info.value.step == 3


@pytest.mark.parametrize("loop", [running_total_item, list_append_detached, no_grad_outputs, accumulation,
                                  keep_last_one])
def test_near_misses_stay_silent(loop: Callable[..., None]) -> None:
    guard, caught = guarded(loop, adamw=True)
    assert guard.findings == [] and caught == []


def test_two_steps_are_not_enough_to_judge() -> None:
    guard, _ = guarded(running_total, steps=2)
    assert guard.findings == []


def test_eval_forwards_are_left_to_tw104() -> None:
    def loop(model: nn.Module, optimizer: torch.optim.Optimizer, data: list) -> None:
        kept = []
        for x, y in data:
            step(model, optimizer, x, y)
            model.eval()
            kept.append(model(x))  # an evaluation with autograd on, kept: TW104's finding, not TW102's
            model.train()

    model, optimizer, data = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", trainwise.guards.GuardWarning)
        with trainwise.guard(model, optimizer, checks=["TW102", "TW104"]) as guard:
            loop(model, optimizer, data)
    assert [f.code for f in guard.findings] == ["TW104"]


@dataclasses.dataclass
class Output:
    """A dataclass output, as some libraries return."""

    hidden: torch.Tensor | None
    logits: torch.Tensor


class Wrapped(nn.Module):
    """Returns a dict, a tuple or a dataclass holding the logits."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.body = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> object:
        logits = self.body(x)
        if self.kind == "dict":
            return {"n": 1, "logits": logits}
        if self.kind == "tuple":
            return (torch.zeros(1), logits)
        return Output(hidden=None, logits=logits)


@pytest.mark.parametrize("kind", ["dict", "tuple", "dataclass"])
def test_structured_outputs_are_tagged_and_unchanged(kind: str) -> None:
    torch.manual_seed(0)
    model = Wrapped(kind)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    kept = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", trainwise.guards.GuardWarning)
        with trainwise.guard(model, optimizer, checks=["TW102"]) as guard:
            for _ in range(4):
                out = model(x)
                logits = out["logits"] if kind == "dict" else out[1] if kind == "tuple" else out.logits
                assert type(out).__name__ == {"dict": "dict", "tuple": "tuple", "dataclass": "Output"}[kind]
                logits.sum().backward()
                optimizer.step()
                kept.append(logits)
    assert [f.code for f in guard.findings] == ["TW102"]


def test_a_kept_second_output_is_found() -> None:
    class TwoHeads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.head = nn.Linear(8, 16), nn.Linear(16, 3)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            features = self.body(x).relu()
            return self.head(features), features * 1.0

    def loop(model: nn.Module, optimizer: torch.optim.Optimizer, data: list) -> None:
        kept = []
        for x, y in data:
            optimizer.zero_grad()
            logits, features = model(x)
            nn.functional.cross_entropy(logits, y).backward()
            optimizer.step()
            kept.append(features)  # only the second output is kept

    torch.manual_seed(0)
    model = TwoHeads()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(torch.randn(4, 8), torch.randint(0, 3, (4,))) for _ in range(5)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", trainwise.guards.GuardWarning)
        with trainwise.guard(model, optimizer, checks=["TW102"]) as guard:
            loop(model, optimizer, data)
    assert [(f.code, f.step) for f in guard.findings] == [("TW102", 3)]


def test_close_removes_every_hook_and_outputs_are_untouched() -> None:
    model, optimizer, data = make()
    x = data[0][0]
    with trainwise.guard(model, optimizer, checks=["TW102"]) as guard:
        out = model(x)
        check = next(c for c in guard.checks if isinstance(c, GraphKeptAcrossSteps))
        assert len(check._pending) == 1
        out.mul_(2)  # in-place on the output still allowed (nothing wraps it)
        assert out.grad_fn is not None and out.requires_grad and out.dtype == torch.float32
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks
    assert check._pending == type(check._pending)()
    with torch.no_grad():
        assert torch.equal(model(x), model[2](model[1](model[0](x))))


def test_guarded_run_ends_with_the_same_weights() -> None:
    def train(use_guard: bool) -> list[torch.Tensor]:
        model, optimizer, data = make(seed=1, adamw=True)
        guard = trainwise.guard(model, optimizer, checks=["TW102"]) if use_guard else None
        for x, y in data:
            step(model, optimizer, x, y)
        if guard is not None:
            guard.close()
            assert guard.findings == []
        return [p.detach().clone() for p in model.parameters()]

    for plain, watched in zip(train(False), train(True)):
        assert torch.equal(plain, watched)


def test_no_optimizer_and_no_backward_means_no_step_and_no_finding() -> None:
    model, _, data = make()
    with trainwise.guard(model, checks=["TW102"]) as guard:
        kept = [model(x) for x, _ in data]  # forwards only (features kept on purpose): no step, nothing judged
        assert guard.step == 0 and len(kept) == 8
    assert guard.findings == []


class _RNN(nn.Module):
    """word_language_model's shape, made small: the output and the LSTM's ``(h, c)``."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(4, 8)
        self.decoder = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, hidden: Hidden) -> tuple[torch.Tensor, Hidden]:
        output, hidden = self.rnn(x, hidden)
        return self.decoder(output), hidden


Hidden = tuple[torch.Tensor, torch.Tensor]


def _manual_updates(model: nn.Module, *, detach: bool, steps: int = 8) -> None:
    """No optimizer: the update is written out (p.data.add_), as word_language_model does."""
    torch.manual_seed(1)
    hidden = torch.zeros(1, 2, 8), torch.zeros(1, 2, 8)
    for _ in range(steps):
        if detach:
            hidden = tuple(h.detach() for h in hidden)
        output, hidden = model(torch.randn(5, 2, 4), hidden)
        loss = nn.functional.cross_entropy(output.view(-1, 3), torch.randint(0, 3, (10,)))
        model.zero_grad()
        loss.backward(retain_graph=not detach)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-0.1)


def test_without_an_optimizer_a_backward_is_the_step_and_a_kept_hidden_state_is_found() -> None:
    model = _RNN()
    with trainwise.guard(model, checks=["TW102"], action="record") as guard:
        _manual_updates(model, detach=False)
        assert guard.step == 7  # a forward after a backward starts the next step: 8 forwards, 7 steps
    assert [(f.code, f.step) for f in guard.findings] == [("TW102", 3)]
    with trainwise.guard(model, checks=["TW102"], action="record") as guard:
        _manual_updates(model, detach=True)  # the hidden state detached each step: correct
    assert guard.findings == []
    assert not any(p._post_accumulate_grad_hooks for p in model.parameters())  # nothing left after close


def test_without_an_optimizer_several_backwards_through_one_forward_are_one_step() -> None:
    """Gradients of each output in turn through one graph (retain_graph): the graph is alive for the whole
    step on purpose; only a forward after a backward starts the next step."""
    model, _, data = make()
    with trainwise.guard(model, checks=["TW102"], action="record") as guard:
        for x, _ in data:
            output = model(x)
            for column in range(output.shape[1]):
                model.zero_grad()
                output[:, column].sum().backward(retain_graph=True)
        assert guard.step == len(data) - 1
    assert guard.findings == []

