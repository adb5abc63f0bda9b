"""TW115 at run time: a compiled forward that torch.compile recompiles again and again, read from dynamo's own cache
at the guard's check points (never per step), with the dimension that changes and the point where dynamo stops
compiling and runs eagerly; automatic dynamic shapes, ``dynamic=True`` and fixed shapes stay silent. The eager
backend counts recompiles without a C++ compiler, as the recompiles lab does."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch
from torch import nn

import trainwise as tw
from trainwise.compiled import CompileWatch
from trainwise.guards.tw115_recompiling_forward import RECOMPILES_REPORTED, RecompilingForward


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """A fresh compile cache for each test (cache entries live on the forward's code object), and dynamo's warning
    at the recompile limit kept out of the output."""
    import torch._dynamo

    quiet = logging.getLogger("torch._dynamo")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    quiet.setLevel(level)


def _train(compiled, model, sizes, *, check_every=1, evaluate=False, guarded=None):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with tw.guard(guarded or compiled, optimizer, action="record", checks=["TW115"],
                  check_every=check_every) as guard:
        for size in sizes:
            optimizer.zero_grad()
            compiled(torch.randn(size, 4)).pow(2).mean().backward()
            optimizer.step()
            if evaluate:
                model.eval()
                with torch.no_grad():
                    compiled(torch.randn(size, 4))
                model.train()
    return guard


def test_shapes_that_change_every_step_are_reported_then_the_eager_fallback():
    model = _Net()
    compiled = torch.compile(model, backend="eager", dynamic=False)
    guard = _train(compiled, model, range(1, 12))
    assert [(f.code, f.where, f.step) for f in guard.findings] == [
        ("TW115", "_Net.forward", RECOMPILES_REPORTED + 1),  # the 6th graph, found at the check after its step
        ("TW115", "_Net.forward (recompile limit)", 8),
    ]
    many, limit = (str(f) for f in guard.findings)
    assert "compiled 6 graphs of _Net.forward (5 recompilations" in many
    assert "the size of dimension 0 of `x` changes (1, 2, 3, 4, 5, 6)" in many
    assert "compiled 8 graphs of _Net.forward, torch._dynamo.config.recompile_limit (8)" in limit
    assert "now runs eagerly" in limit and "dynamic=None" in limit
    assert "trainwise doctor --explain TW115" in limit and "trainwise lab recompiles" in limit


def test_with_a_long_check_interval_the_limit_is_the_one_finding_at_close():
    model = _Net()
    compiled = torch.compile(model, backend="eager", dynamic=False)
    guard = _train(compiled, model, range(1, 12), check_every=50)
    assert [(f.where, f.step) for f in guard.findings] == [("_Net.forward (recompile limit)", 11)]


def test_a_compiled_container_and_a_module_compiled_in_place_are_counted():
    sequential = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))  # dynamo compiles a frame around it
    guard = _train(torch.compile(sequential, backend="eager", dynamic=False), sequential, range(1, 10), check_every=50)
    assert [f.where for f in guard.findings] == ["Sequential.forward (recompile limit)"]
    assert "dimension 0 of `args[0]`" in guard.findings[0].message
    torch._dynamo.reset()
    model = _Net()
    model.compile(backend="eager", dynamic=False)  # compiled in place: the guard sees the module itself
    guard = _train(model, model, range(1, 10), check_every=50)
    assert [f.where for f in guard.findings] == ["_Net.forward (recompile limit)"]


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic-dynamic", "dynamic-true"])
def test_a_changing_batch_that_compiles_dynamic_is_silent(dynamic):
    model = _Net()
    compiled = torch.compile(model, backend="eager", dynamic=dynamic)
    guard = _train(compiled, model, [*range(1, 12), 16, 16, 5], evaluate=True)
    assert guard.findings == []


def test_fixed_shapes_with_a_short_last_batch_and_evaluation_are_silent():
    model = _Net()
    compiled = torch.compile(model, backend="eager", dynamic=False)
    guard = _train(compiled, model, [16, 16, 16, 3] * 3, evaluate=True)  # 4 graphs: train and eval, 16 and 3
    assert guard.findings == []
    assert CompileWatch([compiled]).count().graphs == 4


def test_a_model_never_compiled_reads_nothing_and_never_imports_dynamo():
    """Without torch.compile, TW115 has nothing to read, and the guard does not import torch._dynamo for it (about
    a second; an optimizer's step imports it anyway, so the loop here only evaluates)."""
    code = ("import sys, torch, trainwise as tw\n"
            "m = torch.nn.Linear(4, 2)\n"
            "with tw.guard(m, check_every=1) as g, torch.no_grad():\n"
            "    for _ in range(3):\n"
            "        m.eval(); m(torch.randn(3, 4))\n"
            "print(g.findings, 'torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] False"


def test_nothing_runs_per_step():
    """The check reads dynamo's cache only at the guard's check points (``check_every`` steps and close)."""
    from trainwise.guards.check import Check

    for event in ("before_forward", "after_forward", "before_step", "after_step"):
        assert getattr(RecompilingForward, event) is getattr(Check, event), event


def test_the_trainer_logs_the_graphs_it_compiled_and_reports_recompiles(tmp_path):
    """``compile=True`` with the eager backend (no C++ compiler needed): the end record counts the versions of the
    forward compiled in the run; a model whose forward guards on a value that changes every step is TW115."""
    previous = torch.compiler.get_default_backend()
    torch.compiler.set_default_backend("eager")
    try:
        g = torch.Generator().manual_seed(0)
        data = torch.utils.data.TensorDataset(torch.randn(40, 4, generator=g), torch.randint(0, 2, (40,), generator=g))

        def fit(model, run):
            tw.Trainer(epochs=2, batch_size=16, compile=True, device="cpu", progress="off", plot=False,
                       diagnose=False, checkpoints=False, run_dir=str(tmp_path / run), log_every=2).fit(model, data,
                                                                                                      data)
            return tw.read_log(tmp_path / run / "metrics.jsonl")

        records = fit(_Net, "clean")
        end = records[-1]
        assert end["kind"] == "end" and end["compiled_graphs"] == 3  # 16, then a dynamic batch (8), evaluation
        assert not [r for r in records if r["kind"] == "guard"]

        class Counting(_Net):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                self.calls = getattr(self, "calls", 0) + 1  # a Python int attribute dynamo guards on
                return super().forward(x) * self.calls

        torch._dynamo.reset()
        records = fit(Counting, "recompiling")
        found = [(r["code"], r["where"]) for r in records if r["kind"] == "guard"]
        assert ("TW115", "Counting.forward (recompile limit)") in found
        assert records[-1]["compiled_graphs"] == 8
    finally:
        torch.compiler.set_default_backend(previous)
