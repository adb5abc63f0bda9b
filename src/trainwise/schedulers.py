"""Learning-rate schedulers across an unfreeze: a parameter group added to a running optimizer joins every
torch built-in schedule at its current position, as if it had been there from the start.

A new group must follow the schedule as if it had been there from the start. Every built-in schedule is
proportional to the group's base lr (LambdaLR: base * lambda(t); the chainable ones: base * product of
factors; OneCycleLR/CyclicLR: linear in their per-group bounds, which are scaled with the base), except for
the shared ``eta_min`` of the cosine schedules (affine) and ``min_lr`` of ReduceLROnPlateau (a floor). So the
new group's current lr is the template group's current lr mapped by the ratio of the bases, which also holds
inside SequentialLR (its active scheduler decides) and ChainedScheduler (a product of proportional steps).
"""

from __future__ import annotations

import bisect
import fnmatch
from collections.abc import Iterable
from typing import Any

import torch

from trainwise.errors import TrainwiseError

_S = torch.optim.lr_scheduler
_CYCLES: tuple[type, ...] = (_S.OneCycleLR, _S.CyclicLR)
_COSINES: tuple[type, ...] = (_S.CosineAnnealingLR, _S.CosineAnnealingWarmRestarts)
_EXTENDABLE: frozenset[type] = frozenset({
    _S.StepLR, _S.MultiStepLR, _S.ExponentialLR, _S.LinearLR, _S.ConstantLR, _S.PolynomialLR, _S.LambdaLR,
    _S.MultiplicativeLR, *_COSINES, *_CYCLES, _S.SequentialLR, _S.ChainedScheduler, _S.ReduceLROnPlateau,
})
_FIRST = "unfreeze before creating the scheduler (with the Trainer, run each unfreezing phase as its own fit())"
_FIX = f"use one of torch's built-in schedulers, or {_FIRST}"


class _Plan:
    """What one new group gets: its template group, base lr, scale of the cycle bounds, current and initial lr."""

    def __init__(self, template: int, base: float, scale: float | None, lr: float, initial_lr: float) -> None:
        self.template, self.base, self.scale, self.lr, self.initial_lr = template, base, scale, lr, initial_lr


def _inner(scheduler: Any) -> list[Any]:
    return list(scheduler._schedulers) if type(scheduler) in (_S.SequentialLR, _S.ChainedScheduler) else []


def _walk(scheduler: Any) -> Iterable[Any]:
    yield scheduler
    for inner in _inner(scheduler):
        yield from _walk(inner)


def check_extendable(scheduler: Any, optimizer: torch.optim.Optimizer) -> None:
    """Refuse, before anything changes, a scheduler whose per-group state this module cannot extend."""
    for item in _walk(scheduler):
        name = type(item).__name__
        if type(item) not in _EXTENDABLE:
            raise TrainwiseError(
                f"cannot add the unfrozen parameters to the schedule of {name}, whose per-group state trainwise does "
                f"not know; {_FIX}."
            )
        if getattr(item, "optimizer", None) is not optimizer:
            raise TrainwiseError(
                f"the scheduler {name} drives another optimizer; pass the scheduler of this optimizer."
            )
        if type(item) is _S.ChainedScheduler:
            for chained in _walk(item):
                if isinstance(chained, _COSINES) and chained.eta_min != 0:
                    raise TrainwiseError(
                        f"cannot add the unfrozen parameters to a ChainedScheduler holding {type(chained).__name__} "
                        f"with eta_min={chained.eta_min}, whose chained lr is not proportional to the base lr; "
                        f"use eta_min=0, or {_FIRST}."
                    )


def _pattern_of(names: list[str], patterns: dict[str, float]) -> str | None:
    return next((p for p in patterns if names and fnmatch.fnmatchcase(names[0], p)), None)


def _template(optimizer: torch.optim.Optimizer, group: dict[str, Any], patterns: dict[str, float]) -> int:
    """The existing group whose schedule a new group copies: same name, else same lr pattern, else group 0."""
    existing = optimizer.param_groups
    for i, other in enumerate(existing):
        if "group_name" in group and other.get("group_name") == group["group_name"]:
            return i
    pattern = _pattern_of(group["param_names"], patterns)
    for i, other in enumerate(existing):
        if other.get("param_names") and _pattern_of(other["param_names"], patterns) == pattern:
            return i
    return 0


def plan_new_group(scheduler: Any, optimizer: torch.optim.Optimizer, group: dict[str, Any], patterns: dict[str, float],
          default_lr: float) -> _Plan:
    """Where a new group joins the schedule; raises (changing nothing) where the ratio of bases is undefined."""
    t = _template(optimizer, group, patterns)
    template = optimizer.param_groups[t]
    own_pattern = _pattern_of(template.get("param_names") or [], patterns)
    natural = patterns[own_pattern] if own_pattern is not None else default_lr  # the lr the template was given
    base = float(group["lr"])
    cycles = any(isinstance(item, _CYCLES) for item in _walk(scheduler))
    scale = base / natural if natural else None
    if cycles and scale is None:
        raise TrainwiseError(f"cannot scale the cycle of the new parameter group because its template group {t} "
                             f"was given lr 0; {_FIRST}.")
    initial = scale * float(template["initial_lr"]) if cycles and scale is not None else base
    plan = _Plan(t, base, scale, 0.0, initial)
    plan.lr = _current_lr(scheduler, optimizer, plan, natural)
    return plan


