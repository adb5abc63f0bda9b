"""The runtime guard itself: hooks in and out, one report per code and place, warn or raise."""

from __future__ import annotations

import copy
import inspect
import io
import pickle
import warnings

import pytest
import torch
from torch import nn

import trainwise as tw


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _train(model, optimizer, steps=3):
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(5, 4)).pow(2).mean().backward()
        optimizer.step()


def test_a_module_attribute_requires_grad_is_reported_once_with_its_name():
    model = _model()
    model[0].requires_grad = False  # freezes nothing
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tw.guard(model, optimizer, check_every=1) as guard:
            _train(model, optimizer)
    found = [w.message for w in caught if isinstance(w.message, tw.guards.GuardWarning)]
    assert [(f.code, f.where) for f in guard.findings] == [("TW110", "0")]
    assert len(found) == 1 and found[0].code == "TW110" and found[0].where == "0"
    assert "requires_grad_(False)" in str(found[0]) and "--explain TW110" in str(found[0])


def test_the_corrected_loop_gets_nothing():
    model = _model()
    model[0].requires_grad_(False)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tw.guards.GuardWarning)
        with tw.guard(model, optimizer) as guard:
            _train(model, optimizer)
    assert guard.findings == []


def test_raise_and_unknown_codes():
    model = _model()
    model.requires_grad = False
    with pytest.raises(tw.guards.GuardError) as caught:
        tw.guard(model, action="raise")
    assert caught.value.code == "TW110" and caught.value.where == "(the model)"
    with pytest.raises(tw.TrainwiseError, match="no runtime guard has code 'TW999'"):
        tw.guard(_model(), checks=["TW999"])


def test_closing_removes_every_hook_and_changes_nothing():
    guarded, plain = _model(), _model()
    opt_guarded = torch.optim.AdamW(guarded.parameters(), lr=1e-2)
    opt_plain = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    torch.manual_seed(1)
    with tw.guard(guarded, opt_guarded) as guard:
        _train(guarded, opt_guarded, steps=5)
    torch.manual_seed(1)
    _train(plain, opt_plain, steps=5)
    assert guard.step == 5
    for a, b in zip(guarded.parameters(), plain.parameters()):
        assert torch.equal(a, b)
    assert not guarded._forward_hooks and not guarded._forward_pre_hooks and "forward" not in vars(guarded)
    assert not opt_guarded._optimizer_step_pre_hooks and not opt_guarded._optimizer_step_post_hooks


