"""load_weights from every common layout, wrapper prefixes removed or added, and the report it returns."""

from __future__ import annotations

import warnings

import pytest
import torch
from ckpt_helpers import Net

from trainwise import load_weights, save_checkpoint, save_weights
from trainwise.checkpoint import LoadReport, WeightsMismatchError
from trainwise.errors import TrainwiseError


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture
def source() -> Net:
    torch.manual_seed(1)
    model = Net()
    model.norm.running_mean.add_(0.5)  # buffers travel too
    return model


@pytest.fixture
def fresh() -> Net:
    torch.manual_seed(2)
    return Net()


def prefixed(state: dict, prefix: str) -> dict:
    return {prefix + k: v for k, v in state.items()}


@pytest.mark.parametrize(
    "layout",
    ["raw", "state_dict", "model_state_dict", "model", "module", "nested", "lightning"],
)
def test_finds_weights_in_common_layouts(source, fresh, layout):
    sd = source.state_dict()
    checkpoint = {
        "raw": sd,
        "state_dict": {"state_dict": sd, "epoch": 3},
        "model_state_dict": {"model_state_dict": sd, "optimizer_state_dict": {}, "epoch": 3},
        "model": {"model": sd, "step": 10},
        "module": {"module": sd},
        "nested": {"model": {"state_dict": sd}, "step": 10},
        "lightning": {"state_dict": prefixed(sd, "model."), "pytorch-lightning_version": "2.4.0",
                      "epoch": 3, "global_step": 120, "optimizer_states": [], "lr_schedulers": []},
    }[layout]
    report = load_weights(fresh, checkpoint)
    assert report.ok and same_weights(source, fresh)
    assert report.prefix_changes == (["removed 'model.'"] if layout == "lightning" else [])


def test_dataparallel_prefix_is_removed(source, fresh, tmp_path):
    wrapped = torch.nn.DataParallel(source)  # a real DataParallel state dict (CPU: no devices needed)
    assert all(k.startswith("module.") for k in wrapped.state_dict())
    torch.save(wrapped.state_dict(), tmp_path / "dp.pt")
    report = load_weights(fresh, tmp_path / "dp.pt")
    assert report.prefix_changes == ["removed 'module.'"] and same_weights(source, fresh)


def test_ddp_style_checkpoint_dict(source, fresh):
    # DDP's keys are exactly DataParallel's: "module." + the module's keys
    checkpoint = {"model": prefixed(source.state_dict(), "module."), "optimizer": {}, "epoch": 1}
    assert load_weights(fresh, checkpoint).prefix_changes == ["removed 'module.'"]
    assert same_weights(source, fresh)


def test_torch_compile_prefix_is_removed(source, fresh):
    compiled = torch.compile(source)  # nothing is compiled until the first call; the keys are real
    keys = list(compiled.state_dict())
    assert keys and all(k.startswith("_orig_mod.") for k in keys)
    report = load_weights(fresh, compiled.state_dict())
    assert report.prefix_changes == ["removed '_orig_mod.'"] and same_weights(source, fresh)


def test_compiled_ddp_chain_is_removed(source, fresh):
    report = load_weights(fresh, prefixed(source.state_dict(), "_orig_mod.module."))
    assert report.ok and same_weights(source, fresh)


@pytest.mark.parametrize("wrap", ["dataparallel", "compile"])
def test_prefix_is_added_when_the_target_is_wrapped(source, fresh, wrap):
    target = torch.nn.DataParallel(fresh) if wrap == "dataparallel" else torch.compile(fresh)
    report = load_weights(target, source.state_dict())
    expected = "module." if wrap == "dataparallel" else "_orig_mod."
    assert report.prefix_changes == [f"added {expected!r}"] and same_weights(source, fresh)


def test_prefix_is_swapped_between_wrappers(source, fresh):
    report = load_weights(torch.nn.DataParallel(fresh), prefixed(source.state_dict(), "_orig_mod."))
    assert report.prefix_changes == ["removed '_orig_mod.'", "added 'module.'"] and same_weights(source, fresh)


def test_prefixes_left_alone_when_keys_already_match(fresh):
    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Net()  # every key really starts with "model."

    torch.manual_seed(3)
    a, b = Outer(), Outer()
    report = load_weights(b, a.state_dict())
    assert report.ok and report.prefix_changes == [] and same_weights(a, b)


