"""TW113: an optimizer step that applied a non-finite (inf or NaN) gradient, naming the parameter and the step."""

from __future__ import annotations

import functools
import itertools
import operator

import torch

from trainwise.guards.check import Check

_GRAD = operator.attrgetter("grad")
_NOT_NONE = functools.partial(operator.is_not, None)
_ROW = operator.itemgetter(2)  # the norms of a pending (step, indices, norms) entry


class NonFiniteGradient(Check):
    """The first parameter whose gradient held inf or NaN when the optimizer stepped, and that step.

    Each step keeps the float32 norm of every gradient on the device (``torch._foreach_norm``, one call,
    no host sync; inf and NaN elements make it non-finite, so can a finite gradient whose norm passes 1e19,
    which is no healthier); ``on_check`` reads the interval's norms once. A ``GradScaler`` never calls
    ``step()`` on non-finite gradients, except for optimizers that unscale themselves (``fused=True``), whose
    steps it marks with ``found_inf``: those are skipped.
    """

    code = "TW113"

    def on_install(self) -> None:
        self._done = False
        self._groups = -1
        # (step, indices of the parameters that had a gradient or None for all, their norms)
        self._pending: list[tuple[int, list[int] | None, list[torch.Tensor]]] = []
        optimizer = self.guard.optimizer
        if optimizer is not None:
            self._load(optimizer)

    def _load(self, optimizer: torch.optim.Optimizer) -> None:
        """Cache the optimizer's parameters and their names (again when a parameter group is added)."""
        names = {id(p): name for name, p in self.guard.model.named_parameters()}
        self._params = [p for group in optimizer.param_groups for p in group["params"]]
        self._names = [
            names.get(id(p), f"param_groups[{g}][{i}]")
            for g, group in enumerate(optimizer.param_groups) for i, p in enumerate(group["params"])
        ]
        self._groups = len(optimizer.param_groups)
        low = (torch.float16, torch.bfloat16, torch.float32)
        # float32 norms keep float16 ones from overflowing; float64 or complex gradients keep their own dtype
        self._dtype = torch.float32 if all(p.dtype in low for p in self._params) else None

    def before_step(self, optimizer: torch.optim.Optimizer) -> None:
        if not self.guard.closure_step:  # otherwise the gradients this step applies do not exist yet
            self._keep_norms(optimizer, self.guard.step + 1)

    def after_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.guard.closure_step:  # step(closure) (LBFGS, Lightning's automatic optimization) ran backward
            self._keep_norms(optimizer, self.guard.step)

    def _keep_norms(self, optimizer: torch.optim.Optimizer, step: int) -> None:
        if self._done or "found_inf" in vars(optimizer):  # a fused optimizer under GradScaler: it skips inf itself
            return
        if len(optimizer.param_groups) != self._groups:
            self._load(optimizer)
        grads = list(map(_GRAD, self._params))  # map and filter run in C: this is on every step's path
        kept = list(filter(_NOT_NONE, grads))
        if not kept:
            return
        indices = None if len(kept) == len(grads) else [i for i, g in enumerate(grads) if g is not None]
        # the norms stay a list until on_check stacks the interval's at once (a stack per step costs as much)
        self._pending.append((step, indices, torch._foreach_norm(kept, 2.0, dtype=self._dtype)))

    def on_check(self) -> None:
        pending, self._pending = self._pending, []
        if self._done or not pending:
            return
        norms = list(itertools.chain.from_iterable(map(_ROW, pending)))  # in C: an interval holds many
        device = norms[0].device
        try:
            stacked = torch.stack(norms)
        except RuntimeError:  # parameters on several devices (a model split, or moved since the guard started)
            stacked = torch.stack([n if n.device == device else n.to(device) for n in norms])
        finite = torch.isfinite(stacked)
        if bool(finite.all()):  # the one host sync of the interval
            return
        flags = finite.cpu().tolist()
        offset = 0
        for step, indices, row in pending:
            count = len(row)
            bad = next((k for k in range(count) if not flags[offset + k]), None)
            offset += count
            if bad is None:
                continue
            name = self._names[bad if indices is None else indices[bad]]
            self._done = True
            self.guard.report(
                self.code, name,
                f"the gradient of {name} held inf or NaN when the optimizer stepped at step {step}, which makes "
                f"the weights non-finite; find the overflowing loss or layer, lower the learning rate, clip with "
                f"torch.nn.utils.clip_grad_norm_, or train float16 with a torch.amp.GradScaler.",
                step=step,
            )
            return

    def close(self) -> None:
        self._pending.clear()
