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


def test_type_checking_imports_match_the_lazy_exports():
    import ast
    from pathlib import Path

    import trainwise

    tree = ast.parse(Path(trainwise.__file__).read_text())
    guarded = {
        alias.name: node.module
        for block in tree.body
        if isinstance(block, ast.If) and getattr(block.test, "id", "") == "TYPE_CHECKING"
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert guarded == trainwise._EXPORTS
