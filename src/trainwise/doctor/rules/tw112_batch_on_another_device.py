"""TW112 batch-on-another-device: found at run time by ``trainwise.guard``, never in the source."""

from __future__ import annotations

from typing import ClassVar

from trainwise.doctor.rule import Rule


class BatchOnAnotherDevice(Rule):
    """A batch tensor on another device than the model's parameters (found at run time by `trainwise.guard`).

    ## What it does
    This rule has no static check: `trainwise.guard(model, optimizer)` (and the Trainer) finds it at run
    time. When the guarded model's forward fails, it compares the device of every tensor argument, and of
    tensors inside tuples, lists and dicts, with the device of the model's parameters, and raises a
    `trainwise.guards.GuardError` naming the field (`x`, `batch["attention_mask"]`) in place of torch's own
    error, which it is raised from (a forward that works costs nothing, and a model that moves its inputs
    itself is fine). Where the guard hooks the forward instead of wrapping it (a compiled model, `forwards=`,
    `trainwise run`) it compares before each checked forward.

    ## Why is this bad?
    torch cannot compute with tensors on two devices: the forward fails with an error deep inside a layer
    that names neither the field that was left behind nor the fix. Tensors that torch does accept elsewhere
    pass: CPU scalars, CPU integer tensors of lengths (`pack_padded_sequence` wants those on the CPU), and
    tensors on any device that holds some of the model's parameters (a model split over devices).

    Its fundamental's lab, `trainwise lab from-numpy`, measures the other half of tensors and NumPy: memory
    shared by `from_numpy` and `.numpy()` (TW116), also after `move_to_device` to the CPU.

    ## Example
    ```python
    import torch

    model = model.to("cuda")
    for batch in loader:
        loss = model(**batch).loss  # the batch is still on the CPU
    ```

    ## Use instead
    ```python
    import torch
    import trainwise

    model = model.to("cuda")
    for batch in loader:
        batch = trainwise.move_to_device(batch, "cuda")
        loss = model(**batch).loss
    ```

    ## Fix safety
    There is no automatic fix: the doctor does not report this in the source; the guard names the field to
    move at run time.
    """

    code = "TW112"
    name = "batch-on-another-device"
    message = "a batch tensor is on another device than the model's parameters; move the batch to the model's device"
    runtime_only: ClassVar[bool] = True  # reported by trainwise.guard, never by the static doctor
