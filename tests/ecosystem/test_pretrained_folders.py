"""A ``save_pretrained`` folder, whole or sharded, is a checkpoint like any other: ``ckpt inspect`` summarises it
(its shards, tensors, dtypes and total size) and ``export`` takes its weights."""

from __future__ import annotations

import json

import pytest
import torch
from hf_models import tiny_bert_classifier

from trainwise.cli import main

pytest.importorskip("transformers")
pytest.importorskip("safetensors")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("pretrained")
    model = tiny_bert_classifier(seed=0)
    model.save_pretrained(root / "whole")
    model.save_pretrained(root / "sharded", max_shard_size="20KB")
    return root, model


def _inspect(path, capsys) -> dict:
    assert main(["ckpt", "inspect", str(path), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("which", ["whole", "sharded", "index"])
def test_ckpt_inspect_summarises_a_save_pretrained_folder_and_a_shard_index(folders, capsys, which):
    root, model = folders
    path = root / "sharded" / "model.safetensors.index.json" if which == "index" else root / which
    info = _inspect(path, capsys)
    names = {t["name"] for t in info["tensors"]}
    assert names == set(model.state_dict())
    assert info["parameters"] == sum(t.numel() for t in model.state_dict().values())
    assert info["dtypes"] == {"float32": len(names)}
    files = info["files"]
    assert info["bytes"] == sum(f["bytes"] for f in files)
    if which == "whole":
        assert [f["name"] for f in files] == ["model.safetensors"] and "save_pretrained folder" in info["format"]
    else:
        assert len(files) >= 2 and all(f["name"].endswith(".safetensors") for f in files)


def test_export_takes_the_weights_of_a_sharded_save_pretrained_folder(folders, tmp_path, monkeypatch, capsys):
    root, model = folders
    (tmp_path / "factory.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(__import__('hf_models').__file__.rsplit('/', 1)[0])!r})\n"
        "from hf_models import tiny_bert_classifier\n"
        "def build():\n"
        "    return tiny_bert_classifier(seed=7)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "bert.pt2"
    code = main(["export", str(root / "sharded"), "--model", "factory:build", "--example-shape", "2,9",
                 "--example-dtype", "int64", "--outputs", "logits", "--output", str(out), "--json"])
    assert code == 0, capsys.readouterr().err
    from trainwise.exporting import load_exported

    exported = load_exported(out)
    ids = torch.randint(1, 50, (3, 9))
    with torch.no_grad():
        expected = model.eval()(input_ids=ids).logits
    assert torch.allclose(exported(ids), expected, atol=1e-5)  # the folder's weights, not the factory's seed 7
