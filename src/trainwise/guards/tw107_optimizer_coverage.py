"""TW107 at run time: frozen parameters inside the optimizer's groups, and trainable ones in no group."""

from __future__ import annotations

import torch

from trainwise.guards.check import Check


def _shown(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


class OptimizerCoverage(Check):
    """Compares the model's parameters with the optimizer's param groups when the guard starts, before the
    first step and at every check interval (a later unfreeze or ``add_param_group`` changes the answer).
    Parameters the optimizer holds that are not the model's (a loss module's) are left alone."""

    code = "TW107"

    def on_install(self) -> None:
        self._scan()

    def before_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.guard.listen(self, "before_step", False)  # the first step only: then at every check interval
        self._scan()

    def on_check(self) -> None:
        self._scan()

    def _scan(self) -> None:
        optimizer = self.guard.optimizer
        if optimizer is None:
            return
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        frozen: list[str] = []
        missing: list[str] = []
        for name, param in self.guard.model.named_parameters():
            if param.requires_grad:
                if id(param) not in held:
                    missing.append(name)
            elif id(param) in held:
                frozen.append(name)
        if frozen:
            self.guard.report(
                self.code, frozen[0],
                f"{len(frozen)} frozen parameter tensor(s) (requires_grad=False) are in the optimizer's param "
                f"groups ({_shown(frozen)}), where momentum, weight decay or stale gradients can still move them; "
                f"build the optimizer from `p for p in model.parameters() if p.requires_grad`.",
            )
        if missing:
            self.guard.report(
                self.code, missing[0],
                f"{len(missing)} trainable parameter tensor(s) are in no optimizer group ({_shown(missing)}) and "
                f"will never be updated; build the optimizer from the model's current trainable parameters, or "
                f"add them with optimizer.add_param_group (trainwise.freezing.extend_optimizer).",
            )
