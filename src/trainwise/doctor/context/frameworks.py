"""What the training frameworks do to a model's mode, as far as the code shows: a ``LightningModule`` (its
class chain across the files of the run), Lightning's ``Trainer`` and Hugging Face's trainers (which put the
model in train mode themselves), the hooks that run before training, and the configuration switches a freeze
may sit under (``if cfg.freeze_backbone:``). Asked by TW108."""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from trainwise.doctor.context.syntax import dotted, keyword

if TYPE_CHECKING:
    from trainwise.doctor.context import Context

_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
LIGHTNING_MODULES = frozenset({
    "lightning.LightningModule", "lightning.pytorch.LightningModule", "lightning.pytorch.core.LightningModule",
    "lightning.pytorch.core.module.LightningModule", "pytorch_lightning.LightningModule",
    "pytorch_lightning.core.LightningModule", "pytorch_lightning.core.module.LightningModule",
})
_LIGHTNING_TRAINERS = frozenset({
    "lightning.Trainer", "lightning.pytorch.Trainer", "lightning.pytorch.trainer.Trainer",
    "lightning.pytorch.trainer.trainer.Trainer", "pytorch_lightning.Trainer", "pytorch_lightning.trainer.Trainer",
    "pytorch_lightning.trainer.trainer.Trainer",
})
# Hugging Face trainers: their training_step calls model.train() at every step (transformers, trl).
_HF_TRAINER = re.compile(r"(?:transformers|trl)(?:\.\w+)*\.(?:\w*Seq2Seq|SFT|DPO|Reward|PPO|GRPO|KTO|ORPO|CPO)?Trainer")
# Lightning hooks that run once before training: a freeze there holds for the whole fit.
BEFORE_TRAINING = frozenset({"__init__", "setup", "configure_model", "configure_sharded_model", "on_fit_start",
                             "on_train_start", "configure_optimizers"})
# Names that say the norm statistics keep training on purpose (``train_bn``, ``update_norm_stats``).
_DELIBERATE = re.compile(r"(?:train|update|adapt|tune)_?(?:bn|norms?|batch_?norms?|running)\w*|"
                         r"(?:bn|norms?)_?(?:train|update|adapt|momentum)\w*", re.IGNORECASE)


def lightning_chain(ctx: Context, cls: ast.ClassDef | None,
                    depth: int = 0) -> list[tuple[Context, ast.ClassDef]] | None:
    """``cls`` and its ancestors up to the one deriving from ``LightningModule`` (of this file or another of
    the run), each with its file's context; None when ``cls`` is no LightningModule or a base is unknown (a
    class from outside the run may have hooks of its own)."""
    if cls is None or depth > 4:
        return None
    found: list[tuple[Context, ast.ClassDef]] | None = None
    for base in cls.bases:
        q = ctx.qualname(base)
        if q in LIGHTNING_MODULES:
            found = found or [(ctx, cls)]
            continue
        local = ctx.class_named(base.id, cls) if isinstance(base, ast.Name) else None
        sub = lightning_chain(ctx, local, depth + 1) if local is not None else _chain_of_run(ctx, base, depth + 1)
        if sub is None:
            if q is not None and q.split(".", 1)[0] in ("abc", "typing"):
                continue
            return None
        found = [(ctx, cls), *sub]
    return found


def _chain_of_run(ctx: Context, base: ast.expr, depth: int) -> list[tuple[Context, ast.ClassDef]] | None:
    """``lightning_chain`` of a base class of another file of the run. Whether there is one is asked once per
    class of the run: most are no LightningModule, and their file is then not parsed again for each subclass."""
    program = ctx.program
    symbol = program.resolve(ctx, base) if program is not None else None
    if program is None or symbol is None or symbol.name is None or "." in symbol.name:
        return None

    found: list[list[tuple[Context, ast.ClassDef]] | None] = []

    def chain() -> list[tuple[Context, ast.ClassDef]] | None:
        other = program.class_of(ctx, base)
        found.append(lightning_chain(other[0], other[1], depth) if other is not None else None)
        return found[-1]

    if not program.remember(("Lightning chain", symbol.path, symbol.name, depth), lambda: chain() is not None):
        return None
    return found[0] if found else chain()


def deliberate(chain: list[tuple[Context, ast.ClassDef]]) -> bool:
    """Whether the classes name a choice to keep the norm statistics training (``train_bn``,
    ``update_norm_stats``), or set ``track_running_stats``/``momentum`` on their layers."""
    for _ctx, cls in chain:
        for n in ast.walk(cls):
            word = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else (
                n.arg if isinstance(n, ast.arg) else None)
            if word is not None and (_DELIBERATE.fullmatch(word) or word == "track_running_stats"):
                return True
    return False


