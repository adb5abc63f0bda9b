"""TW102 at run time: a loss or model output with autograd history kept across optimizer steps.

Each training forward's output gets a token: a tiny object stored in the ``metadata`` dict of the output's
``grad_fn`` node (about 1 µs, cheaper than a hook). The node owns it, so the token lives exactly as long as
that forward's autograd graph; the guard holds it only by a weak reference. A token still alive two optimizer
steps after its forward means something (``total += loss``, ``losses.append(loss)``, a dict entry) keeps the
graph. The output itself is not touched: same object, same values, in-place operations still allowed. Only the
forwards of a few sampled steps are tagged (steps 0, 32, 64, 128, 256, then one in 256: ``check.sample_gap``):
what keeps one graph keeps them all.
"""

from __future__ import annotations

import collections
import weakref
from typing import Any

import torch

from trainwise.guards.check import Check, sample_gap
from trainwise.guards.outputs import tensors_with_graph

_WHERE = "(the model)"
_KEY = "trainwise.TW102"  # the token's key in grad_fn.metadata
_LAG = 3  # a forward made when guard.step was s is judged after step s + 3: two full steps after its own
_MAX_PENDING = 4096  # forwards waiting for their verdict, at most (a loop that takes no step): then none is tagged


class GraphLifetime:
    """A token stored in the ``metadata`` dict of a forward output's ``grad_fn``: the node owns it, so it lives
    exactly as long as that forward's autograd graph, and the guard holds it only by a weak reference."""

    __slots__ = ("__weakref__",)


class GraphKeptAcrossSteps(Check):
    """A training forward whose autograd graph is still alive two optimizer steps later: a running total or a
    list keeps the loss (or the output) with its graph, so memory grows every step."""

    code = "TW102"

    def __init__(self, guard: Any) -> None:
        super().__init__(guard)
        self._pending: collections.deque[tuple[int, weakref.ref[GraphLifetime]]] = collections.deque()
        self._done = False

    def on_install(self) -> None:
        # nothing runs on the steps between: a sampled step's forwards are tagged (after_forward listened to
        # from step s to s + 1) and judged after step s + _LAG, at calls the guard makes on those steps only
        if self.guard.optimizer is None and not self.guard.steps_at_backward:  # no step to keep a graph across
            self.guard.listen(self, "after_forward", False)
            return
        self._sample(first=True)

    def _sample(self, *, first: bool = False) -> None:
        if self._done:
            return
        step = self.guard.step
        if not first:
            self.guard.listen(self, "after_forward", True)
        self.guard.at_step(step + 1, self._stop_tagging)
        self.guard.at_step(step + _LAG, self._judge)
        self.guard.at_step(step + sample_gap(step), self._sample)

    def take_over(self, previous: Check) -> None:
        # the forwards the replaced guard tagged came before this guard's first step: they are its step 0's
        if not isinstance(previous, GraphKeptAcrossSteps):
            return
        if previous._done:
            self._done = True
            return
        self._pending.extendleft((0, ref) for _, ref in reversed(previous._pending) if ref() is not None)

    def _stop_tagging(self) -> None:
        self.guard.listen(self, "after_forward", False)

    def after_forward(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        if self._done or not module.training or not torch.is_grad_enabled():
            return None
        if len(self._pending) >= _MAX_PENDING:  # forwards without a step (no optimizer step, no backward)
            self.guard.listen(self, "after_forward", False)
            return None
        tensors = tensors_with_graph(output)
        if not tensors:
            return None
        token = GraphLifetime()
        try:
            for tensor in tensors:
                tensor.grad_fn.metadata[_KEY] = token  # type: ignore[union-attr]
        except (RuntimeError, TypeError, AttributeError):  # an exotic node or tensor subclass: skip silently
            return None
        self._pending.append((self.guard.step, weakref.ref(token)))
        return None

    def _judge(self) -> None:
        """Report the forwards made ``_LAG`` or more steps ago whose graphs are still alive."""
        pending = self._pending
        limit = self.guard.step - _LAG
        kept: list[int] = []
        while pending and pending[0][0] <= limit:
            step, ref = pending.popleft()
            if ref() is not None:
                kept.append(step)
        if kept and not self._done:
            self._report(kept)

    def _report(self, kept: list[int]) -> None:
        self._done = True  # reported once: stop tagging
        self._pending.clear()
        self.guard.report(
            self.code, _WHERE,
            f"a tensor with autograd history from the forward before step {kept[0] + 1} is still alive at step "
            f"{self.guard.step} ({len(kept)} forward graph(s) of two or more steps ago kept, each with the "
            f"activations no backward has freed, and one more every step): store `loss.item()` or "
            f"`loss.detach()` in running totals, lists and dicts instead of the tensor itself.",
        )

    def close(self) -> None:
        self._pending.clear()
