"""TW101 sample-count-divided-by-batches: ``correct / len(loader)`` divides a per-sample sum by a batch count."""

from __future__ import annotations

import ast

from trainwise.doctor.context import Binding, dotted, is_const, last_name, method_call
from trainwise.doctor.context.counting import BatchCount, counting, is_zero_binding
from trainwise.doctor.rule import FixAvailability, Rule

_STRIP_METHODS = frozenset({"item", "float", "double", "cpu", "numpy", "tolist", "long", "int"})
_SUM_FUNCS = frozenset({"torch.sum", "torch.count_nonzero", "sum", "numpy.sum", "np.sum"})
_MEAN_FUNCS = frozenset({"torch.mean", "numpy.mean", "np.mean", "statistics.mean"})
_BATCH_SIZE_NAMES = frozenset({"batch_size", "bs", "bsz", "n_samples", "num_samples", "batch_len", "b", "n"})


class SampleCountDividedByBatches(Rule):
    """A count of samples (correct predictions, a summed loss) divided by `len(loader)`, the number of batches.

    ## What it does
    Finds a per-sample sum, such as the number of correct predictions or a loss multiplied by each batch's
    size, divided by the number of batches of a DataLoader: `len(loader)` written in the division (also
    inside an f-string, after `100 *`, as `max(len(loader), 1)`), a variable or attribute that holds it
    (`n_batches = len(val_dl)`, `self.num_batches = len(self.test_loader)`, `n = steps`), a counter that
    goes up by one once per batch of a loop over the loader (`total += 1`, `steps = steps + 1`), the index
    of `enumerate(loader)` plus one (`i + 1`, or `step` with `start=1`), and a count of batches computed
    from the data (`len(X) // batch_size`, `math.ceil(len(X) / batch_size)`). It looks inside functions,
    methods and at module level, and counts `correct, total = 0, 0` as starting both at zero.

    It also finds a total that gets one term per batch (a summed per-batch loss too) divided, after its loop,
    by a count of batches that is not that loop's: off by a constant (`len(loader) + 1`, a counter started
    at 1, the `enumerate` index without `+ 1`), or the batch counter of another
    loader's loop when its own loop has one too (`val_loss / n_train` beside an `n_val += 1`).

    ## Why is this bad?
    `len(loader)` is the number of *batches*, not of samples. Dividing a count of correct samples by it
    inflates the accuracy about batch-size times (an "accuracy" of 3,150 % with batches of 64), or hides a
    real drop behind a plausible number when the batch is small. The number of samples is
    `len(loader.dataset)`, or better the samples actually seen (`total += labels.size(0)`).

    The rule stays silent on an average loss per batch (`running_loss / len(loader)` or `running_loss /
    total` where each step added `loss.item()` and `total += 1`), on a sum of per-batch fractions or means
    (or of an unknown function's result, `accuracy(out, y)`) divided by the number of batches, on loaders
    whose batches hold one sample, and on a division already compensated by the batch size. A counter is
    only taken to count batches when every assignment of it is a zero or a `+ 1` run exactly once per
    iteration of one loop over a loader (not under an `if`, not in a loop nested inside it), and only
    against a sum made inside that same loop: a counter in a per-sample inner loop counts samples, and
    one bumped only sometimes counts something the rule cannot know. A count off by one stays silent when
    the total or the counter is not added to exactly once per batch (under an `if`, in a loop that may
    `continue` or `break`), and another loader's counter when the total's loop counts nothing itself, the two
    loops are nested, or a loader is another name for the other (`loader = val_loader`).

    `trainwise lab accuracy` measures it: accuracy over batches vs over samples.

    ## Example
    ```python
    from torch.utils.data import DataLoader

    test_loader = DataLoader(test_set, batch_size=64)
    correct = 0
    for images, labels in test_loader:
        predicted = model(images).argmax(dim=1)
        correct += (predicted == labels).sum().item()
    print(f"accuracy: {100 * correct / len(test_loader):.1f}%")
    ```

    ## Use instead
    ```python
    from torch.utils.data import DataLoader

    test_loader = DataLoader(test_set, batch_size=64)
    correct = 0
    for images, labels in test_loader:
        predicted = model(images).argmax(dim=1)
        correct += (predicted == labels).sum().item()
    print(f"accuracy: {100 * correct / len(test_loader.dataset):.1f}%")
    ```
    Better still, count the samples you actually saw (`total += labels.size(0)`), which stays right with
    `drop_last=True`, samplers and several processes (`trainwise.metrics.Accuracy` does that).

    ## Fix safety
    The fix replaces `len(loader)` by `len(loader.dataset)` where the division uses `len(loader)` directly.
    It is safe: it changes the printed value from a wrong number to the right one. It is marked unsafe when
    the loader has a `sampler`, a `batch_sampler` or `drop_last=True`, because then the samples seen differ
    from the dataset's length. No fix is offered when the number of batches comes through a variable (which
    may also be used, rightly, for a per-batch average), a counter, an index or a computation.
    """

    code = "TW101"
    name = "sample-count-divided-by-batches"
    message = "a count of samples is divided by len(loader), the number of batches; divide by len(loader.dataset)"
    fix_availability = FixAvailability.SOMETIMES

    def visit_BinOp(self, node: ast.BinOp) -> None:
        """``numerator / len(loader)``, unless the result is divided again (by the batch size)."""
        if not isinstance(node.op, ast.Div):
            return
        parent = self.ctx.parent(node)
        if isinstance(parent, ast.BinOp) and isinstance(parent.op, (ast.Div, ast.FloorDiv)) and parent.left is node:
            return
        self._check(node, node.left, node.right)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        """``correct /= len(loader)``."""
        if isinstance(node.op, ast.Div):
            self._check(node, node.target, node.value)

    def _check(self, node: ast.AST, numerator: ast.AST, denominator: ast.AST) -> None:
        count = counting(self.ctx).count(denominator, node)
        if count is None:
            return
        if count.offset or not self._sample_count(node, numerator, denominator, count):
            self._wrong_count(node, numerator, denominator, count)

    def _wrong_count(self, node: ast.AST, numerator: ast.AST, denominator: ast.AST, count: BatchCount) -> None:
        """A total that gets one term per batch of a loop, divided after it by a count of batches that is not
        that loop's: off by a constant, or another loader's."""
        numerator = _strip_casts(numerator)
        loop = counting(self.ctx).summed_over(numerator, node)
        if loop is None or self.ctx.is_inside(node, loop):
            return
        summed = counting(self.ctx).loop_loader(loop)
        if summed is None:
            return
        here = count.loop is loop or (count.loop is None and counting(self.ctx).same_loader(count.loader, summed[0]))
        total = _short(self.ctx.segment(numerator) or "the total")
        divisor = _short(self.ctx.segment(_strip_casts(denominator)) or "it")
        loader = self.ctx.segment(summed[0]) or "loader"
        fix = "by the number of samples seen" if self._sample_sum(numerator, node, 0) is not None else (
            f"by len({loader}) or by a counter started at 0")
        if here and count.offset:
            many = f"{abs(count.offset)} batch{'es' if abs(count.offset) > 1 else ''}"
            side = "more" if count.offset > 0 else "fewer"
            self.report(node, f"`{total}` adds one term per batch of `{loader}`, but `{divisor}` is "
                              f"{many} {side} than the batches it summed; divide {fix}")
        elif not here and count.loop is not loop and self._other_loop(count, loop, summed[0], node):
            other = self.ctx.segment(count.loader) or "another loader"  # type: ignore[arg-type]
            self.report(node, f"`{total}` adds one term per batch of `{loader}`, but `{divisor}` counts the "
                              f"batches of `{other}`; divide {fix}")

    def _other_loop(self, count: BatchCount, loop: ast.AST, loader: ast.AST, at: ast.AST) -> bool:
        """Whether ``count`` is the batch counter of a loop over another loader (neither ``loop`` nor nested with
        it) while ``loop`` has an exact counter of its own: the two counters were mixed up."""
        if count.offset or count.how != "counter" or count.loader is None or count.loop is None:
            return False
        if self.ctx.is_inside(count.loop, loop) or self.ctx.is_inside(loop, count.loop):
            return False
        counts = counting(self.ctx)
        return counts.different_loaders(count.loader, loader) and bool(counts.counters_of(loop, at))

    def _sample_count(self, node: ast.AST, numerator: ast.AST, denominator: ast.AST, count: BatchCount) -> bool:
        """A per-sample sum divided by an exact count of batches: reported; whether it was."""
        increments = self._sample_sum(numerator, node, 0)
        if increments is None:
            return False
        if count.loop is not None and (
            not increments or not all(self.ctx.is_inside(s, count.loop) for s in increments)
        ):
            return False  # a counter of batches and a sum made in another loop: see _wrong_count
        numerator_text = _short(self.ctx.segment(numerator))
        loader_text = (self.ctx.segment(count.loader) if count.loader is not None else "") or "loader"
        denominator_text = ""
        if count.how != "len":
            denominator_text = (count.name if count.how in ("alias", "counter") else None) or _short(
                self.ctx.segment(_strip_casts(denominator)) or "it"
            )
        fix = None
        if count.how == "len" and count.info is not None:
            fix = self.make_fix(
                count.loader,  # type: ignore[arg-type]
                lambda n, cst: cst.Attribute(value=n, attr=cst.Name("dataset")),
                f"use len({loader_text}.dataset)",
                safe=not count.info.custom_sampling,
            )
            why = f"is divided by len({loader_text}), the number of batches; divide by len({loader_text}.dataset)"
        elif count.how == "alias" and count.loader is not None:
            holds = "which holds" if count.name else "that is"
            why = (f"is divided by `{denominator_text}`, {holds} len({loader_text}), the number of batches; "
                   f"divide by len({loader_text}.dataset)")
        elif count.how == "counter":
            why = (f"is divided by `{denominator_text}`, which counts batches (+1 per batch of `{loader_text}`); "
                   f"divide by the number of samples: add each batch's size (`labels.size(0)`) to a total")
        elif count.how == "index":
            why = (f"is divided by `{denominator_text}`, the number of batches of `{loader_text}` so far; "
                   f"divide by the number of samples seen (add each batch's size)")
        else:
            why = f"is divided by `{denominator_text}`, a number of batches; divide by the number of samples"
        self.report(node, f"`{numerator_text}` counts samples but {why}", fix=fix)
        return True

    # ------------------------------------------------------------------------------------------- numerator
    def _sample_sum(self, expr: ast.AST, at: ast.AST, depth: int) -> list[ast.AST] | None:
        """Whether ``expr`` is a sum over samples: directly (then ``[]``), or a variable only ever incremented
        by such (then the incrementing statements); None when it is not (or not known to be)."""
        if depth > 3:
            return None
        expr = _strip_casts(expr)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult):  # 100 * correct
            if _is_number(expr.left):
                return self._sample_sum(expr.right, at, depth + 1)
            if _is_number(expr.right):
                return self._sample_sum(expr.left, at, depth + 1)
        if isinstance(expr, (ast.Name, ast.Attribute)) and dotted(expr) is not None:
            return self._accumulates_samples(expr, at)
        return [] if self._increment_kind(expr) == "sample" else None

    def _accumulates_samples(self, expr: ast.AST, at: ast.AST) -> list[ast.AST] | None:
        """The statements that increment ``expr``, all by per-sample sums; None when one does otherwise. The
        same for every read of the name (a notebook divides the same ``correct`` in every cell): once per list
        of bindings, unless ``at`` is one of them."""
        bindings = self.ctx.bindings_of(expr, at)
        statements = self.ctx.memo_bindings("statements", bindings, lambda: {id(b.stmt) for b in bindings})
        if id(at) in statements:
            return self._increments(expr, at, bindings)
        return self.ctx.memo_bindings(("TW101 increments", dotted(expr)), bindings,
                                      lambda: self._increments(expr, at, bindings))

    def _increments(self, expr: ast.AST, at: ast.AST, bindings: list[Binding]) -> list[ast.AST] | None:
        increments: list[ast.AST] = []
        for b in bindings:
            stmt = b.stmt
            if b.kind == "augassign" and isinstance(stmt, ast.AugAssign):
                if isinstance(stmt.op, (ast.Div, ast.Mult)):
                    continue  # rescaling (correct /= n, correct *= 100) keeps it what it was
                if not isinstance(stmt.op, ast.Add) or b.value is None:
                    return None
                if self._increment_kind(b.value) != "sample":
                    return None
                increments.append(stmt)
            elif is_zero_binding(b):
                continue  # correct = 0, test_loss, correct = 0, 0
            elif b.kind == "assign" and b.value is not None and not b.unpacked:
                if stmt is at:
                    continue
                if self._increment_kind(b.value) == "sample" or (
                    isinstance(b.value, ast.BinOp) and isinstance(b.value.op, ast.Add)
                    and dotted(b.value.left) == dotted(expr) and self._increment_kind(b.value.right) == "sample"
                ):
                    increments.append(stmt)
                    continue
                return None
            else:
                return None
        return increments or None

    def _increment_kind(self, expr: ast.AST) -> str | None:
        """"sample" for a per-sample sum, "fraction" for a per-batch mean or fraction, else None."""
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult):
            for side, other in ((expr.left, expr.right), (expr.right, expr.left)):
                if self._is_batch_size(side) and not self._has_mean_or_div(other):
                    return "sample"
        if self._has_mean_or_div(expr):
            return "fraction"
        has_compare = has_sum = False
        for sub in _walk(expr):
            if isinstance(sub, ast.Compare) and all(isinstance(op, (ast.Eq, ast.NotEq)) for op in sub.ops):
                has_compare = True
            elif isinstance(sub, ast.Call):
                if method_call(sub, "eq", "ne", "equal"):
                    has_compare = True
                elif method_call(sub, "sum", "count_nonzero", "nansum") or (
                    self.ctx.qualname(sub.func) or last_name(sub.func) or ""
                ) in _SUM_FUNCS:
                    has_sum = True
                kw = next((k for k in sub.keywords if k.arg == "reduction"), None)
                if kw is not None and is_const(kw.value, "sum"):
                    return "sample"
        if has_compare and has_sum:
            return "sample"
        return None

    def _has_mean_or_div(self, expr: ast.AST) -> bool:
        for sub in _walk(expr):
            if isinstance(sub, ast.BinOp) and isinstance(sub.op, (ast.Div, ast.FloorDiv)):
                return True
            if isinstance(sub, ast.Call) and (
                method_call(sub, "mean", "nanmean") or (self.ctx.qualname(sub.func) or "") in _MEAN_FUNCS
            ):
                return True
        return False

    def _is_batch_size(self, expr: ast.AST) -> bool:
        """``x.size(0)``, ``x.shape[0]``, ``len(x)`` (x not a loader), ``batch_size``."""
        if isinstance(expr, ast.Call):
            if method_call(expr, "size") and len(expr.args) == 1 and is_const(expr.args[0], 0):
                return True
            if isinstance(expr.func, ast.Name) and expr.func.id == "len" and len(expr.args) == 1:
                return self.ctx.loader(expr.args[0]) is None
            return False
        if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Attribute):
            return expr.value.attr == "shape" and is_const(expr.slice, 0)
        name = last_name(expr)
        return name is not None and (name in _BATCH_SIZE_NAMES or name.endswith("batch_size"))


def _strip_casts(expr: ast.AST) -> ast.AST:
    """``float(x)``, ``x.item()``, ``x.double()`` ... -> ``x``."""
    for _ in range(8):
        if isinstance(expr, ast.Call) and not expr.keywords:
            if isinstance(expr.func, ast.Name) and expr.func.id in ("float", "int") and len(expr.args) == 1:
                expr = expr.args[0]
                continue
            if isinstance(expr.func, ast.Attribute) and expr.func.attr in _STRIP_METHODS and not expr.args:
                expr = expr.func.value
                continue
        break
    return expr


def _is_number(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Constant) and type(expr.value) in (int, float)


def _walk(expr: ast.AST, limit: int = 400) -> list[ast.AST]:
    """The nodes of an expression, at most ``limit`` of them (the rule only needs small expressions)."""
    out = []
    stack = [expr]
    while stack and len(out) < limit:
        node = stack.pop()
        out.append(node)
        if isinstance(node, ast.Lambda) and node is not expr:
            continue
        stack.extend(ast.iter_child_nodes(node))
    return out


def _short(text: str, limit: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
