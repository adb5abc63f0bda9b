"""``trainwise fit CONFIG.toml``: resolution, overrides, one-line errors and short real runs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from trainwise.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits.toml"

TINY_FACTORIES = """
import torch
from torch.utils.data import TensorDataset

SEEN = {}


def model(width=4):
    return torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.ReLU(), torch.nn.Linear(width, 2))


def data(n=32, val=True):
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(0))
    dataset = TensorDataset(x, (x[:, 0] > 0).long())
    return (dataset, dataset) if val else dataset


class Interrupting(torch.nn.Linear):
    def forward(self, x):
        raise KeyboardInterrupt


def interrupting_model():
    return Interrupting(3, 2)


def interrupting_data():
    raise KeyboardInterrupt


def data_list():
    return list(data())


def wide_data():
    x = torch.randn(16, 5, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x, (x[:, 0] > 0).long())


def record_scheduler(optimizer, gamma=1.0):
    SEEN["optimizer"] = optimizer
    return torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=gamma)
"""


def fit(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["fit", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def tiny(tmp_path: Path, request: pytest.FixtureRequest):
    """A factory module next to a config file, under a module name unique to the test; removed afterwards."""
    name = "fit_factories_" + "".join(c if c.isalnum() else "_" for c in request.node.name)
    (tmp_path / f"{name}.py").write_text(TINY_FACTORIES, encoding="utf-8")

    def write(body: str) -> Path:
        path = tmp_path / "config.toml"
        path.write_text(textwrap.dedent(body).replace("MODULE", name), encoding="utf-8")
        return path

    yield name, write
    sys.modules.pop(name, None)


TINY_CONFIG = """
    [model]
    factory = "MODULE:model"
    [data]
    factory = "MODULE:data"
    [trainer]
    epochs = 1
    batch_size = 8
    progress = "off"
