"""``trainwise demo``: JSON summary as the last line; user errors exit 2 without a traceback."""

import json
import subprocess
import sys

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
