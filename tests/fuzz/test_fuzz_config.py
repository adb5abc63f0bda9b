"""Seeded fuzzing of ``trainwise fit CONFIG.toml`` and of TrainerConfig (issue 10, item 4).

A valid configuration is mutated (wrong types, huge integers, nan and inf, control characters, unknown keys
and tables, invalid TOML, garbage bytes, invalid UTF-8) and read with ``--print-config``, so nothing trains.
The CLI must exit 0 or 2, with exactly one line and no traceback on stderr for 2; TrainerConfig must raise
nothing but TrainwiseError; and whatever it accepts must be a value training can use (finite numbers,
integers that fit in 64 bits).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import random
import time
import traceback
import warnings
from pathlib import Path

import pytest
from _mutate import mutate_text

from trainwise.cli import main
from trainwise.config import TrainerConfig, parse_override
from trainwise.errors import TrainwiseError

SEED = 0
CASES = 200

BASE = """\
[model]
factory = "trainwise.demo:make_model"
kwargs = { width = 8, dropout = 0.1 }

[data]
factory = "trainwise.demo:make_data"

[trainer]
epochs = 2
lr = 0.001
batch_size = 16
effective_batch = 32
precision = "fp32"
lr_by_pattern = { "head.*" = 0.01 }
unfreeze_at = { 1 = ["conv.*"] }
patience = 3
dist_timeout = 300.0
max_grad_norm = 1.0
seed = 0
min_delta = 0.0
"""

TRAINER_KEYS = ("epochs", "lr", "batch_size", "effective_batch", "precision", "lr_by_pattern", "unfreeze_at",
                "patience", "dist_timeout", "max_grad_norm", "seed", "min_delta", "num_workers", "keep_last",
                "log_every", "weight_decay", "device", "resume", "accumulation_steps", "compile", "ignore_index")
ODD_VALUES = (
    "nan", "+nan", "-nan", "inf", "-inf", "1e999", "-1e999", "0", "-1", "-0.0", "1.5", "true", "false", '""',
    '"\\u001b[2J\\u001b[31mred"', '"' + "x" * 5000 + '"', "[]", "[1, 2]", "{}", "{ a = 1 }", "1979-05-27",
    "07:32:00", "1979-05-27T07:32:00Z", "9223372036854775807", "9223372036854775808", "-9223372036854775809",
    "18446744073709551616", "0x7fffffffffffffff", "0x" + "f" * 1500, "1" + "0" * 40, "1e308", "5e-324",
    "0o777", "0b101", '"auto"', '"bf16"', "{ 1 = 1 }", '{ "x" = nan }', '{ "-1" = ["a"] }', '{ "²" = ["a"] }',
    '{ "1" = "notalist" }', '{ "1" = [1, 2] }', '"\\u0000"', "'''multi\nline'''",
)
OVERRIDES = (
    "epochs=nan", "epochs=1e999", "lr=nan", "lr=inf", "lr=-inf", "lr=1e999", "seed=99999999999999999999",
    "batch_size=" + "9" * 40, "max_grad_norm=nan", "dist_timeout=inf", "min_delta=nan", "patience=-1",
    "lr_by_pattern={x = nan}", "unfreeze_at={ 1 = 2 }", "model.kwargs.width=1e999", "model.kwargs.width=nan",
    "device=\x1b[2J", "precision=fp64", "epochs=", "=3", "lr_by_pattern={", "unfreeze_at={ ² = [\"a\"] }",
    "model.factory=os:getcwd", "data.kwargs.seed=0x" + "f" * 40,
)


def mutated_config(rng: random.Random) -> tuple[bytes, list[str]]:
    """A mutated BASE (structure-aware most of the time) and 0-2 command-line overrides."""
    text = BASE
    op = rng.random()
    if op < 0.45:  # one option gets an odd value
        key = rng.choice(TRAINER_KEYS)
        line = f"{key} = {rng.choice(ODD_VALUES)}\n"
        lines = [x for x in text.splitlines(keepends=True) if not x.startswith(f"{key} =")]
        lines.insert(lines.index("[trainer]\n") + 1, line)
        data = "".join(lines).encode()
    elif op < 0.6:  # a factory table gets an odd value or key
        table = rng.choice(("model", "data"))
        line = rng.choice((f"factory = {rng.choice(ODD_VALUES)}", f"kwargs = {rng.choice(ODD_VALUES)}",
                           f"extra = {rng.choice(ODD_VALUES)}", 'factory = "os:sep"', 'factory = "no.such:thing"',
                           'factory = "trainwise.demo:nothing"', 'factory = ":"', 'factory = "\\u0000:x"',
                           'factory = "trainwise.demo:make_model.__call__.__self__"'))
        lines = text.splitlines(keepends=True)
        lines.insert(lines.index(f"[{table}]\n") + 1, line + "\n")
        data = "".join(lines).encode()
    elif op < 0.7:  # unknown or misplaced tables and keys
        data = (text + rng.choice(("[trainerr]\nepochs = 1\n", "epochs = 3\n", "[model.kwargs]\nx = 1\n",
                                   "[[trainer]]\n", "[trainer]\nepochs = 4\n", "lr = 1\n[x]\n",
                                   "[trainer.lr_by_pattern]\n\"a\" = \"b\"\n"))).encode()
    else:  # text-level damage
        data = mutate_text(text, rng)
    overrides = [rng.choice(OVERRIDES) for _ in range(rng.choice((0, 0, 1, 2)))]
    return data, overrides


def finite_and_bounded(resolved: dict) -> list[str]:
    """Values --print-config accepted that training could not use."""
    bad = []
    for key, value in resolved["trainer"].items():
        values = list(value.values()) if isinstance(value, dict) else [value]
        for item in values:
            if isinstance(item, float) and not math.isfinite(item):
                bad.append(f"{key}={item}")
            if isinstance(item, int) and not isinstance(item, bool) and abs(item) >= 2**63:
                bad.append(f"{key} is a {item.bit_length()}-bit integer")
    return bad


def test_fuzz_fit_print_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rng = random.Random(SEED)
    problems: list[str] = []
    began = time.perf_counter()
    for case in range(CASES):
        data, overrides = mutated_config(rng)
        path = tmp_path / f"case{case:03d}.toml"
        path.write_bytes(data)
        out, err = io.StringIO(), io.StringIO()
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                warnings.simplefilter("ignore")
                code = main(["fit", str(path), "--print-config", *overrides])
        except BaseException as exc:
            where = "".join(traceback.format_tb(exc.__traceback__)[-2:]).rstrip()
            problems.append(f"case {case} {overrides}: {type(exc).__name__}: {str(exc)[:200]}\n{where}")
            continue
        lines = err.getvalue().strip().splitlines()
        if code == 2:
            if len(lines) != 1 or not lines[0].startswith("trainwise fit: error: "):
                problems.append(f"case {case} {overrides}: exit 2 with stderr {err.getvalue()[:300]!r}")
            if any(ord(c) < 32 for c in lines[0] if lines) or "\x1b" in err.getvalue():
                problems.append(f"case {case}: control characters on stderr {err.getvalue()[:300]!r}")
        elif code == 0:
            bad = finite_and_bounded(json.loads(out.getvalue()))
            if bad:
                problems.append(f"case {case} {overrides}: accepted {', '.join(bad)}")
        else:
            problems.append(f"case {case} {overrides}: exit code {code}")
        if problems and problems[-1].startswith(f"case {case} "):
            (tmp_path / f"failed-{case:03d}.toml").write_bytes(data)
    seconds = time.perf_counter() - began
    assert not problems, f"{len(problems)} problems (files in {tmp_path}):\n" + "\n".join(problems[:15])
    assert seconds < 30, f"{CASES} configs took {seconds:.0f} s"


ODD_PYTHON_VALUES = (
    math.nan, math.inf, -math.inf, 10**30, -(10**30), 2**63, 10**5000, -1, 0, 1.5, True, None, "", "\x1b[2J",
    "x" * 10_000, [], [1], {}, {"a": math.nan}, {"²": ["a"]}, {"1" * 5000: ["a"]}, {1: "a"}, {1: [1]}, object(),
    b"bytes", (1, 2), {"head.*": 10**400},
)


@pytest.mark.parametrize("key", TrainerConfig.option_names())
def test_trainer_config_refuses_with_one_sentence(key):
    for value in ODD_PYTHON_VALUES:
        try:
            config = TrainerConfig(**{key: value})
        except TrainwiseError as exc:
            text = str(exc)
            assert "\n" not in text and len(text) < 2_000 and "\x1b" not in text, (key, text[:300])
            continue
        except BaseException as exc:
            raise AssertionError(f"TrainerConfig({key}={value!r:.80}): {type(exc).__name__}: {exc}") from None
        assert not finite_and_bounded({"trainer": config.to_dict()}), (key, value)


@pytest.mark.parametrize("text", (*OVERRIDES, "epochs=" + "9" * 5000, "lr=" + "9" * 5000, "seed=-1"))
def test_overrides_refuse_with_one_sentence(text):
    try:
        key, value = parse_override(text)
        config = TrainerConfig(**{key: value})  # it parses: the config must then take it or refuse it
    except TrainwiseError as exc:
        assert "\n" not in str(exc) and "\x1b" not in str(exc) and len(str(exc)) < 2_000
        return
    assert not finite_and_bounded({"trainer": config.to_dict()}), text


def test_config_cases_are_reproducible():
    first = [mutated_config(random.Random(3)) for _ in range(5)]
    assert first == [mutated_config(random.Random(3)) for _ in range(5)]


def test_base_config_is_valid(tmp_path, capsys):
    path = Path(tmp_path / "base.toml")
    path.write_text(BASE)
    assert main(["fit", str(path), "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["trainer"]["epochs"] == 2


HUGE = "9" * 5000  # Python refuses int() of more than 4300 digits with a ValueError, not a TOMLDecodeError


@pytest.mark.parametrize("where", ["file", "kwargs override"])
def test_a_5000_digit_integer_is_one_line(tmp_path, capsys, where):
    path = tmp_path / "c.toml"
    text = BASE if where != "file" else BASE.replace("epochs = 2", f"epochs = {HUGE}")
    path.write_text(text)
    overrides = [f"model.kwargs.width={HUGE}"] if where != "file" else []
    assert main(["fit", str(path), "--print-config", *overrides]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
