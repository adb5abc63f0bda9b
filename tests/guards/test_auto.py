"""``AutoGuard``: a Guard on every root model of the process and its optimizer, found through torch's global hooks,
with each finding placed at the caller's line; nothing kept alive, nothing left behind."""

from __future__ import annotations

import copy
import gc
import io
import pickle
import sys
import warnings
import weakref

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.modules import module as module_hooks

from trainwise.guards.auto import AutoGuard


def _here() -> int:
    return sys._getframe(1).f_lineno


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, *, zero: bool = True) -> None:
    if zero:
        optimizer.zero_grad()
    F.cross_entropy(model(torch.randn(4, 3)), torch.tensor([0, 1, 0, 1])).backward()
    optimizer.step()


def test_an_optimizer_made_after_the_first_forward_is_paired_at_its_first_step():
    found = []
    auto = AutoGuard(on_finding=found.append).install()
    try:
        model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
        model(torch.randn(2, 3))  # guarded without an optimizer: none exists yet
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            F.cross_entropy(model(torch.randn(4, 3)), torch.tensor([0, 1, 0, 1])).backward()
            optimizer.step(); line = _here()  # noqa: E702
    finally:
        auto.close()
    assert [(f.code, f.place.line) for f in found] == [("TW105", line)]
    assert found[0].place.path == __file__


def test_only_root_models_are_guarded_and_a_part_called_alone_is_not_a_new_root():
    auto = AutoGuard().install()
    try:
        model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loss_fn = nn.CrossEntropyLoss()  # called at the top too, but it has no parameters
        for _ in range(2):
            optimizer.zero_grad()
            loss_fn(model(torch.randn(4, 3)), torch.tensor([0, 1, 0, 1])).backward()
            optimizer.step()
        model[0](torch.randn(2, 3))
        assert len(auto._roots) == 1
        guard = auto._roots[0].live_guards()[0]
        assert guard.model is model and guard.optimizer is optimizer
        assert not model[0]._forward_pre_hooks and not model[2]._forward_hooks  # the submodules: no hooks
        # a bigger model holding the guarded one takes over, with its optimizer
        bigger = nn.Sequential(model, nn.Linear(2, 2))
        bigger(torch.randn(2, 3))
        assert len(auto._roots) == 1 and auto._roots[0].live_guards()[0].optimizer is optimizer
    finally:
        auto.close()
    # true: the bigger model's new layer is in no optimizer group (said once the guard on it closes)
    assert [(f.code, f.finding.where) for f in auto.findings] == [("TW107", "1.weight")]


def test_close_removes_every_hook_and_a_dropped_model_is_freed():
    pre, post = len(module_hooks._global_forward_pre_hooks), len(module_hooks._global_forward_hooks)
    auto = AutoGuard().install()
    try:
        model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        _step(model, optimizer)
        dropped = weakref.ref(model), weakref.ref(optimizer)
        del model, optimizer
        gc.collect()
        assert dropped[0]() is None and dropped[1]() is None  # nothing of the guard keeps them alive
        assert not auto._modules and not auto._optimizers and not auto._stepped  # nor their entries
        assert auto._roots[0].model() is None
        kept = nn.Linear(3, 2)
        kept_optimizer = torch.optim.SGD(kept.parameters(), lr=0.1)
        _step(kept, kept_optimizer)
        assert len(auto._roots) == 1 and auto._roots[0].model() is kept  # the dropped model's root is gone
    finally:
        auto.close()
    assert (len(module_hooks._global_forward_pre_hooks), len(module_hooks._global_forward_hooks)) == (pre, post)
    assert not kept._forward_pre_hooks and not kept._forward_hooks
    assert not kept_optimizer._optimizer_step_pre_hooks and "zero_grad" not in vars(kept_optimizer)


