"""Gradient accumulation whose gradients equal those of the whole effective batch.

Each micro-batch loss is weighted by the number of items it averages over (samples, or tokens) divided by
an expected window count fixed before the window's counts are known (``steps`` times the window's first
count; under DDP ``steps`` times the previous window's mean count per micro-batch over all processes), so
gradients keep the magnitude of ``loss / steps`` (fp16 overflows no sooner); the step then divides by the
window's total count over that same expected count. That is exact when micro-batches differ in size, when
a loss is a sum over a varying number of tokens, and for a short last window at the end of an epoch:
dividing every micro-batch loss by the accumulation count is not.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterable
from typing import Any, Literal

import torch

from trainwise.errors import TrainwiseError

_NULL_CONTEXT = contextlib.nullcontext()  # reusable: entering it does nothing


def accumulation_steps(effective_batch: int, micro_batch: int) -> int:
    """The number of micro-batches per optimizer step; the micro-batch must divide the effective batch."""
    for name, value in (("effective_batch", effective_batch), ("micro_batch", micro_batch)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise TrainwiseError(f"{name} must be a positive integer, got {value!r}.")
    if effective_batch % micro_batch:
        divisors = [d for d in range(1, effective_batch + 1) if effective_batch % d == 0 and d <= micro_batch]
        raise TrainwiseError(
            f"micro-batch {micro_batch} does not divide the effective batch {effective_batch}; use a "
            f"micro-batch that does, such as {divisors[-1]}."
        )
    return effective_batch // micro_batch


def check_loss(loss: Any) -> torch.Tensor:
    """A loss must be a scalar tensor attached to the graph; anything else is a user error."""
    if not isinstance(loss, torch.Tensor):
        raise TrainwiseError(
            f"the loss must be a scalar tensor, got a {type(loss).__name__}; return the tensor itself, "
            "not loss.item()."
        )
    if loss.dim() != 0:
        if loss.numel() == 1:
            return loss.reshape(())
        raise TrainwiseError(
            f"the loss must be a scalar tensor, got shape {tuple(loss.shape)}; reduce it with "
            "reduction='mean' (or 'sum' with reduction='sum' here)."
        )
    if not loss.requires_grad:
        raise TrainwiseError(
            "the loss does not require grad; compute it from the model's outputs outside torch.no_grad() "
            "and without .detach()."
        )
    return loss


class GradientAccumulator:
    """Accumulate micro-batch gradients and take one optimizer step per window.

    In a hand-written loop::

        accumulator = GradientAccumulator(optimizer, steps=4, scheduler=scheduler, max_grad_norm=1.0)
        for i, (x, y) in enumerate(loader):
            loss = F.cross_entropy(model(x), y)           # mean over len(y) samples
            accumulator.backward(loss, count=len(y))
            if accumulator.window_full or i == len(loader) - 1:
                accumulator.step()                          # also steps on a short last window

    ``step`` divides the gradients by the window's total count, unscales them (fp16), clips them, steps
    the optimizer (skipped, as GradScaler does, when gradients are inf/NaN), steps the scheduler once per
    optimizer step and zeroes the gradients with ``set_to_none=True``. With ``distributed=True`` (under
    DDP or FSDP) it divides by the window's count summed over all processes instead, so the result is the
    gradient of the global batch even when processes count different numbers of samples or tokens.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        steps: int = 1,
        scheduler: Any = None,
        scaler: torch.amp.GradScaler | None = None,
        max_grad_norm: float | None = None,
        skip_nonfinite: bool = False,
        distributed: bool = False,
    ) -> None:
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise TrainwiseError(f"accumulation steps must be a positive integer, got {steps!r}.")
        if max_grad_norm is not None and not (max_grad_norm > 0):
            raise TrainwiseError(f"max_grad_norm must be positive or None, got {max_grad_norm!r}.")
        self.optimizer = optimizer
        self.steps = steps
        self.scheduler = scheduler
        self.scaler = scaler if scaler is not None and scaler.is_enabled() else None
        self.max_grad_norm = max_grad_norm
        self.skip_nonfinite = skip_nonfinite
        # Under DDP: divide by the count summed over every process (one all-reduce of a scalar tensor per
        # window, no host sync) and undo DDP's mean over processes, so that unequal per-process counts (a
        # short last batch, token counts) still give the gradient of the global batch.
        self.distributed = distributed
        self.micro_batches = 0  # in the current window
        self.optimizer_steps = 0  # optimizer steps taken (skipped ones excluded)
        self.skipped_steps = 0
        self.last_grad_norm: torch.Tensor | None = None
        self._count: torch.Tensor | int | float = 0
        # Backpropagated: loss * count / expected (about loss / steps: a GradScaler overflows no sooner than with
        # the usual recipe); the step divides by total count / expected. Any positive ``expected`` fixed at the
        # window's first micro-batch is exact, and computing it needs no host sync.
        self._expected: torch.Tensor | int | float | None = None
        # distributed only: mean count per micro-batch of the last window over every process (1 at first)
        self._reference: torch.Tensor | int | float = 1
        # distributed only: one more number each window's count all-reduce carries for another part of the loop,
        # so that it agrees across processes with no collective of its own (the Trainer's RunControl: a
        # preemption); None: 0 is carried. An object with ``value`` (this process's number) and
        # ``reduced(total)`` (the window's sum, on the device, not read here), set alike on every process.
        self.shared: Any = None

    @property
    def window_full(self) -> bool:
        """True once ``steps`` micro-batches were accumulated since the last optimizer step."""
        return self.micro_batches >= self.steps

    @property
    def windows(self) -> int:
        """Windows finished so far: optimizer steps taken plus those skipped for non-finite gradients."""
        return self.optimizer_steps + self.skipped_steps

    def ends_window(self, *, last: bool) -> bool:
        """Whether the next micro-batch ends the window: it fills it, or it is the epoch's ``last`` (see
        :func:`trainwise.mark_last`). Under DDP only that micro-batch's backward may sync gradients."""
        return self.micro_batches + 1 >= self.steps or last

    def backward(
        self,
        loss: torch.Tensor,
        *,
        count: torch.Tensor | int | float,
        reduction: Literal["mean", "sum"] = "mean",
    ) -> None:
        """Backpropagate one micro-batch loss that averages (or sums) over ``count`` items."""
        loss = check_loss(loss)
        if reduction not in ("mean", "sum"):
            raise TrainwiseError(f"reduction must be 'mean' or 'sum', got {reduction!r}.")
        if isinstance(count, torch.Tensor):
            count = count.detach()
        elif not count > 0:
            raise TrainwiseError(f"count must be the positive number of items behind the loss, got {count!r}.")
        if self._expected is None:
            self._expected = self._window_expected(count)
        # The micro-batch's summed loss over ``expected``: its gradient adds up exactly across micro-batches.
        weight = _ratio(count if reduction == "mean" else 1, self._expected)
        if isinstance(weight, torch.Tensor):
            total = loss * weight.to(torch.promote_types(loss.dtype, torch.float32))
        else:
            # Host counts: a one-micro-batch window of a mean loss (not distributed) has weight 1.0 and the
            # step divides by 1.0, so both are skipped (a pass over every gradient that large models notice).
            total = loss if weight == 1 else loss * weight
        if self.scaler is not None:
            total = self.scaler.scale(total)
        total.backward()
        self.micro_batches += 1
        self._count = self._count + count

    def backward_empty(self, outputs: Any) -> None:
        """Backpropagate a micro-batch that counts zero items: a padding batch of zero rows (a rank whose shard
        ran out, see ``trainwise.data.ShardedBatchSampler``) or one whose every token is ignored.

        It adds nothing to the gradient or to the window's count, but it runs a backward through the model's
        ``outputs`` (their forward graph), so that DDP's gradient all-reduce and FSDP's reduce-scatter run on
        this process as on the others, and it counts as a micro-batch of the window (``window_full``). The
        zero is ``sum((t * 0).sum())`` over the floating tensors in ``outputs`` (a tensor, or tuples, lists and
        dicts of them): built from the outputs, never from the loss, whose mean over zero items is NaN (and
        NaN * 0 is NaN). It is finite whenever the outputs are (always for zero rows); an inf or NaN output
        makes it NaN. The window must count some item on some process, or its step divides 0 by 0.
        """
        found, pending = [], [outputs]
        while pending:
            item = pending.pop()
            if isinstance(item, torch.Tensor):
                if item.requires_grad and item.is_floating_point():
                    found.append(item)
            elif isinstance(item, dict):  # transformers' ModelOutput is a dict too
                pending.extend(item.values())
            elif isinstance(item, (list, tuple)):
                pending.extend(item)
        if not found:
            raise TrainwiseError(
                f"backward_empty needs the model's outputs as tensors attached to the graph, got "
                f"{type(outputs).__name__}; pass what the model returned, computed outside torch.no_grad()."
            )
        zero = sum((t * 0).sum(dtype=torch.float32) for t in found)
        # a summed loss of zero items: the window's count gains 0 (a tensor: backward checks only host counts)
        self.backward(zero, count=torch.zeros((), device=zero.device), reduction="sum")

    def discard_window(self) -> None:
        """Forget the current window, its gradients and counts, as if it never started (a window redone at a
        smaller micro-batch after running out of memory)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.micro_batches = 0
        self._count = 0
        self._expected = None

    def parameters(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def _grads(self) -> list[torch.Tensor]:
        return [p.grad for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]

    def step(self) -> bool:
        """Finish the window: normalise, unscale, clip, step, zero. Returns whether the optimizer stepped."""
        if self.micro_batches == 0:
            raise TrainwiseError("step() was called with no accumulated micro-batch; call backward() first.")
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        count = self._count
        grads = None  # listed only when something needs them
        if self.distributed:
            grads = self._grads()
            count, micro_batches = self._global_count(grads)
            self._reference = _positive(_ratio(count, micro_batches))  # the same on every process
        # after unscale_ (which checks for inf/NaN), so the inf check sees the backpropagated values
        # _positive: a window that counted no item anywhere (all padding) has zero gradients, not 0/0
        divisor = _ratio(_positive(count), self._expected if self._expected is not None else 1)
        if isinstance(divisor, torch.Tensor) or divisor != 1:
            grads = self._grads() if grads is None else grads
            _divide_(grads, divisor)
        stepped = True
        if self.max_grad_norm is not None:
            self.last_grad_norm = torch.nn.utils.clip_grad_norm_(self.parameters(), self.max_grad_norm)
        elif self.skip_nonfinite:
            self.last_grad_norm = _total_norm(self._grads() if grads is None else grads)
        if self.skip_nonfinite and self.scaler is None and self.last_grad_norm is not None:
            stepped = bool(torch.isfinite(self.last_grad_norm))  # a host sync: only when asked for
        if self.scaler is not None:
            scale_before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            stepped = self.scaler.get_scale() >= scale_before  # the scale backs off exactly on a skip
        elif stepped:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if stepped:
            self.optimizer_steps += 1
            if self.scheduler is not None:
                self.scheduler.step()
        else:
            self.skipped_steps += 1
        self.micro_batches = 0
        self._count = 0
        self._expected = None
        return stepped

    def _global_count(self, grads: list[torch.Tensor]) -> tuple[torch.Tensor | int | float, torch.Tensor | int | float]:
        """The window's count and micro-batches, each summed over all processes and divided by their number.

        DDP averaged the processes' sums of ``loss * count / expected``, with ``expected`` the same on every
        process, so dividing by (count over all processes / their number) / expected gives the global batch.
        """
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return self._count, self.micro_batches
        device = grads[0].device if grads else torch.device("cpu")
        count = torch.as_tensor(self._count, dtype=torch.float64, device=device)
        shared = self.shared  # the third element: whatever another part of the loop agrees on (0 without one)
        both = torch.stack([count, torch.full_like(count, self.micro_batches),
                            torch.full_like(count, shared.value if shared is not None else 0.0)])
        dist.all_reduce(both, op=dist.ReduceOp.SUM)
        if shared is not None:
            shared.reduced(both[2])
        both = both / dist.get_world_size()
        return both[0], both[1]

    def _window_expected(self, count: torch.Tensor | int | float) -> torch.Tensor | int | float:
        """The expected window count, fixed at the window's first micro-batch (no host sync: may be a tensor)."""
        if self.distributed:
            # DDP averages the processes' sums before the step, which can divide out only an ``expected`` that
            # is the same on every process: the previous window's global mean count per micro-batch (the step's
            # all-reduce gives it to every process), 1 for the first window.
            return self.steps * self._reference
        # about the window's total count; any positive value is exact (a host count is positive: checked)
        return self.steps * (_positive(count) if isinstance(count, torch.Tensor) else count)

    def sync_context(self, model: torch.nn.Module, *, last: bool) -> contextlib.AbstractContextManager[None]:
        """Under DDP, skip the gradient all-reduce for every micro-batch but the last of a window."""
        # looked up on the class: a module's own attributes and submodules are no context manager
        if last or getattr(type(model), "no_sync", None) is None:
            return _NULL_CONTEXT
        return model.no_sync()

    def state_dict(self) -> dict[str, int | float]:
        # the reference count goes with the state so that a resumed DDP run scales its next window as the
        # uninterrupted run does (same rounding, bit for bit)
        return {"optimizer_steps": self.optimizer_steps, "skipped_steps": self.skipped_steps,
                "reference": float(self._reference)}

    def load_state_dict(self, state: dict[str, int | float]) -> None:
        self.optimizer_steps = int(state["optimizer_steps"])
        self.skipped_steps = int(state["skipped_steps"])
        reference = float(state.get("reference", 1.0))
        self._reference = reference if reference > 0 and reference != float("inf") else 1.0


