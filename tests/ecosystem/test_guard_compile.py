"""``torch.compile`` and the runtime guards: the checks run outside the compiled region, so they add no graph
break to the user's module (the Trainer with ``compile=True`` used to get 2 on an MLP and 1 on a tiny Llama, all
in the guards' own hooks), and they still report the mistakes they exist for. Compiling on the CPU takes
seconds: every test here is slow."""

from __future__ import annotations

import pytest
import torch
from hf_models import tiny_llama, token_batches
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import trainwise as tw

pytestmark = pytest.mark.slow


def _count_graph_breaks(run):
    """Graph breaks torch.compile took while ``run()`` ran, from a fresh compile cache."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    try:
        result = run()
        return sum(counters["graph_break"].values()), result
    finally:
        torch._dynamo.reset()


class _Samples(Dataset):
    """Token samples (dicts of 1-D tensors) as a map-style dataset, batched by the Trainer."""

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        return self.samples[index]


class _EvaluatesInTrainMode:
    """A Trainer callback with the mistake TW103 reports: an evaluation without model.eval() (before the
    first step, whose validation would otherwise be the step's one TW103 scan)."""

    def on_fit_start(self, state) -> None:
        with torch.no_grad():
            state.model(torch.randn(2, 4))


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 3))


@pytest.fixture
def aot_eager(monkeypatch):
    """``torch.compile`` with the ``aot_eager`` backend: graph breaks are dynamo's, whatever the backend, and
    aot_eager traces forward and backward as inductor does without generating and compiling C++ (on a CPU the
    two Trainer cases take 8 s instead of 33)."""
    compile_ = torch.compile

    def compile_aot_eager(model=None, **options):
        return compile_(model, **{**options, "backend": "aot_eager"})

    monkeypatch.setattr(torch, "compile", compile_aot_eager)


@pytest.mark.parametrize("which", ["mlp", "tiny-llama"])
def test_the_compiled_trainer_with_its_guards_takes_no_graph_break(tmp_path, which, aot_eager):
    if which == "mlp":
        g = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g))
        model, callbacks = _mlp, [_EvaluatesInTrainMode()]
    else:
        data, model, callbacks = _Samples(token_batches(32, ragged=False)), tiny_llama, []
    trainer = tw.Trainer(epochs=1, batch_size=8, device="cpu", progress="off", plot=False, diagnose=False,
                         checkpoints=False, run_dir=str(tmp_path / "run"), log_every=1, compile=True,
                         callbacks=callbacks)
    breaks, _ = _count_graph_breaks(lambda: trainer.fit(model, data, data))
    found = [r["code"] for r in tw.read_log(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "guard"]
    assert breaks == 0
    assert found == (["TW103"] if which == "mlp" else [])  # the guards ran: the callback's mistake is found


@pytest.mark.parametrize("guarded", ["compiled", "inner", "in-place"])
def test_a_compiled_hand_written_loop_still_gets_its_findings(guarded):
    """``tw.guard(torch.compile(model), optimizer)``: no graph break, also with the forward hooks added and
    removed on the ``forward_every`` schedule. A guard given the module inside, or a module compiled in place
    (``model.compile()``), cannot hook outside the compiled region: its checks run eagerly, at a break each,
    and find the same; its hooks then stay on between watched steps (a compiled graph keeps the hooks it was
    traced with, so the evaluation graph traced on an unwatched step must have them too)."""
    model = _mlp()
    if guarded == "in-place":
        model.compile()
        compiled = model
    else:
        compiled = torch.compile(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    kept = []

    def loop():
        with tw.guard(compiled if guarded == "compiled" else model, optimizer, action="record",
                      forward_every=2) as guard:
            for _ in range(5):
                x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
                optimizer.zero_grad()
                loss = nn.functional.cross_entropy(compiled(x), y)
                loss.backward()
                optimizer.step()
                kept.append(loss)  # TW102: every step's graph stays alive
                with torch.no_grad():
                    compiled(x)  # TW103: an evaluation without model.eval()
        return guard

    breaks, guard = _count_graph_breaks(loop)
    assert sorted((f.code, f.where) for f in guard.findings) == [("TW102", "(the model)"), ("TW103", "2")]
    assert guard.model is model  # names as in the user's module (no `_orig_mod.` prefix)
    for module in (model, compiled):
        assert not module._forward_hooks and not module._forward_pre_hooks  # all gone at close
    if guarded == "compiled":
        assert breaks == 0
    else:
        assert breaks > 0