"""


def test_print_config_shows_overrides_and_defaults(capsys):
    code, out, err = fit(capsys, EXAMPLE, "epochs=3", "--print-config", "max_grad_norm=1.5", "device=cpu")
    assert code == 0, err
    resolved = json.loads(out)
    trainer = resolved["trainer"]
    assert trainer["epochs"] == 3 and trainer["max_grad_norm"] == 1.5 and trainer["device"] == "cpu"
    assert trainer["batch_size"] == 64 and trainer["lr"] == 3e-3  # from the file
    assert trainer["log_every"] == 50 and trainer["effective_batch"] is None  # defaults filled in
    assert resolved["model"] == {"factory": "trainwise.demo:make_model", "kwargs": {}}
    assert resolved["optimizer"] is None
    assert list(resolved) == sorted(resolved)


def test_dotted_overrides_set_factory_kwargs(capsys, tiny):
    _, write = tiny
    config = write(TINY_CONFIG)
    code, out, err = fit(
        capsys, config, "model.kwargs.width=16", "data.kwargs.val=false", "trainer.seed=3", "--print-config"
    )
    assert code == 0, err
    resolved = json.loads(out)
    assert resolved["model"]["kwargs"] == {"width": 16}
    assert resolved["data"]["kwargs"] == {"val": False}
    assert resolved["trainer"]["seed"] == 3


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("epocs=3", "did you mean 'epochs'"),
        ("trainer.bacth_size=3", "did you mean 'batch_size'"),
        ("epochs=abc", "epochs must be an integer"),
        ("epochs=0", "epochs must be at least 1"),
        ("precision=fp8", "precision must be one of"),
        ("epochs", "not key=value"),
        ("modle.factory=x:y", "did you mean 'model'"),
        ("model.kwarg.width=3", "did you mean 'kwargs'"),
        ("model.kwargs.depth=3", "do not fit trainwise.demo:make_model"),
    ],
)
def test_bad_overrides_exit_2_with_one_line(capsys, override, expected):
    code, out, err = fit(capsys, EXAMPLE, override, "--print-config")
    assert code == 2
    assert expected in err
    assert "Traceback" not in out + err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("trainwise.demo.make_model", "must be written package.module:function"),
        ("no_such_module_xyz.sub:make", "no module named 'no_such_module_xyz'"),
        ("trainwise.demo:make_modle", "did you mean 'make_model'"),
        ("trainwise.demo:DIGITS_ATTRIBUTION", "not a function or class"),
    ],
)
def test_bad_factory_specs_exit_2_without_traceback(capsys, spec, expected):
    code, out, err = fit(capsys, EXAMPLE, f"model.factory={spec}", "--print-config")
    assert code == 2
    assert expected in err and "[model]" in err
    assert "Traceback" not in out + err


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('[modle]\nfactory = "trainwise.demo:make_model"\n', "unknown table [modle]; did you mean 'model'"),
        ('epochs = 3\n[model]\nfactory = "x:y"\n', "put it under [trainer]"),
        ('[model]\nfactory = "trainwise.demo:make_model"\n', "has no [data] table"),
        ('[model]\nfactroy = "x:y"\n', "did you mean 'factory'"),
        ('[model]\nfactory = 3\n[data]\nfactory = "x:y"\n', "factory must be a string"),
        (
            '[model]\nfactory = "trainwise.demo:make_model"\n[data]\nfactory = "trainwise.demo:make_data"\n'
            "[trainer]\nepocs = 2\n",
            "unknown [trainer] option 'epocs'; did you mean 'epochs'",
        ),
        (
            '[model]\nfactory = "trainwise.demo:make_model"\n[data]\nfactory = "trainwise.demo:make_data"\n'
            '[trainer]\nepochs = "2"\n',
            "epochs must be an integer",
        ),
        ("[model]\nfactory = 3 x\n", "not valid TOML"),
    ],
)
def test_bad_files_exit_2_with_one_line(capsys, tmp_path, body, expected):
    config = tmp_path / "bad.toml"
    config.write_text(body, encoding="utf-8")
    code, out, err = fit(capsys, config, "--print-config")
    assert code == 2
    assert expected in err
    assert "Traceback" not in out + err


def test_invalid_toml_names_the_line(capsys, tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text('[model]\nfactory = "a:b"\n\n[data\n', encoding="utf-8")
    code, _, err = fit(capsys, config)
    assert code == 2 and "line 4" in err


def test_missing_config_file(capsys, tmp_path):
    code, _, err = fit(capsys, tmp_path / "missing.toml")
    assert code == 2 and "not found" in err


def test_lr_next_to_an_optimizer_table_is_rejected(capsys, tiny):
    _, write = tiny
    config = write(TINY_CONFIG + '    [optimizer]\n    factory = "torch.optim:SGD"\n    kwargs = { lr = 0.1 }\n')
    code, _, err = fit(capsys, config, "lr=0.5", "--print-config")
    assert code == 2 and "optimizer.kwargs.lr" in err


def test_example_trains_one_epoch_and_logs(capsys, tmp_path):
    run_dir = tmp_path / "run"
    code, out, err = fit(capsys, EXAMPLE, "--json", "epochs=1", "progress=off", "device=cpu", f"run_dir={run_dir}")
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["epochs"] == 1 and summary["stopped"] == "completed"
    assert summary["run_dir"] == str(run_dir)
    assert 0.0 <= summary["val_accuracy"] <= 1.0 and summary["val_loss"] > 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("kind") == "epoch" for r in records)
    assert json.loads((run_dir / "fit.json").read_text())["trainer"]["epochs"] == 1


def test_custom_optimizer_scheduler_and_loss_are_used(capsys, tiny):
    name, write = tiny
    config = write(
        TINY_CONFIG
        + """
    [loss]
    factory = "torch.nn:CrossEntropyLoss"
    kwargs = { label_smoothing = 0.1 }
    [optimizer]
    factory = "torch.optim:SGD"
    kwargs = { lr = 0.05, momentum = 0.9 }
    [scheduler]
    factory = "MODULE:record_scheduler"
    """
    )
    path_before = list(sys.path)
    code, out, err = fit(capsys, config, f"run_dir={config.parent / 'run'}", "data.kwargs.val=false")
    assert code == 0, err
    assert sys.path == path_before  # the config's folder is on sys.path only during the command
    optimizer = sys.modules[name].SEEN["optimizer"]
    assert isinstance(optimizer, torch.optim.SGD)
    assert optimizer.defaults["lr"] == 0.05 and optimizer.defaults["momentum"] == 0.9
    assert "training loss" in out  # no validation data: the summary reports the training loss


def test_interrupted_run_exits_130(capsys, tiny):
    name, write = tiny
    config = write(TINY_CONFIG)
    code, out, _ = fit(
        capsys, config, f"model.factory={name}:interrupting_model", "--json", f"run_dir={config.parent}/r"
    )
    assert code == 130
    assert json.loads(out.strip().splitlines()[-1])["stopped"] == "interrupted"


def test_interrupted_before_training_exits_130(capsys, tiny):
    """Ctrl-C while the factories run (no result yet): one line, exit code 130."""
    name, write = tiny
    config = write(TINY_CONFIG)
    code, out, err = fit(capsys, config, f"data.factory={name}:interrupting_data", f"run_dir={config.parent}/r")
    assert code == 130 and out == "" and err.strip() == "trainwise fit: interrupted."


def test_interrupt_raised_out_of_fit_with_its_result_exits_130(capsys, tiny, monkeypatch):
    """Trainer.fit saves the log and a checkpoint, then re-raises KeyboardInterrupt with the result attached."""
    from trainwise.trainer import Trainer

    name, write = tiny
    config = write(TINY_CONFIG)
    real_fit = Trainer.fit

    def fit_then_raise(self, *args, **kwargs):
        try:
            result = real_fit(self, *args, **kwargs)
        except KeyboardInterrupt as exc:  # a Trainer that already re-raises
            assert exc.result.stopped == "interrupted"
            raise
        exc = KeyboardInterrupt()
        exc.result = result
        raise exc

    monkeypatch.setattr(Trainer, "fit", fit_then_raise)
    run_dir = config.parent / "r"
    code, out, err = fit(capsys, config, f"model.factory={name}:interrupting_model", "--json", f"run_dir={run_dir}")
    assert code == 130
    assert json.loads(out.strip().splitlines()[-1])["stopped"] == "interrupted"
    assert err.strip().splitlines()[-1] == f"trainwise fit: interrupted; what was logged is in {run_dir}."


def test_a_data_factory_that_returns_a_list(capsys, tiny):
    name, write = tiny
    config = write(TINY_CONFIG)
    code, _, err = fit(capsys, config, f"data.factory={name}:data_list", f"run_dir={config.parent}/r")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"[data] factory {name}:data_list returned a list (TensorDataset, TensorDataset)" in err
    assert "return the tuple (train, val) instead" in err
    assert not (config.parent / "r").exists()  # refused before the run folder is made


def test_data_that_does_not_fit_the_model_is_one_sentence(capsys, tiny):
    name, write = tiny
    config = write(TINY_CONFIG)
    code, _, err = fit(capsys, config, "model.kwargs.width=4", f"data.factory={name}:wide_data",
                       f"run_dir={config.parent}/r")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"the data of [data] {name}:wide_data does not fit the model of [model] {name}:model" in err
    assert "mat1 and mat2 shapes cannot be multiplied" in err and err.strip().endswith("what the model takes.")


def test_errors_use_the_override_spelling(capsys, tiny, tmp_path):
    _, write = tiny
    config = write(TINY_CONFIG)
    run_dir = tmp_path / "run"
    assert fit(capsys, config, f"run_dir={run_dir}", "plot=false")[0] == 0
    code, _, err = fit(capsys, config, f"run_dir={run_dir}")
    assert code == 2 and "resume=auto" in err and "overwrite=true" in err
    assert "resume='auto'" not in err and "overwrite=True" not in err


def test_factory_kwargs_that_do_not_fit_the_optimizer(capsys, tiny):
    _, write = tiny
    config = write(TINY_CONFIG + '    [optimizer]\n    factory = "torch.optim:SGD"\n    kwargs = { moment = 0.9 }\n')
    code, out, err = fit(capsys, config, "--print-config")
    assert code == 2 and "moment" in err and "Traceback" not in out + err


def test_missing_config_in_a_subprocess_has_no_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "trainwise.cli", "fit", "missing.toml"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "missing.toml" in proc.stderr


def test_a_second_fit_into_the_same_run_folder_is_refused_and_overwrites_nothing(capsys, tiny, tmp_path):
    _, write = tiny
    config = write(TINY_CONFIG)
    run_dir = tmp_path / "run"
    code, _, err = fit(capsys, config, f"run_dir={run_dir}", "plot=false")
    assert code == 0, err
    before = (run_dir / "fit.json").read_bytes()
    code, _, err = fit(capsys, config, f"run_dir={run_dir}", "plot=false", "lr=0.01")
    assert code == 2 and "already holds a run" in err and "Traceback" not in err
    assert (run_dir / "fit.json").read_bytes() == before  # the first run's record is intact
    code, _, err = fit(capsys, config, f"run_dir={run_dir}", "plot=false", "lr=0.01", "overwrite=true")
    assert code == 0, err
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run.previous-")]
    assert len(aside) == 1 and (aside[0] / "fit.json").read_bytes() == before
    assert json.loads((run_dir / "fit.json").read_text())["trainer"]["lr"] == 0.01


def test_a_refused_resume_leaves_the_run_record_alone(capsys, tiny, tmp_path):
    _, write = tiny
    config = write(TINY_CONFIG)
    run_dir = tmp_path / "run"
    code, _, err = fit(capsys, config, f"run_dir={run_dir}", "plot=false")
    assert code == 0, err
    before = (run_dir / "fit.json").read_bytes()
    code, _, err = fit(capsys, config, f"run_dir={run_dir}", "plot=false", "resume=auto", "batch_size=4", "epochs=2")
    assert code == 2 and "batch_size 8 -> 4" in err and "Traceback" not in err
    assert (run_dir / "fit.json").read_bytes() == before


def test_a_refused_resume_of_a_folder_without_fit_json_leaves_every_file_as_it_was(capsys, tiny, tmp_path):
    """A run folder the Python API made has no fit.json: a refused CLI resume must not create one."""
    import hashlib

    _, write = tiny
    config = write(TINY_CONFIG)
    run_dir = tmp_path / "run"
    code, _, err = fit(capsys, config, f"run_dir={run_dir}", "plot=false")
    assert code == 0, err
    (run_dir / "fit.json").unlink()

    def digest():
        return {p.relative_to(run_dir): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(run_dir.rglob("*")) if p.is_file()}

    before = digest()
    code, _, err = fit(capsys, config, f"run_dir={run_dir}", "plot=false", "resume=auto", "batch_size=4", "epochs=2")
    assert code == 2 and "batch_size 8 -> 4" in err
    assert digest() == before
    code, _, err = fit(capsys, config, f"run_dir={run_dir}", "plot=false", "resume=auto", "epochs=2")
    assert code == 0, err
    assert json.loads((run_dir / "fit.json").read_text())["trainer"]["epochs"] == 2  # written once it continued
