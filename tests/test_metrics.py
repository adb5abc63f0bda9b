"""Metrics are sums and counts of samples: accuracy = correct / samples seen, never / batches."""

import functools
import math

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from trainwise import Accuracy, Mean, MetricSet, Trainer, TrainwiseError
from trainwise.metrics import HOST_COMPARE_MAX


def _reference_accuracy(model, x, y):
    with torch.no_grad():
        return (model(x).argmax(-1) == y).sum().item() / len(y)


def _classifier():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3)


def test_mean_is_weighted_by_samples():
    m = Mean()
    m.update(torch.tensor(1.0), 10)
    m.update(torch.tensor(4.0), 2)  # a short last batch
    assert m.compute() == pytest.approx((10 * 1.0 + 2 * 4.0) / 12)
    m.update_sum(torch.tensor(6.0), 3)
    assert m.compute() == pytest.approx((10 + 8 + 6) / 15)


def test_mean_rejects_non_scalars():
    with pytest.raises(TrainwiseError, match="takes a scalar"):
        Mean().update(torch.ones(3), 3)


def test_empty_metric_is_nan():
    assert math.isnan(Mean().compute())


def test_accuracy_counts_samples_with_short_last_batch():
    model = _classifier()
    x, y = torch.randn(103, 4), torch.randint(0, 3, (103,))
    acc = Accuracy()
    for xb, yb in DataLoader(TensorDataset(x, y), batch_size=10):  # last batch has 3 samples
        acc.update(model(xb), yb)
    assert acc.compute() == pytest.approx(_reference_accuracy(model, x, y), abs=1e-12)


def test_accuracy_ignores_padding_tokens():
    logits = torch.tensor([[[5.0, 0.0], [0.0, 5.0], [5.0, 0.0]]])
    targets = torch.tensor([[0, 0, -100]])
    acc = Accuracy()
    acc.update(logits, targets)
    assert acc.compute() == 0.5


def test_accuracy_shape_mismatch_is_one_sentence():
    with pytest.raises(TrainwiseError, match="logits of shape"):
        Accuracy().update(torch.randn(4, 3), torch.zeros(5, dtype=torch.long))


def test_metric_set_reads_back_once():
    metrics = MetricSet()
    metrics.mean("loss").update(torch.tensor(2.0), 4)
    metrics.accuracy("accuracy").update(torch.eye(3), torch.tensor([0, 1, 0]))
    values = metrics.compute()
    assert values == {"loss": 2.0, "accuracy": pytest.approx(2 / 3)}
    assert metrics.counts() == {"loss": 4.0, "accuracy": 3.0}
    metrics.reset()
    assert all(math.isnan(v) for v in metrics.compute().values())


def test_metrics_stay_detached():
    w = torch.ones((), requires_grad=True)
    m = Mean()
    m.update(w * 3, 2)
    assert m.state.grad_fn is None and not m.state.requires_grad


class _DictData(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"inputs": self.x[i], "targets": self.y[i]}


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("dict_batches", [False, True])
def test_trainer_validation_accuracy_is_correct_over_dataset(tmp_path, drop_last, dict_batches):
    x, y = torch.randn(103, 4), torch.randint(0, 3, (103,))
    data = _DictData(x, y) if dict_batches else TensorDataset(x, y)
    model = _classifier()
    trainer = Trainer(progress="off", run_dir=str(tmp_path), device="cpu")
    loader = DataLoader(data, batch_size=10, drop_last=drop_last)
    values = trainer.validate(model, loader)
    seen = 100 if drop_last else 103
    assert values["accuracy"] == pytest.approx(_reference_accuracy(model, x[:seen], y[:seen]), abs=1e-12)
    with torch.no_grad():
        ref_loss = torch.nn.functional.cross_entropy(model(x[:seen]), y[:seen]).item()
    assert values["loss"] == pytest.approx(ref_loss, rel=1e-6)


def test_trainer_train_accuracy_counts_samples(tmp_path):
    # lr tiny so the model barely moves: train accuracy over one epoch equals a fixed-model reference
    x, y = torch.randn(103, 4), torch.randint(0, 3, (103,))
    model = _classifier()
    expected = _reference_accuracy(model, x, y)
    result = Trainer(
        epochs=1, batch_size=10, progress="off", run_dir=str(tmp_path), device="cpu",
        optimizer=lambda p: torch.optim.SGD(p, lr=1e-12),
    ).fit(model, DataLoader(TensorDataset(x, y), batch_size=10, shuffle=True))
    assert result.last["train_accuracy"] == pytest.approx(expected, abs=1e-12)


