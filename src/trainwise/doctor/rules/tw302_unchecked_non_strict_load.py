"""TW302 unchecked-non-strict-load: ``load_state_dict(strict=False)`` whose key report nobody reads."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from trainwise.doctor.context import (
    Context,
    argument,
    dotted,
    is_const,
    is_param,
    keyword,
    position,
    walk_own,
)
from trainwise.doctor.context.checkpoint_paths import path_pattern, same_file
from trainwise.doctor.context.checkpoints import WRAPPER_NAMES, Checkpoints, Keys
from trainwise.doctor.context.functions import constant_of
from trainwise.doctor.rule import Related, Rule


@dataclass(frozen=True)
class _SavedTo:
    """A wrapped model's state dict saved to a known file, as another file of the run sees it (no ast)."""

    file: str  # the file that saves (for a helper: the file that calls it)
    path: str  # the constant path, or "" when only a pattern is known
    keys: Keys
    saved: str
    prefix: str
    places: tuple[Related, ...]
    pattern: str = ""  # the path as a pattern (``*/ckpt_*.pth``), for paths built from arguments


class UncheckedNonStrictLoad(Rule):
    """`load_state_dict(..., strict=False)` whose missing and unexpected keys are never looked at.

    ## What it does
    Finds `load_state_dict(state, strict=False)` calls whose result (the named tuple of `missing_keys` and
    `unexpected_keys`) is discarded, or assigned to names that are never read, or only returned by a
    function or method whose every call in the project drops it (`msg = self.load_state_dict(state,
    strict=False); return msg`, then `self.load_from_pretrained(path)` as a statement).

    It also finds, within one file, a state dict saved from a wrapped model and loaded strictly into the bare
    one: `torch.save(dp_model.state_dict(), path)` with `dp_model = nn.DataParallel(model)` (or
    `DistributedDataParallel(...)`, `torch.compile(...)`, also `model = nn.DataParallel(model)` on the same
    name), then `model.load_state_dict(torch.load(path))` where `model` is the inner model, `dp_model.module`
    or a model built bare (a class of the file, a torchvision/timm constructor). The state dict may sit in a
    checkpoint dict (`{"model": ...}` saved, `ckpt["model"]` loaded), and the save may be in a helper or
    training function that every call passes the wrapped model (`save_checkpoint(model, path)`). The save and
    the load may be in two files of the run (`train.py` saves, `eval.py` loads) when both name the same
    constant path (a string, or a constant imported from a module of the run such as `config.CKPT`), also
    through a helper of a third file (`save_checkpoint(dp_model, optimizer, epoch, "last.pth")` calling
    `torch.save({"model": model.state_dict(), ...}, path)` in `utils/checkpoint.py`); the finding names the
    save, and the model loaded into may be a class of another file of the run, or be built by a factory
    function of the run whose every `return` builds one bare (`net = create_model(cfg)`).

    The model may be wrapped on some runs only (`if torch.cuda.device_count() > 1: net =
    nn.DataParallel(net)`, then `net = net.to(device)`). The paths need not be constants: a path joined or
    formatted from arguments (`os.path.join(args.out, "best.pth")`, `f"{cfg.out}/epoch_{epoch}.ckpt"`) is
    read as a pattern (`*/best.pth`, `*/epoch_*.ckpt`), the save's and the load's matching when their file
    names are the same with a stem of their own (not `*.pth`) in folders that may be the same; the load may
    pick the file from a glob (`sorted(glob.glob(...))[-1]`, `max(folder.glob(...), key=...)`). The state dict
    may be saved by a method of a checkpoint-writer class of the run (`writer.save({"net": net.state_dict()},
    step)`, its folder and file stem read from the constructor call) and read back through a loading function
    of the run (`state, epoch = load_latest(folder, "ckpt")`, which returns `ckpt["model"], ckpt["epoch"]`).

    ## Why is this bad?
    A wrapper's state dict has `module.` (DataParallel/DDP) or `_orig_mod.` (`torch.compile`) in front of
    every key. A strict load into the bare model fails with every key missing and unexpected, typically after
    the training run, at evaluation or export. With `strict=False`, keys that do not match are skipped
    silently: such a checkpoint then loads *nothing*, training or evaluation runs from random weights, and
    the only symptom is a bad number much later. The call returns the keys it could not match; look at them
    (or use `trainwise.checkpoint.load_weights`, which fixes the prefixes and reports what was left out).

    The rule stays silent when the result is used: assigned and then read, printed, asserted or returned,
    and when the function compares the keys itself before the load and looks at the outcome: the keys of the
    loaded dict (or of a dict it is built from) or of the model's own `state_dict()` in a set difference
    (`set(sd.keys()) - set(model.state_dict().keys())`), an `in` test of each key (`[k for k in model_keys if
    k not in loaded_keys]`, `for k, v in model.state_dict().items(): if k not in ckpt: logger.warning(...)`)
    or `==`/`<=` of key sets, whose result is raised, reported, asserted, returned or tested with a raise or a
    report in the branch. Keys that are only counted (`len(sd)`), filtered (`{k: v for k, v in sd.items() if
    k in model_sd}`, a prefix) or tested for one name (`"state_dict" in ckpt`) tell nobody what was skipped.
    On the saved-wrapped form it stays silent when the state dict was taken from `dp_model.module` (or
    `._orig_mod`), when it is loaded into the wrapped model (the DDP tutorial's
    `ddp_model.load_state_dict(...)`), when its keys are rewritten or the loaded dict is passed to anything
    before the load (`{k.replace("module.", ""): v ...}`, `k[7:]`, `removeprefix`,
    `consume_prefix_in_state_dict_if_present`; a file that strips these prefixes anywhere is left alone), when
    the paths differ or cannot be told equal (file names that say nothing of their own, `f"{name}.pth"`;
    two different constant folders), when the model loaded into is of unknown kind (a parameter,
    `build_model()` of a library), when a helper saves models that are wrapped on one call and bare on
    another, when the helper decides what to save from the model it is given (`if isinstance(model,
    nn.DataParallel): torch.save(model.module.state_dict(), ...)`), and when a loading helper rewrites the
    keys before returning them.

    `trainwise lab strict-false` measures it: wrapped checkpoints: strict=False vs load_weights.

    ## Example
    ```python
    import torch

    model.load_state_dict(torch.load("weights.pt", weights_only=True), strict=False)
    ```

    ## Use instead
    ```python
    import torch

    result = model.load_state_dict(torch.load("weights.pt", weights_only=True), strict=False)
    if result.missing_keys or result.unexpected_keys:
        print(f"missing: {result.missing_keys}, unexpected: {result.unexpected_keys}")
    ```

    ## Fix safety
    There is no automatic fix: what to do with keys that did not match depends on the model.
    """

    code = "TW302"
    name = "unchecked-non-strict-load"
    message = "load_state_dict(strict=False) ignores mismatched keys silently; check the returned keys"

    def visit_Call(self, node: ast.Call) -> None:
        """``x.load_state_dict(state, strict=False)`` or ``(state, False)``; a strict load of a wrapped
        model's state dict into the bare model."""
        func = node.func
        if not (isinstance(func, ast.Attribute) and func.attr == "load_state_dict"):
            return
        strict = keyword(node, "strict")
        if not (is_const(strict.value, False) if strict is not None else (
            len(node.args) >= 2 and is_const(node.args[1], False))):
            strict_value = strict.value if strict is not None else (node.args[1] if len(node.args) >= 2 else None)
            if strict_value is None or is_const(strict_value, True):
                self._check_prefix(node)
            return
        if self.ctx.analysis(Checkpoints).keys_checked(node):
            return
        parent = self.ctx.parent(node)
        if isinstance(parent, ast.Expr):
            self.report(node, "load_state_dict(strict=False) discards its report of missing and unexpected keys: "
                              "a checkpoint whose keys do not match loads nothing, silently; check the result")
            return
        if isinstance(parent, (ast.Assign, ast.AnnAssign)) and parent.value is node:
            targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            names = []
            for target in targets:
                elements = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
                for element in elements:
                    if isinstance(element, ast.Starred):
                        element = element.value
                    if not isinstance(element, ast.Name):
                        return  # stored on an object or in a container: assume someone reads it
                    names.append(element.id)
            if all(name.startswith("_") for name in names):
                return  # an explicit discard
            if not self._read_later(set(names), parent):
                self.report(node, f"the keys that load_state_dict(strict=False) could not match are assigned to "
                                  f"`{', '.join(names)}` but never read; a checkpoint whose keys do not match "
                                  f"loads nothing, silently")
            elif (fn := self._returned_to_droppers(set(names), parent)) is not None:
                self.report(node, f"the keys that load_state_dict(strict=False) could not match are returned by "
                                  f"`{fn}()`, and every call of it drops them; a checkpoint whose keys do not match "
                                  f"loads nothing, silently")

    def _returned_to_droppers(self, names: set[str], stmt: ast.AST) -> str | None:
        """The name of the function holding ``stmt`` when its only reads of ``names`` are ``return name`` and
        every call of it in the project (this file and the others, by name) is a statement that drops the
        result (``self.load_from_pretrained(path)``); None otherwise, or when it has no call."""
        fn = self.ctx.scope(stmt)
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or fn.name.startswith("__"):
            return None
        reads = [n for n in self.ctx.nodes(ast.Name) if n.id in names and isinstance(n.ctx, ast.Load)  # type: ignore[attr-defined]
                 and position(n) > position(stmt) and self.ctx.is_inside(n, fn)]
        if not reads or not all(isinstance(self.ctx.parent(n), ast.Return) for n in reads):
            return None
        program = self.ctx.program
        if program is None:
            dropped = [isinstance(self.ctx.parent(c), ast.Expr) for c in self.ctx.calls_named(fn.name)]
        else:
            here = self.ctx.path
            dropped = [d for path, d in program.gather(
                f"TW302 calls of {fn.name}",
                lambda c: [(c.path, isinstance(c.parent(call), ast.Expr)) for call in c.calls_named(fn.name)],
                needles=(fn.name,)) if program.same_project(path, here)]
        return fn.name if dropped and all(dropped) else None

    def _read_later(self, names: set[str], stmt: ast.AST) -> bool:
        scope = self.ctx.scope(stmt)
        after = position(stmt)
        for name in self.ctx.nodes(ast.Name):
            if name.id in names and isinstance(name.ctx, ast.Load) and position(name) > after:  # type: ignore[attr-defined]
                inner = self.ctx.scope(name)
                if inner is scope or self.ctx.is_inside(inner, scope):
                    return True
        return False

    # ------------------------------------------------------------------ a wrapped model's keys, loaded bare
    def _check_prefix(self, load: ast.Call) -> None:
        """``torch.save(dp_model.state_dict(), path)`` then ``model.load_state_dict(torch.load(path))``: the
        keys start with ``module.`` (``_orig_mod.``), the bare model's do not, and the strict load fails. The
        save may be in another file of the run when both name the same constant path."""
        state = load.args[0] if load.args else getattr(keyword(load, "state_dict"), "value", None)
        facts = self.ctx.analysis(Checkpoints)
        if state is None or facts.strips_prefixes():
            return
        saves = facts.wrapped_saves()
        program = self.ctx.program
        if not saves and (program is None or len(program.paths) < 2):
            return
        target = load.func.value  # type: ignore[attr-defined]
        advice = (f"the bare `{dotted(target)}`'s do not, so the strict load fails with missing and unexpected keys; "
                  f"save the inner model's state_dict() (`.module`, `._orig_mod`) or strip the prefix before loading")
        source = facts.loaded_from(state, load)
        wanted: object = ...
        if source is not None:
            path, keys = source
            for save in saves:
                if save.keys == keys and facts.same_path(save.path, save.path_at, path, load) and facts.bare(
                        target, load):
                    where = f"{save.saved} ({WRAPPER_NAMES[save.prefix]}, line {save.save.lineno})"
                    self.report(load, f"this state dict was saved from the wrapped {where}: its keys start with "
                                      f"`{save.prefix}`, {advice}")
                    return
            wanted = constant_of(self.ctx, path)
            pattern = path_pattern(self.ctx, path, load)
        else:  # read through a helper that loads (``ckpt = load_latest(folder)[0]``)
            through = facts.load_pattern(state, load)
            if through is None:
                return
            pattern, keys = through
        if program is None:
            return
        for saved in program.gather("TW302 wrapped saves", _saves_to_files, ("state_dict",)):
            if saved.keys != keys:
                continue
            if saved.file != self.ctx.path and isinstance(wanted, str) and saved.path == wanted:
                to = repr(wanted)
            elif "*" in saved.pattern + pattern and same_file(saved.pattern, pattern):
                to = f"a file named like {saved.pattern!r}"
            else:
                continue
            if facts.bare(target, load):
                self.report(load, f"this state dict was saved from the wrapped {saved.saved} "
                                  f"({WRAPPER_NAMES[saved.prefix]}, {saved.places[0].where()}) to {to}: its "
                                  f"keys start with `{saved.prefix}`, {advice}", related=saved.places)
                return


