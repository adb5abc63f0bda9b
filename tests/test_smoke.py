import subprocess
import sys


def test_import_is_light():
    code = "import sys, trainwise; bad = [m for m in ('rich', 'matplotlib', 'onnx', 'libcst', 'tensorboard') if m in sys.modules]; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
