"""Guards on every model and optimizer a process uses, through torch's global hooks: what ``trainwise run`` puts
around an unchanged script.

A module called while no other module's forward runs is a root model. The first time one is seen, a
:class:`~trainwise.guards.core.Guard` is attached to it, paired with the optimizer that holds its parameters (one
found in the calling frames, or the first to step). Every check is the guard's own: this module only finds the
objects and says where in the user's code each finding happened (its innermost frame: ``user_code.py``).
While a guarded root's forward runs, the global forward hooks are out of torch's hook tables (the root's own
hooks count its calls and put them back when it returns), so its submodules' calls cost nothing; a nested call
of an unguarded root costs one global pre-hook and one global forward hook that return at once. An optimizer
already seen costs one dictionary look-up per step. A forward left by an exception that is not an
``Exception`` (Ctrl-C), after which torch calls no forward hook, is ended at the next optimizer step.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import os
import sys
import warnings
import weakref
from collections.abc import Callable, Iterator
from types import CodeType, FrameType
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from trainwise.guards import pickling
from trainwise.guards.check import Check
from trainwise.guards.core import Guard, GuardFinding
from trainwise.guards.registry import check_classes
from trainwise.guards.user_code import UserCode
from trainwise.wrappers import model_layers, optimizer_layers


class _HookedGuard(Guard):
    """A guard attached from inside the model's first forward call: its forward hooks run for that call too;
    ``on_close`` (the AutoGuard's count of the steps watched) is told its steps when it closes."""

    _wraps_forward = False
    on_close: Callable[[Guard], None] | None = None

    def close(self, *, check: bool = True) -> None:
        if self.on_close is not None and not self._closed:
            self.on_close(self)
        super().close(check=check)


@dataclasses.dataclass(frozen=True)
class Place:
    """A line of the user's code: its file (absolute) and line number; ``callers``, the lines of the user's frames
    that called it, innermost first (the code path that ran; not part of the place's identity)."""

    path: str
    line: int
    callers: tuple[tuple[str, int], ...] = dataclasses.field(default=(), compare=False)

    def shown(self) -> str:
        """``path:line``, the path relative to the current folder when it lies inside it."""
        return f"{shown_path(self.path)}:{self.line}"


def _start_folder() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # the folder was removed
        return None


_START_FOLDER = _start_folder()  # the current folder when trainwise started: a script may change it


def absolute_path(path: str) -> str:
    """``path`` made absolute from the folder trainwise started in."""
    return os.path.normpath(os.path.join(_START_FOLDER or os.getcwd(), path))


def shown_path(path: str) -> str:
    """``path`` relative to the folder trainwise started in when it lies inside it, else as it is."""
    if _START_FOLDER is None:
        return path
    try:
        relative = os.path.relpath(path, _START_FOLDER)
    except ValueError:  # another drive (Windows)
        return path
    return path if relative.startswith("..") else relative


@dataclasses.dataclass(frozen=True)
class LocatedFinding:
    """A guard's finding and the line of the user's code where it happened (None when no line is known)."""

    finding: GuardFinding
    place: Place | None

    @property
    def code(self) -> str:
        return self.finding.code


_COMPILE_WARNING = "Using `torch.compile\\(module\\)` when there are global hooks"

# codes whose finding happened at the model's evaluation forward, whenever the check can tell
_AT_EVALUATION = frozenset({"TW104"})


def _overrides(cls: type[Check], *names: str) -> bool:
    return any(getattr(cls, name) is not getattr(Check, name) for name in names)


def _about_steps(cls: type[Check]) -> bool:
    return cls.about_steps or _overrides(cls, "before_step", "after_step")


class _Root:
    """A root model and its guards (weakly held: a guard lives as long as the hooks on its model do, so a
    model the script drops is freed with its guard); where it was first called and first stepped."""

    _serials = itertools.count()

    def __init__(self, model: nn.Module, place: Place | None) -> None:
        self.serial = next(self._serials)  # unlike id(), never given to another root
        self.model = weakref.ref(model_layers(model)[-1])  # the user's module, inside DDP or compile
        self.outer = weakref.ref(model)
        self.guards: list[weakref.ref[Guard]] = []
        self.optimizers: list[weakref.ref[Any]] = []  # the torch optimizers its guards hold, in order
        self.forward_place = place
        self.step_place: Place | None = None
        self.eval_place: Place | None = None  # its first forward in eval mode with autograd on
        self.own_hooks: list[Any] = []  # its pre- and forward hook counting its own calls (AutoGuard's)

    def remove_own_hooks(self) -> None:
        for handle in self.own_hooks:
            handle.remove()
        self.own_hooks = []
        outer = self.outer()
        if outer is not None:  # its guards closed before: pickled as it is from now on
            pickling.release(outer)

    def live_guards(self) -> list[Guard]:
        return [g for ref in self.guards if (g := ref()) is not None]


class AutoGuard:
    """Guards every root model of the process and the optimizer that trains it, until :meth:`close`.

    >>> auto = AutoGuard(on_finding=print).install()   # then run any training code, unchanged
    >>> auto.close()                                    # last checks; auto.findings lists them all

    ``codes``: the guard codes to run (all when None). ``stop_at``: the code object of the function that runs
    the user's code (frames outside it are not the user's). ``user_code``: tells whether a file is the user's
    (default :class:`~trainwise.guards.user_code.UserCode`: not torch, trainwise, the standard library or an
    installed package). Findings are kept once per code and place.
    """

    def __init__(
        self,
        *,
        codes: list[str] | None = None,
        on_finding: Callable[[LocatedFinding], None] | None = None,
        check_every: int = 50,
        stop_at: CodeType | None = None,
        user_code: Callable[[str], bool] | None = None,
    ) -> None:
        self.classes = check_classes(codes)
        self.codes = [cls.code for cls in self.classes]
        # the checks a second optimizer of the same model runs: those of the step (coverage left out: another
        # optimizer holding the model's other parameters is no mistake)
        self.step_codes = [c.code for c in self.classes if _about_steps(c) and c.code != "TW107"]
        self.on_finding = on_finding
        self.check_every = check_every
        self.stop_at = stop_at
        self.findings: list[LocatedFinding] = []
        self._by_place: dict[tuple[str, Place | None], LocatedFinding] = {}
        self._seen: set[tuple[int, str, str]] = set()  # (root, code, where): a replaced guard says it again
        self._modules: dict[int, tuple[weakref.ref[nn.Module], _Root | None]] = {}  # None: not a root
        self._roots: list[_Root] = []
        self._optimizers: dict[int, tuple[weakref.ref[Any], weakref.ref[Any]]] = {}  # inner -> (inner, given)
        self._stepped: dict[int, weakref.ref[Any]] = {}  # the optimizers that have stepped
        self._users = user_code or UserCode()
        self._handles: list[Any] = []
        # the root module whose forward runs, its re-entries seen by the global hooks, and its depth counted by
        # its own hooks (a guarded root's: the global hooks step aside while it runs)
        self._running: list[Any] = [None, 0, 0]
        self._resume: Callable[[], None] = lambda: None
        # what was watched, for a report after a script that failed: root models, and the most steps of a guard
        self.watched_models = 0
        self.watched_steps = 0

    # -- hooks ---------------------------------------------------------------------------------------

    def install(self) -> AutoGuard:
        """Register the global hooks (module forwards, optimizer steps)."""
        running, known = self._running, self._modules
        # inside a torch.compile region the hooks are traced: they return before reading any state of theirs, so
        # that the graph holds nothing of them and gets no break (one call each in eager mode)
        compiling = torch.compiler.is_compiling

        def pre(module: nn.Module, args: tuple[Any, ...]) -> None:
            if compiling():
                return None
            top = running[0]
            if top is not None:  # a nested call: the fast path
                if module is top:
                    running[1] += 1
                return None
            running[0] = module
            entry = known.get(id(module))
            if entry is None or entry[0]() is not module:
                self._discover(module, args)
                entry = known.get(id(module))
            elif (not module.training and entry[1] is not None and entry[1].eval_place is None
                  and torch.is_grad_enabled()):  # the first evaluation with autograd on: where TW104 happens
                entry[1].eval_place = self._place()
            if entry is not None and entry[1] is not None and entry[1].own_hooks:
                suspend()  # a guarded root counts its own forward: no global hook on its submodules' calls
            return None

        def post(module: nn.Module, args: Any, output: Any) -> None:
            if compiling():
                return None
            if module is running[0]:
                if running[1]:
                    running[1] -= 1
                else:
                    running[0] = None
            return None

        def own_pre(module: nn.Module, args: tuple[Any, ...]) -> None:
            if not compiling() and module is running[0]:
                running[2] += 1

        def own_post(module: nn.Module, args: Any, output: Any) -> None:
            if not compiling() and module is running[0]:
                running[2] -= 1
                if running[2] <= 0:
                    end_root()

        self._own_hooks = (own_pre, own_post)
        pre_hooks = nn.modules.module._global_forward_pre_hooks
        post_hooks = nn.modules.module._global_forward_hooks
        always_called = nn.modules.module._global_forward_hooks_always_called
        suspended = [False]

        def suspend() -> None:
            """The global hooks out of torch's dicts: with none left, torch calls a module's forward directly."""
            pre_id, post_id = self._handles[0].id, self._handles[1].id
            pre_hooks.pop(pre_id, None)
            post_hooks.pop(post_id, None)
            always_called.pop(post_id, None)
            suspended[0] = True

        def resume() -> None:
            if suspended[0] and self._handles:
                pre_id, post_id = self._handles[0].id, self._handles[1].id
                pre_hooks[pre_id], post_hooks[post_id], always_called[post_id] = pre, post, True
            suspended[0] = False

        def end_root() -> None:
            running[0], running[1], running[2] = None, 0, 0
            resume()

        self._resume = resume
        stepped = self._stepped

        def step_pre(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            if compiling():
                return None
            if running[0] is not None and running[2]:  # a root's forward left by Ctrl-C, its hooks skipped
                end_root()
            ref = stepped.get(id(optimizer))
            if ref is None or ref() is not optimizer:
                self._new_optimizer(optimizer)
            return None

        # torch warns, on each torch.compile'd module's call, that global hooks fire for it too: they are ours,
        # and they expect it
        warnings.filterwarnings("ignore", message=_COMPILE_WARNING, category=UserWarning)
        self._handles = [
            nn.modules.module.register_module_forward_pre_hook(pre),
            nn.modules.module.register_module_forward_hook(post, always_call=True),
            register_optimizer_step_pre_hook(step_pre),
        ]
        return self

    def close(self) -> None:
        """Run every guard's last checks, remove every hook; the findings stay in ``findings``."""
        self._resume()
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for root in self._roots:
            root.remove_own_hooks()
        warnings.filters[:] = [f for f in warnings.filters if f[1] is None or f[1].pattern != _COMPILE_WARNING]
        for root in self._roots:
            for guard in reversed(root.live_guards()):  # the last installed first: zero_grad spies unwind
                guard.close()
        self._roots = []
        self._modules.clear()
        self._optimizers.clear()
        self._stepped.clear()

    # -- roots and optimizers ------------------------------------------------------------------------

    def _live_roots(self) -> Iterator[tuple[_Root, nn.Module]]:
        for root in self._roots:
            model = root.model()
            if model is not None and root.live_guards():
                yield root, model

    def _discover(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        """A module called at the top: guard it if it is a new root with parameters. The user's code runs on
        whatever happens here: a model the guard cannot take is said once and left unguarded."""
        self._modules[id(module)] = (_forgetting(self._modules, module), None)
        try:
            self._guard_root(module, args)
        except Exception as exc:  # never the script's failure (nor a warning a filter could make one)
            _say(f"trainwise: could not guard a {type(module).__name__}, left unguarded: {exc}")

    def _guard_root(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        user_model = model_layers(module)[-1]
        if next(user_model.parameters(), None) is None:
            return  # a loss or activation module called on its own: nothing trains there
        optimizers: list[Any] = []
        for root, model in list(self._live_roots()):
            if any(m is user_model for m in model.modules()) or any(m is module for m in model.modules()):
                return  # a part of a guarded model (or the model itself), called on its own
            if any(m is model for m in user_model.modules()):  # a new wrapper or a bigger model: it takes over
                optimizers += [o for ref in root.optimizers if (o := ref()) is not None]
                for guard in reversed(root.live_guards()):
                    guard.close(check=False)
                root.remove_own_hooks()
                self._roots.remove(root)
        place = self._place()
        self._find_optimizers()
        params = {id(p) for p in user_model.parameters()}
        for inner_ref, given_ref in list(self._optimizers.values()):
            inner = inner_ref()
            if inner is not None and inner not in optimizers and _holds(inner, params):
                optimizers.append(given_ref() or inner)
        root = _Root(module, place)
        self.watched_models += 1
        self._modules[id(module)] = (_forgetting(self._modules, module), root)
        self._roots = [r for r in self._roots if r.model() is not None]  # the dropped models' roots go
        self._roots.append(root)
        before = set(module._forward_pre_hooks)
        # with two optimizers sharing the model (an encoder's and a decoder's), each holds only part of its
        # parameters: TW107's "trainable parameters in no group" would be false, so it is left out
        codes = self.codes if len(optimizers) < 2 else [c for c in self.codes if c != "TW107"]
        self._attach(root, module, optimizers[0] if optimizers else None, codes)
        for optimizer in optimizers[1:]:
            self._attach(root, module, optimizer, self.step_codes)
        own_pre, own_post = self._own_hooks
        root.own_hooks = [module.register_forward_pre_hook(own_pre),
                          module.register_forward_hook(own_post, always_call=True)]
        # hooks registered now run from this call's forward hook on, not its pre-hooks: run those for it
        for key in [k for k in module._forward_pre_hooks if k not in before]:
            hook = module._forward_pre_hooks[key]
            if key in module._forward_pre_hooks_with_kwargs:
                hook(module, args, {})
            else:
                hook(module, args)

    def _attach(self, root: _Root, module: nn.Module, optimizer: Any, codes: list[str]) -> None:
        if not codes:
            return
        guard: Guard | None = None

        def found(finding: GuardFinding) -> None:
            self._found(root, finding, closing=guard is not None and guard.closing)

        guard = _HookedGuard(module, optimizer, action="record", checks=codes, on_finding=found,
                      check_every=self.check_every)
        guard.check_when_freed = True
        guard.on_close = self._count_steps
        root.guards.append(weakref.ref(guard))
        if guard.optimizer is not None:
            root.optimizers.append(weakref.ref(guard.optimizer))
            self._remember(guard.optimizer, optimizer)

    def _count_steps(self, guard: Guard) -> None:
        self.watched_steps = max(self.watched_steps, guard.step)

    def _remember(self, inner: Any, given: Any) -> None:
        self._optimizers[id(inner)] = (_forgetting(self._optimizers, inner), weakref.ref(given))

    def _find_optimizers(self) -> None:
        """The optimizers the user's module-level code holds (a script's globals). A function's locals are not
        read: in Python 3.11 reading ``frame.f_locals`` copies them into a dict the frame keeps, which would keep
        a model the function then drops alive; such an optimizer is paired at its first step instead."""
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_code is not self.stop_at:
            code = frame.f_code
            if not code.co_flags & inspect.CO_OPTIMIZED and not self._skipped(code.co_filename):
                for value in list(frame.f_globals.values()):
                    if isinstance(value, torch.optim.Optimizer):
                        inner = optimizer_layers(value)[-1]
                        entry = self._optimizers.get(id(inner))
                        if isinstance(inner, torch.optim.Optimizer) and (entry is None or entry[0]() is not inner):
                            self._remember(inner, value)
            frame = frame.f_back

    def _new_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """An optimizer stepping for the first time: pair it with the roots whose parameters it holds (unless
        they already are), and note where it steps; one the guard cannot take is said once and left alone."""
        self._stepped[id(optimizer)] = _forgetting(self._stepped, optimizer)
        try:
            self._pair(optimizer)
        except Exception as exc:  # never the script's failure (nor a warning a filter could make one)
            _say(f"trainwise: could not guard a {type(optimizer).__name__}, left unguarded: {exc}")

    def _pair(self, optimizer: torch.optim.Optimizer) -> None:
        entry = self._optimizers.get(id(optimizer))
        if entry is None or entry[0]() is not optimizer:
            self._remember(optimizer, optimizer)
        params = {id(p) for group in optimizer.param_groups for p in group["params"]}
        place = self._place()
        for root, model in list(self._live_roots()):
            if not any(id(p) in params for p in model.parameters()):
                continue
            root.step_place = root.step_place or place
            outer = root.outer()
            if outer is None or any(ref() is optimizer for ref in root.optimizers):
                continue
            if not root.optimizers:  # guarded without an optimizer so far: the guard with one replaces it,
                previous = root.live_guards()  # carrying on from what that one saw before this first step
                root.guards = []
                self._attach(root, outer, optimizer, self.codes)
                for guard in root.live_guards():
                    for before in previous:
                        guard.take_over(before)
                for guard in reversed(previous):
                    guard.close(check=False)
            else:
                self._attach(root, outer, optimizer, self.step_codes)

    # -- findings ------------------------------------------------------------------------------------

    def _found(self, root: _Root, finding: GuardFinding, *, closing: bool = False) -> None:
        key = (root.serial, finding.code, finding.where)
        if key in self._seen:
            return
        self._seen.add(key)
        place = root.eval_place if finding.code in _AT_EVALUATION and root.eval_place else None
        if place is None and not closing:
            place = self._place()
        if place is None:  # found at close (the end, or the model freed): where the model stepped or was called
            steps = any(c.code == finding.code and _about_steps(c) for c in self.classes)
            place = (root.step_place or root.forward_place) if steps else (root.forward_place or root.step_place)
        if (finding.code, place) in self._by_place:
            return
        located = LocatedFinding(finding, place)
        self._by_place[(finding.code, place)] = located
        self.findings.append(located)
        if self.on_finding is not None:
            self.on_finding(located)

    def _skipped(self, filename: str) -> bool:
        return not self._users(filename)

    def _place(self) -> Place | None:
        """The innermost frame of the user's code on the stack (inside ``stop_at`` when given) with the user's
        frames that called it, or None."""
        frame: FrameType | None = sys._getframe(1)
        lines: list[tuple[str, int]] = []
        while frame is not None and frame.f_code is not self.stop_at:
            if not self._skipped(frame.f_code.co_filename):
                lines.append((os.path.abspath(frame.f_code.co_filename), frame.f_lineno))
            frame = frame.f_back
        if not lines or (frame is None and self.stop_at is not None):  # not called from the user's code
            return None
        return Place(*lines[0], callers=tuple(lines[1:]))


def _forgetting(table: dict[int, Any], value: Any) -> weakref.ref[Any]:
    """A weak reference to ``value`` that removes its entry (keyed by ``id``) from ``table`` when it dies, unless
    the id has been given to a new object since."""
    key = id(value)

    def forget(ref: weakref.ref[Any]) -> None:
        entry = table.get(key)
        if entry is ref or (isinstance(entry, tuple) and entry[0] is ref):
            del table[key]

    return weakref.ref(value, forget)


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")


def _holds(optimizer: torch.optim.Optimizer, params: set[int]) -> bool:
    return any(id(p) in params for group in optimizer.param_groups for p in group["params"])
