"""What ``torch.compile`` compiled for a module: how many graphs its forward has, what made torch recompile it
and whether it reached dynamo's recompile limit, read from torch's own caches when asked, never per step.

Dynamo compiles the first Python frame a compiled call runs (the module's ``forward``, or the small
``wrap_inline`` frame it puts around a ``torch.nn`` container such as ``nn.Sequential``) and keeps one cache
entry per compiled version of it on the frame's code object; a recompilation adds an entry, and once a code
object holds ``torch._dynamo.config.recompile_limit`` entries (8), a call that matches none of them runs
eagerly, uncompiled. :class:`CompileWatch` reads those entries (``_debug_get_cache_entry_list``, the list
torch's own recompile checks walk) and the reasons dynamo recorded when a guard failed (``guard_failures``).
Both are torch internals: if a version of torch lacks them, the counts are ``None`` and nothing fails.
Nothing here imports ``torch._dynamo``: a process that never compiled has nothing to count.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import types
from typing import Any

from torch import nn

from trainwise.wrappers import is_compiled_module, model_layers

_SIZE = re.compile(r"tensor '([^']+)' size mismatch at index (\d+)\. expected (\d+), actual (\d+)")
_PREFIX = re.compile(r"^\s*\d+/\d+:\s*")  # the compile id dynamo puts before each reason ("0/7: ...")


@dataclasses.dataclass(frozen=True)
class CompileCount:
    """The graphs compiled for a module's forward (dynamo's cache entries on its code objects; a graph break
    inside the forward does not add one), the limit that makes further shapes run eagerly, and torch's
    reasons for the recompilations, oldest first."""

    graphs: int
    limit: int | None
    reasons: tuple[str, ...]

    @property
    def recompiles(self) -> int:
        return max(self.graphs - 1, 0)

    @property
    def at_limit(self) -> bool:
        """Dynamo will compile no more versions: a call that matches none of these graphs runs eagerly."""
        return self.limit is not None and self.graphs >= self.limit

    def what_changed(self) -> str:
        """What torch says made it recompile, in a few words: the dimensions whose size changed (with the sizes
        seen), else its last reason as it wrote it; empty when torch recorded none."""
        sizes: dict[tuple[str, int], list[str]] = {}
        for reason in self.reasons:
            for name, dim, expected, actual in _SIZE.findall(reason):
                seen = sizes.setdefault((name, int(dim)), [])
                for size in (expected, actual):
                    if size not in seen:
                        seen.append(size)
        if sizes:
            parts = []
            for (name, dim), seen in sizes.items():
                shown = ", ".join(seen[:6]) + (", ..." if len(seen) > 6 else "")
                parts.append(f"the size of dimension {dim} of `{name}` changes ({shown})")
            return "; ".join(parts)
        if self.reasons:
            last = self.reasons[-1].strip().splitlines()[0]
            return f"torch's reason: {last[:200]}"
        return ""


def forward_codes(model: nn.Module) -> list[tuple[types.CodeType, int]]:
    """The code objects dynamo compiles as the first frame of a call of ``model`` (any wrapper layers), each
    with the ``isolate_recompiles`` region its entries are counted in (-1: the shared one)."""
    codes: list[tuple[types.CodeType, int]] = []

    def add(function: Any, region: int) -> None:
        function = getattr(function, "__func__", function)  # a bound method: its function
        code = getattr(function, "__code__", None)
        if isinstance(code, types.CodeType) and all(code is not c for c, _ in codes):
            codes.append((code, region))

    layers = model_layers(model)
    region = -1
    for layer in layers:
        if is_compiled_module(layer):
            region = getattr(layer.dynamo_ctx, "_isolate_recompiles_id", -1) if hasattr(layer, "dynamo_ctx") else -1
            inner = getattr(layer.forward, "__wrapped__", None)  # wrap_inline's frame around a torch.nn module
            if isinstance(inner, types.FunctionType):
                add(inner, region)
    user = layers[-1]
    # the forward torch calls: an instance attribute (a library's patch) before the class's
    own = vars(user).get("forward")
    add(own if hasattr(getattr(own, "__func__", own), "__code__") else type(user).forward, region)
    return codes


def _cache_entries(code: types.CodeType) -> list[Any] | None:
    eval_frame = getattr(getattr(sys.modules.get("torch._C"), "_dynamo", None), "eval_frame", None)
    read = getattr(eval_frame, "_debug_get_cache_entry_list", None)
    if read is None:
        return None
    try:
        return list(read(code))
    except Exception:  # a torch whose cache API changed: nothing counted, nothing broken
        return None


def recompile_limit() -> int | None:
    """``torch._dynamo.config.recompile_limit`` (``cache_size_limit`` before torch 2.6), when dynamo is loaded."""
    config = getattr(sys.modules.get("torch._dynamo"), "config", None)
    for name in ("recompile_limit", "cache_size_limit"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


class CompileWatch:
    """The compiled graphs of a module's forward (and of more wrappers of the same module): ``count()`` now,
    ``new_graphs()`` since the watch started. Each read walks a few cache entries; nothing runs in between."""

    def __init__(self, models: list[nn.Module]) -> None:
        self.codes: list[tuple[types.CodeType, int]] = []
        self.modules = {id(layer) for model in models for layer in model_layers(model)}
        for model in models:
            for code, region in forward_codes(model):
                if all(code is not c or region != r for c, r in self.codes):
                    self.codes.append((code, region))
        self.start = self._ids()

    def _entries(self) -> list[tuple[types.CodeType, Any]] | None:
        if "torch._dynamo" not in sys.modules:  # nothing was ever compiled in this process
            return []
        found = []
        for code, region in self.codes:
            entries = _cache_entries(code)
            if entries is None:
                return None
            found += [(code, e) for e in entries
                      if getattr(e, "isolate_recompiles_id", -1) == region and self._ours(e)]
        return found

    def _ours(self, entry: Any) -> bool:
        """An entry compiled for this module: not one whose guards pin another module instance (dynamo counts
        its limit per such instance; without any, per code object, as here)."""
        pinned = getattr(getattr(entry, "guard_manager", None), "id_matched_objs", None) or {}
        for ref in pinned.values():
            value = ref() if callable(ref) else None
            if isinstance(value, nn.Module) and id(value) not in self.modules:
                return False
        return True

    def _ids(self) -> set[tuple[int, str]]:
        return {(id(code), str(getattr(e, "compile_id", id(e)))) for code, e in self._entries() or []}

    def count(self) -> CompileCount | None:
        """The graphs each watched code object holds (the largest: dynamo's limit is per code object); None
        when this torch does not expose its cache."""
        entries = self._entries()
        if entries is None:
            return None
        per_code = [sum(1 for c, _ in entries if c is code) for code, _ in self.codes]
        graphs = max(per_code, default=0)
        failures = getattr(sys.modules.get("torch._dynamo.utils"), "guard_failures", None) or {}
        reasons: list[str] = []
        for code, _ in self.codes:
            for reason in failures.get(code, ()) if hasattr(failures, "get") else ():
                text = _PREFIX.sub("", str(reason))
                if text not in reasons:
                    reasons.append(text)
        return CompileCount(graphs=graphs, limit=recompile_limit() if graphs else None, reasons=tuple(reasons))

    def new_graphs(self) -> int | None:
        """Graphs compiled for the watched forwards since the watch started; None when this torch does not
        expose its cache."""
        entries = self._entries()
        if entries is None:
            return None
        return sum(1 for code, e in entries if (id(code), str(getattr(e, "compile_id", id(e)))) not in self.start)