def _saves_to_files(ctx: Context) -> list[_SavedTo]:
    """The wrapped models' state dicts a file saves to a constant path: its own saves, and, seen from their
    calls in other files, the saves of its functions that save the state dict of a parameter they are given a
    wrapped model for (``save_checkpoint(dp_model, "best.pth")`` elsewhere)."""
    program = ctx.program
    if program is None:
        return []
    facts = ctx.analysis(Checkpoints)
    out = []
    for save in facts.wrapped_saves():
        path = constant_of(ctx, save.path)
        pattern = path if isinstance(path, str) else path_pattern(ctx, save.path, save.path_at)
        place = program.place(ctx, save.save, f"saved from the wrapped {save.saved}")
        out.append(_SavedTo(ctx.path, path if isinstance(path, str) else "", save.keys, save.saved, save.prefix,
                            (place,), pattern))
    for helper in facts.helper_saves():
        places = (program.place(ctx, helper.call, f"the wrapped {helper.saved}"),
                  program.place(helper.callee, helper.save, f"`{helper.function}()` saves its state dict here"))
        path = helper.pattern if "*" not in helper.pattern else ""
        out.append(_SavedTo(ctx.path, path, helper.keys, helper.saved, helper.prefix, places, helper.pattern))
    for fn in ctx.tree.body:
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            saves = _param_saves(ctx, fn)
            if saves:
                for caller, call in program.callers(ctx, fn):
                    out.extend(_helper_saves(caller, call, ctx, fn, saves))
    return out


