"""Freezing for fine-tuning: parameters stop training, and norm layers inside a frozen part stay in eval mode.

``model.train()`` walks every submodule and switches BatchNorm back to batch statistics, so a "frozen"
backbone keeps updating its running mean and variance. Here a frozen norm layer keeps its class (``type(m) is
nn.BatchNorm2d`` stays true, so ``torch.ao.quantization.fuse_modules`` and type checks work) and gets two
instance attributes: ``train``, a ``functools.partial`` of a module-level function that calls the class's own
``train(False)``, which shadows the method (torch's ``Module.train`` calls ``child.train(mode)`` on each child),
and a marker for :func:`is_pinned_eval`. This survives ``train()`` on any ancestor, ``deepcopy``, pickling and
``torch.save(model)`` (the partial pickles by reference), ``state_dict`` (no new keys) and ``torch.compile`` (the
layer's ``training`` is False when traced). :func:`unfreeze` removes both attributes.
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from trainwise.errors import TrainwiseError
from trainwise.schedulers import check_extendable, join_schedule, plan_new_group

Pattern = str | nn.Module | nn.Parameter

_PINNED = "_trainwise_pinned_eval"  # instance marker of a norm layer kept in eval mode


def _pinned_train(module: nn.Module, mode: bool = True) -> nn.Module:
    """``train()`` of a pinned norm layer: its class's own ``train`` with ``mode=False``, whatever was asked."""
    return type(module).train(module, False)


def _new_frozen(base: type) -> nn.Module:
    """Unpickling entry point named by models that earlier trainwise versions (which swapped the class) saved
    whole: a bare, pinned instance of ``base``, whose saved state pickle adds afterwards."""
    module = base.__new__(base)
    _set_pin(module)
    return module


def has_running_stats(module: nn.Module) -> bool:
    """BatchNorm of any dimension, SyncBatchNorm, or InstanceNorm with ``track_running_stats``."""
    return isinstance(module, nn.modules.batchnorm._NormBase) and bool(module.track_running_stats)


def is_pinned_eval(module: nn.Module) -> bool:
    """True for a norm layer that :func:`freeze` keeps in eval mode."""
    return bool(vars(module).get(_PINNED, False))


def _set_pin(module: nn.Module) -> None:
    # An instance attribute shadows the class's ``train``; torch's ``Module.train`` calls ``child.train(mode)``
    # on every child, so this one is honoured. ``partial`` of a module-level function pickles and deep-copies
    # by reference (the copy's partial points at the copy), and the class stays what it was.
    vars(module)["train"] = functools.partial(_pinned_train, module)
    vars(module)[_PINNED] = True


def _pin(module: nn.Module) -> None:
    if not is_pinned_eval(module):
        _set_pin(module)
    module.training = False


def _unpin(module: nn.Module, training: bool) -> None:
    if is_pinned_eval(module):
        vars(module).pop("train", None)
        vars(module).pop(_PINNED, None)
        module.training = training


def _resolve(model: nn.Module, patterns: tuple[Pattern, ...], verb: str) -> tuple[set[str], set[str]]:
    """Names of the modules matched (with their descendants) and of the parameters matched."""
    modules = dict(model.named_modules())
    params = dict(model.named_parameters())
    module_ids = {id(m): n for n, m in modules.items()}
    param_ids = {id(p): n for n, p in params.items()}
    matched_modules: set[str] = set()
    matched_params: set[str] = set()
    for pattern in patterns:
        found_modules: set[str] = set()
        found_params: set[str] = set()
        if isinstance(pattern, nn.Parameter):
            if id(pattern) not in param_ids:
                raise TrainwiseError(f"cannot {verb} a parameter that is not in this model; pass one of its own.")
            found_params.add(param_ids[id(pattern)])
        elif isinstance(pattern, nn.Module):
            if id(pattern) not in module_ids:
                raise TrainwiseError(f"cannot {verb} a module that is not part of this model; pass one of its own.")
            found_modules.add(module_ids[id(pattern)])
        elif isinstance(pattern, str):
            found_modules = {n for n in modules if n and fnmatch.fnmatchcase(n, pattern)}
            found_params = {n for n in params if fnmatch.fnmatchcase(n, pattern)}
            if not found_modules and not found_params:
                names = [n for n in modules if n] + list(params)
                close = difflib.get_close_matches(pattern, names, n=3, cutoff=0.5)
                hint = f"close matches: {', '.join(close)}" if close else f"top-level modules: {', '.join(_top(model))}"
                raise TrainwiseError(f"pattern {pattern!r} matches no module or parameter name; {hint}.")
        else:
            raise TrainwiseError(
                f"{verb} takes glob patterns of names, modules or parameters, got {type(pattern).__name__}."
            )
        for name in found_modules:  # a module brings its descendants and their parameters
            prefix = f"{name}."
            matched_modules.update(n for n in modules if n == name or n.startswith(prefix))
            found_params.update(n for n in params if n.startswith(prefix))
        matched_params.update(found_params)
    return matched_modules, matched_params