def test_trainwise_checkpoint_and_safetensors(source, fresh, tmp_path):
    optimizer = torch.optim.SGD(source.parameters(), lr=0.1)
    save_checkpoint(tmp_path / "ckpt.pt", {"model": torch.nn.DataParallel(source), "optimizer": optimizer})
    report = load_weights(fresh, tmp_path / "ckpt.pt")
    assert report.ok and report.found_at == "['state']['model']" and same_weights(source, fresh)

    torch.manual_seed(5)
    other = Net()
    save_weights(torch.compile(source), tmp_path / "w.safetensors")  # unwrapped on save
    report = load_weights(other, tmp_path / "w.safetensors")
    assert report.ok and report.prefix_changes == [] and same_weights(source, other)
    save_weights(source, tmp_path / "w.pt")
    assert list(torch.load(tmp_path / "w.pt", weights_only=True)) == list(source.state_dict())


def test_safetensors_with_tied_weights(tmp_path):
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.out = torch.nn.Linear(4, 10, bias=False)
            self.out.weight = self.embed.weight

    torch.manual_seed(0)
    a, b = Tied(), Tied()
    save_weights(a, tmp_path / "tied.safetensors")
    assert load_weights(b, tmp_path / "tied.safetensors").ok and same_weights(a, b)


def test_strict_mismatch_raises_a_table_and_loads_nothing(source, tmp_path):
    sd = source.state_dict()
    sd.pop("head.bias")
    sd["extra.weight"] = torch.zeros(2, 2)
    sd["encoder.weight"] = torch.zeros(5, 4)  # model has (8, 4)
    torch.manual_seed(4)
    target = Net()
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(WeightsMismatchError) as info:
        load_weights(target, sd)
    message = str(info.value)
    lines = message.splitlines()
    assert lines[0].startswith(
        "load_weights from the given mapping: 2 of 9 model keys did not load (1 missing, 1 with a different "
        "shape) and 1 checkpoint key was unexpected"
    )
    assert "pass strict=False" in lines[0]
    table = "\n".join(lines[1:])
    assert "missing" in table and "head.bias" in table and "(3,)" in table
    assert "unexpected" in table and "extra.weight" in table and "(2, 2)" in table
    assert "shape" in table and "encoder.weight" in table and "(5, 4)" in table and "(8, 4)" in table
    assert isinstance(info.value, TrainwiseError) and info.value.report.mismatched[0][0] == "encoder.weight"
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())  # untouched


