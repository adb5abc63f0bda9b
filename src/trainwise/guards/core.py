"""The runtime guard: hooks on a model and an optimizer that report the doctor's mistakes while a loop runs.

One ``Guard`` installs four hooks (before and after the model's forward, before and after the optimizer's
step) and passes each event to the checks that want it; every check is a class in this package, one file per
code (``tw102_graph_kept.py``...). Checks never synchronise with the device per step: what needs a value from
the device is gathered there and read in ``on_check``, every ``check_every`` optimizer steps and at ``close``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import torch

from trainwise.errors import TrainwiseError
from trainwise.guards import pickling
from trainwise.guards.check import Check
from trainwise.guards.registry import check_classes
from trainwise.wrappers import is_compiled_module, model_layers, optimizer_layers

Action = Literal["warn", "raise", "record"]
# Guard codes the doctor has no rule for yet, so no `trainwise doctor --explain` page: their findings point to the
# lab only (tests/guards/test_guard_core.py fails once the doctor explains one, to take it out of this set).
NOT_EXPLAINED: frozenset[str] = frozenset()
_FORWARD_EVENTS = frozenset({"before_forward", "after_forward", "after_eval_forward"})
_NEVER = sys.maxsize  # no call is due


@dataclasses.dataclass(frozen=True)
class GuardFinding:
    """One mistake seen at run time: the doctor's code, the optimizer step, where (a module or parameter
    name, or a batch field) and one sentence naming the fix."""

    code: str
    step: int
    where: str
    message: str

    def __str__(self) -> str:
        from trainwise.labs import lab_for_code

        place = f" ({self.where})" if self.where else ""
        lab = lab_for_code(self.code)
        see = [] if self.code in NOT_EXPLAINED else [f"trainwise doctor --explain {self.code}"]
        see += [f"measured: trainwise lab {lab.name}"] if lab else []
        pointer = f" ({'; '.join(see)})" if see else ""
        return f"{self.code} at step {self.step}{place}: {self.message}{pointer}"


class GuardWarning(UserWarning):
    """A runtime guard's finding, as a warning: ``.code``, ``.step``, ``.where``, ``.finding``."""

    def __init__(self, finding: GuardFinding) -> None:
        super().__init__(str(finding))
        self.finding = finding
        self.code, self.step, self.where = finding.code, finding.step, finding.where


class GuardError(TrainwiseError):
    """A runtime guard's finding with ``action="raise"``: ``.code``, ``.step``, ``.where``, ``.finding``."""

    def __init__(self, finding: GuardFinding) -> None:
        super().__init__(str(finding))
        self.finding = finding
        self.code, self.step, self.where = finding.code, finding.step, finding.where


