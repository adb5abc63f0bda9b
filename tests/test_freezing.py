"""Freezing: frozen weights and BatchNorm statistics stay bitwise unchanged through training."""

import copy
import io
import pickle

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainwise import Trainer, TrainwiseError
from trainwise.freezing import (
    extend_optimizer,
    freeze,
    frozen_norm_layers,
    is_pinned_eval,
    param_groups,
    unfreeze,
)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
            nn.Conv2d(4, 4, 3, padding=1), nn.InstanceNorm2d(4, affine=True, track_running_stats=True), nn.ReLU(),
            nn.Flatten(), nn.Linear(4 * 8 * 8, 16), nn.BatchNorm1d(16), nn.ReLU(),
        )
        self.head = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x):
        return self.head(self.backbone(x))


def _data(n=48):
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g))


def _snapshot(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_frozen_backbone_is_bitwise_unchanged_after_training(tmp_path):
    torch.manual_seed(0)
    model = Net()
    freeze(model, "backbone")
    before_backbone, before_head = _snapshot(model.backbone), _snapshot(model.head)
    Trainer(epochs=3, batch_size=8, progress="off", device="cpu", plot=False, run_dir=str(tmp_path)).fit(
        model, _data(), _data(16)
    )
    after = model.backbone.state_dict()
    for key, value in before_backbone.items():  # includes running_mean, running_var, num_batches_tracked
        assert torch.equal(value, after[key]), key
    assert all(p.grad is None for p in model.backbone.parameters())
    assert any(not torch.equal(v, model.head.state_dict()[k]) for k, v in before_head.items())
    assert sorted(frozen_norm_layers(model)) == ["backbone.1", "backbone.4", "backbone.8"]


def test_norm_layers_stay_in_eval_through_train_on_any_ancestor():
    model = Net()
    freeze(model, "backbone.0", "backbone.1")
    for module in (model, model.backbone):
        module.train()
        assert model.backbone[1].training is False
        assert model.backbone[8].training is True  # not frozen
    model.backbone[1].train()
    assert model.backbone[1].training is False


def test_train_norm_stats_option_keeps_them_training():
    model = Net()
    freeze(model, "backbone", train_norm_stats=True)
    model.train()
    assert model.backbone[1].training and frozen_norm_layers(model) == []


def test_frozen_modules_survive_deepcopy_pickle_and_state_dict():
    model = Net()
    freeze(model, "backbone")
    keys = list(Net().state_dict())
    assert list(model.state_dict()) == keys
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        clone.train()
        assert clone.backbone[1].training is False
        assert list(clone.state_dict()) == keys
        assert not any(p.requires_grad for p in clone.backbone.parameters())
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    loaded.train()
    assert loaded.backbone[1].training is False
    fresh = Net()
    fresh.load_state_dict(model.state_dict())


def test_unfreeze_releases_norm_layers_and_parameters():
    model = Net()
    freeze(model, "backbone")
    unfreeze(model, "backbone")
    model.train()
    assert model.backbone[1].training and type(model.backbone[1]) is nn.BatchNorm2d
    assert all(p.requires_grad for p in model.parameters())
    assert frozen_norm_layers(model) == []


def test_freeze_by_object_and_parameter_glob():
    model = Net()
    freeze(model, model.head[0])
    assert not model.head[0].weight.requires_grad and model.head[3].weight.requires_grad
    names = freeze(model, "*.bias")
    assert "backbone.0.bias" in names and not model.backbone[0].bias.requires_grad
    assert model.backbone[0].weight.requires_grad


def test_pattern_matching_nothing_lists_close_matches():
    with pytest.raises(TrainwiseError, match=r"'backbon' matches no module.*close matches: backbone"):
        freeze(Net(), "backbon")
    with pytest.raises(TrainwiseError, match="not part of this model"):
        freeze(Net(), nn.Linear(2, 2))


def test_freezing_everything_is_an_error_at_fit(tmp_path):
    model = Net()
    freeze(model)
    with pytest.raises(TrainwiseError, match="no trainable parameters"):
        Trainer(progress="off", device="cpu", run_dir=str(tmp_path)).fit(model, _data())


def test_param_groups_hold_exactly_the_trainable_parameters_without_decay_on_bias_and_norm():
    model = Net()
    freeze(model, "backbone")
    optimizer = torch.optim.AdamW(param_groups(model), lr=1e-3, weight_decay=0.05)
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert held == {id(p) for p in model.parameters() if p.requires_grad}
    decay = {n: g["weight_decay"] for g in optimizer.param_groups for n in g["param_names"]}
    assert decay["head.0.weight"] == 0.05 and decay["head.3.weight"] == 0.05
    assert decay["head.0.bias"] == 0.0 and decay["head.1.weight"] == 0.0 and decay["head.1.bias"] == 0.0


def test_per_pattern_learning_rates_and_unknown_pattern():
    model = Net()
    groups = param_groups(model, lr_by_pattern={"backbone.*": 1e-5})
    lrs = {n: g.get("lr") for g in groups for n in g["param_names"]}
    assert lrs["backbone.0.weight"] == 1e-5 and lrs["head.0.weight"] is None
    with pytest.raises(TrainwiseError, match="matches no trainable parameter"):
        param_groups(model, lr_by_pattern={"bakbone.*": 1e-5})


def test_trainer_optimizer_holds_only_trainable_parameters(tmp_path):
    model = Net()
    freeze(model, "backbone")
    captured = {}

    def factory(groups):
        captured["optimizer"] = torch.optim.SGD(groups, lr=0.1, weight_decay=0.01)
        return captured["optimizer"]

    Trainer(epochs=1, batch_size=16, optimizer=factory, progress="off", device="cpu", plot=False,
            run_dir=str(tmp_path)).fit(model, _data())
    groups = captured["optimizer"].param_groups
    assert {id(p) for g in groups for p in g["params"]} == {id(p) for p in model.head.parameters()}
    assert {g["weight_decay"] for g in groups} == {0.0, 0.01}


def test_extend_optimizer_keeps_existing_state():
    model = Net()
    freeze(model, "backbone")
    optimizer = torch.optim.Adam(param_groups(model), lr=1e-3)
    model(torch.randn(4, 1, 8, 8)).sum().backward()
    optimizer.step()
    state_before = {id(p): optimizer.state[p]["exp_avg"].clone() for p in model.head.parameters()}
    unfreeze(model, "backbone")
    added = extend_optimizer(optimizer, model)
    assert set(added) == {n for n, _ in model.backbone.named_parameters(prefix="backbone")}
    for p in model.head.parameters():
        assert torch.equal(optimizer.state[p]["exp_avg"], state_before[id(p)])
    assert extend_optimizer(optimizer, model) == []


def test_gradual_unfreezing_in_the_trainer(tmp_path):
    model = Net()
    freeze(model, "backbone")
    before = _snapshot(model.backbone)
    result = Trainer(epochs=3, batch_size=16, unfreeze_at={3: ["backbone"]}, progress="off", device="cpu",
                     plot=False, run_dir=str(tmp_path)).fit(model, _data())
    assert result.stopped == "completed"
    assert any(not torch.equal(v, model.backbone.state_dict()[k]) for k, v in before.items())
    assert frozen_norm_layers(model) == []


@pytest.mark.slow
def test_frozen_norm_layers_under_torch_compile(tmp_path):
    torch.manual_seed(0)
    model = Net()
    freeze(model, "backbone")
    before = _snapshot(model.backbone)
    Trainer(epochs=1, batch_size=16, compile=True, progress="off", device="cpu", plot=False,
            run_dir=str(tmp_path)).fit(model, _data())
    after = model.backbone.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in before.items())


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4 * 8 * 8, 2)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))).flatten(1))


