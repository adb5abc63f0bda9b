"""What a guard attaches to a module never travels in a pickle of it: ``torch.save(model)`` of a whole model, an
EMA ``copy.deepcopy``, a model passed to a spawned process (Hogwild) all give the module as it is without trainwise.

While a guard has hooks (or its forward wrapper, or its ``zero_grad`` spy) on a module, the module's
``__getstate__`` is an instance attribute over its class's: the state the class gives, with trainwise's hooks and
attributes taken out (a deep copy and every pickler, ``torch.save``'s and multiprocessing's among them, read the
state there). The copy holds nothing of trainwise, so it loads where trainwise is not installed; the module
itself keeps its hooks. The attribute goes when the last guard's hooks do.
"""

from __future__ import annotations

import weakref
from typing import Any

from torch import nn

_OURS = "trainwise.guards."
# torch's forward hook tables (id -> hook), and those that hold the ids of some of them (id -> flag)
_HOOKS = ("_forward_pre_hooks", "_forward_hooks")
_HOOK_IDS = ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs", "_forward_hooks_always_called")
# instance attributes a guard may set over the module's own, each keeping what was there before in ``.own``
_OVER = ("forward", "zero_grad", "__getstate__")


def _is_ours(value: Any) -> bool:
    return str(getattr(value, "__module__", "")).startswith(_OURS)


def _own(value: Any) -> Any:
    """What was there before trainwise's attribute(s): the first value down the ``.own`` chain that is not ours."""
    while value is not None and _is_ours(value):
        value = value.own
    return value


class _StateWithoutGuards:
    """A guarded module's ``__getstate__``: its class's state (or the instance's own ``__getstate__``, kept in
    ``own``) without trainwise's hooks and attributes."""

    def __init__(self, module: nn.Module) -> None:
        self.module = weakref.ref(module)
        self.own = vars(module).get("__getstate__")

    def __call__(self) -> Any:
        module = self.module()
        state = self.own() if self.own is not None else type(module).__getstate__(module)
        return without_guards(state) if isinstance(state, dict) else state


def without_guards(state: dict[str, Any]) -> dict[str, Any]:
    """A module's ``__dict__`` state with trainwise's hooks and attributes taken out (copies where it changes)."""
    state = dict(state)
    ours = {key for table in _HOOKS for key, hook in state.get(table, {}).items() if _is_ours(hook)}
    if ours:
        for table in (*_HOOKS, *_HOOK_IDS):
            if table in state:
                state[table] = type(state[table])((k, v) for k, v in state[table].items() if k not in ours)
    for name in _OVER:
        if name in state and _is_ours(state[name]):
            own = _own(state[name])
            if own is None:
                del state[name]
            else:
                state[name] = own
    return state


def _carries_guards(module: nn.Module) -> bool:
    attributes = vars(module)
    return (any(_is_ours(hook) for table in _HOOKS for hook in attributes.get(table, {}).values())
            or any(_is_ours(attributes.get(name)) for name in _OVER if name != "__getstate__"))


def pickle_without_guards(module: nn.Module) -> None:
    """From now on, a pickle or deep copy of ``module`` leaves trainwise's hooks and attributes out."""
    if not isinstance(vars(module).get("__getstate__"), _StateWithoutGuards):
        vars(module)["__getstate__"] = _StateWithoutGuards(module)


def release(module: nn.Module) -> None:
    """Put back ``module``'s own ``__getstate__`` once no hook or attribute of trainwise is left on it."""
    state = vars(module).get("__getstate__")
    if isinstance(state, _StateWithoutGuards) and not _carries_guards(module):
        if state.own is None:
            del vars(module)["__getstate__"]
        else:
            vars(module)["__getstate__"] = state.own
