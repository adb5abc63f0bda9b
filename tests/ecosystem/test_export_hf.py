"""Export of real Hugging Face models: a BERT classifier returns a ``ModelOutput`` and builds its attention mask
with tensor ``&`` (``torch.ops.aten.__and__.Tensor`` in the graph). ``outputs="logits"`` exports the logits; the
artifacts load in a fresh process where transformers is never imported, and match the eager model at batch sizes
1, 4 and 7 (the export was captured at 2), with masks that pad otherwise than the example's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings
import zipfile

import numpy as np
import pytest
import torch
from hf_models import VOCAB, tiny_bert_classifier, tiny_bert_config

import trainwise
from trainwise.cli import main
from trainwise.errors import TrainwiseError
from trainwise.exporting import load_exported

transformers = pytest.importorskip("transformers")

LENGTH = 12
try:
    import onnx  # noqa: F401
    import onnxruntime  # noqa: F401
    import onnxscript  # noqa: F401

    HAVE_ONNX = True
except ImportError:
    HAVE_ONNX = False
FORMATS = {"torch.export": "pt2", "torchscript": "torchscript", **({"onnx": "onnx"} if HAVE_ONNX else {})}


def _tokens(lengths: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` and an ``attention_mask`` with ``lengths[i]`` real tokens in row ``i`` (the rest padding)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (len(lengths), LENGTH), generator=g)
    mask = (torch.arange(LENGTH) < torch.tensor(lengths)[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask


# batch sizes none of the exports saw (the example is 2, its checks 1 and 3): unpadded, ragged and short rows
CHECKS = [_tokens([5], seed=1), _tokens([12, 3, 8, 12], seed=2), _tokens([1, 12, 7, 2, 12, 9, 4], seed=3)]


@pytest.fixture(scope="module")
def bert_exports(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf-export")
    model = tiny_bert_classifier(seed=0)
    model.train()  # as after fine-tuning: export must still give the eval-mode logits
    example = _tokens([12, 7], seed=0)
    reports = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript says it traced (asserted below); transformers' own warnings
        for format, suffix in FORMATS.items():
            reports[format] = trainwise.export(model, example, folder / f"bert.{suffix}", format, outputs="logits")
    assert model.training
    model.eval()
    with torch.no_grad():
        expected = [model(input_ids=ids, attention_mask=mask).logits for ids, mask in CHECKS]
    return {"folder": folder, "reports": reports, "expected": expected, "model": model}


@pytest.mark.slow
def test_bert_classifier_exports_with_a_dynamic_batch_and_the_mask_operators(bert_exports):
    for format, report in bert_exports["reports"].items():
        assert report.verified and report.dynamic_batch and report.batch_sizes == (2, 1, 3), format
        assert [(s["name"], s["shape"], s["dtype"]) for s in report.inputs] == [
            ("input_ids", ["batch", "sequence"], "int64"),
            ("attention_mask", ["batch", "sequence"], "int64"),
        ]
        assert report.lengths == {"sequence": (LENGTH, LENGTH + 3, LENGTH // 2)}, format
        assert [(s["name"], s["shape"]) for s in report.outputs] == [("logits", ["batch", 3])]
    assert bert_exports["reports"]["torchscript"].method == "trace"  # no HF model scripts; tracing is what works
    with zipfile.ZipFile(bert_exports["reports"]["torch.export"].path) as archive:
        program = next(archive.read(name) for name in archive.namelist() if name.endswith("models/model.json"))
    assert b"torch.ops.aten.__and__.Tensor" in program  # the operator the .pt2 check refused before


@pytest.mark.slow
def test_bert_artifacts_run_in_a_fresh_process_without_transformers(bert_exports, tmp_path):
    inputs = tmp_path / "inputs.pt"
    torch.save([list(pair) for pair in CHECKS], inputs)
    results = tmp_path / "results.pt"
    script = textwrap.dedent(
        """
        import importlib.abc, json, sys

        class NoTransformers(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "transformers":
                    raise ImportError("the artifact must run without transformers")

        sys.meta_path.insert(0, NoTransformers())
        import torch, trainwise

        checks = torch.load(sys.argv[1], weights_only=True)
        outputs = {  # the TorchScript one is this test's own program: trusted
            path: [trainwise.load_exported(path, trust_code=path.endswith(".torchscript"))(ids, mask)
                   for ids, mask in checks]
            for path in sys.argv[3:]
        }
        torch.save(outputs, sys.argv[2])
        print(json.dumps({"transformers": sorted(m for m in sys.modules if m.split(".")[0] == "transformers")}))
        """
    )
    paths = [str(report.path) for report in bert_exports["reports"].values()]
    proc = subprocess.run(
        [sys.executable, "-c", script, str(inputs), str(results), *paths],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"transformers": []}
    loaded = torch.load(results, weights_only=True)
    for path in paths:
        for (ids, _), got, want in zip(CHECKS, loaded[path], bert_exports["expected"]):
            assert got.shape == (len(ids), 3), path
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=f"{path} at batch size {len(ids)}")


@pytest.mark.slow
def test_a_bert_wrapped_by_hand_loads_back(tmp_path):
    """The issue's case: a wrapper returning ``.logits`` exported, then its own .pt2 refused for aten.__and__."""

    class Logits(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

    model = Logits(tiny_bert_classifier())
    report = trainwise.export(model, _tokens([12, 7], seed=0), tmp_path / "bert.pt2")
    ids, mask = CHECKS[1]
    with torch.no_grad():
        torch.testing.assert_close(load_exported(report.path)(ids, mask), model(ids, mask), atol=1e-5, rtol=1e-5)


def test_a_model_output_without_outputs_names_the_field_to_export(tmp_path):
    model = tiny_bert_classifier()
    with pytest.raises(TrainwiseError) as info:
        trainwise.export(model, _tokens([12, 7], seed=0), tmp_path / "bert.pt2")
    message = str(info.value)
    assert "the model returns a SequenceClassifierOutput with the tensor fields logits" in message
    assert "pass outputs='logits' to export that field" in message and "\n" not in message
    assert list(tmp_path.iterdir()) == []


def test_the_refusal_reads_an_image_classifier_output(tmp_path):
    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=32, num_labels=3)  # fmt: skip
    model = transformers.ViTForImageClassification(config)
    with pytest.raises(TrainwiseError, match="the model returns an ImageClassifierOutput with the tensor fields"):
        trainwise.export(model, torch.randn(2, 1, 8, 8), tmp_path / "vit.pt2")


@pytest.mark.parametrize(
    ("outputs", "hidden_states", "match"),
    [
        ("logit", False, r"the model's SequenceClassifierOutput has no field 'logit'; pass outputs= one of 'logits'\."),
        ("hidden_states", False, r"has no field 'hidden_states'; pass outputs= one of 'logits'"),
        ("hidden_states", True, r"has a tuple, not a tensor, as 'hidden_states'; pass outputs= one of 'logits'"),
    ],
    ids=["misspelt", "absent", "a-tuple"],
)
def test_outputs_that_name_no_tensor_field_are_one_sentence(tmp_path, outputs, hidden_states, match):
    model = tiny_bert_classifier()
    model.config.output_hidden_states = hidden_states
    with pytest.raises(TrainwiseError, match=match) as info:
        trainwise.export(model, _tokens([12, 7], seed=0), tmp_path / "bert.pt2", outputs=outputs)
    assert "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_several_outputs_of_a_base_model_export_as_a_tuple(tmp_path):
    torch.manual_seed(0)
    model = transformers.BertModel(tiny_bert_config())
    report = trainwise.export(model, _tokens([12, 7], seed=0), tmp_path / "encoder.pt2",
                              outputs=("last_hidden_state", "pooler_output"))  # fmt: skip
    assert [(s["name"], s["shape"]) for s in report.outputs] == [
        ("last_hidden_state", ["batch", "sequence", 16]),
        ("pooler_output", ["batch", 16]),
    ]
    ids, mask = CHECKS[2]
    hidden, pooled = load_exported(report.path)(ids, mask)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask)
    torch.testing.assert_close(hidden, want.last_hidden_state, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pooled, want.pooler_output, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("format", [f for f in FORMATS if f != "torchscript"])
def test_a_text_model_exports_with_its_sequence_length_free(bert_exports, format):
    """Token inputs keep their length free by default (up to the model's max_position_embeddings, 32 here): the
    artifact runs at lengths the example (12) never had, as the eager model does."""
    artifact = load_exported(bert_exports["reports"][format].path)
    model = bert_exports["model"]
    for length in (28, 5, 32):
        g = torch.Generator().manual_seed(length)
        ids = torch.randint(1, VOCAB, (3, length), generator=g)
        mask = torch.ones_like(ids)
        mask[0, length // 2:] = 0
        with torch.no_grad():
            want = model(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(artifact(ids, mask), want, atol=1e-5, rtol=1e-5)


def test_the_sequence_length_can_be_fixed_or_another_dimension_freed(tmp_path):
    model = tiny_bert_classifier(seed=0).eval()
    example = _tokens([12, 7], seed=0)
    fixed = trainwise.export(model, example, tmp_path / "fixed.pt2", outputs="logits",
                             dims={"input_ids": {1: None}, "attention_mask": {1: None}})
    assert [s["shape"] for s in fixed.inputs] == [["batch", LENGTH], ["batch", LENGTH]] and fixed.lengths == {}
    with pytest.raises(TrainwiseError, match=r"must have shape \(batch, 12\)"):
        load_exported(fixed.path)(torch.ones(1, 20, dtype=torch.long), torch.ones(1, 20, dtype=torch.long))
    with pytest.raises(TrainwiseError, match=r"dims names the input 'ids'; the inputs are input_ids, attention_mask"):
        trainwise.export(model, example, tmp_path / "bad.pt2", outputs="logits", dims={"ids": {1: None}})
    with pytest.raises(TrainwiseError, match=r"dimension 0 is dynamic_batch's"):
        trainwise.export(model, example, tmp_path / "bad.pt2", outputs="logits", dims={"input_ids": {0: None}})


def _bert_factory_module(tmp_path, monkeypatch) -> None:
    """``hf_factory:make_bert`` importable from the current folder, as a CLI user's own module would be."""
    (tmp_path / "hf_factory.py").write_text(
        "import transformers\n\n"
        "def make_bert():\n"
        "    config = transformers.BertConfig(vocab_size=61, hidden_size=16, num_hidden_layers=2,\n"
        "                                     num_attention_heads=2, intermediate_size=32,\n"
        "                                     max_position_embeddings=32, num_labels=3)\n"
        "    return transformers.BertForSequenceClassification(config)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.slow
def test_the_cli_exports_a_bert_classifier_with_outputs(tmp_path, monkeypatch, capsys):
    _bert_factory_module(tmp_path, monkeypatch)
    argv = ["export", "--model", "hf_factory:make_bert", "--example-shape", "2,12", "--example-dtype", "int64"]
    assert main([*argv, "-o", "bert.pt2"]) == 2
    err = capsys.readouterr().err
    assert "returns a SequenceClassifierOutput" in err and "pass --outputs logits to export that field" in err
    assert main([*argv, "-o", "bert.pt2", "--outputs", "logits", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["verified"] and [s["name"] for s in report["outputs"]] == ["logits"]
    np.save(tmp_path / "ids.npy", np.arange(1, 25, dtype=np.int64).reshape(2, 12))
    assert main(["predict", "bert.pt2", "ids.npy"]) == 0
    assert "logits: shape [2, 3] float32" in capsys.readouterr().out


@pytest.mark.skipif(not HAVE_ONNX, reason="needs onnx, onnxscript and onnxruntime")
def test_a_successful_onnx_export_says_nothing_but_its_report(tmp_path, caplog):
    model = tiny_bert_classifier(seed=0).eval()
    with warnings.catch_warnings(record=True) as caught, caplog.at_level("WARNING"):
        warnings.simplefilter("always")
        report = trainwise.export(model, _tokens([12, 7], seed=0), tmp_path / "bert.onnx", "onnx", outputs="logits")
    assert report.verified
    assert [r.getMessage() for r in caplog.records if r.levelname in ("WARNING", "ERROR")] == []
    assert [str(w.message) for w in caught if "onnx" in (w.filename or "")] == []


def test_the_cli_fixes_a_dimension_with_dims(tmp_path, monkeypatch, capsys):
    _bert_factory_module(tmp_path, monkeypatch)
    common = ["export", "--model", "hf_factory:make_bert", "--example-shape", "2,9", "--example-dtype", "int64",
              "--outputs", "logits", "--json"]
    assert main([*common, "--output", "free.pt2"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"][0]["shape"] == ["batch", "sequence"]
    assert main([*common, "--output", "fixed.pt2", "--dims", '{"input_ids": {"1": null}}']) == 0
    assert json.loads(capsys.readouterr().out)["inputs"][0]["shape"] == ["batch", 9]
    assert main([*common, "--output", "bad.pt2", "--dims", "[1"]) == 2
    assert "--dims must be a JSON object" in capsys.readouterr().err
