"""Library messages in the command line's own spelling.

The library names its options as Python keywords (``device='auto'``, ``overwrite=True``, ``format='onnx'``);
on the command line the same advice must name what the command accepts: ``--device auto`` and
``--overwrite`` for ``trainwise demo``, ``--format onnx`` for ``export`` and ``predict``, and the key=value
overrides of ``trainwise fit`` (``device=auto``, ``overwrite=true``). Only names the command knows are
rewritten; anything else stays as the library wrote it. Never imports torch.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable

# A Python keyword argument as messages write it: name=, name='text', name=True, name=3, name=...
_VALUE = r"'[^'\n]*'|\"[^\"\n]*\"|True|False|None|-?\d[\w.+\-]*|\.\.\."
_KEYWORD = re.compile(rf"(?<![\w.\-])([A-Za-z_]\w*)=({_VALUE})?")

# Options that are flags of a subcommand, by the library's keyword name.
_FLAGS: dict[str, dict[str, str]] = {
    "demo": {
        "device": "--device",
        "num_workers": "--workers",
        "run_dir": "--run-dir",
        "overwrite": "--overwrite",
        "epochs": "--epochs",
        "seed": "--seed",
    },
    "export": {"format": "--format", "atol": "--atol", "rtol": "--rtol", "outputs": "--outputs"},
    "predict": {"format": "--format", "trust_code": "--trust-code"},
}
# Keyword and value that read as a flag of their own.
_SPECIAL: dict[tuple[str, str, str], str] = {
    ("export", "dynamic_batch", "False"): "--static-batch",
}
# Whole phrases whose advice names something the command has no flag for: said the command's way instead.
_PHRASES: dict[str, list[tuple[str, str]]] = {
    "demo": [
        ("pass resume='auto' to continue it, another run_dir, or overwrite=True",
         "pass another --run-dir, or --overwrite"),
    ],
    "export": [("pass a looser atol or rtol", "pass a looser --atol or --rtol")],
    "fit": [
        ("pass val_data=None to train without validation",
         "have the [data] factory return the training data alone to train without validation"),
        ("pass loss_fn=... that reads it", "name a [loss] factory whose function reads it"),
        ("start a new run from the weights that fit with trainwise.load_weights(model, path, strict=False)",
         "start a new run_dir whose [model] factory loads the weights that fit with trainwise.load_weights(model, "
         "path, strict=False)"),
    ],
}


def cli_spelling(message: str, command: str | None) -> str:
    """``message`` with the Python spelling of the options ``command`` has replaced by its own spelling."""
    if not command:
        return message
    for python, cli in _PHRASES.get(command, ()):
        message = message.replace(python, cli)
    rewrite = _fit_option if command == "fit" else _flag(command)
    if rewrite is None:
        return message

    def replace(match: re.Match[str]) -> str:
        return rewrite(match.group(1), match.group(2)) or match.group(0)

    return _KEYWORD.sub(replace, message)


def _unquoted(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _flag(command: str) -> Callable[[str, str | None], str | None] | None:
    flags = _FLAGS.get(command)
    if not flags and not any(key[0] == command for key in _SPECIAL):
        return None

    def rewrite(name: str, value: str | None) -> str | None:
        special = _SPECIAL.get((command, name, value or ""))
        if special:
            return special
        flag = (flags or {}).get(name)
        if flag is None:
            return None
        if value is None or value == "True":  # "pass format= one of ..." / a switch such as --overwrite
            return flag
        if value in ("False", "None"):
            return None  # no flag says "off": leave the sentence as the library wrote it
        text = _unquoted(value)
        return f"{flag} {shlex.quote(text) if text else repr('')}"

    return rewrite


def _fit_option(name: str, value: str | None) -> str | None:
    """``trainwise fit`` takes Trainer options as key=value: ``device='auto'`` -> ``device=auto``."""
    from trainwise.config import TrainerConfig

    if name not in TrainerConfig.option_names() or value is None:
        return None
    if value in ("True", "False", "None"):
        return f"{name}={value.lower()}"
    return f"{name}={_unquoted(value)}"
