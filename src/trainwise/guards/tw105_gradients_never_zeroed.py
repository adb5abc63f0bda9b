"""TW105 at run time: an optimizer step whose gradients still hold those of the previous step."""

from __future__ import annotations

import functools
import operator
import weakref
from collections.abc import Callable
from typing import Any

import torch

from trainwise.guards.check import Check

_WATCHED = 4  # parameters whose gradient tensors are followed from one step to the next
_GRAD = operator.attrgetter("grad")
_CALL = operator.methodcaller("__call__")  # a weak reference's referent
_NOT_NONE = functools.partial(operator.is_not, None)


class GradientsNeverZeroed(Check):
    """No ``zero_grad()`` between two steps and the same gradient tensors as after the last step: ``backward()``
    added to them, so the step applies every earlier batch's gradient again.

    ``optimizer.zero_grad`` and ``model.zero_grad`` are wrapped (instance attributes, removed at ``close``) to
    note that zeroing happened, on every wrapper as well: Lightning's ``LightningOptimizer.zero_grad`` zeroes
    the gradients without calling the inner optimizer's, DDP's zeroes them without the module's. ``p.grad =
    None`` by hand replaces the tensors, which weak references notice. A step given a closure (LBFGS,
    Lightning's automatic optimization) runs ``zero_grad`` and ``backward`` inside ``step()``: judged after it.
    """

    code = "TW105"

    def on_install(self) -> None:
        self._zeroed = False
        self._done = False
        self._last: list[weakref.ref[torch.Tensor]] = []  # the watched gradients after the last step
        self._last_params: list[torch.Tensor] = []  # their parameters
        self._saved: list[tuple[Any, Any]] = []  # (owner, its own zero_grad attribute or None) to restore
        optimizer = self.guard.optimizer
        if optimizer is None:
            self._watched: list[torch.Tensor] = []
            return
        self._watched = [p for group in optimizer.param_groups for p in group["params"]][:_WATCHED]
        for owner in [*self.guard.optimizer_layers, *self.guard.model_layers]:
            self._wrap(owner)

    def _wrap(self, owner: Any) -> None:
        own = vars(owner).get("zero_grad")
        self._saved.append((owner, own))
        object.__setattr__(owner, "zero_grad", _ZeroGradSpy(owner, owner.zero_grad, self))

    def note_zeroed(self) -> None:
        self._zeroed = True

    def before_step(self, optimizer: torch.optim.Optimizer) -> None:
        if not self.guard.closure_step:  # otherwise the gradients this step applies do not exist yet
            self._judge(optimizer)

    def _judge(self, optimizer: torch.optim.Optimizer) -> None:
        if self._zeroed or self._done or not self._last:
            self._zeroed = False
            return
        if all(map(operator.is_, map(_GRAD, self._last_params), map(_CALL, self._last))):
            self._done = True
            self.guard.report(
                self.code, type(optimizer).__name__,
                "no zero_grad() ran since the last step and backward() added to the same gradients, so this step "
                "applies every earlier batch's gradient again; call optimizer.zero_grad(set_to_none=True) once "
                "per step, before backward() or after step().",
            )

    def after_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.guard.closure_step:
            self._judge(optimizer)
        if self._done:
            return
        grads = list(map(_GRAD, self._watched))  # map runs in C: this is on every step's path
        if all(map(_NOT_NONE, grads)):
            self._last, self._last_params = list(map(weakref.ref, grads)), self._watched
        else:
            kept = [(p, g) for p, g in zip(self._watched, grads) if g is not None]
            self._last, self._last_params = [weakref.ref(g) for _, g in kept], [p for p, _ in kept]

    def close(self) -> None:
        for owner, own in self._saved:
            if own is None:
                vars(owner).pop("zero_grad", None)
            else:
                object.__setattr__(owner, "zero_grad", own)
        self._saved.clear()
        self._last.clear()


class _ZeroGradSpy:
    """``owner.zero_grad`` that tells the check zeroing happened. A deep copy or a pickle of the owner (an EMA
    copy of the model, ``torch.save(model)``) gets the plain method bound to the copy instead: the spy, which
    holds the guard, never travels with it."""

    def __init__(self, owner: Any, original: Callable[..., Any], check: GradientsNeverZeroed) -> None:
        self.owner, self.original, self.check = owner, original, check

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.check.note_zeroed()
        return self.original(*args, **kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        copied = memo.get(id(self.owner), self.owner)
        return functools.partial(type(self.owner).zero_grad, copied)

    def __reduce__(self) -> tuple[Any, ...]:
        return functools.partial, (type(self.owner).zero_grad, self.owner)
