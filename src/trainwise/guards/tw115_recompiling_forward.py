"""TW115 at run time: a compiled model whose forward torch.compile recompiles again and again (shapes, or other
guarded state, that change from call to call), and the point where it stops compiling and runs eagerly."""

from __future__ import annotations

from trainwise.compiled import CompileCount, CompileWatch
from trainwise.guards.check import Check

# A finding once the forward has been recompiled this many times. A run whose shapes settle needs at most about 3:
# the first graph, one that makes a changing dimension dynamic (automatic dynamic shapes), one for a batch of
# size 1 (torch specialises 0 and 1), one for evaluation (grad mode off) -- 4 graphs, measured on the Trainer with
# a short last batch of 1 in training and validation. Dynamo's own recompile_limit is 8.
RECOMPILES_REPORTED = 5

_FIX = ("let the changing dimension vary inside one graph (torch.compile's default dynamic=None rather than "
        "dynamic=False, or torch._dynamo.mark_dynamic(x, dim) on the input), pad or bucket inputs to a few fixed "
        "shapes (drop_last=True for a short last batch), or keep changing values out of the forward's guarded state")


class RecompilingForward(Check):
    """Reads dynamo's cache entries on the guarded model's compiled forward (``trainwise.compiled``) at each
    check interval and at ``close``, never per step: a finding the first time the forward has been recompiled
    ``RECOMPILES_REPORTED`` times, naming the dimension whose size changes when torch's recorded reason says so,
    and another when it reaches ``torch._dynamo.config.recompile_limit``, after which calls that match none of
    its graphs run eagerly. Counted per compiled code object, as dynamo counts towards its limit (two
    ``nn.Sequential`` compiled in one process share theirs). Nothing to read where nothing was compiled."""

    code = "TW115"

    def on_install(self) -> None:
        self._watch = CompileWatch([*self.guard._entries, self.guard.model])
        self._name = f"{type(self.guard.model).__name__}.forward"
        self._many = self._limit = False

    def on_check(self) -> None:
        if self._limit:
            return
        count = self._watch.count()
        if count is None or not count.graphs:
            return
        if count.at_limit:
            self._limit = True
            self._report_limit(count)
        elif count.recompiles >= RECOMPILES_REPORTED and not self._many:
            self._many = True
            changed = count.what_changed()
            self.guard.report(
                self.code, self._name,
                f"torch.compile has compiled {count.graphs} graphs of {self._name} ({count.recompiles} "
                f"recompilations, each a fresh trace and compile{'; ' + changed if changed else ''}); at "
                f"torch._dynamo.config.recompile_limit ({count.limit}) new shapes will run uncompiled; {_FIX}.",
            )

    def _report_limit(self, count: CompileCount) -> None:
        changed = count.what_changed()
        self.guard.report(
            self.code, f"{self._name} (recompile limit)",
            f"torch.compile has compiled {count.graphs} graphs of {self._name}, torch._dynamo.config."
            f"recompile_limit ({count.limit}): a call whose shapes match none of them now runs eagerly, uncompiled "
            f"and slower, without an error{'; ' + changed if changed else ''}; {_FIX}.",
        )