def _divide_(grads: Iterable[torch.Tensor], count: torch.Tensor | int | float) -> None:
    grads = list(grads)
    if not grads:
        return
    if not isinstance(count, torch.Tensor):
        if count == 1:
            return
        torch._foreach_div_(grads, float(count))
        return
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
    for g in grads:
        groups[(g.device, g.dtype)].append(g)
    for (device, _), group in groups.items():
        torch._foreach_div_(group, count.to(device=device))


def _positive(value: torch.Tensor | int | float) -> torch.Tensor | int | float:
    """The value, or 1 where it is not positive (an all-padding micro-batch counts 0 tokens); no host sync."""
    if isinstance(value, torch.Tensor):
        return torch.where(value > 0, value, torch.ones_like(value))
    return value if value > 0 else 1


def _ratio(numerator: torch.Tensor | int | float, denominator: torch.Tensor | int | float) -> torch.Tensor | float:
    """A Python float for host numbers; otherwise a float64 tensor (float32 on MPS) on the tensors' device."""
    if not isinstance(numerator, torch.Tensor) and not isinstance(denominator, torch.Tensor):
        return numerator / denominator
    tensors = [v for v in (numerator, denominator) if isinstance(v, torch.Tensor)]
    device = next((t.device for t in tensors if t.device.type != "cpu"), tensors[0].device)
    dtype = torch.float32 if device.type == "mps" else torch.float64
    return torch.as_tensor(numerator, dtype=dtype, device=device) / torch.as_tensor(
        denominator, dtype=dtype, device=device
    )


def _total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    if not grads:
        return torch.tensor(0.0)
    norms = torch._foreach_norm(grads)
    device = grads[0].device
    return torch.linalg.vector_norm(torch.stack([n.to(device) for n in norms]))


__all__ = ["GradientAccumulator", "accumulation_steps", "check_loss"]