def test_metrics_first_touched_in_inference_mode_work_outside_it(tmp_path):
    """A MetricSet first used inside evaluating() held inference tensors: reset() and all_reduce() outside
    inference mode then raised "Inplace update to inference tensor outside InferenceMode"."""
    import torch.distributed as dist

    from trainwise import MetricSet, evaluating

    net = torch.nn.Linear(2, 3)
    metrics = MetricSet("cpu")
    with evaluating(net):
        outputs = net(torch.randn(4, 2))
        metrics.mean("loss").update(outputs.sum() / 4, 4)
        metrics.accuracy("accuracy").update(outputs, torch.tensor([0, 1, 2, 0]))
    metrics.reset()
    metrics.mean("loss").update(torch.tensor(3.0), 2)  # a training-style update, outside inference mode
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        metrics.all_reduce()
    finally:
        dist.destroy_process_group()
    assert metrics.compute()["loss"] == 3.0
    assert metrics.counts() == {"loss": 2.0, "accuracy": 0.0}


@pytest.mark.parametrize(
    "loss, count",
    [
        (torch.tensor(0.25), 4),  # a detached training loss over a host count: the fast path
        (0.25, 4),  # a number
        (torch.tensor([0.25]), 4),  # a one-element tensor
        (torch.tensor(0.25, requires_grad=True), 4),  # still attached to its graph
        (torch.tensor(0.25), torch.tensor(4)),  # a count on the device (tokens)
        (torch.tensor(0.25, dtype=torch.float64), 4.0),  # a float count
    ],
)
def test_update_loss_weights_a_mean_loss_by_its_count_whatever_its_form(loss, count):
    metric = Mean()
    metric.update_loss(torch.tensor(1.0), 4)
    metric.update_loss(loss, count)
    metric.update_loss(None, 3)  # no counted item: nothing added
    assert metric.compute() == pytest.approx((1.0 * 4 + 0.25 * 4) / 8)
    assert not metric.state.requires_grad


def test_update_loss_gives_back_the_value_it_read_on_the_host():
    """A CPU loss on a CPU metric is read once (``item``) to be added; that value comes back, for the Trainer's
    non-finite check to use instead of keeping the tensor. Any other form gives None."""
    metric = Mean()
    assert metric.update_loss(torch.tensor(0.25), 4) == 0.25
    value = metric.update_loss(torch.tensor(float("nan")), 4)
    assert value != value  # NaN, as read
    assert metric.update_loss(torch.tensor(0.5, requires_grad=True), 4) is None  # the general way: not read
    assert metric.update_loss(torch.tensor(0.5), torch.tensor(4)) is None  # a count on the device
    assert metric.update_loss(None, 3) is None and metric.update_loss(torch.tensor(1.0), 0) is None


def _dispatched(fn) -> list[str]:
    from torch.utils._python_dispatch import TorchDispatchMode

    names: list[str] = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return names


@pytest.mark.parametrize("on_host", [True, False], ids=["cpu", "device-path"])
@pytest.mark.parametrize("shape", [(16,), (HOST_COMPARE_MAX + 1,), (4, 6), ()])
def test_accuracy_update_is_few_kernels_and_exact_with_ignored_targets(shape, on_host):
    # each kernel is a few microseconds of a CPU training step: argmax, one comparison, one sum, and on an
    # accelerator one add (on the CPU the counts are read back and added on the host instead, and a small batch
    # of one target per sample is compared as Python lists after the argmax)
    torch.manual_seed(0)
    acc, logits_seen, targets_seen = Accuracy(), [], []
    acc._on_host = on_host  # False: the accelerator's path (counts kept on the device), run on CPU tensors
    for step in range(5):
        logits = torch.randn(*shape, 5, requires_grad=True)
        targets = torch.randint(0, 5, shape)
        if targets.dim():
            targets.view(-1)[step % targets.numel()] = -100
        ops = sorted(_dispatched(functools.partial(acc.update, logits, targets)))
        if step == 3:  # the first addition after a read takes the folded total back to the host: one read
            assert ops.count("_local_scalar_dense") == (1 if on_host else 0)
            ops.remove("_local_scalar_dense") if on_host else None
        if step:  # the first call also makes its buffers
            expected_ops = ["argmax", "eq"] + (["sum"] if shape != () else []) + ([] if on_host else ["add_"])
            if on_host and len(shape) == 1 and shape[0] <= HOST_COMPARE_MAX:
                expected_ops = ["argmax"]
            assert ops == sorted(expected_ops)
        if step == 2:
            acc.compute()  # a read in the middle: later counts add to what was folded
        logits_seen.append(logits.detach().reshape(-1, 5))
        targets_seen.append(targets.reshape(-1))
    logits, targets = torch.cat(logits_seen), torch.cat(targets_seen)
    kept = targets != -100
    expected = ((logits.argmax(-1) == targets) & kept).sum().item() / kept.sum().item()
    assert acc.compute() == pytest.approx(expected, abs=1e-12)


