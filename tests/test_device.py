"""Device and precision policy; moving any batch structure."""

import dataclasses
from collections import namedtuple

import numpy as np
import pytest
import torch

from trainwise import TrainwiseError, move_to_device, resolve_device, resolve_precision


def test_auto_device_on_this_machine_gives_a_reason():
    choice = resolve_device("auto")
    assert choice.device.type in ("cuda", "mps", "cpu") and choice.reason


def test_explicit_cuda_without_cuda_is_one_sentence():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(TrainwiseError, match="CUDA is not available; use device='auto'"):
        resolve_device("cuda")


def test_unknown_device():
    with pytest.raises(TrainwiseError, match="unknown device"):
        resolve_device("tpu9")


@dataclasses.dataclass
class Pair:
    image: torch.Tensor
    label: torch.Tensor
    name: str = "x"


Point = namedtuple("Point", "a b")


def test_move_nested_structures():
    batch = {
        "a": torch.ones(2),
        "b": [torch.zeros(1), (torch.ones(1), 3, "s", None)],
        "c": Pair(torch.ones(1), torch.zeros(1)),
        "d": Point(torch.ones(1), 2.5),
    }
    moved = move_to_device(batch, "meta")
    assert moved["a"].device.type == "meta"
    assert moved["b"][0].device.type == "meta" and isinstance(moved["b"][1], tuple)
    assert moved["b"][1][1:] == (3, "s", None)
    assert isinstance(moved["c"], Pair) and moved["c"].image.device.type == "meta" and moved["c"].name == "x"
    assert isinstance(moved["d"], Point) and moved["d"].a.device.type == "meta" and moved["d"].b == 2.5


def test_unsupported_batch_types_name_the_field_and_the_fix():
    with pytest.raises(TrainwiseError, match=r"batch\['x'\] is a ndarray.*torch.as_tensor"):
        move_to_device({"x": np.ones(3)}, "cpu")
    with pytest.raises(TrainwiseError, match=r"batch\[1\] has unsupported type object"):
        move_to_device([torch.ones(1), object()], "cpu")


def test_precision_policy():
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu).name == "fp32"
    fp16 = resolve_precision("fp16", cpu)
    assert fp16.needs_scaler and isinstance(fp16.make_scaler(), torch.amp.GradScaler)
    bf16 = resolve_precision("bf16", cpu)
    assert not bf16.needs_scaler and bf16.make_scaler() is None
    with bf16.autocast():
        out = torch.nn.Linear(4, 4)(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16
    with pytest.raises(TrainwiseError, match="unknown precision"):
        resolve_precision("fp8", cpu)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_auto_precision_and_pinned_copy():
    policy = resolve_precision("auto", torch.device("cuda"))
    assert policy.name in ("bf16", "fp16")
    moved = move_to_device({"x": torch.ones(4).pin_memory()}, "cuda")
    torch.cuda.synchronize()
    assert moved["x"].is_cuda
