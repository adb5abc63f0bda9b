"""The non-finite loss guard and the optimizer-coverage check: run-time checks without a host sync per step."""

from __future__ import annotations

import warnings

import torch

from trainwise.errors import NonFiniteLossError


class NonFiniteLossGuard:
    """Remember each step's loss on the device; once per interval, find the first NaN/inf step.

    ``observe`` keeps a detached reference (no kernel, no host sync); ``check`` stacks what it kept, reads
    one flag back and raises :class:`NonFiniteLossError` naming the first bad step. Given the ``model``, each
    check that passes also keeps a copy of its parameters and buffers (on the CPU for an accelerator), and a
    check that fails puts that copy back: the model is left at its last state checked finite, not holding
    the NaN update, and the error says which step that state is from.
    """

    def __init__(self, device: torch.device | str = "cpu", *, model: torch.nn.Module | None = None) -> None:
        self.device = torch.device(device)
        self.model = model
        self.kept_step: int | None = None  # optimizer steps done when the kept state was copied
        self._kept: list[torch.Tensor] = []
        self._steps: list[int] = []
        self._losses: list[torch.Tensor] = []

    def observe(self, loss: torch.Tensor, step: int) -> None:
        self._steps.append(step)
        self._losses.append(loss.detach() if loss.requires_grad else loss)

    def first_bad(self) -> tuple[int, float] | None:
        """``(step, value)`` of the first non-finite loss observed since the last reset, or None."""
        if not self._losses:
            return None
        losses = torch.stack([loss if loss.dim() == 0 else loss.reshape(()) for loss in self._losses])
        losses = losses if losses.dtype == torch.float32 else losses.float()
        bad = ~torch.isfinite(losses)
        if not bool(bad.any()):  # the one host sync
            self.reset()
            return None
        index = int(bad.nonzero()[0, 0])
        return self._steps[index], float(losses[index])

    def check(self, step: int | None = None) -> None:
        """Raise if a non-finite loss was observed (the model restored first); else keep the model at ``step``."""
        found = self.first_bad()
        if found is None:
            if self.model is not None and step is not None:
                self.keep(step)
            return
        bad_step, value = found
        what = f"the training loss became {value} at step {bad_step}"
        raise NonFiniteLossError(self.restore_and_explain(what), step=bad_step)

    def restore_and_explain(self, what: str) -> str:
        """``what`` happened, where the model was left, and the fix; restores the kept state if there is one."""
        where = ""
        if self.model is not None:
            kept = self.restore()
            where = (
                f"; the model is back at its state after step {kept}, the last one checked finite"
                if kept is not None
                else "; no finite state of the model was kept, so it holds the non-finite update"
            )
        return f"{what}{where}; lower the learning rate, clip gradients (max_grad_norm) or use nonfinite='skip'."

    def keep(self, step: int) -> None:
        """Copy the model's parameters and buffers (reusing the previous copy's memory) as its state at ``step``."""
        assert self.model is not None
        tensors = _state_tensors(self.model)
        if len(self._kept) != len(tensors) or any(
            k.shape != t.shape or k.dtype != t.dtype for k, t in zip(self._kept, tensors)
        ):
            # Pinned host memory for CUDA tensors: the copy runs asynchronously on the stream, and the next
            # check's host sync (which comes before any restore) waits for it.
            self._kept = [
                torch.empty_like(t, device="cpu", pin_memory=t.device.type == "cuda")
                if t.device.type != "cpu" else torch.empty_like(t)
                for t in tensors
            ]
        with torch.no_grad():
            for kept, tensor in zip(self._kept, tensors):
                kept.copy_(tensor, non_blocking=kept.is_pinned())
        self.kept_step = step

    def restore(self) -> int | None:
        """Put the kept state back into the model if it is finite; its step, or None when nothing finite was kept."""
        if self.model is None or self.kept_step is None:
            return None
        tensors = _state_tensors(self.model)
        if len(tensors) != len(self._kept):
            return None
        with torch.no_grad():
            if not all(bool(torch.isfinite(k).all()) for k in self._kept if k.is_floating_point()):
                return None
            for kept, tensor in zip(self._kept, tensors):
                tensor.copy_(kept)
        return self.kept_step

    def reset(self) -> None:
        self._steps.clear()
        self._losses.clear()


def check_finite_everywhere(guard: NonFiniteLossGuard, step: int) -> None:
    """``guard.check(step)`` decided together: every process raises :class:`NonFiniteLossError` when any
    process saw a NaN/inf loss (one tiny all-reduce under several processes)."""
    from trainwise.distributed import any_rank, is_distributed

    if not is_distributed():
        guard.check(step)
        return
    try:
        guard.check(step)
        found = None
    except NonFiniteLossError as exc:
        found = exc
    if any_rank(found is not None, device=guard.device):
        raise found or NonFiniteLossError(
            guard.restore_and_explain("the training loss became non-finite on another process"), step=step + 1
        )


def _state_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters()] + [b for b in model.buffers()]


class UnoptimizedParameterWarning(UserWarning):
    """A trainable parameter is in no optimizer group: it will never be updated."""


def check_optimizer_covers(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Warn about parameters that require grad but are in no optimizer group; return their names.

    Typical causes: layers kept in a plain Python list (invisible to ``parameters()`` when the optimizer was
    built) or an optimizer built before a layer was added or unfrozen.
    """
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in in_optimizer]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        warnings.warn(
            f"{len(missing)} trainable parameter(s) are in no optimizer group and will never be updated "
            f"({shown}); build the optimizer from the model's current trainable parameters.",
            UnoptimizedParameterWarning,
            stacklevel=3,
        )
    return missing