def test_a_training_loss_summed_on_the_host_has_the_bits_of_the_tensor_sum():
    torch.manual_seed(2)
    losses = [torch.rand((), dtype=torch.float32) * 10 for _ in range(300)]
    counts = [int(c) for c in torch.randint(1, 100, (300,))]
    host, device = Mean(), Mean()
    device._on_host = False  # the tensor additions an accelerator does
    for i, (loss, count) in enumerate(zip(losses, counts)):
        ops = _dispatched(functools.partial(host.update_loss, loss, count))
        device.update_loss(loss, count)
        assert "add_" not in ops
        if i % 37 == 0:  # reads between additions (log intervals) fold the host's total into the tensor
            assert host.compute() == device.compute()
        if i == 150:  # and so do a snapshot and a checkpoint
            host.restore(host.snapshot())
            host.load_state_dict(host.state_dict())
    assert torch.equal(host.fold(), device.fold())
    host.update(torch.tensor(1.5), 3)  # the general path after host additions continues from their total
    device.update(torch.tensor(1.5), 3)
    assert torch.equal(host.fold(), device.fold())


def test_accuracy_counts_between_reads_survive_snapshot_state_dict_and_inference_mode():
    torch.manual_seed(1)
    logits, targets = torch.randn(8, 3), torch.tensor([0, 1, 2, -100, 0, 1, 2, 0])
    reference = Accuracy()
    reference.update(logits, targets)
    with torch.inference_mode():  # buffers first made under inference mode are still written after it
        acc = Accuracy()
        acc.update(logits, targets)
    snapshot = acc.snapshot()
    acc.update(logits, targets)
    acc.restore(snapshot)  # the update after the snapshot is undone
    assert acc.compute() == reference.compute()
    acc.update(logits, targets)
    loaded = Accuracy()
    loaded.load_state_dict(acc.state_dict())
    assert loaded.compute() == acc.compute() == reference.compute()
    acc.reset()
    assert math.isnan(acc.compute())


def test_accuracy_with_an_ignore_index_that_is_a_class_masks_it():
    acc = Accuracy(ignore_index=1)
    acc.update(torch.tensor([[0.0, 5.0], [5.0, 0.0], [5.0, 0.0]]), torch.tensor([1, 0, 1]))
    assert acc.compute() == 1.0  # the one non-ignored target, predicted right; the predicted 1s are not counted


@pytest.mark.parametrize("ignore_index", [-100, None, 5, 2])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32])
def test_a_small_batch_compared_on_the_host_counts_what_the_tensor_comparison_counts(ignore_index, dtype):
    """Batches of one target per sample, below and above HOST_COMPARE_MAX, ignored targets among them (an
    ignore_index that is a class, 2, takes the masked tensor path): the same correct and counted items as the
    accelerator's tensor path, to the bit."""
    torch.manual_seed(3)
    host, device = Accuracy(ignore_index=ignore_index), Accuracy(ignore_index=ignore_index)
    device._on_host = False
    for size in (1, 7, 64, HOST_COMPARE_MAX, HOST_COMPARE_MAX + 1, 300):
        logits = torch.randn(size, 5, requires_grad=True)
        targets = torch.randint(0, 5, (size,))
        targets[::3] = -100 if ignore_index is None else ignore_index
        host.update(logits, targets.to(dtype))
        device.update(logits, targets.to(dtype))
        assert host.fold().tolist() == device.fold().tolist()
    total, count = host.fold().tolist()
    assert 0 < total < count