def _param_saves(callee: Context, fn: ast.AST) -> list[tuple[ast.Call, Keys, str]]:
    """``(save, keys, parameter)`` for each ``torch.save`` of a function's own body that saves the state dict of
    one of its parameters."""
    there = callee.analysis(Checkpoints)
    out = []
    for save in walk_own(getattr(fn, "body", [])):
        if not isinstance(save, ast.Call) or callee.qualname(save.func) != "torch.save" or len(save.args) < 2:
            continue
        for keys, model in there.state_dicts(save.args[0], save, (), 0):
            if isinstance(model, ast.Name) and is_param(fn, model.id):
                out.append((save, keys, model.id))
    return out


def _helper_saves(ctx: Context, call: ast.Call, callee: Context, fn: ast.FunctionDef | ast.AsyncFunctionDef,
                  saves: list[tuple[ast.Call, Keys, str]]) -> list[_SavedTo]:
    """``save_checkpoint(dp_model, "best.pth")`` calling ``fn`` of another file, which saves its parameter's
    state dict (``torch.save({"model": model.state_dict()}, path)``): the saves, seen from the call."""
    program = ctx.program
    if program is None:
        return []
    facts = ctx.analysis(Checkpoints)
    out = []
    for save, keys, param in saves:
        arg = argument(fn, param, call)
        if arg is None:
            continue
        prefix = facts.wrapper_call(arg) if isinstance(arg, ast.Call) else facts.wrapper_prefix(arg, call)
        where = save.args[1]
        if isinstance(where, ast.Name) and is_param(fn, where.id):
            passed = argument(fn, where.id, call)
            path = constant_of(ctx, passed) if passed is not None else ...
        else:
            path = constant_of(callee, where)
        if prefix is not None and isinstance(path, str):
            saved = f"`{dotted(arg)}` passed to `{fn.name}()`" if dotted(arg) is not None else "model"
            places = (program.place(ctx, call, f"the wrapped {saved}"),
                      program.place(callee, save, f"`{fn.name}()` saves its state dict here"))
            out.append(_SavedTo(ctx.path, path, keys, saved, prefix, places))
    return out
