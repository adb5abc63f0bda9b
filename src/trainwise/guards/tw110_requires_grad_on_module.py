"""TW110 at run time: ``module.requires_grad = False`` sets a plain attribute and freezes nothing."""

from __future__ import annotations

from trainwise.guards.check import Check


class RequiresGradOnModule(Check):
    """A submodule with a ``requires_grad`` attribute of its own (set on the module, not its parameters):
    checked when the guard starts and at every check interval, so one set later by a helper is found too."""

    code = "TW110"

    def on_install(self) -> None:
        self._scan()

    def on_check(self) -> None:
        self._scan()

    def _scan(self) -> None:
        for name, module in self.guard.model.named_modules():
            if "requires_grad" in vars(module):
                value = vars(module)["requires_grad"]
                trainable = sum(p.requires_grad for p in module.parameters())
                self.guard.report(
                    self.code, name or "(the model)",
                    f"`requires_grad = {value!r}` was set on the module {type(module).__name__}, which freezes "
                    f"nothing ({trainable} of its parameter tensors still train); call "
                    f"`.requires_grad_({value!r})` or trainwise.freeze() instead.",
                )
