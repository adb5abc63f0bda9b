"""TW104 at run time: an evaluation forward (model in eval mode) with autograd on, never backpropagated.

Each such forward's output gets a token, a pre-hook on its ``grad_fn`` that the node owns: the token marks a
backward pass going through the output, and dies with the graph. Seen at the next forward (and at each
check): a graph freed without a backward, or one still alive and untouched after an optimizer step or when
the guard closes, recorded activations for nothing; the evaluation wanted ``torch.no_grad()``. Training
forwards call nothing here while no tagged output waits for its verdict.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from trainwise.guards.check import Check
from trainwise.guards.outputs import tensors_with_graph

_WHERE = "(the model)"
_MAX_PENDING = 4096  # evaluation forwards whose graphs are alive and waiting, at most


class BackpropMark:
    """Whether a backward pass reached a forward's output: outlives the graph, so it can be read afterwards."""

    __slots__ = ("backpropagated", "step")

    def __init__(self, step: int) -> None:
        self.step = step
        self.backpropagated = False


class GraphToken:
    """A pre-hook on a forward output's ``grad_fn``: owned by the node, so it lives as long as the graph;
    marks ``seen.backpropagated`` when a backward pass goes through that output."""

    __slots__ = ("__weakref__", "seen")

    def __init__(self, seen: BackpropMark) -> None:
        self.seen = seen

    def __call__(self, grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
        self.seen.backpropagated = True
        return None  # gradients unchanged


Pending = tuple[weakref.ref[GraphToken], BackpropMark, list[RemovableHandle]]


def attach_token(output: Any, step: int, on_freed: Callable[[Any], None]) -> Pending | None:
    """Hook one fresh token on the ``grad_fn`` of each tensor of ``output`` with a graph: a weak reference to
    it (dead once every one of those graphs is freed; ``on_freed`` called then), its mark and the hooks'
    handles; None when nothing can be tagged."""
    tensors = tensors_with_graph(output)
    if not tensors:
        return None
    seen = BackpropMark(step)
    token = GraphToken(seen)
    handles = []
    try:
        for tensor in tensors:
            handles.append(tensor.grad_fn.register_prehook(token))  # type: ignore[union-attr]
    except (RuntimeError, TypeError, AttributeError):  # an exotic node or tensor subclass: skip silently
        for handle in handles:
            handle.remove()
        return None
    return weakref.ref(token, on_freed), seen, handles


class EvalOutputsNotBackpropagated(Check):
    """Eval-mode forwards run with autograd on whose outputs no backward ever reaches; an eval-mode forward
    that is backpropagated (adversarial inputs, a fine-tune with frozen batch norm) is fine."""

    code = "TW104"

    def __init__(self, guard: Any) -> None:
        super().__init__(guard)
        self._pending: list[Pending] = []
        self._done = False
        self._freed = False  # a tracked graph was freed since the last sweep
        self._swept_at = -1  # guard.step at the last sweep

    def _on_freed(self, ref: Any) -> None:
        self._freed = True

    def on_install(self) -> None:
        self.guard.listen(self, "after_forward", False)  # only while tagged outputs wait for their verdict

    def after_forward(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        if self._pending and (self._freed or self._swept_at != self.guard.step):
            self._sweep(final=False)  # only when a verdict may have changed: a graph freed, or a step taken
        return None

    def after_eval_forward(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        if self._done or not torch.is_grad_enabled() or len(self._pending) >= _MAX_PENDING:
            return
        tagged = attach_token(output, self.guard.step, self._on_freed)
        if tagged is not None:
            if not self._pending:
                self.guard.listen(self, "after_forward", True)
            self._pending.append(tagged)

    def on_check(self) -> None:
        if self._pending and not self._done:
            self._sweep(final=self.guard.closing)

    def _sweep(self, *, final: bool) -> None:
        """Drop the outputs a backward reached; report one freed without a backward, or alive and
        unused across an optimizer step (or at the last check)."""
        step = self._swept_at = self.guard.step
        self._freed = False
        waiting: list[Pending] = []
        wasted: BackpropMark | None = None
        for item in self._pending:
            ref, seen, _ = item
            if seen.backpropagated:
                continue
            if ref() is not None and not final and seen.step >= step:
                waiting.append(item)
            elif wasted is None:
                wasted = seen
        self._pending = waiting
        if not waiting:
            self.guard.listen(self, "after_forward", False)
        if wasted is not None:
            self._done = True  # reported once: stop tagging
            self.guard.listen(self, "after_eval_forward", False)
            self.close()
            self.guard.report(
                self.code, _WHERE,
                f"the model ran in eval mode with autograd on (step {wasted.step}) and no backward ever used "
                f"its outputs, so each forward recorded a graph for nothing: evaluate under `torch.no_grad()`, "
                f"`torch.inference_mode()` or `trainwise.evaluating(model)`.",
            )

    def close(self) -> None:
        for _, _, handles in self._pending:  # hooks on graphs still alive: removed, like the guard's own
            for handle in handles:
                handle.remove()
        self._pending = []