def test_non_strict_loads_what_matches_and_warns_once(source, fresh):
    sd = source.state_dict()
    sd.pop("head.bias")
    sd["head.weight"] = torch.zeros(7, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = load_weights(fresh, sd, strict=False)
    assert len(caught) == 1
    text = str(caught[0].message)
    assert "\n" not in text and "2 of 9 model keys did not load" in text
    assert isinstance(report, LoadReport) and not report.ok
    assert report.missing == ["head.bias"] and report.mismatched == [("head.weight", (7, 8), (3, 8))]
    assert torch.equal(fresh.encoder.weight, source.encoder.weight)
    assert not torch.equal(fresh.head.weight, torch.zeros(3, 8))


def test_non_strict_that_loads_nothing_says_so(fresh):
    with pytest.warns(UserWarning, match="9 of 9 model keys did not load"):
        report = load_weights(fresh, {"totally.different": torch.zeros(1)}, strict=False)
    assert report.loaded == [] and report.unexpected == ["totally.different"]


def test_sources_without_weights_are_errors(fresh):
    with pytest.raises(TrainwiseError, match="no model weights found"):
        load_weights(fresh, {"epoch": 3, "optimizer": {"param_groups": []}})
    with pytest.raises(TrainwiseError, match="file path, a state dict"):
        load_weights(fresh, 42)


def test_report_table_for_a_clean_load(source, fresh):
    report = load_weights(fresh, source.state_dict())
    assert str(report).startswith("load_weights from the given mapping: all 9 model keys loaded")
    assert report.to_dict()["ok"] is True


# -- files whose name lies, tensors without data, sparse tensors, hostile keys (issue 10 item 9) ----------


def test_files_whose_name_lies_load_by_content(source, fresh, tmp_path):
    from trainwise.checkpoint.weights import safetensors_bytes

    torch.save(source.state_dict(), tmp_path / "zip.safetensors")
    (tmp_path / "st.pt").write_bytes(safetensors_bytes(source.state_dict()))
    for name in ("zip.safetensors", "st.pt"):
        torch.manual_seed(7)
        target = Net()
        with pytest.warns(UserWarning, match="name"):
            assert load_weights(target, tmp_path / name).ok
        assert same_weights(source, target)


def one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text and text.endswith("."), text
    return text


@pytest.mark.parametrize("kind", ["meta", "coo", "csr"])
@pytest.mark.parametrize("from_file", [False, True])
def test_tensors_without_data_or_sparse_are_refused_naming_the_key(fresh, tmp_path, kind, from_file):
    sd = Net().state_dict()
    weight = sd["encoder.weight"]
    sd["encoder.weight"] = {
        "meta": lambda: torch.empty(weight.shape, device="meta"),
        "coo": lambda: weight.to_sparse(),
        "csr": lambda: weight.to_sparse_csr(),
    }[kind]()
    source = sd
    if from_file:
        torch.save(sd, tmp_path / "w.pt")
        source = tmp_path / "w.pt"
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that sparse CSR support is in beta
        for strict in (True, False):
            with pytest.raises(TrainwiseError) as info:
                load_weights(fresh, source, strict=strict)
            text = one_line(info.value)
            assert "'encoder.weight'" in text
            assert ("meta" in text and "no data" in text) if kind == "meta" else ".to_dense()" in text
    assert all(torch.equal(before[k], v) for k, v in fresh.state_dict().items())  # untouched


@pytest.mark.parametrize(
    "kind", ["zero-byte", "truncated", "random", "json", "plain-pickle", "truncated-safetensors", "directory",
             "missing"],
)
def test_bad_files_are_one_sentence_from_load_weights(fresh, tmp_path, kind):
    from ckpt_helpers import make_bad_inputs

    good = tmp_path / "good.pt"
    torch.save(fresh.state_dict(), good)
    files = make_bad_inputs(tmp_path / "bad", good)
    with pytest.raises(TrainwiseError) as info:
        load_weights(fresh, files[kind])
    one_line(info.value)


def test_hostile_keys_are_shown_escaped(fresh):
    weights = {"\x1b[2J" + "x" * 10_000: torch.zeros(1), "encoder.weight": torch.zeros(8, 4)}
    with pytest.raises(WeightsMismatchError) as info:
        load_weights(fresh, weights)
    text = str(info.value)
    assert "\x1b" not in text and "\\x1b[2J" in text and len(text) < 5_000
    with pytest.raises(TrainwiseError) as info:
        load_weights(fresh, {torch.zeros(2, 2): torch.zeros(1), "a\x1b[31m": 1})  # no string keys: no weights
    text = one_line(info.value)
    assert "\x1b" not in text and "no model weights" in text


# -- strict=False suggested only when it would load most of the model (issue 26 item 10) ------------------


def test_strict_false_is_suggested_only_when_it_would_load_most_of_the_model(source, fresh):
    sd = source.state_dict()  # Net: 9 keys, 100 elements
    most = {"encoder.weight": sd["encoder.weight"], "head.weight": sd["head.weight"]}  # 2 keys, 56 elements
    with pytest.raises(WeightsMismatchError) as info:
        load_weights(fresh, most)
    assert str(info.value).splitlines()[0].endswith("pass strict=False to load the keys that match.")
    assert info.value.report.fits

    with pytest.raises(WeightsMismatchError) as info:
        load_weights(fresh, {"head.bias": sd["head.bias"], "other.weight": torch.zeros(3)})  # 1 key, 3 elements
    first = str(info.value).splitlines()[0]
    assert "strict=False" not in first and "only 1 of 9 keys match" in first and "another kind of model" in first

    with pytest.warns(UserWarning) as caught:
        report = load_weights(fresh, {"other.weight": torch.zeros(3)}, strict=False)
    assert report.loaded == [] and "strict=False" not in str(report) and "strict=False" not in str(caught[0].message)
    assert "another kind of model" in str(caught[0].message)


def test_a_non_strict_report_does_not_suggest_strict_false(source, fresh):
    sd = source.state_dict()
    sd.pop("head.bias")
    with pytest.warns(UserWarning, match="1 of 9 model keys did not load"):
        report = load_weights(fresh, sd, strict=False)
    first = str(report).splitlines()[0]
    assert report.fits and "strict=False" not in first and "the keys that match loaded" in first
    assert report.to_dict()["strict"] is False


# -- base_model_prefix, folders and shard indexes without transformers (issue 26 item 6) -----------------


class Task(torch.nn.Module):
    """A task model in transformers' shape: its base model under ``base_model_prefix``, and a head."""

    base_model_prefix = "backbone"

    def __init__(self):
        super().__init__()
        self.backbone = Net()
        self.classifier = torch.nn.Linear(3, 2)


def test_base_model_prefix_is_added_or_removed_only_with_the_attribute(source):
    torch.manual_seed(6)
    task = Task()
    report = load_weights(task, source.state_dict(), strict=False)
    assert report.prefix_changes == ["added 'backbone.'"] and report.missing == ["classifier.weight", "classifier.bias"]
    assert same_weights(task.backbone, source)

    class Base(Net):
        base_model_prefix = "backbone"  # as transformers' bare models have it too (BertModel: "bert")

    torch.manual_seed(7)
    bare = Base()
    report = load_weights(bare, task.state_dict(), strict=False)
    assert report.prefix_changes == ["removed 'backbone.'"] and sorted(report.unexpected) == [
        "classifier.bias", "classifier.weight"]
    assert same_weights(bare, source)

    class Untagged(Task):
        base_model_prefix = ""

    with pytest.warns(UserWarning, match="11 of 11 model keys did not load"):  # no attribute: no guessing
        assert load_weights(Untagged(), source.state_dict(), strict=False).prefix_changes == []


def test_folder_and_shard_index(source, tmp_path):
    import json

    (tmp_path / "one").mkdir()
    (tmp_path / "sharded").mkdir()
    save_weights(source, tmp_path / "one" / "model.safetensors")
    torch.manual_seed(8)
    target = Net()
    report = load_weights(target, tmp_path / "one")
    assert report.ok and report.source == str(tmp_path / "one" / "model.safetensors") and same_weights(source, target)

    folder = tmp_path / "sharded"
    sd = source.state_dict()
    keys = sorted(sd)
    parts = {"model-00001-of-00002.safetensors": keys[:4], "model-00002-of-00002.safetensors": keys[4:]}
    for name, part in parts.items():
        save_weights({k: sd[k] for k in part}, folder / name)
    weight_map = {k: name for name, part in parts.items() for k in part}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    torch.manual_seed(9)
    target = Net()
    report = load_weights(target, folder)
    assert report.ok and report.source.endswith("model.safetensors.index.json (2 shards)")
    assert same_weights(source, target)

    save_weights(source, tmp_path / "outside.safetensors")  # loadable, so only refusing it passes
    weight_map[keys[0]] = "../outside.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(TrainwiseError) as info:
        load_weights(Net(), folder)
    assert "'../outside.safetensors'" in one_line(info.value) and "not a file in the index's folder" in str(info.value)


def test_resume_refusal_suggests_the_weights_that_fit_only_when_most_do():
    from trainwise.checkpoint.compat import check_resume, resume_changes

    def refusal(old: dict, new: dict) -> str:
        changes = resume_changes({"run": {"parameters": old}}, {}, {"parameters": new})
        with pytest.raises(TrainwiseError) as info:
            check_resume(changes, mismatch="raise", checkpoint="last.pt")
        return one_line(info.value)

    old = {"encoder.weight": [8, 4], "encoder.bias": [8], "head.weight": [3, 8], "head.bias": [3]}
    text = refusal(old, {**old, "head.weight": [5, 8], "head.bias": [5]})  # a new head: the encoder fits
    assert "changed shape" in text and "load_weights(model, path, strict=False)" in text
    text = refusal(old, {"other.weight": [8, 4], "other.bias": [8], "head.bias": [3]})  # 3 of 47 elements fit
    assert "strict=False" not in text and "shares less than half of its parameters" in text