def _targets(model: nn.Module, patterns: tuple[Pattern, ...], verb: str) -> tuple[set[str], set[str]]:
    """What ``patterns`` match; no patterns means the whole model."""
    if patterns:
        return _resolve(model, patterns, verb)
    return {n for n, _ in model.named_modules()}, {n for n, _ in model.named_parameters()}


def _top(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_children()] or ["(none)"]


def _norm_layers_to_pin(model: nn.Module, module_names: set[str]) -> list[nn.Module]:
    layers = []
    for name, module in model.named_modules():
        if not has_running_stats(module):
            continue
        own = list(module.parameters(recurse=False))
        inside = name in module_names
        all_frozen = bool(own) and not any(p.requires_grad for p in own)
        if inside or all_frozen:
            layers.append(module)
    return layers


def freeze(model: nn.Module, *patterns: Pattern, train_norm_stats: bool = False) -> list[str]:
    """Freeze the parameters matched by ``patterns`` (glob on module or parameter names, or objects).

    Without patterns, freezes the whole model. Norm layers with running statistics inside the frozen part
    are kept in eval mode through any later ``model.train()`` unless ``train_norm_stats=True``.
    Returns the names of the parameters frozen.
    """
    if not isinstance(model, nn.Module):
        raise TrainwiseError(f"freeze takes a torch.nn.Module first, got {type(model).__name__}.")
    module_names, param_names = _targets(model, patterns, "freeze")
    params = dict(model.named_parameters())
    for name in param_names:
        params[name].requires_grad_(False)
        params[name].grad = None
    if not train_norm_stats:
        for layer in _norm_layers_to_pin(model, module_names):
            _pin(layer)
    return sorted(param_names)


def unfreeze(model: nn.Module, *patterns: Pattern) -> list[str]:
    """Make the matched parameters trainable again (all of them without patterns) and release norm layers.

    Released norm layers take the model's current mode, so they follow the next ``model.train()``.
    Returns the names of the parameters unfrozen.
    """
    module_names, param_names = _targets(model, patterns, "unfreeze")
    params = dict(model.named_parameters())
    for name in param_names:
        params[name].requires_grad_(True)
    for name, module in model.named_modules():
        if not is_pinned_eval(module):
            continue
        own = list(module.parameters(recurse=False))
        if name in module_names or (own and all(p.requires_grad for p in own)):
            _unpin(module, model.training)
    return sorted(param_names)


def frozen_norm_layers(model: nn.Module) -> list[str]:
    """Names of the norm layers that :func:`freeze` keeps in eval mode."""
    return [name for name, module in model.named_modules() if is_pinned_eval(module)]


def pin_frozen_norm_layers(model: nn.Module) -> list[str]:
    """Keep in eval mode, as :func:`freeze` does, every norm layer with running statistics whose parameters
    are all frozen (or, without parameters, whose nearest enclosing module with parameters is all frozen).

    The tutorial recipe ``backbone.requires_grad_(False)`` stops gradients, not running statistics: each
    ``model.train()`` would switch those layers back to batch statistics. Returns the names pinned by this call.
    """
    modules = dict(model.named_modules())
    pinned = []
    for name, module in modules.items():
        if not has_running_stats(module) or is_pinned_eval(module):
            continue
        own = list(module.parameters(recurse=False))
        frozen = not any(p.requires_grad for p in own) if own else _enclosing_frozen(modules, name)
        if frozen:
            _pin(module)
            pinned.append(name)
    return pinned


def _enclosing_frozen(modules: dict[str, nn.Module], name: str) -> bool:
    """Whether the nearest ancestor of ``name`` that has parameters has them all frozen."""
    while name:
        name = name.rpartition(".")[0]
        params = list(modules[name].parameters())
        if params:
            return not any(p.requires_grad for p in params)
    return False


# -- optimizer parameter groups ---------------------------------------------------------------------------

_NORM_TYPES: tuple[type, ...] = (
    nn.modules.batchnorm._NormBase,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
    *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()),
)


def no_decay_names(model: nn.Module) -> set[str]:
    """Biases and the parameters of normalisation layers: weight decay only shrinks them toward zero."""
    names = set()
    for module_name, module in model.named_modules():
        is_norm = isinstance(module, _NORM_TYPES)
        for param_name, _ in module.named_parameters(recurse=False):
            full = f"{module_name}.{param_name}" if module_name else param_name
            if is_norm or param_name == "bias" or param_name.endswith("_bias"):
                names.add(full)
    return names


