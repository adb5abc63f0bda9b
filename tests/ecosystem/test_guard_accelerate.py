"""The runtime guard in a real Accelerate loop, installed as an Accelerate user writes it: after
``accelerator.prepare``, with ``gradient_accumulation_steps`` and bf16 autocast. A clean loop gets no finding;
a loss kept across steps, an evaluation in train mode and a missing ``zero_grad`` get their codes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import trainwise as tw

accelerate = pytest.importorskip("accelerate")
from accelerate.state import AcceleratorState, GradientState  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """Accelerate keeps its state in process-wide singletons: each test builds its own Accelerator."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def _loop(*, accumulation: int = 1, precision: str = "no", mistake: str | None = None):
    """A tiny classifier trained by Accelerate's documented loop, guarded after ``prepare``; 16 micro-batches,
    with an evaluation after each optimizer step. Returns the guard (closed) and the prepared optimizer."""
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=accumulation,
                                         mixed_precision=precision)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 3, (64,)))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    guard = tw.guard(model, optimizer, action="record")  # the line under test: after prepare
    kept = []
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            if mistake != "no_zero_grad":
                optimizer.zero_grad()
        if mistake == "kept_loss":
            kept.append(loss)  # the graph of every micro-batch stays alive
        if accelerator.sync_gradients:
            if mistake != "eval_in_train_mode":
                model.eval()
            with torch.no_grad():
                model(x)
            model.train()
    guard.close()
    return guard, optimizer


@pytest.mark.parametrize(("accumulation", "precision"), [(1, "no"), (4, "no"), (4, "bf16")])
def test_a_clean_accelerate_loop_gets_no_finding(accumulation, precision):
    guard, optimizer = _loop(accumulation=accumulation, precision=precision)
    assert type(optimizer).__name__ == "AcceleratedOptimizer"
    assert guard.optimizer is optimizer.optimizer  # the hooks are on the optimizer that steps
    assert guard.step == 16 // accumulation  # optimizer steps, not micro-batches
    assert guard.findings == []


@pytest.mark.parametrize(("mistake", "code"), [
    ("kept_loss", "TW102"),
    ("eval_in_train_mode", "TW103"),
    ("no_zero_grad", "TW105"),
])
@pytest.mark.parametrize(("accumulation", "precision"), [(1, "no"), (4, "bf16")])
def test_each_mistake_in_an_accelerate_loop_gets_its_code(mistake, code, accumulation, precision):
    guard, _ = _loop(accumulation=accumulation, precision=precision, mistake=mistake)
    assert [f.code for f in guard.findings] == [code]


def test_bf16_autocast_really_runs_in_the_guarded_forward():
    """The bf16 case is not fp32 in disguise: inside the prepared, guarded forward the layers compute in
    bfloat16 (Accelerate converts the model's output back to float32)."""
    accelerator = accelerate.Accelerator(cpu=True, mixed_precision="bf16")
    model = accelerator.prepare(nn.Sequential(nn.Linear(4, 3)))
    dtypes = []
    handle = model[0].register_forward_hook(lambda module, args, output: dtypes.append(output.dtype))
    with tw.guard(model, action="record") as guard:
        output = model(torch.randn(2, 4))
    handle.remove()
    assert dtypes == [torch.bfloat16] and output.dtype == torch.float32 and guard.findings == []


@pytest.mark.slow
def test_a_model_accelerate_compiles_is_checked_as_the_users_module_without_a_graph_break():
    """``Accelerator(dynamo_backend=...)`` returns a ``torch.compile`` wrapper from ``prepare``: the guard checks
    the module inside (names without ``_orig_mod.``) and hooks the wrapper, outside the compiled graph. Graph
    breaks are dynamo's, whatever the backend: ``aot_eager`` traces forward and backward as inductor does, without
    generating and compiling C++ (19 s less on a CPU)."""
    from torch._dynamo.utils import counters

    accelerator = accelerate.Accelerator(cpu=True, dynamo_backend="aot_eager")
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
    model, optimizer = accelerator.prepare(module, torch.optim.SGD(module.parameters(), lr=0.05))
    assert model is not module  # the compiled wrapper
    torch._dynamo.reset()
    counters.clear()
    kept = []
    with tw.guard(model, optimizer, action="record") as guard:
        for _ in range(5):
            x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            kept.append(loss)  # TW102
            with torch.no_grad():
                model(x)  # TW103: no model.eval()
    breaks = sum(counters["graph_break"].values())
    torch._dynamo.reset()
    assert guard.model is module and breaks == 0
    assert sorted((f.code, f.where) for f in guard.findings) == [("TW102", "(the model)"), ("TW103", "2")]
