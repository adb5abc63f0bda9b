"""TW101 sample-count-divided-by-batches: ``correct / len(loader)`` divides a per-sample sum by a batch count."""

from __future__ import annotations

import ast

from trainwise.doctor.context import LoaderInfo, dotted, is_const, last_name, method_call
from trainwise.doctor.rule import FixAvailability, Rule

_STRIP_METHODS = frozenset({"item", "float", "double", "cpu", "numpy", "tolist", "long", "int"})
_SUM_FUNCS = frozenset({"torch.sum", "torch.count_nonzero", "sum", "numpy.sum", "np.sum"})
_MEAN_FUNCS = frozenset({"torch.mean", "numpy.mean", "np.mean", "statistics.mean"})
_BATCH_SIZE_NAMES = frozenset({"batch_size", "bs", "bsz", "n_samples", "num_samples", "batch_len", "b", "n"})


class SampleCountDividedByBatches(Rule):
    """A count of samples (correct predictions, a summed loss) divided by `len(loader)`, the number of batches.

    ## What it does
    Finds a per-sample sum, such as the number of correct predictions or a loss multiplied by each batch's
    size, divided by `len(<a DataLoader>)`: directly, through a variable, inside an f-string, after `100 *`.

    ## Why is this bad?
    `len(loader)` is the number of *batches*, not of samples. Dividing a count of correct samples by it
    inflates the accuracy about batch-size times (an "accuracy" of 3,150 % with batches of 64), or hides a
    real drop behind a plausible number when the batch is small. The number of samples is
    `len(loader.dataset)`.

    The rule stays silent on an average loss per batch (`running_loss / len(loader)` where each step added
    `loss.item()`), on a sum of per-batch fractions or means divided by the number of batches, on loaders
    whose batches hold one sample, and on a division already compensated by the batch size.

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
    from the dataset's length; no fix is offered when the number of batches comes through a variable
    (which may also be used, rightly, for a per-batch average).
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
        found = self._batch_count(denominator, node, 0)
        if found is None:
            return
        loader_expr, info, direct = found
        if not self._per_sample_sum(numerator, node, 0):
            return
        loader_text = self.ctx.segment(loader_expr) or "loader"
        fix = None
        if direct:
            fix = self.make_fix(
                loader_expr,
                lambda n, cst: cst.Attribute(value=n, attr=cst.Name("dataset")),
                f"use len({loader_text}.dataset)",
                safe=not info.custom_sampling,
            )
        numerator_text = _short(self.ctx.segment(numerator))
        self.report(
            node,
            f"`{numerator_text}` counts samples but is divided by len({loader_text}), the number of batches; "
            f"divide by len({loader_text}.dataset)",
            fix=fix,
        )

    # ------------------------------------------------------------------------------------------ denominator
    def _batch_count(self, expr: ast.AST, at: ast.AST, depth: int) -> tuple[ast.AST, LoaderInfo, bool] | None:
        """The loader whose ``len()`` ``expr`` is (directly, or through a variable assigned once)."""
        if depth > 3:
            return None
        expr = _strip_casts(expr)
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "len":
            if len(expr.args) != 1 or expr.keywords:
                return None
            info = self.ctx.loader(expr.args[0])
            if info is None or info.one_sample_per_batch:
                return None
            return expr.args[0], info, depth == 0
        if isinstance(expr, ast.Name):
            bindings = self.ctx.lookup(expr.id, at)
            if len(bindings) != 1:
                return None
            b = bindings[0]
            if b.kind != "assign" or b.unpacked or b.value is None:
                return None
            found = self._batch_count(b.value, b.stmt, depth + 1)
            if found is not None:
                return found[0], found[1], False
        return None

    # ------------------------------------------------------------------------------------------- numerator
    def _per_sample_sum(self, expr: ast.AST, at: ast.AST, depth: int) -> bool:
        """Whether ``expr`` is a sum over samples: directly, or a variable only ever incremented by such."""
        if depth > 3:
            return False
        expr = _strip_casts(expr)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult):  # 100 * correct
            if _is_number(expr.left):
                return self._per_sample_sum(expr.right, at, depth + 1)
            if _is_number(expr.right):
                return self._per_sample_sum(expr.left, at, depth + 1)
        if isinstance(expr, (ast.Name, ast.Attribute)) and dotted(expr) is not None:
            return self._accumulates_samples(expr, at, depth)
        return self._increment_kind(expr) == "sample"

    def _accumulates_samples(self, expr: ast.AST, at: ast.AST, depth: int) -> bool:
        bindings = self.ctx.bindings_of(expr, at)
        samples = 0
        for b in bindings:
            stmt = b.stmt
            if b.kind == "augassign" and isinstance(stmt, ast.AugAssign):
                if isinstance(stmt.op, (ast.Div, ast.Mult)):
                    continue  # rescaling (correct /= n, correct *= 100) keeps it what it was
                if not isinstance(stmt.op, ast.Add) or b.value is None:
                    return False
                kind = self._increment_kind(b.value)
                if kind != "sample":
                    return False
                samples += 1
            elif b.kind == "assign" and b.value is not None and not b.unpacked:
                if _is_zero(b.value):
                    continue
                if stmt is at:
                    continue
                if self._increment_kind(b.value) == "sample" or (
                    isinstance(b.value, ast.BinOp) and isinstance(b.value.op, ast.Add)
                    and dotted(b.value.left) == dotted(expr) and self._increment_kind(b.value.right) == "sample"
                ):
                    samples += 1
                    continue
                return False
            else:
                return False
        return samples > 0

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


def _is_zero(expr: ast.AST) -> bool:
    if _is_number(expr):
        return expr.value == 0  # type: ignore[attr-defined]
    if isinstance(expr, ast.Call) and len(expr.args) == 1 and _is_number(expr.args[0]):
        return expr.args[0].value == 0 and last_name(expr.func) in ("tensor", "float", "int", "zeros")  # type: ignore[attr-defined]
    return False


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
