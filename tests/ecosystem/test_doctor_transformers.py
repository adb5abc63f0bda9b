"""The doctor on the installed transformers' own sources (issue 26, item 7).

Feature lists built inside one ``forward()`` (an FPN top-down path: a list filled in one loop and read in the
next, or extended after the backbone returns it) were reported as TW102, "kept across iterations": 11 false
findings in these model files, and one more in ``integrations/integration_utils.py``, where
``clearml.OutputModel(...)`` constructs an object that was taken for a model's output. The real bug in
``unispeech_sat`` (``self.layer_norm_for_extract.requires_grad = False`` sets an attribute on a module and
freezes nothing: TW110) must stay. Two non-strict loads whose function compares the keys itself first and
raises were reported as TW302 (issue 29). The files are read from the installed package, not imported.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from trainwise.doctor.engine import check_file

# the files that gave the false TW102 findings with transformers 5.25 (lines as of that version)
FALSE_TW102 = [
    "integrations/integration_utils.py",  # 2068: self._checkpoints_saved.append(output_model)
    "models/deformable_detr/modeling_deformable_detr.py",  # 1387, 1405: position_embeddings_list.append(pos)
    "models/grounding_dino/modeling_grounding_dino.py",  # 2131: the list the backbone returned, extended
    "models/mm_grounding_dino/modeling_mm_grounding_dino.py",  # 2028: the same
    "models/oneformer/modeling_oneformer.py",  # 1378: position_embeddings_list.append(...)
    "models/pp_ocrv5_server_det/modeling_pp_ocrv5_server_det.py",  # 187, 200: channel_adjusted, projected
    "models/pp_ocrv5_server_det/modular_pp_ocrv5_server_det.py",  # 639, 652
    "models/pp_ocrv6_medium_det/modeling_pp_ocrv6_medium_det.py",  # 278, 291
]
# load_state_dict(strict=False) after the function compared the keys and raised on a mismatch: wav2vec2's
# load_adapter (a set difference of the loaded and the adapter's keys) and load_sharded_checkpoint (the model's
# state_dict() keys against the index's)
KEYS_COMPARED = ["models/wav2vec2/modeling_wav2vec2.py", "trainer_utils.py"]
UNISPEECH_SAT = ["models/unispeech_sat/modeling_unispeech_sat.py", "models/unispeech_sat/modular_unispeech_sat.py"]


@pytest.fixture(scope="module")
def transformers_root() -> Path:
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("transformers is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def _findings(root: Path, relative: str) -> list:
    path = root / relative
    if not path.is_file():
        pytest.skip(f"{relative} is not in this transformers version")
    result = check_file(str(path))
    assert not [f for f in result.findings if f.code == "TW900"], result.findings
    return result.findings


@pytest.mark.parametrize("relative", FALSE_TW102)
def test_no_tw102_on_lists_that_live_within_one_forward(transformers_root, relative):
    findings = _findings(transformers_root, relative)
    assert [f for f in findings if f.code == "TW102"] == []


@pytest.mark.parametrize("relative", UNISPEECH_SAT)
def test_the_real_tw110_in_unispeech_sat_stays(transformers_root, relative):
    findings = _findings(transformers_root, relative)
    (finding,) = [f for f in findings if f.code == "TW110"]
    assert "`self.layer_norm_for_extract` is a module" in finding.message
    line = (transformers_root / relative).read_text(encoding="utf-8").splitlines()[finding.line - 1]
    assert line.strip() == "self.layer_norm_for_extract.requires_grad = False"


@pytest.mark.parametrize("relative", KEYS_COMPARED)
def test_no_tw302_where_the_keys_are_compared_before_the_load(transformers_root, relative):
    findings = _findings(transformers_root, relative)
    assert "load_state_dict(state_dict, strict=False)" in (transformers_root / relative).read_text(encoding="utf-8")
    assert [f for f in findings if f.code == "TW302"] == []