def _new_base(scheduler: Any, plan: _Plan) -> float:
    """The new group's entry in ``scheduler.base_lrs``."""
    if isinstance(scheduler, _CYCLES):
        return float(scheduler.base_lrs[plan.template]) * plan.scale  # type: ignore[operator]
    return plan.base


def _first_with_bases(scheduler: Any) -> Any:
    return scheduler if hasattr(scheduler, "base_lrs") else _first_with_bases(_inner(scheduler)[0])


def _current_lr(scheduler: Any, optimizer: torch.optim.Optimizer, plan: _Plan, natural: float) -> float:
    """The new group's lr at the scheduler's current position."""
    t = plan.template
    template = optimizer.param_groups[t]
    now = float(template["lr"])
    kind = type(scheduler)
    if kind is _S.SequentialLR:
        active = scheduler._schedulers[bisect.bisect_right(scheduler._milestones, scheduler.last_epoch)]
        return _current_lr(active, optimizer, plan, natural)
    if kind is _S.LambdaLR:
        return plan.base * scheduler.lr_lambdas[t](scheduler.last_epoch)
    if kind is _S.ReduceLROnPlateau:
        old_base, new_base, floor = float(template.get("initial_lr", natural)), plan.base, _plateau_min(scheduler, t)
    else:
        bases = _first_with_bases(scheduler)
        old_base, new_base, floor = float(bases.base_lrs[t]), _new_base(bases, plan), None
    eta = float(scheduler.eta_min) if isinstance(scheduler, _COSINES) else 0.0
    if old_base == eta:
        raise TrainwiseError(f"cannot place the new parameter group on the schedule of {kind.__name__} because its "
                             f"template group {t} has base lr {old_base}, so its progress is unknown; {_FIRST}.")
    lr = eta + (now - eta) * (new_base - eta) / (old_base - eta)
    return lr if floor is None else max(lr, floor)


def _plateau_min(scheduler: Any, t: int) -> float:
    return scheduler.default_min_lr if scheduler.default_min_lr is not None else scheduler.min_lrs[t]


# the per-group lists of torch's schedulers, as their state_dict() names them
_PER_GROUP = ("base_lrs", "_last_lr", "_lr_lambdas", "min_lrs", "max_lrs", "base_momentums", "max_momentums")


def fold_schedule_state(saved: Any, kept: list[int], groups: int) -> Any:
    """A saved scheduler state whose per-group lists (of ``groups`` saved groups, nested schedulers' too) keep
    only the entries ``kept``: the scheduler of an optimizer whose saved groups were folded
    (:func:`trainwise.freezing.saved_groups_like`)."""
    if not isinstance(saved, dict):
        return saved
    folded = dict(saved)
    for key in _PER_GROUP:
        values = folded.get(key)
        if isinstance(values, list) and len(values) == groups:
            folded[key] = [values[i] for i in kept]
    if isinstance(folded.get("_schedulers"), list):  # SequentialLR, ChainedScheduler
        folded["_schedulers"] = [fold_schedule_state(inner, kept, groups) for inner in folded["_schedulers"]]
    return folded


def join_schedule(plan: _Plan, scheduler: Any, optimizer: torch.optim.Optimizer) -> None:
    """Extend every per-group list of ``scheduler`` (and of the schedulers inside it) for the group just added."""
    t = plan.template
    template, group = optimizer.param_groups[t], optimizer.param_groups[-1]
    extended: set[int] = set()  # a list can be shared (SequentialLR's _last_lr is its active scheduler's)

    def append(values: list[Any], value: Any) -> None:
        if id(values) not in extended:
            extended.add(id(values))
            values.append(value)

    for item in _walk(scheduler):
        if hasattr(item, "base_lrs"):
            append(item.base_lrs, _new_base(item, plan))
        if isinstance(item, (_S.LambdaLR, _S.MultiplicativeLR)):
            append(item.lr_lambdas, item.lr_lambdas[t])
        if isinstance(item, _S.ReduceLROnPlateau):
            append(item.min_lrs, _plateau_min(item, t))
        if isinstance(item, _S.OneCycleLR):
            for key in ("max_lr", "min_lr"):
                group[key] = float(template[key]) * plan.scale  # type: ignore[operator]
        if isinstance(item, _S.CyclicLR):
            append(item.max_lrs, float(item.max_lrs[t]) * plan.scale)  # type: ignore[operator]
            if item.cycle_momentum:
                append(item.base_momentums, item.base_momentums[t])
                append(item.max_momentums, item.max_momentums[t])
        if isinstance(item, _CYCLES) and item.cycle_momentum:  # momentum is not scaled: the template's, now
            group["base_momentum"], group["max_momentum"] = template["base_momentum"], template["max_momentum"]
            if item.use_beta1:
                group["betas"] = (template["betas"][0], *group["betas"][1:])
            else:
                group["momentum"] = template["momentum"]
        if hasattr(item, "_last_lr"):
            append(item._last_lr, plan.lr)
