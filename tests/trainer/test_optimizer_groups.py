"""The user's optimizer factory: the no-decay groups folded back when its optimizer has no weight decay (one
group, as a hand-written loop has, the same updates bit for bit), kept when it has; a checkpoint written with
the two groups resumes into the folded optimizer exactly."""

import copy

import pytest
import torch
from torch.utils.data import TensorDataset

import trainwise as tw
from trainwise import Trainer
from trainwise.freezing import fold_equal_groups, saved_groups_like


class NotTorchsAdam(torch.optim.Adam):
    """torch's Adam defined outside torch.optim: never folded (its update could depend on its groups)."""


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def _data() -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(96, 6, generator=generator), torch.randint(0, 3, (96,), generator=generator))


def _fit(model, run_dir, optimizer, *, epochs=2, **options):
    return Trainer(epochs=epochs, batch_size=16, seed=0, device="cpu", progress="off", plot=False, guards="off",
                   optimizer=optimizer, run_dir=str(run_dir), **options).fit(model, _data())


def test_a_factory_without_weight_decay_gets_one_group_in_the_models_order_and_the_same_updates(tmp_path):
    built = []

    def adam(groups):
        built.append(torch.optim.Adam(groups, lr=1e-2))
        return built[-1]

    folded, kept = _model(), _model()
    _fit(folded, tmp_path / "folded", adam)
    _fit(kept, tmp_path / "kept", lambda groups: NotTorchsAdam(groups, lr=1e-2))
    assert len(built[0].param_groups) == 1
    assert built[0].param_groups[0]["params"] == list(folded.parameters())
    assert built[0].param_groups[0]["param_names"] == [name for name, _ in folded.named_parameters()]
    for (name, a), b in zip(folded.state_dict().items(), kept.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_factory_with_weight_decay_keeps_the_no_decay_group(tmp_path):
    built = []

    def adamw(groups):  # AdamW's own weight decay (0.01) on weights, none on biases and norms
        built.append(torch.optim.AdamW(groups, lr=1e-2))
        return built[-1]

    _fit(_model(), tmp_path, adamw, epochs=1)
    assert [(g["group_name"], g["weight_decay"]) for g in built[0].param_groups] == [
        ("default", 0.01), ("default (no decay)", 0.0)]


def test_folding_only_equal_groups_of_torchs_optimizers_before_their_first_step():
    model = _model()
    lrs = tw.param_groups(model, lr_by_pattern={"3.*": 0.5})  # a pattern's group differs in lr: kept apart
    sgd = torch.optim.SGD(lrs, lr=0.1)
    assert fold_equal_groups(sgd, model) == ["default (no decay)", "3.* (no decay)"]
    assert [(g["group_name"], g["param_names"]) for g in sgd.param_groups] == [
        ("default", ["0.weight", "0.bias", "1.weight", "1.bias"]), ("3.*", ["3.weight", "3.bias"])]
    custom = NotTorchsAdam(tw.param_groups(model), lr=0.1)
    assert fold_equal_groups(custom, model) == [] and len(custom.param_groups) == 2
    stepped = torch.optim.Adam(tw.param_groups(model), lr=0.1)
    model(torch.randn(2, 6)).sum().backward()
    stepped.step()
    assert fold_equal_groups(stepped, model) == [] and len(stepped.param_groups) == 2


@pytest.mark.parametrize("schedule", [
    lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + step)),
    lambda optimizer: torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=12),
])
def test_a_checkpoint_with_the_two_groups_resumes_into_the_folded_optimizer_bitwise(tmp_path, schedule):
    start = _model()
    whole = copy.deepcopy(start)
    _fit(whole, tmp_path / "whole", lambda groups: torch.optim.Adam(groups, lr=1e-2), scheduler=schedule)
    # what a trainwise that did not fold wrote: the same Adam over the two groups, same settings in both
    two_groups = torch.optim.Adam(tw.param_groups(start), lr=1e-2)
    _fit(start, tmp_path / "cut", two_groups, epochs=1, scheduler=schedule)
    assert len(two_groups.param_groups) == 2
    built = []

    def adam(groups):
        built.append(torch.optim.Adam(groups, lr=1e-2))
        return built[-1]

    resumed = _model()
    result = _fit(resumed, tmp_path / "cut", adam, resume="auto", scheduler=schedule)
    assert len(built[0].param_groups) == 1 and result.steps == 12
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_saved_layout_that_does_not_fold_is_left_for_load_state_dict_to_refuse():
    model = _model()
    folded = torch.optim.Adam(tw.param_groups(model), lr=1e-2)
    fold_equal_groups(folded, model)
    decayed = torch.optim.Adam(tw.param_groups(model, weight_decay=0.1), lr=1e-2).state_dict()
    assert saved_groups_like(decayed, folded) == (decayed, None)  # the groups' settings differ: not one group
    nameless = {"state": {}, "param_groups": [{"params": [0, 1]}, {"params": [2, 3, 4, 5]}]}
    assert saved_groups_like(nameless, folded) == (nameless, None)
