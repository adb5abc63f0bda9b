"""TW113 nonfinite-gradient: found at run time by ``trainwise.guard``, never in the source."""

from __future__ import annotations

from typing import ClassVar

from trainwise.doctor.rule import Rule


class NonFiniteGradient(Rule):
    """An optimizer step that applied an inf or NaN gradient (found at run time by `trainwise.guard`).

    ## What it does
    This rule has no static check: `trainwise.guard(model, optimizer)` (and the Trainer) finds it at run
    time, at no cost per step. A step that applies an inf or NaN gradient leaves the weights it updates inf
    or NaN, and they stay so; every `check_every` steps (and at the end) the guard reads the norm of every
    parameter once and names the first one that is no longer finite and the steps since the last check
    (`check_every=1` names the exact step and the first parameter, at one host sync per step). Steps that a
    `torch.amp.GradScaler` skips leave the weights finite and are not reported: inf gradients are expected
    there while the scale calibrates. Weights already non-finite when the guard starts are said as such.

    ## Why is this bad?
    One non-finite gradient makes the weights it touches inf or NaN, and from then on every loss and every
    gradient follows: training goes on and produces nothing. The first parameter and step say where to
    look: an overflowing layer, a division by zero or the log of zero in the loss, a learning rate that is
    too high, or float16 without a gradient scaler.

    ## Example
    ```python
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=10.0)  # too high: the weights blow up
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
    ```

    ## Fix safety
    There is no automatic fix: the doctor does not report this in the source; the guard names the
    parameter and the steps at run time.
    """

    code = "TW113"
    name = "nonfinite-gradient"
    message = "an optimizer step applied an inf or NaN gradient; find the overflowing loss or layer"
    runtime_only: ClassVar[bool] = True  # reported by trainwise.guard, never by the static doctor