def test_a_closed_guard_keeps_no_wrapper_alive():
    # a DDP wrapper kept alive past its process group aborts gloo at interpreter exit (exit -6, not the
    # script's own code): after close the guard holds only the user's module and optimizer
    import gc
    import weakref

    model = nn.Linear(4, 2)
    wrapper = nn.DataParallel(model)  # on CPU it only calls the module: a wrapper like DDP's
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = tw.guard(wrapper, optimizer)
    wrapper(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    guard.close()
    gone = weakref.ref(wrapper)
    del wrapper
    gc.collect()
    assert gone() is None
    assert guard.model is model and guard.optimizer is optimizer


def test_a_finding_points_to_the_doctors_page_exactly_when_the_doctor_explains_its_code():
    """Every guard code has a `trainwise doctor --explain` page but those in NOT_EXPLAINED (TW115: a runtime
    guard whose doctor rule does not exist yet), whose findings point to their lab only. When the doctor gains a
    rule for one, take it out of NOT_EXPLAINED."""
    from trainwise.doctor.rules import rule_for
    from trainwise.guards.core import NOT_EXPLAINED, GuardFinding
    from trainwise.guards.registry import all_check_classes

    for code in [cls.code for cls in all_check_classes()]:
        text = str(GuardFinding(code=code, step=1, where="x", message="m"))
        assert (rule_for(code) is None) == (code in NOT_EXPLAINED), code
        assert ("--explain" in text) == (code not in NOT_EXPLAINED), text


class _Holder(nn.Module):
    """What a LightningModule is: a module holding the network in ``self.net``, whose forward calls it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.3), nn.Linear(8, 2))

    def forward(self, x):
        return self.net(x)


@pytest.mark.parametrize("given", [False, True], ids=["model-only", "forwards"])
def test_a_submodule_in_forwards_is_checked_when_called_directly(given):
    holder = _Holder()
    with tw.guard(holder, action="record") if not given else tw.Guard(
            holder, action="record", forwards=[holder.net]) as guard, torch.no_grad():
        holder.net(torch.randn(3, 4))  # an evaluation in train mode, through the submodule
    assert [(f.code, f.where) for f in guard.findings] == ([("TW103", "net.1")] if given else [])
    assert not holder.net._forward_pre_hooks and not holder.net._forward_hooks and not holder._forward_hooks


def test_a_call_of_a_forwards_module_inside_the_model_is_checked_once(monkeypatch):
    from trainwise.guards.tw112_batch_on_another_device import BatchOnAnotherDevice

    calls = []
    original = BatchOnAnotherDevice.before_forward  # looks before every checked forward on the hook path
    monkeypatch.setattr(BatchOnAnotherDevice, "before_forward",
                        lambda self, *args: (calls.append(1), original(self, *args))[1])
    holder = _Holder()
    with tw.Guard(holder, action="record", forwards=[holder.net, holder.net[0]]):
        holder(torch.randn(3, 4))  # the model's forward, calling net, calling net[0]
        assert len(calls) == 1
        holder.net(torch.randn(3, 4))  # net directly, calling net[0]
        assert len(calls) == 2
        with pytest.raises(RuntimeError):
            holder.net(torch.randn(3, 5))  # a forward that fails leaves the count right
        holder.net[0](torch.randn(3, 4))
        assert len(calls) == 4


def test_forwards_must_be_submodules_of_the_model():
    holder = _Holder()
    with pytest.raises(tw.TrainwiseError, match="forwards must be submodules of the guarded model; a Linear"):
        tw.Guard(holder, forwards=[nn.Linear(2, 2)])
    with pytest.raises(tw.TrainwiseError, match="forwards must be submodules"):
        tw.Guard(holder, forwards=[holder])


def test_forwards_with_a_compiled_model_add_no_graph_break():
    from torch._dynamo.utils import counters

    holder = _Holder()
    compiled = torch.compile(holder, backend="eager")
    optimizer = torch.optim.SGD(holder.parameters(), lr=0.1)
    torch._dynamo.reset()
    counters.clear()
    kept = []
    with tw.Guard(compiled, optimizer, action="record", forwards=[holder.net]) as guard:
        for _ in range(4):
            for call in (compiled, holder.net):  # the compiled model, and its submodule directly
                out = call(torch.randn(3, 4))
                out.sum().backward()
                optimizer.step()
                optimizer.zero_grad()
                if call is compiled:
                    kept.append(out)  # TW102, through the compiled model
        with torch.no_grad():
            holder.net(torch.randn(3, 4))  # TW103, through the submodule
    breaks = sum(counters["graph_break"].values())
    torch._dynamo.reset()
    assert breaks == 0 and guard._depth == 0
    assert [(f.code, f.where) for f in guard.findings] == [("TW102", "(the model)"), ("TW103", "net.1")]


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def forward(self, input_ids: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.layer(input_ids) * scale


def test_a_deep_copy_of_a_guarded_model_computes_with_its_own_weights_unguarded():
    """An EMA copy made with deepcopy during training: its forward is its own, not the guarded model's."""
    model = _Net()
    with tw.guard(model, torch.optim.SGD(model.parameters(), lr=0.1), action="record") as guard:
        twin = copy.deepcopy(model)
        assert getattr(vars(twin).get("forward"), "guard", None) is None  # no copy of the guard travels with it
        with torch.no_grad():
            twin.layer.weight.add_(1.0)
        x = torch.randn(3, 4)
        assert not torch.equal(twin(x), model(x))
        assert torch.equal(twin(x), twin.layer(x))
        twin.train()
        with torch.no_grad():
            twin(x)  # no guard runs on the copy: nothing is reported for it
    assert guard.findings == []


def test_a_guarded_model_pickles_and_loads_as_a_plain_model():
    model = _Net()
    with tw.guard(model, torch.optim.SGD(model.parameters(), lr=0.1), action="record"):
        buffer = io.BytesIO()
        torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    x = torch.randn(3, 4)
    assert torch.equal(loaded(x), model(x))
    assert sorted(vars(loaded)) == sorted(vars(_Net()))  # no forward of the guard's, not even a stand-in


class _Lightning(nn.Module):
    """A LightningModule's shape: the guard (Lightning's callback's) hooks the submodule training_step calls."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@pytest.mark.parametrize("how", ["forwards", "forward_every", "compiled"])
def test_a_model_with_the_guards_hooks_pickles_and_copies_without_them(how):
    """Where the guard hooks the forward rather than wrapping it (``forwards=``, a compiled module): pickle, deep
    copy and torch.save give the module as it is without the guard, which goes on watching the model."""
    model = _Lightning()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    options = {"forwards": {"forwards": [model.net]}, "forward_every": {"forward_every": 8},
               "compiled": {"other_wrappers": [torch.compile(model)]}}[how]
    plain = [(name, sorted(vars(m))) for name, m in model.named_modules()]
    with tw.guard(model, optimizer, action="record") as guard:
        guard_options = tw.Guard(model, optimizer, action="record", **options)
        model.net(torch.randn(5, 4)).sum().backward()
        optimizer.step()
        pickled = pickle.dumps(model)
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        for twin in (pickle.loads(pickled), copy.deepcopy(model), torch.load(buffer, weights_only=False)):
            assert [(name, sorted(vars(m))) for name, m in twin.named_modules()] == plain
            assert not any(m._forward_hooks or m._forward_pre_hooks for m in twin.modules())
        assert b"trainwise" not in pickled
        model.net(torch.randn(5, 4)).sum().backward()
        optimizer.step()  # gradients never zeroed: still watched
        guard_options.close()
    assert [f.code for f in guard.findings] == ["TW105"]
    assert [(name, sorted(vars(m))) for name, m in model.named_modules()] == plain


def test_the_guarded_forward_has_the_models_signature():
    """The Hugging Face Trainer keeps only the dataset columns named in ``inspect.signature(model.forward)``."""
    model = _Net()
    before = inspect.signature(model.forward)
    with tw.guard(model, action="record"):
        assert inspect.signature(model.forward) == before
        assert list(inspect.signature(model.forward).parameters) == ["input_ids", "scale"]


def test_a_forward_wrapped_before_or_after_the_guard_is_kept_and_guards_unwind_in_any_order():
    model = _Net()
    own = vars(model).setdefault("forward", model.forward)  # an instance forward set before (Accelerate's)
    first = tw.guard(model, action="record")
    second = tw.guard(model, action="record")
    first.close()  # under the second: stays in its chain until that one goes
    x = torch.randn(3, 4)
    assert torch.equal(model(x), model.layer(x))
    second.close()
    assert vars(model)["forward"] is own
    guard = tw.guard(model, action="record")
    over = vars(model)["forward"]
    vars(model)["forward"] = lambda *args, **kwargs: over(*args, **kwargs) * 2  # wrapped again after the guard
    guard.close()
    assert torch.equal(model(x), model.layer(x) * 2)  # the later wrapper works; the closed guard passes through
    with torch.no_grad():
        model.train()
        model(x)
    assert guard.findings == []


@pytest.mark.parametrize("forward_every", [1, 8])
def test_a_correct_step_between_samples_and_checks_calls_no_check(monkeypatch, forward_every):
    """Every check is sampled or scheduled: on the steps between, a correct loop runs no check's code at all."""
    from trainwise.guards.registry import check_classes

    calls = []
    events = ("before_forward", "after_forward", "after_eval_forward", "on_forward_error", "before_step",
              "after_step", "on_check")
    for cls in check_classes(None):
        for event in events:
            if event in vars(cls):
                original = getattr(cls, event)

                def spy(self, *args, _original=original, _event=event):
                    calls.append((self.code, _event, self.guard.step))
                    return _original(self, *args)

                monkeypatch.setattr(cls, event, spy)
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with tw.guard(model, optimizer, check_every=50, forward_every=forward_every) as guard:
        _train(model, optimizer, steps=30)
        assert guard.findings == []
    assert not [call for call in calls if 4 <= call[2] < 30], sorted({c[:2] for c in calls if 4 <= c[2] < 30})
