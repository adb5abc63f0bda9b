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
    with pytest.raises(tw.guards.GuardError) as caught:
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


# What the Trainer's loop rules out itself: it zeroes the gradients every step (TW105), scales float16 with a
# GradScaler (TW109) and moves every batch to the model's device (TW112); with train_norm_stats=True frozen norm
# layers update their statistics on purpose (TW108).
RULED_OUT_BY_THE_LOOP = {"TW105", "TW109", "TW112"}


@pytest.mark.parametrize("train_norm_stats", [False, True])
def test_the_trainer_runs_every_check_but_those_its_own_loop_rules_out(tmp_path, monkeypatch, train_norm_stats):
    with tw.guard(nn.Linear(2, 2)) as plain:  # a guard given no checks= runs every check there is
        every = {check.code for check in plain.checks}
    installed = []  # the codes of each tw.Guard built during the fit, whichever module builds it
    real_init = tw.Guard.__init__

    def recording_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        installed.append(sorted(check.code for check in self.checks))

    monkeypatch.setattr(tw.Guard, "__init__", recording_init)
    _fit(tmp_path, train_norm_stats=train_norm_stats)
    skipped = RULED_OUT_BY_THE_LOOP | ({"TW108"} if train_norm_stats else set())
    assert every > skipped  # a renamed code cannot silently switch a check back on
    assert installed == [sorted(every - skipped)]
