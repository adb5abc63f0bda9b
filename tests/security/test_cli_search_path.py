"""`python -m trainwise.cli` never runs a user's file that happens to be named like a module we import."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_a_numpy_py_in_the_current_folder_is_not_imported(tmp_path):
    marker = tmp_path / "MARK"
    (tmp_path / "numpy.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    result = subprocess.run(
        [sys.executable, "-m", "trainwise.cli", "ckpt", "inspect", str(tmp_path / "missing.pt")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert not marker.exists()
    assert result.returncode == 2 and "does not exist" in result.stderr
    assert "Traceback" not in result.stderr
