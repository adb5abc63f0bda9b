"""The framework integrations' imports: ``trainwise`` and ``trainwise.integrations`` import no framework, and
each integration without its framework is one sentence naming the ``pip install``."""

from __future__ import annotations

import json
import subprocess
import sys

FRAMEWORKS = ("lightning", "pytorch_lightning", "transformers", "accelerate", "datasets")


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_importing_the_package_imports_no_framework():
    code = ("import sys, trainwise, trainwise.integrations; "
            f"print([m for m in {FRAMEWORKS!r} if m in sys.modules])")
    assert _run(code).strip() == "[]"


def test_an_integration_without_its_framework_names_the_pip_install():
    code = f"""
import importlib, json, sys
for name in {FRAMEWORKS!r}:
    sys.modules[name] = None  # what an environment without it gives: import fails
messages = {{}}
for module in ("lightning", "transformers", "accelerate"):
    try:
        importlib.import_module("trainwise.integrations." + module)
    except ImportError as error:
        messages[module] = [str(error), error.__cause__ is None and error.__suppress_context__]
print(json.dumps(messages))
"""
    assert json.loads(_run(code)) == {
        "lightning": ["trainwise.integrations.lightning needs Lightning: pip install lightning", True],
        "transformers": ["trainwise.integrations.transformers needs Hugging Face Transformers: pip install "
                         "transformers", True],
        "accelerate": ["trainwise.integrations.accelerate needs Hugging Face Accelerate: pip install accelerate",
                       True],
    }
