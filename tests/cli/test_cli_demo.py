"""``trainwise demo``: JSON summary as the last line; user errors exit 2 without a traceback."""

import json
import signal
import subprocess
import sys
import time

import pytest

from trainwise.cli import main


def test_demo_json_last_line(tmp_path, capsys):
    assert main(["demo", "--epochs", "1", "--run-dir", str(tmp_path / "run"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("val_accuracy", "val_loss", "epochs", "seconds", "run_dir"):
        assert key in summary
    assert summary["epochs"] == 1 and (tmp_path / "run" / "metrics.jsonl").exists()


def test_demo_bad_arguments_exit_2(capsys):
    assert main(["demo", "--epochs", "0"]) == 2
    assert "--epochs must be at least 1" in capsys.readouterr().err
    assert main(["demo", "--device", "tpu9"]) == 2


def test_cli_user_error_has_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "trainwise.cli", "demo", "--workers", "-1"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "--workers must be 0 or more" in proc.stderr


def test_demo_finetune_keeps_frozen_statistics(tmp_path, capsys):
    assert main(["demo", "--finetune", "--epochs", "2", "--run-dir", str(tmp_path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["frozen_unchanged"] is True and summary["changed"] == []
    assert summary["frozen_norm_layers"] == ["features.1", "features.4", "features.8"]
    assert summary["pretrain_val_accuracy"] > 0.5 and summary["finetune_val_accuracy"] > 0.3
    assert (tmp_path / "pretrain" / "metrics.jsonl").exists() and (tmp_path / "finetune" / "metrics.jsonl").exists()


# -- Ctrl-C: exit code 130 and one line, as trainwise fit (issue 16 item 4) -------------------------------------


@pytest.mark.slow
def test_ctrl_c_during_training_exits_130(tmp_path):
    """SIGINT once the first epoch is logged: the demo stops, says so in one line, and exits 130."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainwise.cli", "demo", "--epochs", "200", "--run-dir", str(run_dir), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    log = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (log.exists() and '"kind": "epoch"' in log.read_text()):  # training is under way
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in out + err
    assert err.strip().splitlines()[-1] == f"trainwise demo: interrupted; what was logged is in {run_dir}."
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["stopped"] == "interrupted" and 1 <= summary["epochs"] < 200
    assert '"kind": "interrupted"' in log.read_text()


def _interrupted_result(run_dir):
    from trainwise.results import FitResult

    return FitResult(history=[{"epoch": 1, "val_loss": 0.5, "val_accuracy": 0.9}], run_dir=run_dir, steps=3,
                     seconds=0.1, stopped="interrupted", device="cpu", precision="fp32")


@pytest.mark.parametrize("json_output", [False, True])
def test_interrupt_raised_out_of_fit_exits_130(tmp_path, monkeypatch, capsys, json_output):
    """Trainer.fit re-raises KeyboardInterrupt with the result attached: 130, the summary with --json."""

    def interrupted(**kwargs):
        exc = KeyboardInterrupt()
        exc.result = _interrupted_result(tmp_path)
        raise exc

    monkeypatch.setattr("trainwise.demo.run_demo", interrupted)
    assert main(["demo", "--epochs", "1", *(["--json"] if json_output else [])]) == 130
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines()[-1] == f"trainwise demo: interrupted; what was logged is in {tmp_path}."
    if json_output:
        summary = json.loads(captured.out.strip().splitlines()[-1])
        assert summary["stopped"] == "interrupted" and summary["epochs"] == 1


def test_interrupt_returned_by_fit_exits_130(tmp_path, monkeypatch, capsys):
    """A Trainer that returns its result with stopped="interrupted" (as before issue 16): 130 all the same."""
    summary = {"val_accuracy": 0.9, "val_loss": 0.5, "train_loss": 0.4, "epochs": 1, "steps": 3, "seconds": 0.1,
               "run_dir": str(tmp_path), "device": "cpu", "precision": "fp32", "stopped": "interrupted",
               "overfitting": None, "model": None}
    monkeypatch.setattr("trainwise.demo.run_demo", lambda **kwargs: dict(summary))
    assert main(["demo", "--epochs", "1", "--json"]) == 130
    captured = capsys.readouterr()
    assert json.loads(captured.out.strip().splitlines()[-1])["stopped"] == "interrupted"
    assert "trainwise demo: interrupted" in captured.err


def test_interrupt_before_training_exits_130(monkeypatch, capsys):
    def interrupted(**kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("trainwise.demo.run_demo", interrupted)
    assert main(["demo", "--epochs", "1", "--json"]) == 130
    assert capsys.readouterr().err.strip() == "trainwise demo: interrupted."
