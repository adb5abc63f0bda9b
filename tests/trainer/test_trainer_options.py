"""The Trainer's options are declared once, in TrainerConfig: its signature (help(), editors) is generated from
the dataclass, an unknown option is a TypeError naming the closest one, and every option reaches the config."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from trainwise import Trainer, TrainerConfig, TrainwiseError

# where the signature's type is wider than the dataclass's (what Trainer converts on the way in)
_WIDER = {"run_dir": "str | os.PathLike[str] | None", "preempt_signals": "Sequence[str]",
          "unfreeze_at": "Mapping[int, Sequence[str]] | None", "lr_by_pattern": "Mapping[str, float] | None"}


def test_the_signature_lists_every_option_with_the_configs_type_and_default():
    """Declared keywords (no signature patched at run time): help(), editors and type checkers see them."""
    assert "__signature__" not in vars(Trainer.__init__)
    parameters = inspect.signature(Trainer).parameters
    defaults = TrainerConfig()
    fields = {f.name: f for f in dataclasses.fields(TrainerConfig) if f.name != "loggers"}
    options = list(fields)
    assert [name for name in parameters if name in options] == options  # in the dataclass's order
    for name in options:
        assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
        default = parameters[name].default
        assert (list(default) if isinstance(default, tuple) else default) == getattr(defaults, name), name
        assert parameters[name].annotation == _WIDER.get(name, fields[name].type), name
    objects = ["optimizer", "scheduler", "loss_fn", "split_batch", "collate_fn", "loggers", "callbacks", "unknown"]
    assert [name for name in parameters if name not in options] == objects


def test_every_option_reaches_the_config_and_from_config_round_trips():
    changed = {"epochs": 3, "lr": 0.01, "batch_size": "auto", "effective_batch": 64, "seed": 7, "patience": 2,
               "preempt_signals": ["SIGTERM", "SIGUSR1"], "unfreeze_at": {2: ["backbone.*"]}, "run_dir": "runs/x"}
    trainer = Trainer(**changed)
    for name, value in changed.items():
        assert getattr(trainer.config, name) == value, name
    again = Trainer.from_config(trainer.config)
    assert again.config == trainer.config


def test_an_unknown_option_is_a_type_error_naming_the_closest():
    with pytest.raises(TypeError, match="unknown Trainer option 'epocs'; did you mean 'epochs'"):
        Trainer(epocs=3)
    with pytest.raises(TrainwiseError):  # and one sentence for the CLI
        Trainer(lr_by_patern={"a": 1.0})
