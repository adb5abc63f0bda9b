import subprocess
import sys

OPTIONAL = ("rich", "matplotlib", "onnx", "onnxruntime", "libcst", "tensorboard")


def test_import_is_light():
    code = f"import sys, trainwise; print([m for m in {OPTIONAL!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_public_api_is_exported():
    import trainwise

    for name in trainwise.__all__:
        assert hasattr(trainwise, name), name


def test_cli_parser_does_not_import_torch():
    code = "import sys; from trainwise.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_top_level_is_small_and_every_name_is_where_its_list_says():
    import importlib

    import trainwise

    names = trainwise.__all__
    assert len(names) <= 50 and len(set(names)) == len(names)
    assert type(names) is list and set(names) == {"__version__", *trainwise._exports()}  # the literal list
    from pathlib import Path

    assert (Path(trainwise.__file__).parent / "py.typed").is_file()  # PEP 561: type checkers read the hints
    # each resolves to the object of the module its TYPE_CHECKING import names
    for name in (n for n in names if n != "__version__"):
        assert getattr(trainwise, name) is getattr(importlib.import_module(trainwise._exports()[name]), name)
    assert sorted(dir(trainwise)) == sorted(names)


def test_a_moved_name_still_works_with_a_warning_naming_its_namespace():
    import pytest

    import trainwise
    from trainwise.data import seed_worker

    with pytest.warns(DeprecationWarning, match=r"trainwise\.seed_worker moved to trainwise\.data\.seed_worker"):
        assert trainwise.seed_worker is seed_worker
    for name, module in trainwise._MOVED.items():  # every moved name exists in the namespace it names
        assert name not in trainwise.__all__
        assert hasattr(__import__(module, fromlist=[name]), name), (name, module)


def test_namespaces_load_on_first_use_and_a_typo_is_an_attribute_error():
    import pytest

    code = ("import sys, trainwise; assert 'torch' not in sys.modules; import trainwise as tw; "
            "tw.checkpoint; assert 'torch' not in sys.modules; print(tw.data.seeded_loader.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "trainwise.data.seeding"
    import trainwise

    with pytest.raises(AttributeError, match="no attribute 'Trainr'"):
        trainwise.Trainr  # noqa: B018


_LOOP_MODULES = """
import json, sys, tempfile
import torch
from torch import nn
import trainwise as tw

torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,)))
model = nn.Linear(8, 4)
if sys.argv[1] == "minimal":
    optimizer = torch.optim.AdamW(model.parameters())
    for x, y in torch.utils.data.DataLoader(data, batch_size=16, shuffle=True):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
else:
    with tempfile.TemporaryDirectory() as folder:
        tw.Trainer(run_dir=folder + "/run", epochs=1, progress="off", plot=False, device="cpu").fit(model, data)
print(json.dumps(sorted(sys.modules)))
"""
# Loaded only when a run asks for them (compile, FSDP, plots, trackers, export).
HEAVY = ("sympy", "torch._dynamo", "torch._inductor", "torch.distributed.fsdp", "torch.fx", "torch.export",
         "matplotlib", "onnx", "tensorboard", "rich", "libcst")


def test_a_one_process_fit_loads_nothing_heavy_that_the_users_own_loop_does_not():
    """torch's own optimizer constructor loads torch._dynamo (and with it sympy and FSDP) in any loop; beyond what
    the loop a user would write loads, a plain fit (no compile, FSDP, plot or tracker) loads none of them."""
    import json

    def loaded(mode):
        out = subprocess.run([sys.executable, "-c", _LOOP_MODULES, mode], capture_output=True, text=True, check=True)
        return set(json.loads(out.stdout.splitlines()[-1]))

    extra = loaded("fit") - loaded("minimal")
    assert [m for m in sorted(extra) if m.split(".")[0] != "trainwise" and m.startswith(HEAVY)] == []