def param_groups(
    model: nn.Module,
    *,
    weight_decay: float | None = None,
    lr_by_pattern: dict[str, float] | None = None,
    only: Iterable[str] | None = None,
) -> list[dict[str, Any]]:
    """Optimizer groups over the trainable parameters: no weight decay on biases and norm weights.

    ``lr_by_pattern`` maps glob patterns of parameter names to learning rates (first match wins), e.g.
    ``{"backbone.*": 1e-4}``; other parameters use the optimizer's own ``lr``. Decaying groups carry
    ``weight_decay`` only when it is given, so an optimizer factory's own value is kept otherwise.
    ``only`` restricts the groups to these parameter names (used to extend an optimizer).
    """
    patterns = dict(lr_by_pattern or {})
    names = set(only) if only is not None else None
    skip_decay = no_decay_names(model)
    used_patterns: set[str] = set()
    groups: dict[tuple[str | None, bool], dict[str, Any]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad or (names is not None and name not in names):
            continue
        pattern = next((p for p in patterns if fnmatch.fnmatchcase(name, p)), None)
        if pattern is not None:
            used_patterns.add(pattern)
        decay = name not in skip_decay
        key = (pattern, decay)
        group = groups.get(key)
        if group is None:
            group = groups[key] = {"params": [], "param_names": [], "group_name": _group_name(pattern, decay)}
            if pattern is not None:
                group["lr"] = patterns[pattern]
            if not decay:
                group["weight_decay"] = 0.0
            elif weight_decay is not None:
                group["weight_decay"] = weight_decay
        group["params"].append(param)
        group["param_names"].append(name)
    if only is None:
        unused = [p for p in patterns if p not in used_patterns]
        if unused:
            trainable = [n for n, p in model.named_parameters() if p.requires_grad]
            close = difflib.get_close_matches(unused[0], trainable, n=3, cutoff=0.5)
            hint = f"; close matches: {', '.join(close)}" if close else ""
            raise TrainwiseError(f"learning-rate pattern {unused[0]!r} matches no trainable parameter{hint}.")
    return list(groups.values())


_NO_DECAY = " (no decay)"  # the suffix of a group without weight decay


def _group_name(pattern: str | None, decay: bool) -> str:
    return f"{pattern or 'default'}{'' if decay else _NO_DECAY}"


_NOT_SETTINGS = ("params", "param_names", "group_name")


def fold_equal_groups(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> list[str]:
    """Fold each no-decay group of :func:`trainwise.param_groups` into its decaying twin (same ``lr_by_pattern``
    pattern) when the optimizer gave both the same settings: an optimizer without weight decay (torch's Adam,
    SGD, RMSprop by default) updates them alike, and two groups only run its per-group step code twice. Only
    torch's own optimizers (each parameter updated on its own) and before their first step; the parameters
    keep the model's order. Returns the names of the groups folded away."""
    if not type(optimizer).__module__.startswith("torch.optim.") or optimizer.state:
        return []
    groups = optimizer.param_groups
    by_name = {group.get("group_name"): group for group in groups}
    folded: list[str] = []
    order = {param_name: i for i, (param_name, _) in enumerate(model.named_parameters())}
    for group in list(groups):
        name = group.get("group_name")
        twin = by_name.get(name[: -len(_NO_DECAY)]) if isinstance(name, str) and name.endswith(_NO_DECAY) else None
        if twin is None or not same_settings(group, twin) or "param_names" not in group or "param_names" not in twin:
            continue
        pairs = sorted([*zip(twin["param_names"], twin["params"]), *zip(group["param_names"], group["params"])],
                       key=lambda pair: order.get(pair[0], len(order)))
        twin["param_names"], twin["params"] = [n for n, _ in pairs], [p for _, p in pairs]
        groups.remove(group)
        folded.append(name)
    return folded


def same_settings(one: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether two param groups hold equal settings (0 and 0.0 alike; a tensor lr is never compared)."""
    keys = set(one) - set(_NOT_SETTINGS)
    if keys != set(other) - set(_NOT_SETTINGS):
        return False
    for key in keys:
        a, b = one[key], other[key]
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor) or a != b:
            return False
    return True


def saved_groups_like(saved: Any, optimizer: torch.optim.Optimizer) -> tuple[Any, list[int] | None]:
    """A saved optimizer state regrouped as ``optimizer``'s folded groups (:func:`fold_equal_groups`), and for
    each live group the saved group whose per-group values it takes (for the scheduler's lists,
    :func:`trainwise.schedulers.fold_schedule_state`): a checkpoint of a trainwise that did not fold holds a
    no-decay group beside its twin with the same settings. Each saved group must land whole in one live group,
    by parameter names, beside groups of the same settings; anything else (another layout, no names) comes back
    as it is with None, for ``load_state_dict`` to judge."""
    groups = saved.get("param_groups") if isinstance(saved, dict) else None
    live = optimizer.param_groups
    if not isinstance(groups, list) or len(groups) <= len(live) or not isinstance(saved.get("state"), dict):
        return saved, None
    if not all(isinstance(g, dict) and "param_names" in g and "params" in g for g in groups) or \
            not all("param_names" in g for g in live):
        return saved, None
    home = {name: i for i, group in enumerate(live) for name in group["param_names"]}
    landing: dict[int, list[int]] = {}
    for number, group in enumerate(groups):
        targets = {home.get(name) for name in group["param_names"]}
        if len(targets) != 1 or None in targets:
            return saved, None
        landing.setdefault(targets.pop(), []).append(number)
    if len(landing) != len(live) or not all(same_settings(groups[n], groups[ns[0]])
                                            for ns in landing.values() for n in ns):
        return saved, None
    index = {name: i for group in groups for name, i in zip(group["param_names"], group["params"])}
    state, regrouped, position = {}, [], 0
    for i, group in enumerate(live):
        params = []
        for name in group["param_names"]:
            if index[name] in saved["state"]:
                state[position] = saved["state"][index[name]]
            params.append(position)
            position += 1
        regrouped.append({**groups[landing[i][0]], "params": params, "param_names": list(group["param_names"]),
                          "group_name": group.get("group_name")})
    return {**saved, "state": state, "param_groups": regrouped}, [landing[i][0] for i in range(len(live))]


def extend_optimizer(
    optimizer: torch.optim.Optimizer,
    model: nn.Module,
    *,
    weight_decay: float | None = None,
    lr_by_pattern: dict[str, float] | None = None,
    scheduler: Any = None,
) -> list[str]:
    """Add the model's trainable parameters that the optimizer lacks (after :func:`unfreeze`) as new groups.

    The state of the parameters already there (Adam moments, momentum) is untouched. With ``scheduler`` (any of
    torch's built-in schedulers, nested ones included), each new group joins the schedule at its current position
    as if it had been in the optimizer from the start: its per-group state is copied from a template group (the
    existing group with the same ``group_name``, else the same ``lr_by_pattern`` pattern, else group 0) and its
    current lr is the schedule's value now, not its base lr. A scheduler it cannot extend is refused before
    anything changes. Returns the parameter names added.
    """
    if scheduler is not None:
        check_extendable(scheduler, optimizer)
    present = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in present]
    if not missing:
        return []
    patterns = dict(lr_by_pattern or {})
    default_lr = optimizer.defaults.get("lr", optimizer.param_groups[0]["lr"])
    groups = param_groups(model, weight_decay=weight_decay, lr_by_pattern=patterns, only=missing)
    plans = []
    for group in groups:  # everything that can fail happens here, before the optimizer changes
        group.setdefault("lr", default_lr)
        plans.append(None if scheduler is None else plan_new_group(scheduler, optimizer, group, patterns, default_lr))
    for group, plan in zip(groups, plans, strict=True):
        if plan is None:
            group["initial_lr"] = group["lr"]
            optimizer.add_param_group(group)
        else:
            group["lr"], group["initial_lr"] = plan.lr, plan.initial_lr
            optimizer.add_param_group(group)
            join_schedule(plan, scheduler, optimizer)
    return missing


def unfreeze_into(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *patterns: Pattern,
    lr_by_pattern: dict[str, float] | None = None,
    scheduler: Any = None,
) -> list[str]:
    """:func:`unfreeze` the matched parameters and add them to ``optimizer`` (:func:`extend_optimizer`), the
    scheduler extended for the new groups; returns the parameter names added to the optimizer.

    All or nothing: when the optimizer or scheduler cannot be extended, the parameters and norm layers are left
    frozen as they were.
    """
    if scheduler is not None:
        check_extendable(scheduler, optimizer)
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    pinned = [module for module in model.modules() if is_pinned_eval(module)]
    unfreeze(model, *patterns)
    try:
        return extend_optimizer(optimizer, model, lr_by_pattern=lr_by_pattern, scheduler=scheduler)
    except TrainwiseError:
        for name, param in model.named_parameters():
            if name in frozen:
                param.requires_grad_(False)
        for module in pinned:
            _pin(module)
        raise