def unconditional(ctx: Context, stmt: ast.AST, fn: ast.AST) -> bool:
    """Whether ``stmt`` runs every time ``fn`` does for some configuration: no ``if``, ``while`` or ``try``
    around it, but the tests of a loop over parameters on their names (already judged by the freeze, ``if "fc"
    not in name``) and configuration switches (``if cfg.freeze_backbone:``, ``if not self.hparams.finetune:``):
    with the switch set, the freeze holds for the whole fit."""
    loop_names: set[str] = set()
    chain = []
    for parent in ctx.ancestors(stmt):
        if parent is fn:
            break
        chain.append(parent)
    for parent in reversed(chain):
        if isinstance(parent, (ast.For, ast.AsyncFor)):
            loop_names |= {n.id for n in ast.walk(parent.target) if isinstance(n, ast.Name)}
        elif isinstance(parent, (ast.If, ast.IfExp)):
            if not any(isinstance(n, ast.Name) and n.id in loop_names for n in ast.walk(parent.test)) \
                    and switch_of(parent.test) is None:
                return False
        elif isinstance(parent, (ast.While, ast.Try, ast.ExceptHandler, ast.Match)):
            return False
    return True


def switch_around(ctx: Context, stmt: ast.AST) -> str | None:
    """The configuration switch of an ``if`` around ``stmt`` in its function (not a test on a loop variable)."""
    loops = {n.id for p in ctx.ancestors(stmt) if isinstance(p, (ast.For, ast.AsyncFor))
             for n in ast.walk(p.target) if isinstance(n, ast.Name)}
    for parent in ctx.ancestors(stmt):
        if isinstance(parent, _FUNCS):
            return None
        switch = switch_of(parent.test) if isinstance(parent, ast.If) else None
        if switch is not None and switch.split(".", 1)[0] not in loops:
            return switch
    return None


def switch_of(test: ast.AST) -> str | None:
    """The configuration switch an ``if`` tests (``cfg.freeze_backbone``, ``not self.hparams.finetune``,
    ``args.mode == "linear"``): a name or attribute chain, negated or compared with constants; else None
    (a call, a value computed at run time)."""
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test = test.operand
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(
            test.ops[0], (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)):
        other = test.comparators[0]
        constant = isinstance(other, ast.Constant) or (
            isinstance(other, (ast.Tuple, ast.List, ast.Set)) and all(isinstance(e, ast.Constant) for e in other.elts))
        if not constant:
            return None
        test = test.left
    if isinstance(test, ast.Subscript) and isinstance(test.slice, ast.Constant):  # cfg["freeze"]
        test = test.value
    return dotted(test)


def framework_training(ctx: Context, call: ast.Call) -> tuple[str, ast.expr | None] | None:
    """``(kind, model)`` for a call that hands a model to a framework that trains it in train mode:
    ``trainer.fit(model)`` of a Lightning ``Trainer`` (``"lightning"``), ``Trainer(model=model).train()`` of a
    Hugging Face trainer (``"hf"``); the model expression may be None (not passed by name or position)."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return None
    trainer = func.value
    ctor = trainer if isinstance(trainer, ast.Call) else (
        ctx.value_of(trainer, call) if isinstance(trainer, ast.Name) else None)
    if not isinstance(ctor, ast.Call):
        return None
    kind = trainer_kind(ctx, ctor, call)
    if kind == "lightning" and func.attr == "fit":
        return kind, call.args[0] if call.args else getattr(keyword(call, "model"), "value", None)
    if kind == "hf" and func.attr == "train":
        return kind, ctor.args[0] if ctor.args else getattr(keyword(ctor, "model"), "value", None)
    return None


def trainer_kind(ctx: Context, ctor: ast.Call, at: ast.AST) -> str | None:
    """``"lightning"`` for a Lightning ``Trainer(...)``, ``"hf"`` for a Hugging Face trainer (or a class of
    the file deriving from one without its own ``training_step``), else None."""
    q = ctx.qualname(ctor.func) or ""
    if q in _LIGHTNING_TRAINERS:
        return "lightning"
    if _HF_TRAINER.fullmatch(q):
        return "hf"
    if isinstance(ctor.func, ast.Name):
        cls = ctx.class_named(ctor.func.id, at)
        if (cls is not None and any(_HF_TRAINER.fullmatch(ctx.qualname(b) or "") for b in cls.bases)
                and not any(isinstance(f, _FUNCS) and f.name in ("training_step", "compute_loss")
                            for f in cls.body)):
            return "hf"
    return None


def before_training(ctx: Context, cls: ast.ClassDef, stmt: ast.AST) -> bool:
    """Whether a freeze runs, unconditionally, in a hook that runs before training, or in a method of the
    class that such a hook calls unconditionally (``self._freeze_backbone()`` in ``__init__``)."""
    fn = ctx.scope(stmt)
    if not isinstance(fn, _FUNCS) or not unconditional(ctx, stmt, fn):
        return False
    if fn.name in BEFORE_TRAINING:
        return True
    if ctx.parent(fn) is not cls:
        return False
    for call in ctx.calls_named(fn.name):
        hook = ctx.scope(call)
        if (isinstance(call.func, ast.Attribute) and dotted(call.func.value) == "self"
                and isinstance(hook, _FUNCS) and hook.name in BEFORE_TRAINING
                and ctx.parent(hook) is cls and unconditional(ctx, call, hook)):
            return True
    return False
