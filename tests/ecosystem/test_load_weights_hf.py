"""``load_weights`` on the layouts Hugging Face users have, written by transformers itself.

A ``save_pretrained`` folder holds ``model.safetensors``, or shards ``model-0000x-of-0000y.safetensors`` with
``model.safetensors.index.json``, or (older, or ``torch.save``) ``pytorch_model.bin``. A task model
(``BertForSequenceClassification``) keeps its base model under ``base_model_prefix`` (``bert.``), a bare
``BertModel`` does not: the prefix is removed or added when that makes the keys match, and the head is
reported. A shard index is read as hostile: it can name only files inside its own folder.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from hf_models import tiny_bert_classifier, tiny_bert_config

import trainwise as tw
from trainwise.checkpoint import WeightsMismatchError
from trainwise.errors import TrainwiseError

transformers = pytest.importorskip("transformers")

HEAD = ["classifier.bias", "classifier.weight"]


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 61, (3, 10), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _same_state(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@torch.no_grad()
def _logits(model: torch.nn.Module) -> torch.Tensor:
    return model.eval()(**_inputs()).logits


@torch.no_grad()
def _hidden(model: torch.nn.Module) -> torch.Tensor:
    return model.eval()(**_inputs()).last_hidden_state


def _quiet_save(model, folder, **kwargs) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(folder, **kwargs)


def test_save_pretrained_folder(tmp_path):
    saved = tiny_bert_classifier(seed=0)
    _quiet_save(saved, tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    fresh = tiny_bert_classifier(seed=1)
    assert not torch.equal(_logits(fresh), _logits(saved))
    report = tw.load_weights(fresh, tmp_path)
    assert report.ok and report.source == str(tmp_path / "model.safetensors") and report.prefix_changes == []
    assert _same_state(saved, fresh) and torch.equal(_logits(fresh), _logits(saved))


def test_sharded_save_pretrained_folder(tmp_path):
    saved = tiny_bert_classifier(seed=0)
    _quiet_save(saved, tmp_path, max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 2 and not (tmp_path / "model.safetensors").exists()
    for source in (tmp_path, tmp_path / "model.safetensors.index.json"):  # the folder, or the index itself
        fresh = tiny_bert_classifier(seed=1)
        report = tw.load_weights(fresh, source)
        assert report.ok and report.source.endswith(f"model.safetensors.index.json ({len(shards)} shards)")
        assert _same_state(saved, fresh) and torch.equal(_logits(fresh), _logits(saved))


def test_pytorch_model_bin_folder_and_safetensors_preferred(tmp_path):
    saved = tiny_bert_classifier(seed=0)
    _quiet_save(saved, tmp_path, safe_serialization=False)
    if not (tmp_path / "pytorch_model.bin").exists():  # transformers 5 writes safetensors whatever the flag
        (tmp_path / "model.safetensors").unlink()
        torch.save(saved.state_dict(), tmp_path / "pytorch_model.bin")
    fresh = tiny_bert_classifier(seed=1)
    report = tw.load_weights(fresh, tmp_path)
    assert report.ok and report.source == str(tmp_path / "pytorch_model.bin")
    assert torch.equal(_logits(fresh), _logits(saved))

    other = tiny_bert_classifier(seed=2)  # both files in one folder: the safetensors one is read
    _quiet_save(other, tmp_path)
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "pytorch_model.bin").is_file()
    report = tw.load_weights(fresh, tmp_path)
    assert report.source == str(tmp_path / "model.safetensors") and _same_state(other, fresh)


def test_sharded_pytorch_model_bin(tmp_path):
    saved = tiny_bert_classifier(seed=0)
    state = saved.state_dict()
    keys = list(state)
    weight_map = {}
    for number, part in enumerate((keys[: len(keys) // 2], keys[len(keys) // 2:]), start=1):
        name = f"pytorch_model-0000{number}-of-00002.bin"
        torch.save({k: state[k] for k in part}, tmp_path / name)
        weight_map.update(dict.fromkeys(part, name))
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    fresh = tiny_bert_classifier(seed=1)
    assert tw.load_weights(fresh, tmp_path).ok and torch.equal(_logits(fresh), _logits(saved))


def test_task_model_file_into_bare_base_model(tmp_path):
    classifier = tiny_bert_classifier(seed=0)
    _quiet_save(classifier, tmp_path)
    torch.manual_seed(1)
    bare = transformers.BertModel(tiny_bert_config())
    with pytest.raises(WeightsMismatchError) as info:  # strict: the head has no place in a bare BertModel
        tw.load_weights(bare, tmp_path)
    assert sorted(info.value.report.unexpected) == HEAD and not info.value.report.missing
    assert "pass strict=False" in str(info.value).splitlines()[0]
    with pytest.warns(UserWarning, match="2 checkpoint keys were unexpected"):
        report = tw.load_weights(bare, tmp_path, strict=False)
    assert report.prefix_changes == ["removed 'bert.'"] and len(report.loaded) == len(bare.state_dict())
    assert torch.equal(_hidden(bare), _hidden(classifier.bert))


def test_bare_base_model_file_into_task_model():
    torch.manual_seed(1)
    bare = transformers.BertModel(tiny_bert_config())
    classifier = tiny_bert_classifier(seed=0)
    head = {k: v.clone() for k, v in classifier.classifier.state_dict().items()}
    with pytest.raises(WeightsMismatchError) as info:
        tw.load_weights(classifier, bare.state_dict())
    assert sorted(info.value.report.missing) == HEAD and not info.value.report.unexpected
    with pytest.warns(UserWarning, match="2 of 41 model keys did not load"):
        report = tw.load_weights(classifier, bare.state_dict(), strict=False)
    assert report.prefix_changes == ["added 'bert.'"] and sorted(report.missing) == HEAD
    assert "strict=False" not in str(report)  # already non-strict: nothing to suggest
    assert torch.equal(_hidden(classifier.bert), _hidden(bare))
    assert all(torch.equal(v, head[k]) for k, v in classifier.classifier.state_dict().items())  # kept


def test_prefix_left_alone_when_keys_already_match():
    a, b = tiny_bert_classifier(seed=0), tiny_bert_classifier(seed=1)
    report = tw.load_weights(b, a.state_dict())
    assert report.ok and report.prefix_changes == [] and _same_state(a, b)


def _sharded(tmp_path) -> tuple[torch.nn.Module, dict]:
    saved = tiny_bert_classifier(seed=0)
    _quiet_save(saved, tmp_path / "model", max_shard_size="20KB")
    return saved, json.loads((tmp_path / "model" / "model.safetensors.index.json").read_text())


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/ABS/outside.safetensors", "sub/x.safetensors",
                                   "..", "C:outside.safetensors", "sub\\x.safetensors", ""])
def test_index_naming_a_file_outside_its_folder_is_refused(tmp_path, shard):
    saved, index = _sharded(tmp_path)
    # a real, loadable file where the traversal would lead: refusing it is the only way the test passes
    tw.save_weights(saved, tmp_path / "outside.safetensors")
    shard = shard.replace("/ABS", str(tmp_path))
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = shard
    (tmp_path / "model" / "model.safetensors.index.json").write_text(json.dumps(index))
    fresh = tiny_bert_classifier(seed=1)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(TrainwiseError) as info:
        tw.load_weights(fresh, tmp_path / "model", strict=False)
    text = str(info.value)
    assert "\n" not in text and "not a file in the index's folder" in text and first in text
    assert all(torch.equal(before[k], v) for k, v in fresh.state_dict().items())


@pytest.mark.parametrize("damage", ["missing-shard", "not-json", "no-weight-map", "key-not-in-shard",
                                    "key-in-two-shards", "shard-is-text"])
def test_damaged_sharded_folders_are_one_sentence(tmp_path, damage):
    _, index = _sharded(tmp_path)
    folder = tmp_path / "model"
    path = folder / "model.safetensors.index.json"
    shards = sorted(set(index["weight_map"].values()))
    expected = {
        "missing-shard": "does not hold; the folder is incomplete",
        "not-json": "is not valid JSON",
        "no-weight-map": "has no weight_map",
        "key-not-in-shard": "which does not hold it",
        "key-in-two-shards": "is in two shards",
        "shard-is-text": "JSON/text file",
    }[damage]
    if damage == "missing-shard":
        (folder / shards[-1]).unlink()
    elif damage == "not-json":
        path.write_text('{"weight_map": {')
    elif damage == "no-weight-map":
        path.write_text(json.dumps({"weight_map": ["a", "b"]}))
    elif damage == "key-not-in-shard":
        index["weight_map"]["not.a.tensor"] = shards[0]
        path.write_text(json.dumps(index))
    elif damage == "key-in-two-shards":
        tw.save_weights(tiny_bert_classifier(seed=0), folder / "extra.safetensors")  # holds every tensor again
        index["weight_map"]["bert.pooler.dense.bias"] = "extra.safetensors"
        path.write_text(json.dumps(index))
    else:
        index["weight_map"]["bert.pooler.dense.bias"] = "config.json"
        path.write_text(json.dumps(index))
    with pytest.raises(TrainwiseError) as info:
        tw.load_weights(tiny_bert_classifier(seed=1), folder)
    text = str(info.value)
    assert "\n" not in text and text.endswith(".") and expected in text, text


def test_folders_without_weights_are_one_sentence(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrainwiseError, match="folder without model weights"):
        tw.load_weights(tiny_bert_classifier(), tmp_path / "empty")
    (tmp_path / "other").mkdir()
    tw.save_weights(tiny_bert_classifier(), tmp_path / "other" / "weights.pt")
    with pytest.raises(TrainwiseError, match=r"pass one of its files instead, e\.g\. .*weights\.pt"):
        tw.load_weights(tiny_bert_classifier(), tmp_path / "other")