def test_a_model_dropped_before_its_checks_ran_still_reports_at_its_own_line():
    # the interval's checks (TW113 reads its gradient norms every check_every steps) must not die with a model the
    # script drops, whenever the garbage collector frees it (CI once lost a TW113 this way)
    found = []
    auto = AutoGuard(on_finding=found.append).install()
    try:
        model = nn.Linear(3, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            optimizer.zero_grad()
            (model(torch.randn(4, 3)).sum() * float("inf")).backward()
            optimizer.step(); line = _here()  # noqa: E702
        del model, optimizer
        gc.collect(); elsewhere = _here()  # noqa: E702
        assert [(f.code, f.place.line) for f in found] == [("TW113", line)]  # before close, at the step's line
    finally:
        auto.close()
    assert elsewhere not in [f.place.line for f in auto.findings]
    assert [f.code for f in auto.findings] == ["TW113"]


def test_two_models_each_get_their_own_guard_and_optimizer():
    auto = AutoGuard().install()
    try:
        generator, critic = nn.Linear(3, 3), nn.Linear(3, 2)
        g_opt = torch.optim.SGD(generator.parameters(), lr=0.1)
        c_opt = torch.optim.SGD(critic.parameters(), lr=0.1)
        for _ in range(3):
            g_opt.zero_grad()
            c_opt.zero_grad()
            F.cross_entropy(critic(generator(torch.randn(4, 3))), torch.tensor([0, 1, 0, 1])).backward()
            g_opt.step()
            c_opt.step()
        pairs = {(type(r.model()).__name__, id(g.optimizer)) for r in auto._roots for g in r.live_guards()}
    finally:
        auto.close()
    assert pairs == {("Linear", id(g_opt)), ("Linear", id(c_opt))}
    assert auto.findings == []


def test_a_model_that_cannot_be_guarded_is_said_once_and_the_code_runs_on(monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise RuntimeError("an exotic model")

    monkeypatch.setattr(AutoGuard, "_attach", refuse)
    auto = AutoGuard().install()
    try:
        model = nn.Linear(3, 2)
        outputs = [model(torch.ones(1, 3)) for _ in range(2)]
    finally:
        auto.close()
    assert torch.equal(outputs[0], outputs[1])
    assert capsys.readouterr().err == "trainwise: could not guard a Linear, left unguarded: an exotic model\n"


@pytest.mark.slow
def test_a_compiled_model_is_guarded_without_changing_what_it_computes():
    def train() -> float:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
        compiled = torch.compile(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
        for _ in range(3):
            F.cross_entropy(compiled(x), y).backward()  # never zeroed: TW105
            optimizer.step()
        return F.cross_entropy(model(x), y).item()

    plain = train()
    torch._dynamo.reset()
    auto = AutoGuard().install()
    try:
        with warnings.catch_warnings(record=True) as caught:
            guarded = train()
    finally:
        auto.close()
    assert guarded == plain
    assert not [w for w in caught if "global hooks" in str(w.message)]  # torch's warning about our hooks: silenced
    assert [f.code for f in auto.findings] == ["TW105"]


SHARED = """
import torch
from torch import nn
from torch.nn import functional as F

model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
encoder_opt = torch.optim.SGD(model[0].parameters(), lr=0.1)
decoder_opt = torch.optim.Adam(model[2].parameters(), lr=0.1)
for _ in range(3):
    decoder_opt.zero_grad()
    F.cross_entropy(model(torch.randn(4, 3)), torch.tensor([0, 1, 0, 1])).backward()
    encoder_opt.step()  # encoder_opt is never zeroed: TW105
    decoder_opt.step()
"""


def test_two_optimizers_of_one_model_both_guarded_without_a_false_coverage_finding():
    auto = AutoGuard().install()
    try:
        exec(compile(SHARED, "<shared>", "exec"), {"__name__": "__main__"})  # module-level code, as in a script
    finally:
        auto.close()
    assert [(f.code, f.finding.where, f.place.line) for f in auto.findings] == [("TW105", "SGD", 12)]


@pytest.mark.slow
def test_the_global_hooks_add_no_graph_and_no_break_to_a_compiled_model():
    """The global hooks are traced inside a compiled region: they must return before reading any state of theirs
    (a nested call that read which root runs made dynamo fail on the module it found there)."""
    from torch._dynamo.utils import counters

    def train() -> tuple[float, dict, dict]:
        torch._dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
        compiled = torch.compile(model, backend="eager")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
        for _ in range(4):
            optimizer.zero_grad()
            F.cross_entropy(compiled(x), y).backward()
            optimizer.step()
        with torch.no_grad():
            compiled(x)
        return F.cross_entropy(model(x), y).item(), dict(counters["stats"]), dict(counters["graph_break"])

    plain = train()
    auto = AutoGuard().install()
    try:
        guarded = train()
    finally:
        auto.close()
    assert guarded == plain and not guarded[2]
    assert auto.findings == []


class _Probe(nn.Module):
    """Records how many global forward hooks torch holds while it runs (inside the model's forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(len(module_hooks._global_forward_pre_hooks) + len(module_hooks._global_forward_hooks))
        return x


def test_the_global_hooks_step_aside_while_a_guarded_models_forward_runs():
    """Inside a guarded root's forward torch holds none of the global hooks, so every submodule call takes
    torch's direct path; between forwards they are back to find new models."""
    before = len(module_hooks._global_forward_pre_hooks) + len(module_hooks._global_forward_hooks)
    auto = AutoGuard().install()
    try:
        probe = _Probe()
        model = nn.Sequential(nn.Linear(3, 4), probe, nn.Linear(4, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            _step(model, optimizer)
        between = len(module_hooks._global_forward_pre_hooks) + len(module_hooks._global_forward_hooks)
        second = nn.Linear(3, 2)  # a new model called at the top between the first one's forwards: found
        second_optimizer = torch.optim.SGD(second.parameters(), lr=0.1)
        _step(second, second_optimizer, zero=False)
        _step(second, second_optimizer, zero=False)
        roots = [r.model() for r in auto._roots]
    finally:
        auto.close()
    assert probe.seen == [before] * 3 and between == before + 2
    assert roots == [model, second]
    assert [f.code for f in auto.findings] == ["TW105"]  # the second model's, never zeroed


class _Interrupted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.stop = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stop:
            raise KeyboardInterrupt  # Ctrl-C inside the forward: torch calls no forward hook after it
        return self.lin(x)


def test_a_forward_left_by_ctrl_c_does_not_stop_the_finding_of_new_models():
    before = len(module_hooks._global_forward_pre_hooks) + len(module_hooks._global_forward_hooks)
    auto = AutoGuard().install()
    try:
        model = _Interrupted()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        _step(model, optimizer)
        model.stop = True
        with pytest.raises(KeyboardInterrupt):
            model(torch.randn(4, 3))
        model.stop = False
        _step(model, optimizer)  # the script goes on (it caught the interrupt): the step puts the hooks back
        assert len(module_hooks._global_forward_pre_hooks) + len(module_hooks._global_forward_hooks) == before + 2
        second = nn.Linear(3, 2)
        second_optimizer = torch.optim.SGD(second.parameters(), lr=0.1)
        _step(second, second_optimizer)
        roots = [r.model() for r in auto._roots]
    finally:
        auto.close()
    assert roots == [model, second]
    assert len(module_hooks._global_forward_pre_hooks) + len(module_hooks._global_forward_hooks) == before


class _Seq(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _plain_state(module: nn.Module) -> list[tuple[str, list[str], int]]:
    """What a module holds, per submodule: its attributes and how many forward hooks."""
    return [(name, sorted(vars(m)), len(m._forward_hooks) + len(m._forward_pre_hooks))
            for name, m in module.named_modules()]


def test_a_guarded_model_pickles_deep_copies_and_saves_as_the_plain_model_and_stays_guarded():
    """torch.save(model) of a whole model, an EMA deep copy, a model sent to a spawned process: none carries
    anything of trainwise, and the model itself is still guarded afterwards."""
    plain = _plain_state(_Seq())
    auto = AutoGuard().install()
    try:
        model = _Seq()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        _step(model, optimizer)
        pickled = pickle.dumps(model)
        ema = copy.deepcopy(model)
        buffer = io.BytesIO()
        torch.save(model, buffer)
        assert b"trainwise" not in pickled and b"trainwise" not in buffer.getvalue()
        buffer.seek(0)
        for twin in (pickle.loads(pickled), ema, torch.load(buffer, weights_only=False)):
            assert _plain_state(twin) == plain
            x = torch.randn(2, 3)
            assert torch.equal(twin(x), model(x))
        _step(model, optimizer, zero=False)
        _step(model, optimizer, zero=False)
    finally:
        auto.close()
    assert [f.code for f in auto.findings] == ["TW105"]  # still guarded
    assert _plain_state(model) == plain  # and nothing left on it after close


def test_an_optimizer_local_to_a_function_loses_none_of_the_first_steps():
    """The layout of pytorch/examples: the optimizer is a local of main(), met at its first step, after the model's
    first forward; the first step's samples are kept (TW102 found at step 3, TW109 at step 0, as with a global)."""
    found = []
    auto = AutoGuard(on_finding=found.append).install()
    try:
        model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        total = 0
        for _ in range(6):
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.cross_entropy(model(torch.randn(4, 3)), torch.tensor([0, 1, 0, 1]))
            loss.backward()
            optimizer.step()
            total += loss
    finally:
        auto.close()
    assert sorted((f.code, f.finding.step) for f in found) == [("TW102", 3), ("TW109", 0)]
