"""TW105 at run time: an optimizer step whose gradients still hold those of the previous step."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch

from trainwise.guards.check import Check, sample_gap

_CANDIDATES = 4  # the first parameters, of which the first with a gradient has it followed from step to step


class GradientsNeverZeroed(Check):
    """No ``zero_grad()`` between two steps and the same gradient tensors as after the first of them: ``backward()``
    added to them, so the step applies every earlier batch's gradient again.

    ``optimizer.zero_grad`` and ``model.zero_grad`` are wrapped (instance attributes, removed at ``close``) to
    note that zeroing happened, on every wrapper as well: Lightning's ``LightningOptimizer.zero_grad`` zeroes
    the gradients without calling the inner optimizer's, DDP's zeroes them without the module's. ``p.grad =
    None`` by hand replaces the tensors, which weak references notice. A step given a closure (LBFGS,
    Lightning's automatic optimization) runs ``zero_grad`` and ``backward`` inside ``step()``: judged after it.

    A loop that forgets to zero does so on every step, so pairs of consecutive steps are judged, not every step:
    steps 0 and 1, then 33 and 34, 66 and 67, 133 and 134, 266 and 267, then one pair in 257 steps (the gaps of
    ``check.sample_gap``, made odd, so a loop that zeroes on every other step is caught too). The spies are set
    for the pairs only: the steps between cost nothing.
    """

    code = "TW105"

    def on_install(self) -> None:
        self.zeroed = False  # set by the spies: a zero_grad ran since the pair's first step
        # the followed gradient as the pair's first step applied it, and its parameter: one only, since a weak
        # reference to a gradient costs about a microsecond (torch keeps the tensor's Python object alive for it)
        self._last: weakref.ref[torch.Tensor] | None = None
        self._last_param: torch.Tensor | None = None
        self._spies: list[_ZeroGradSpy] = []  # one per owner, set during a judged pair only
        self._spying = False
        self._kept = False  # a spy was wrapped again by someone else: all stay until close
        self.guard.listen(self, "after_step", False)  # needed only once a step is given a closure
        optimizer = self.guard.optimizer
        if optimizer is None:
            self._watched: list[torch.Tensor] = []
            self.guard.listen(self, "before_step", False)
            return
        self._watched = [p for group in optimizer.param_groups for p in group["params"]][:_CANDIDATES]
        self._spies = [_ZeroGradSpy(owner, self) for owner in [*self.guard.optimizer_layers, *self.guard.model_layers]]
        self._spy(True)  # the first pair starts now

    def _spy(self, on: bool) -> None:
        """Set the zeroing spies (a pair starts) or take them away (it ended), unless another wrapper now sits
        over one of them: then they stay until close."""
        if on == self._spying or (not on and self._kept):
            return
        if not on and any(vars(spy.owner).get("zero_grad") is not spy for spy in self._spies):
            self._kept = True
            return
        self._spying = on
        for spy in self._spies:
            spy.set() if on else spy.unset()

    def before_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.guard.closure_step:  # the gradients this step applies do not exist yet: judged after it
            self.guard.listen(self, "after_step", True)
            return
        self._visit(optimizer)

    def after_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.guard.closure_step:
            self._visit(optimizer)

    def _visit(self, optimizer: torch.optim.Optimizer) -> None:
        """A pair's first step follows the gradient it applies; its second reports when no zeroing ran and the
        followed gradient is still the same tensor (a step never replaces gradients), then the pair ends."""
        if self._last is None:
            self.zeroed = False
            for param in self._watched:
                grad = param.grad
                if grad is not None:
                    self._last, self._last_param = weakref.ref(grad), param
                    return
            return  # no gradient yet: the next step starts the pair
        same = not self.zeroed and self._last_param.grad is self._last()  # type: ignore[union-attr]
        self._last = self._last_param = None
        self.guard.listen(self, "before_step", False)
        self.guard.listen(self, "after_step", False)
        self._spy(False)
        if not same:
            # the next pair starts an odd sample gap after this one started (the step before this)
            started = self.guard.step - 1
            self.guard.at_step(started + sample_gap(started, odd=True), self._start_pair)
            return
        self.guard.report(
            self.code, type(optimizer).__name__,
            "no zero_grad() ran since the last step and backward() added to the same gradients, so this step "
            "applies every earlier batch's gradient again; call optimizer.zero_grad(set_to_none=True) once "
            "per step, before backward() or after step().",
        )

    def _start_pair(self) -> None:
        self._spy(True)
        self.guard.listen(self, "before_step", True)

    def close(self) -> None:
        for spy in self._spies:
            spy.unset()
        self._spies.clear()
        self._spying = False
        self._last = self._last_param = None


class _ZeroGradSpy:
    """``owner.zero_grad`` that tells the check zeroing happened, set as an instance attribute over whatever
    ``zero_grad`` the owner has when set (``unset`` puts that back, unless another wrapper sits over the spy now,
    which stays). A deep copy or a pickle of the owner (an EMA copy of the model, ``torch.save(model)``) gets the
    plain method bound to the copy instead: the spy, which holds the guard, never travels with it."""

    def __init__(self, owner: Any, check: GradientsNeverZeroed) -> None:
        self.owner, self.check = owner, check
        self.own: Any = None  # the owner's own zero_grad attribute when set (None: the class's method)
        self.original: Callable[..., Any] = owner.zero_grad

    def set(self) -> None:
        attributes = vars(self.owner)
        if attributes.get("zero_grad") is self:
            return
        self.own = attributes.get("zero_grad")
        self.original = self.owner.zero_grad
        object.__setattr__(self.owner, "zero_grad", self)

    def unset(self) -> None:
        attributes = vars(self.owner)
        if attributes.get("zero_grad") is not self:
            return
        if self.own is None:
            del attributes["zero_grad"]
        else:
            object.__setattr__(self.owner, "zero_grad", self.own)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.check.zeroed = True
        return self.original(*args, **kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        copied = memo.get(id(self.owner), self.owner)
        return functools.partial(type(self.owner).zero_grad, copied)

    def __reduce__(self) -> tuple[Any, ...]:
        return functools.partial, (type(self.owner).zero_grad, self.owner)