class Guard:
    """Runtime checks on ``model`` (and ``optimizer``), reported once per code and place.

    >>> with trainwise.guard(model, optimizer):         # or guard = trainwise.guard(...); ...; guard.close()
    ...     for batch in loader: ...                   # any loop: hand-written, Lightning, Accelerate
    >>> guard.findings                                 # [GuardFinding(code="TW105", step=3, ...), ...]

    ``action="warn"`` issues a :class:`GuardWarning` per finding, ``"raise"`` raises a :class:`GuardError`,
    ``"record"`` only lists it in ``findings``; ``on_finding`` (the Trainer's log) is called with each finding
    as well. ``checks`` restricts the codes.

    ``forward_every=k`` (with an optimizer) hooks the model's forward only during one optimizer step in ``k``
    (steps 0, k, 2k...; the hooks are removed in between), for mistakes that repeat on every step: the
    forward-time checks then cost 1/k of their time. Inside ``with guard.watching_forwards():`` every forward
    is checked. The optimizer-step checks (TW105, TW107) run on every step either way, TW113 at every check.

    ``model`` and ``optimizer`` may be wrapped (DDP, ``torch.compile``; Accelerate's or Lightning's optimizer):
    the checks look at the user's module (``guard.model``) and at the optimizer that really steps
    (``guard.optimizer``). A ``torch.compile`` module's forward is hooked outside the compiled region, so the
    checks add no graph break; the module inside is hooked too, for calls that bypass the compiled one.
    ``other_wrappers`` are more wrappers of the same module whose forwards are checked as well (the Trainer's
    separately compiled evaluation model). ``forwards`` are submodules of ``model`` whose forward, called from
    outside the model's own, is checked as the model's: a LightningModule whose ``training_step`` calls
    ``self.model(x)`` rather than ``self(x)`` (a call nested in another checked forward is not checked again).
    """

    # the plain case wraps model.forward rather than hooking it; a guard attached from inside a forward call (the
    # AutoGuard's) hooks it, so that the call running already gets its forward hook
    _wraps_forward = True

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        action: Action = "warn",
        check_every: int = 50,
        checks: list[str] | None = None,
        on_finding: Callable[[GuardFinding], None] | None = None,
        forward_every: int = 1,
        other_wrappers: Sequence[torch.nn.Module] = (),
        forwards: Sequence[torch.nn.Module] = (),
    ) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TrainwiseError(f"guard() watches a torch.nn.Module, got {type(model).__name__}.")
        # the optimizer that steps, inside Accelerate's AcceleratedOptimizer (which has no step hooks of its own)
        # or Lightning's LightningOptimizer (whose zero_grad does not call the inner optimizer's)
        self.optimizer_layers = optimizer_layers(optimizer) if optimizer is not None else []
        if optimizer is not None and not isinstance(self.optimizer_layers[-1], torch.optim.Optimizer):
            raise TrainwiseError(f"guard()'s optimizer must be a torch optimizer, got {type(optimizer).__name__}.")
        if action not in ("warn", "raise", "record"):
            raise TrainwiseError(f"action must be 'warn', 'raise' or 'record', got {action!r}.")
        if not isinstance(check_every, int) or check_every < 1:
            raise TrainwiseError(f"check_every must be a positive integer, got {check_every!r}.")
        if not isinstance(forward_every, int) or isinstance(forward_every, bool) or forward_every < 1:
            raise TrainwiseError(f"forward_every must be a positive integer, got {forward_every!r}.")
        self.model_layers = model_layers(model)  # as given, then each module it wraps: the last is the user's
        self.model = self.model_layers[-1]
        self._entries = self._compiled_entries([model, *other_wrappers])
        inside = {id(m) for m in self.model.modules()}
        stray = next((m for m in forwards if id(m) not in inside or m is self.model), None)
        if stray is not None:
            raise TrainwiseError(f"forwards must be submodules of the guarded model; a {type(stray).__name__} "
                                 f"is not one.")
        self._forwards = list(forwards)
        self._depth = 0  # checked forwards running (the model's or one of forwards'), with forwards given
        self.optimizer = self.optimizer_layers[-1] if optimizer is not None else None
        self.action = action
        self.check_every = check_every
        self.on_finding = on_finding
        self.step = 0  # optimizer steps taken while guarded (without an optimizer: backward passes, see below)
        # without an optimizer (a loop that updates the weights itself), a backward is the step boundary: one
        # through this parameter (the model's first trainable one), noted by a hook on its gradient
        self._backward_param = None if optimizer is not None else next(
            (p for p in self.model.parameters() if p.requires_grad), None)
        self.steps_at_backward = self._backward_param is not None
        self.findings: list[GuardFinding] = []
        self._reported: set[tuple[str, str]] = set()
        self._handles: list[Any] = []
        # forward hooks, installed and removed on the forward_every schedule
        self.forward_every = forward_every if optimizer is not None else 1
        self._forward_hooks: list[tuple[Callable[..., Any], bool]] = []  # (hook, is a pre-hook)
        self._forward_handles: list[Any] = []
        self._forward_on = False
        # what the wrapped forward calls now: something on every forward, or on eval-mode ones (see _GuardedForward)
        self._forward_work = self._eval_work = False
        self._forward_wrapper: _GuardedForward | None = None
        self._watching = 0  # nested watching_forwards() blocks
        self._in_entry = 0  # forwards of a compiled entry running: the module inside is checked there
        # the forward hooks are inside a compiled region: never removed before close (the module compiled in
        # place, or a hook seen running from a compiled graph)
        self._hooks_stay = getattr(self.model, "_compiled_call_impl", None) is not None
        # the optimizer step running was given a closure (it runs backward itself); set on the steps a check listens
        # before (before_step), which are the steps it reads this on
        self.closure_step = False
        self._step_pre: Callable[..., None] | None = None  # the optimizer's step pre-hook, once installed
        self._step_pre_handle: Any = None  # registered while a check listens before steps (see _hook_step_pre)
        self._in_step_pre = False
        # calls due once guard.step reaches a step: work a check does every few steps costs nothing on the others
        self._wakes: dict[int, list[Callable[[], None]]] = {}
        self._next_check = check_every  # the next step whose post-hook runs check_now
        self._next_wake = 1  # step 0 is watched (forward_every); a first wake sets the schedule
        self._pre_stale = False
        self.checks = [cls(self) for cls in check_classes(checks)]
        self._closed = False
        self.closing = False  # True during the last on_check (at close)
        # run the last checks when the garbage collector frees the guard unclosed, with its model (AutoGuard
        # holds its guards weakly: an interval's pending checks must not die with a model the script drops)
        self.check_when_freed = False
        # the modules that carry the guard's hooks or attributes: pickled and deep-copied without them
        self._carriers = list({id(m): m for m in [*self.model_layers, *self._entries, *self._forwards]}.values())
        for module in self._carriers:
            pickling.pickle_without_guards(module)
        self._install()

    # -- hooks ---------------------------------------------------------------------------------------

    def _compiled_entries(self, wrappers: list[torch.nn.Module]) -> list[torch.nn.Module]:
        """The outermost ``torch.compile`` module of each wrapper (of ``self.model``), once each: hooked, so the
        checks run outside the compiled region instead of inside the user's module, where each is a graph break."""
        entries: list[torch.nn.Module] = []
        for wrapper in wrappers:
            layers = model_layers(wrapper)
            if layers[-1] is not self.model:
                raise TrainwiseError(f"other_wrappers must wrap the guarded model, but a {type(wrapper).__name__} "
                                     f"wraps a {type(layers[-1]).__name__}.")
            compiled = next((layer for layer in layers if is_compiled_module(layer)), None)
            if compiled is not None and not any(compiled is entry for entry in entries):
                entries.append(compiled)
        return entries

    def listen(self, check: Check, event: str, on: bool = True) -> None:
        """Call ``check``'s ``event`` (one it overrides) from now on, or no more (``on=False``): a check with
        nothing to do on an event for a while (it reported already, or waits for a condition) costs no call there."""
        muted = self._muted[event]
        if on:
            muted.discard(check)
        else:
            muted.add(check)
        self._calls[event] = tuple(getattr(c, event) for c in self._listeners[event] if c not in muted)
        if event in _FORWARD_EVENTS:
            self._note_forward_work()
        elif event == "before_step":
            if self._in_step_pre:  # torch iterates the pre-hooks now: the step's post-hook registers or removes it
                self._pre_stale = True
                self._next_wake = min(self._next_wake, self.step + 1)
            else:
                self._hook_step_pre()

    def _hook_step_pre(self) -> None:
        """The optimizer's step pre-hook registered while a check listens before steps, and only then: most
        steps have none to call (the checks that judge steps sample them)."""
        if self._step_pre is None or self.optimizer is None:
            return
        wanted = bool(self._calls["before_step"]) and not self._closed
        if wanted and self._step_pre_handle is None:
            self._step_pre_handle = self.optimizer.register_step_pre_hook(self._step_pre)
        elif not wanted and self._step_pre_handle is not None:
            self._step_pre_handle.remove()
            self._step_pre_handle = None

    def _install(self) -> None:
        events = ("before_forward", "after_forward", "after_eval_forward", "before_step", "after_step")
        self._listeners = {event: [c for c in self.checks if getattr(type(c), event) is not getattr(Check, event)]
                           for event in events}
        self._muted: dict[str, set[Check]] = {event: set() for event in events}
        calls = self._calls = {event: tuple(getattr(c, event) for c in self._listeners[event]) for event in events}
        before_forward = calls["before_forward"]
        after_forward = calls["after_forward"] or calls["after_eval_forward"]
        model = self.model  # what the checks see, whichever wrapper's forward ran
        # the plain case: model.forward wrapped (an instance attribute) rather than hooked, which keeps torch's
        # hook-free call path (about 30 Python lines a forward less); the checks may read its errors there
        self.wraps_forward_call = self._wraps_forward and not (
            self._entries or self._forwards or self._hooks_stay or isinstance(model, torch.jit.ScriptModule))
        self._error_checks = tuple(c for c in self.checks
                                   if type(c).on_forward_error is not Check.on_forward_error)
        for check in self.checks:
            check.on_install()

        def run_pre(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            for call in calls["before_forward"]:
                call(model, args, kwargs)

        def run_post(args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
            replaced = None
            for call in calls["after_forward"]:
                result = call(model, args, kwargs, output if replaced is None else replaced)
                replaced = result if result is not None else replaced
            if not model.training:
                for call in calls["after_eval_forward"]:
                    call(model, args, kwargs, output if replaced is None else replaced)
            return replaced

        # Hooks traced by torch.compile (the user's module compiled in place, or by a wrapper the guard was not
        # given): the checks run eagerly, called from the compiled graph at the price of a graph break each,
        # rather than once at trace time. A compiled graph keeps the hooks it was traced with (torch does not
        # guard on hooks), so from then on they stay, switched by _forward_on. torch._disable_dynamo is the lazy
        # torch.compiler.disable: importing torch._dynamo costs a second, and only a compiled run needs it.
        def traced_pre(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self._hooks_stay = True
            if self.checks_forward_now():
                run_pre(args, kwargs)
            if self._forward_wrapper is not None:  # a traced forward raises at trace time, not in the wrapper:
                for check in self._error_checks:   # the checks that judge errors look before it instead
                    check.before_forward(model, args, kwargs)

        def traced_post(args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
            self._hooks_stay = True
            return run_post(args, kwargs, output) if self.checks_forward_now() else None

        eager_pre, eager_post = torch._disable_dynamo(traced_pre), torch._disable_dynamo(traced_post)

        def pre(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if torch.compiler.is_compiling():
                return eager_pre(args, kwargs)
            if self._forward_on:
                for call in calls["before_forward"]:
                    call(model, args, kwargs)
            return None

        def post(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
            if torch.compiler.is_compiling():
                return eager_post(args, kwargs, output)
            return run_post(args, kwargs, output) if self._forward_on else None

        if before_forward:
            self._forward_hooks.append((pre, True))
        if after_forward:
            self._forward_hooks.append((post, False))
        if self._entries and self._forward_hooks:
            self._hook_inside_compiled(pre if before_forward else None, post if after_forward else None)
        if self._forwards and self._forward_hooks:
            self._hook_direct_calls(pre if before_forward else None, post if after_forward else None)
        if self.wraps_forward_call and (self._forward_hooks or self._error_checks):
            # switched by _forward_on; it reads the forward's errors whether on or not
            self._forward_wrapper = _GuardedForward(self, model, calls, eager_pre, eager_post)
            vars(model)["forward"] = self._forward_wrapper
        self._set_forward_hooks(True)  # step 0 is always watched
        if self.optimizer is not None:
            def step_pre(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
                # torch passes step's own arguments, the optimizer first: step(closure) or step(closure=...)
                self.closure_step = (len(args) > 1 and args[1] is not None) or kwargs.get("closure") is not None
                self._in_step_pre = True
                try:
                    for call in calls["before_step"]:
                        call(optimizer)
                finally:
                    self._in_step_pre = False

            def step_post(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
                # what is due on some steps only (a check's call, the forward_every switch, the periodic checks,
                # a listen made inside the pre-hook) is due at _next_wake: the other steps run these four lines
                self.step += 1
                for call in calls["after_step"]:
                    call(optimizer)
                if self.step >= self._next_wake:
                    self._wake()

            self._step_pre = step_pre
            self._hook_step_pre()
            self._handles.append(self.optimizer.register_step_post_hook(step_post))
        elif self._backward_param is not None:
            self._count_backward_steps(self._backward_param)

    def _count_backward_steps(self, param: torch.Tensor) -> None:
        """Without an optimizer: a hook on ``param``'s gradient notes a backward, and the model's next forward
        starts the next step (its pre-hook runs before the guard's others, so that forward is the new step's).
        Several backward passes through one forward are one step, and the step's work runs in the caller's
        thread (on CUDA, torch calls gradient hooks in its own), at the caller's line."""
        backward = [False]

        def backward_done(tensor: torch.Tensor) -> None:
            backward[0] = True

        def next_step(module: torch.nn.Module, args: Any) -> None:
            if not torch.compiler.is_compiling() and backward[0]:  # traced: nothing of the guard's read
                backward[0] = False
                self.step += 1
                if self.step >= self._next_wake:
                    self._wake()

        self._handles.append(param.register_post_accumulate_grad_hook(backward_done))
        # a compiled model's calls are counted at its compiled entries, eagerly: a hook on the module inside would
        # be traced, and torch.compile recompiles when that module's hooks change (this guard replaced by one
        # with the optimizer)
        for outer in self._entries or [self.model]:
            self._handles.append(outer.register_forward_pre_hook(next_step, prepend=True))

    def take_over(self, previous: Guard) -> None:
        """Carry on from ``previous``, a guard of the same model without an optimizer that this one replaces during
        the optimizer's first step: each check takes what its predecessor saw of the forwards before this step, so
        the first step is judged as if this guard had been there from the start."""
        before = {check.code: check for check in previous.checks}
        for check in self.checks:
            if check.code in before:
                check.take_over(before[check.code])

    def at_step(self, step: int, call: Callable[[], None]) -> None:
        """Call ``call()`` once, right after the optimizer step that brings ``guard.step`` to ``step`` (or after
        the next step, for a step already reached): a check with work on one step in several schedules it here
        instead of listening on every step."""
        self._wakes.setdefault(step, []).append(call)
        self._next_wake = min(self._next_wake, step)

    def _wake(self) -> None:
        step = self.step
        # no forward runs between steps (one interrupted by Ctrl-C left it counted)
        self._in_entry = self._depth = 0
        if self._pre_stale:  # a check listened or stopped listening before steps inside the pre-hook
            self._pre_stale = False
            self._hook_step_pre()
        for due in sorted(s for s in self._wakes if s <= step):
            for call in self._wakes.pop(due):
                call()
        # forward_every: hooks added and removed here; a wrapped forward reads the schedule itself (no wakes)
        every = self.forward_every if self._forward_wrapper is None else 1
        if every > 1 and not self._watching:
            on = step % every == 0
            if on != self._forward_on:
                self._set_forward_hooks(on)
        if step >= self._next_check:  # at a multiple of check_every (guard.step may have been set forward)
            self._next_check = step - step % self.check_every + self.check_every
            if step % self.check_every == 0:
                self.check_now()
        wake = min(min(self._wakes, default=_NEVER), self._next_check)
        if every > 1:  # the step that starts the next forward_every period, or the one after it
            wake = min(wake, step + 1 if step % every == 0 else step - step % every + every)
        if self._entries or self._forwards:  # forwards counted: reset after every step
            wake = step + 1
        self._next_wake = wake

    def _hook_inside_compiled(self, pre: Callable[..., None] | None, post: Callable[..., Any] | None) -> None:
        """With compiled entries: hooks that stay on the user's module until ``close`` (a compiled graph keeps the
        hooks it was traced with) and check only its calls that bypass the compiled entries; inside a compiled
        region they return at once, so tracing them adds nothing to the graph."""
        def inside(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if torch.compiler.is_compiling() or self._in_entry or not self._forward_on:
                return
            pre(module, args, kwargs)  # type: ignore[misc]

        def inside_post(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
            if torch.compiler.is_compiling() or self._in_entry or not self._forward_on:
                return None
            return post(module, args, kwargs, output)  # type: ignore[misc]

        if pre is not None:
            self._handles.append(self.model.register_forward_pre_hook(inside, with_kwargs=True))
        if post is not None:
            self._handles.append(self.model.register_forward_hook(inside_post, with_kwargs=True))
        for entry in self._entries:  # count the entries' forwards running, also those that raise
            self._handles.append(entry.register_forward_pre_hook(self._enter_entry))
            self._handles.append(entry.register_forward_hook(self._leave_entry, always_call=True))

    def _hook_direct_calls(self, pre: Callable[..., None] | None, post: Callable[..., Any] | None) -> None:
        """Hooks, until ``close``, on each of ``forwards``: a call made outside the model's forward (and outside
        another of them) runs the checks as the model's would; the model's own forwards are counted to tell. Inside
        a compiled region they do nothing (the compiled entry's own hooks ran outside it)."""
        def enter(module: torch.nn.Module, args: Any) -> None:
            if not torch.compiler.is_compiling():
                self._depth += 1

        def leave(module: torch.nn.Module, args: Any, output: Any) -> None:
            if not torch.compiler.is_compiling():
                self._depth -= 1

        def direct_pre(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if torch.compiler.is_compiling():
                return
            self._depth += 1
            if self._depth == 1 and pre is not None:
                pre(module, args, kwargs)

        def direct_post(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
            if torch.compiler.is_compiling():
                return None
            self._depth -= 1
            return post(module, args, kwargs, output) if not self._depth and post is not None else None

        for outer in [*self._entries, self.model]:
            self._handles.append(outer.register_forward_pre_hook(enter))
            self._handles.append(outer.register_forward_hook(leave, always_call=True))
        for module in self._forwards:
            self._handles.append(module.register_forward_pre_hook(direct_pre, with_kwargs=True))
            self._handles.append(module.register_forward_hook(direct_post, with_kwargs=True, always_call=True))

    def _enter_entry(self, module: torch.nn.Module, args: Any) -> None:
        self._in_entry += 1

    def _leave_entry(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self._in_entry -= 1

    def checks_forward_now(self) -> bool:
        """Whether a forward of the model runs the forward checks now (``forward_every``, ``watching_forwards``)."""
        if not self._forward_on:
            return False
        every = self.forward_every
        return self._forward_wrapper is None or every == 1 or bool(self._watching) or self.step % every == 0

    def _note_forward_work(self) -> None:
        calls, on = self._calls, self._forward_on
        self._forward_work = on and bool(calls["before_forward"] or calls["after_forward"])
        self._eval_work = on and bool(calls["after_eval_forward"])

    def _set_forward_hooks(self, on: bool) -> None:
        if on == self._forward_on or (on and self._closed):
            return
        self._forward_on = on
        self._note_forward_work()
        if self._forward_wrapper is not None:
            return  # the wrapper stays until close, switched by _forward_on
        if self._hooks_stay and self._forward_handles:
            return  # hooks a compiled graph calls: switched by _forward_on, removed only at close
        if on:
            for module in self._entries or [self.model]:
                for hook, is_pre in self._forward_hooks:
                    register = module.register_forward_pre_hook if is_pre else module.register_forward_hook
                    self._forward_handles.append(register(hook, with_kwargs=True))
        else:
            self._remove_forward_hooks()

    def _remove_forward_hooks(self) -> None:
        for handle in self._forward_handles:
            handle.remove()
        self._forward_handles.clear()

    @contextlib.contextmanager
    def watching_forwards(self) -> Iterator[None]:
        """Check every forward inside the block, whatever ``forward_every`` (code the schedule could miss)."""
        self._watching += 1
        self._set_forward_hooks(True)
        try:
            yield
        finally:
            self._watching -= 1
            if not self._watching and self.forward_every > 1 and self._forward_wrapper is None:
                self._set_forward_hooks(self.step % self.forward_every == 0)

    # -- findings ------------------------------------------------------------------------------------

    def report(self, code: str, where: str, message: str, *, step: int | None = None) -> None:
        """Record a finding once per ``(code, where)``: warn, or raise with ``action="raise"``."""
        if (code, where) in self._reported:
            return
        self._reported.add((code, where))
        finding = GuardFinding(code=code, step=self.step if step is None else step, where=where, message=message)
        self.findings.append(finding)
        if self.on_finding is not None:
            self.on_finding(finding)
        if self.action == "raise":
            raise GuardError(finding)
        if self.action == "warn":
            warnings.warn(GuardWarning(finding), stacklevel=3)

    def fail(self, code: str, where: str, message: str) -> None:
        """Record a finding and raise it as a :class:`GuardError` whatever ``action`` is: for a mistake that
        would fail anyway (a batch on another device), said in place of torch's own message."""
        finding = GuardFinding(code=code, step=self.step, where=where, message=message)
        if (code, where) not in self._reported:
            self._reported.add((code, where))
            self.findings.append(finding)
            if self.on_finding is not None:
                self.on_finding(finding)
        raise GuardError(finding)

    def check_now(self) -> None:
        """Run the checks that read the device (one synchronisation); the guard does this every
        ``check_every`` steps and at ``close``."""
        for check in self.checks:
            check.on_check()

    def close(self, *, check: bool = True) -> None:
        """Run the last checks (unless ``check=False``), then remove every hook; the model and optimizer are
        as before."""
        if self._closed:
            return
        self._closed = self.closing = True
        try:
            if check:
                self.check_now()
        finally:
            self._forward_on = self._forward_work = self._eval_work = False
            self._remove_forward_hooks()
            if self._forward_wrapper is not None:
                self._forward_wrapper.remove()
            for handle in self._handles:
                handle.remove()
            self._handles.clear()
            if self._step_pre_handle is not None:
                self._step_pre_handle.remove()
                self._step_pre_handle = None
            self._forward_hooks.clear()
            self._backward_param = None
            self._wakes.clear()
            self._next_wake = _NEVER
            for item in self.checks:
                item.close()
            for module in self._carriers:
                pickling.release(module)
            self._carriers = []
            # a closed guard keeps no wrapper (DDP, compile) alive: one that outlives its process group
            # into interpreter exit aborts gloo
            self.model_layers, self._entries = self.model_layers[-1:], []
            self.optimizer_layers = self.optimizer_layers[-1:]

    def __del__(self) -> None:
        if getattr(self, "check_when_freed", False) and not self._closed and not sys.is_finalizing():
            with contextlib.suppress(Exception):  # never an error out of the garbage collector
                self.close()

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close(check=exc[0] is None)  # after a failure: the hooks removed, nothing more reported


class _GuardedForward:
    """``model.forward`` while a guard watches it (an instance attribute, taken away at ``close``): the checks
    before and after the model's own forward. A guard with no wrapper above it at ``close`` puts back what was
    there; one wrapped again since (Accelerate's ``prepare``, another guard) stays in that chain, passing calls
    through. A deep copy or a pickle of the model (an EMA copy, ``torch.save(model)``) gets the forward that was
    there before, bound to the copy: the wrapper, which holds the guard, never travels with it."""

    def __init__(self, guard: Guard, model: torch.nn.Module, calls: dict[str, tuple[Callable[..., Any], ...]],
                 eager_pre: Callable[..., Any], eager_post: Callable[..., Any]) -> None:
        self.guard, self.model, self.calls = guard, model, calls
        self.own = vars(model).get("forward")  # an instance attribute there before (Accelerate's wrapper) or None
        self.original = model.forward
        self.__wrapped__ = self.original  # inspect.signature (the HF Trainer's column filter) sees the model's own
        self.eager_pre, self.eager_post = eager_pre, eager_post

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        guard = self.guard
        if not guard._forward_work and (self.model.training or not guard._eval_work):  # no check to call
            try:  # _plain, without its frame: this is every unwatched forward
                return self.original(*args, **kwargs)
            except Exception as error:
                self.failed(args, kwargs, error)
                raise
        if torch.compiler.is_compiling():  # traced by torch.compile: the checks run eagerly (a graph break each),
            self.eager_pre(args, kwargs)   # where they read the forward_every schedule (the step count is not
            output = self.original(*args, **kwargs)  # read in traced code: dynamo would recompile every step)
            replaced = self.eager_post(args, kwargs, output)
            return output if replaced is None else replaced
        if guard.forward_every > 1 and guard.step % guard.forward_every and not guard._watching:
            return self._plain(args, kwargs)  # a step forward_every leaves unwatched
        model, calls = self.model, self.calls
        for call in calls["before_forward"]:
            call(model, args, kwargs)
        try:
            output = self.original(*args, **kwargs)
        except Exception as error:
            self.failed(args, kwargs, error)
            raise
        replaced = None
        for call in calls["after_forward"]:
            result = call(model, args, kwargs, output if replaced is None else replaced)
            replaced = result if result is not None else replaced
        if not model.training:
            for call in calls["after_eval_forward"]:
                call(model, args, kwargs, output if replaced is None else replaced)
        return output if replaced is None else replaced

    def _plain(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            return self.original(*args, **kwargs)
        except Exception as error:
            self.failed(args, kwargs, error)
            raise

    def failed(self, args: tuple[Any, ...], kwargs: dict[str, Any], error: Exception) -> None:
        """The forward raised ``error``: the checks that judge errors see it, and their finding (a
        :class:`GuardError`) replaces it, caused by it; otherwise the caller re-raises ``error`` as it was."""
        guard = self.guard
        if guard._closed:
            return
        try:
            for check in guard._error_checks:
                check.on_forward_error(self.model, args, kwargs, error)
        except GuardError as finding:
            raise finding from error
        except Exception:  # a check that cannot judge this call: the user's own error is what matters
            return

    def remove(self) -> None:
        """Put back the forward there before, unless another wrapper was set over this one since."""
        attributes = vars(self.model)
        if attributes.get("forward") is not self:
            return
        own = self.own
        while isinstance(own, _GuardedForward) and own.guard._closed:  # an inner guard closed first: gone too
            own = own.own
        if own is None:
            del attributes["forward"]
        else:
            attributes["forward"] = own

    def __reduce__(self) -> tuple[Any, ...]:  # copy.deepcopy uses it too, copying the model through its memo
        if self.own is None:
            return functools.partial, (type(self.model).forward, self.model)
        return _same, (self.own,)


def _same(value: Any) -> Any:
    return value


def guard(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    action: Action = "warn",
    check_every: int = 50,
    checks: list[str] | None = None,
    forward_every: int = 1,
) -> Guard:
    """Watch ``model`` and ``optimizer`` for the doctor's mistakes while your loop runs (see :class:`Guard`);
    either may be wrapped (DDP, ``torch.compile``, Accelerate's ``prepare``, Lightning's ``self.optimizers()``)."""
    return Guard(model, optimizer, action=action, check_every=check_every, checks=checks,
                 forward_every=forward_every)