def _trained_stats(model):
    """Give the BatchNorm non-trivial running statistics, so that eval and batch statistics differ."""
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(8, 1, 8, 8) * 3 + 1)
    return model


def test_freeze_leaves_the_class_of_norm_layers_unchanged():
    model = Net()
    freeze(model, "backbone")
    assert type(model.backbone[1]) is nn.BatchNorm2d
    assert type(model.backbone[4]) is nn.InstanceNorm2d and type(model.backbone[8]) is nn.BatchNorm1d
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert type(clone.backbone[1]) is nn.BatchNorm2d
        assert frozen_norm_layers(clone) == ["backbone.1", "backbone.4", "backbone.8"]


def test_fuse_modules_works_on_a_frozen_conv_bn_pair():
    torch.manual_seed(0)
    model = _trained_stats(ConvBN())
    freeze(model, "conv", "bn")
    model.eval()
    x = torch.randn(4, 1, 8, 8)
    expected = model(x)
    fused = torch.ao.quantization.fuse_modules(model, [["conv", "bn"]])
    assert type(fused.bn) is nn.Identity and type(fused.conv) is nn.Conv2d
    torch.testing.assert_close(fused(x), expected, rtol=1e-5, atol=1e-5)
    assert type(model.bn) is nn.BatchNorm2d  # fuse_modules worked on a copy


