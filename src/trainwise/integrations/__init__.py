"""The runtime guards inside the frameworks people already train with, one line each (docs/integrations.md):

- :mod:`trainwise.integrations.lightning`: ``TrainwiseGuard``, a Lightning ``Callback``;
- :mod:`trainwise.integrations.transformers`: ``TrainwiseGuard``, a Hugging Face ``TrainerCallback``;
- :mod:`trainwise.integrations.accelerate`: ``guard(accelerator, model, optimizer)`` after ``prepare``.

Each is a thin adapter over :class:`trainwise.guards.Guard` (the checks are the guard's own) that also sends
the findings to the framework's logger. This package imports no framework: each module imports its own when
it is imported, with one sentence naming the ``pip install`` when the framework is missing.
"""
