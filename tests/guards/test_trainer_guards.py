"""The Trainer runs the guards by default: each finding printed and logged once; raise and off as asked."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import trainwise as tw


def _data():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(32, 4, generator=g), torch.randint(0, 3, (32,), generator=g))


def _model():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    model[0].requires_grad = False  # TW110: freezes nothing
    return model


def _fit(tmp_path, **options):
    return tw.Trainer(epochs=2, batch_size=8, device="cpu", progress="off", plot=False, diagnose=False,
                      checkpoints=False, run_dir=str(tmp_path / "run"), log_every=1, **options).fit(_model, _data())


def test_findings_go_to_the_log_once(tmp_path):
    _fit(tmp_path)
    found = [r for r in tw.read_log(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "guard"]
    assert [(r["code"], r["where"]) for r in found] == [("TW110", "0")]


def test_raise_stops_the_run_with_the_finding(tmp_path):
    with pytest.raises(tw.GuardError) as caught:
        _fit(tmp_path, guards="raise")
    assert caught.value.code == "TW110"


def test_off_installs_nothing(tmp_path):
    result = _fit(tmp_path, guards="off")
    assert not [r for r in tw.read_log(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "guard"]
    assert not result.model._forward_hooks and not result.model._forward_pre_hooks


@pytest.mark.parametrize("finetune", [False, True], ids=["demo", "finetune-demo"])
def test_a_clean_demo_run_gets_no_finding(tmp_path, finetune):
    from trainwise.demo import run_demo, run_finetune_demo

    runner = run_finetune_demo if finetune else run_demo
    summary = runner(epochs=1, run_dir=str(tmp_path / "demo"), device="cpu", progress="off")
    records = [r for path in (tmp_path / "demo").rglob("metrics.jsonl") for r in tw.read_log(path)]
    assert records and not [r for r in records if r["kind"] == "guard"], summary


def test_the_trainer_runs_every_check_but_those_its_own_loop_rules_out(tmp_path, monkeypatch):
    from trainwise import fit_run as trainer_module  # where the Trainer's guards are installed
    from trainwise.guards.registry import all_check_classes

    installed = []
    real_guard = trainer_module.Guard

    def recording_guard(*args, **kwargs):
        guard = real_guard(*args, **kwargs)
        installed.append(sorted(check.code for check in guard.checks))
        return guard

    monkeypatch.setattr(trainer_module, "Guard", recording_guard)
    _fit(tmp_path)
    every = {cls.code for cls in all_check_classes()}
    assert every > trainer_module.RULED_OUT_BY_THE_LOOP  # a renamed code cannot silently switch a check back on
    # zero_grad every step, a GradScaler for float16, every batch moved to the model's device
    assert installed == [sorted(every - {"TW105", "TW109", "TW112"})]