def test_pinned_layer_stays_in_eval_through_train_after_torch_save_and_deepcopy():
    model = _trained_stats(ConvBN())
    freeze(model, "conv", "bn")
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for clone in (torch.load(buffer, weights_only=False), copy.deepcopy(model)):
        clone.train()
        assert clone.training and clone.bn.training is False and clone.head.training
        before = _snapshot(clone.bn)
        clone(torch.randn(8, 1, 8, 8) * 5)
        assert all(torch.equal(v, clone.bn.state_dict()[k]) for k, v in before.items())
        clone.bn.train()  # the clone's own layer, not the original's
        assert clone.bn.training is False and model.bn.training is False
        unfreeze(clone)
        clone.train()
        assert clone.bn.training and not model.bn.training
        model.train()
        assert model.bn.training is False  # unfreezing the clone left the original pinned


def test_unfreeze_removes_the_instance_attributes():
    model = ConvBN()
    freeze(model, "bn")
    assert is_pinned_eval(model.bn)
    unfreeze(model, "bn")
    assert not is_pinned_eval(model.bn)
    assert "train" not in vars(model.bn)
    assert model.bn.train.__func__ is nn.BatchNorm2d.train


def test_model_saved_with_the_old_class_swap_still_loads_pinned():
    from trainwise import freezing

    model = ConvBN()
    model.bn.training = False

    class OldPickler(pickle.Pickler):  # what files written by the class-swapping freeze() contain
        def reducer_override(self, obj):
            if obj is model.bn:
                reduced = object.__reduce_ex__(obj, 2)
                return (freezing._new_frozen, (nn.BatchNorm2d,), *reduced[2:])
            return NotImplemented

    buffer = io.BytesIO()
    OldPickler(buffer, protocol=2).dump(model)
    loaded = pickle.loads(buffer.getvalue())
    assert type(loaded.bn) is nn.BatchNorm2d and is_pinned_eval(loaded.bn)
    loaded.train()
    assert loaded.bn.training is False


def test_compiled_training_forward_keeps_running_stats_of_pinned_layers():
    torch.manual_seed(0)
    model = _trained_stats(ConvBN())
    freeze(model, "conv", "bn")
    model.train()
    before = _snapshot(model.bn)
    compiled = torch.compile(model, backend="aot_eager")
    x = torch.randn(8, 1, 8, 8) * 5
    out = compiled(x)
    assert all(torch.equal(v, model.bn.state_dict()[k]) for k, v in before.items())
    model.eval()
    torch.testing.assert_close(out, model(x))  # the compiled training forward used eval statistics
