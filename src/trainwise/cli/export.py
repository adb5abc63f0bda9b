"""``trainwise export`` and ``trainwise predict``: deployable artifacts from a checkpoint, and running them.

    trainwise export --demo                                                 # the demo CNN -> digits-cnn.pt2
    trainwise export runs/x/best-weights.pt --demo --format onnx
    trainwise export ckpt.pt --model mypkg.models:make_net --example-shape 1,3,32,32 --format torchscript
    trainwise predict digits-cnn.pt2 batch.npy                              # prints outputs (and argmax)
    trainwise predict digits-cnn.pt2 batch.npy --output logits.npy

See docs/export.md. Every user mistake is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from trainwise.errors import TrainwiseError

FORMATS = ("torch.export", "torchscript", "onnx")
DEMO_FACTORY = "trainwise.demo:make_model"
DEMO_SHAPE = "1,1,8,8"
DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "uint8", "bool")


def register(sub: Any) -> None:
    exporter = sub.add_parser(
        "export",
        help="export a model to torch.export, TorchScript or ONNX, verified against eager",
        description=(
            "Export a model for deployment: the model from --model (or --demo) with the weights of CHECKPOINT, in "
            "eval mode, with a dynamic batch dimension. The artifact is loaded back and compared with the eager "
            "model at three batch sizes; a JSON sidecar ARTIFACT.json records shapes, versions and parity."
        ),
    )
    exporter.add_argument("checkpoint", nargs="?", metavar="CHECKPOINT", help="weights file (optional with --demo)")
    exporter.add_argument("--model", metavar="MODULE:FACTORY", help="package.module:function that builds the model")
    exporter.add_argument("--model-kwargs", metavar="JSON", default="{}", help="factory arguments as JSON")
    exporter.add_argument("--demo", action="store_true", help=f"the demo's CNN ({DEMO_FACTORY}, shape {DEMO_SHAPE})")
    exporter.add_argument("--example-shape", metavar="N,C,...", help="shape of the example input, batch first")
    exporter.add_argument("--example-dtype", default="float32", choices=DTYPES, help="dtype of the example input")
    exporter.add_argument("--format", default="torch.export", choices=FORMATS, help="default torch.export")
    exporter.add_argument("--output", "-o", metavar="PATH", help="artifact path (default from the checkpoint's name)")
    exporter.add_argument("--static-batch", action="store_true", help="fix the batch size to the example's")
    exporter.add_argument("--atol", type=float, default=None, help="absolute tolerance of the parity check")
    exporter.add_argument("--rtol", type=float, default=None, help="relative tolerance of the parity check")
    exporter.add_argument("--json", action="store_true", help="print the export report as one JSON line")
    exporter.set_defaults(run=run_export)

    predictor = sub.add_parser(
        "predict",
        help="run an exported model on a .npy (or .npz) file",
        description=(
            "Run an artifact written by trainwise export on INPUT.npy (one input; .npz for several, in order) and "
            "print the outputs, with the argmax of each row for 2-D outputs, or save them with --output."
        ),
    )
    predictor.add_argument("artifact", metavar="ARTIFACT", help=".pt2, .torchscript or .onnx file")
    predictor.add_argument("input", metavar="INPUT.npy", help="the input array, batch first")
    predictor.add_argument("--output", "-o", metavar="OUT.npy", help="save the outputs (.npy, or .npz for several)")
    predictor.add_argument("--format", default=None, choices=FORMATS, help="only when there is no sidecar")
    predictor.add_argument("--json", action="store_true", help="print the outputs as one JSON line")
    predictor.set_defaults(run=run_predict)


# -- export ------------------------------------------------------------------------------------------------


def run_export(args: argparse.Namespace) -> int:
    from trainwise.exporting import SUFFIXES, export

    if args.demo and args.model:
        raise TrainwiseError("pass either --model or --demo, not both.")
    if not args.demo and not args.model:
        raise TrainwiseError("name the model with --model package.module:factory (or --demo for the demo's CNN).")
    spec = DEMO_FACTORY if args.demo else args.model
    shape_text = args.example_shape or (DEMO_SHAPE if args.demo else None)
    if shape_text is None:
        raise TrainwiseError("pass --example-shape, the input's shape with the batch first, e.g. 1,3,32,32.")
    shape = parse_shape(shape_text)
    kwargs = _model_kwargs(args.model_kwargs)
    checkpoint = Path(args.checkpoint) if args.checkpoint else None
    if checkpoint is not None and not checkpoint.is_file():
        raise TrainwiseError(f"checkpoint {checkpoint} does not exist; check the path.")

    model = _build_model(spec, kwargs)
    if checkpoint is not None:
        _load_checkpoint(model, checkpoint)
    elif not args.json:
        print(
            f"trainwise export: no CHECKPOINT given, so {spec} is exported with freshly initialised weights (seed 0).",
            file=sys.stderr,
        )
    example = example_input(shape, args.example_dtype)
    if args.output:
        output = Path(args.output)
    elif checkpoint is not None:
        output = checkpoint.with_suffix(SUFFIXES[args.format])
    else:
        output = Path(("digits-cnn" if args.demo else "model") + SUFFIXES[args.format])
    report = export(
        model,
        example,
        output,
        args.format,
        dynamic_batch=not args.static_batch,
        atol=args.atol,
        rtol=args.rtol,
    )
    if args.json:
        print(json.dumps(report.to_dict(), default=str))
    else:
        print(f"trainwise export: {report}; sidecar {report.sidecar}")
    return 0


def parse_shape(text: str) -> tuple[int, ...]:
    """``"1,1,8,8"`` -> ``(1, 1, 8, 8)``; every size a positive integer."""
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError:
        shape = ()
    if not shape or any(size < 1 for size in shape):
        raise TrainwiseError(
            f"--example-shape {text!r} is not a shape; write positive sizes separated by commas, batch first, "
            "e.g. 1,3,32,32."
        )
    return shape


def example_input(shape: tuple[int, ...], dtype_name: str) -> Any:
    """A seeded example: standard normal for floating dtypes, zeros (valid class or token ids) otherwise."""
    import torch

    dtype = getattr(torch, dtype_name)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    return torch.zeros(shape, dtype=dtype)


def _model_kwargs(text: str) -> dict[str, Any]:
    try:
        kwargs = json.loads(text)
    except ValueError as exc:
        raise TrainwiseError(f"--model-kwargs is not JSON ({exc}); write e.g. '{{\"width\": 16}}'.") from None
    if not isinstance(kwargs, dict):
        raise TrainwiseError(f"--model-kwargs must be a JSON object such as '{{\"width\": 16}}', got {text!r}.")
    return kwargs


def _build_model(spec: str, kwargs: dict[str, Any]) -> Any:
    import torch

    from trainwise.cli.fit import import_factory

    cwd = str(Path.cwd())
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)  # a factory in the current folder, as with trainwise fit
    try:
        try:
            factory = import_factory(spec, table="model")
        except TrainwiseError as exc:
            message = str(exc).replace("[model] factory", "--model").replace("the config file's folder and ", "")
            raise TrainwiseError(message) from None
        torch.manual_seed(0)  # fresh weights repeat when no checkpoint is given
        try:
            model = factory(**kwargs)
        except TypeError as exc:
            raise TrainwiseError(f"--model {spec} cannot be called with --model-kwargs {kwargs}: {exc}.") from None
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(cwd)
    if not isinstance(model, torch.nn.Module):
        raise TrainwiseError(f"--model {spec} returned a {type(model).__name__}; it must return a torch.nn.Module.")
    return model


def _load_checkpoint(model: Any, path: Path) -> None:
    """Any common checkpoint layout, wrapper prefixes handled, read with weights_only=True (fundamental 8)."""
    from trainwise.checkpoint import load_weights

    load_weights(model, path, strict=True)


# -- predict -----------------------------------------------------------------------------------------------


def run_predict(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from trainwise.exporting import load_exported

    artifact = load_exported(args.artifact, format=args.format)
    source = Path(args.input)
    arrays = _read_inputs(source, artifact.input_names)
    specs = artifact.metadata.get("inputs") or []
    for position, spec in enumerate(specs[: len(arrays)]):
        wanted = _numpy_dtype(spec["dtype"])
        if wanted is not None and wanted.kind == "f" and arrays[position].dtype.kind == "f":
            arrays[position] = arrays[position].astype(wanted)  # np.save of random data gives float64
    tensors = [torch.from_numpy(np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("="))) for a in arrays]
    try:
        outputs = artifact.run_tuple(*tensors)
    except TrainwiseError:
        raise
    except Exception as exc:  # the runtime's own error, e.g. a shape the model cannot take (no sidecar to check)
        reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        reason = reason.split(". ")[0][:300]  # the first sentence: runtimes append advice and dumps
        raise TrainwiseError(
            f"{Path(args.artifact).name} fails on {source.name} with {type(exc).__name__}: {reason}; check the "
            "array's shape and dtype against the model's inputs."
        ) from None
    results = [
        out.detach().cpu().float().numpy() if out.dtype == torch.bfloat16 else out.detach().cpu().numpy()
        for out in outputs
    ]
    names = [spec["name"] for spec in artifact.metadata.get("outputs", [])]
    if len(names) != len(results):
        names = ["output"] if len(results) == 1 else [f"output_{i}" for i in range(len(results))]
    if args.output:
        saved = _save_outputs(Path(args.output), names, results)
    if args.json:
        summary: dict[str, Any] = {"outputs": {n: r.tolist() for n, r in zip(names, results)}}
        summary["argmax"] = {n: r.argmax(axis=1).tolist() for n, r in zip(names, results) if r.ndim == 2}
        if args.output:
            summary["saved"] = str(saved)
        print(json.dumps(summary))
        return 0
    for name, result in zip(names, results):
        print(f"{name}: shape {list(result.shape)} {result.dtype}")
        if not args.output:
            print(np.array2string(result, precision=4, suppress_small=True, threshold=200))
        if result.ndim == 2 and result.shape[1] > 1:
            print(f"{name} argmax: {np.array2string(result.argmax(axis=1), threshold=200)}")
    if args.output:
        print(f"trainwise predict: saved {', '.join(names)} to {saved}")
    return 0


def _read_inputs(path: Path, names: list[str]) -> list[Any]:
    import numpy as np

    if not path.is_file():
        raise TrainwiseError(f"input file {path} does not exist; save the batch with numpy.save('{path}', x).")
    try:
        # allow_pickle=False: an object array is a pickle, and unpickling a file from elsewhere can run code
        loaded = np.load(path, allow_pickle=False)
        if isinstance(loaded, np.ndarray):
            arrays = {"": loaded}
        else:
            with loaded:
                keys = list(loaded.files)
                order = names if names and sorted(names) == sorted(keys) else keys
                arrays = {key: loaded[key] for key in order}
    except Exception as exc:  # numpy and zipfile raise many types for a damaged file; nothing in it has run
        reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise TrainwiseError(
            f"cannot read {path} as a .npy or .npz array ({type(exc).__name__}: {reason.split('. ')[0][:200]}); "
            "save it with numpy.save (numbers only, no object arrays)."
        ) from None
    if not arrays:
        raise TrainwiseError(f"{path} holds no arrays; save the batch with numpy.save or numpy.savez.")
    for key, array in arrays.items():
        if array.dtype.kind not in "biufc":
            label = f" {key!r}" if key else ""
            raise TrainwiseError(
                f"array{label} in {path} has dtype {array.dtype}, not numbers; save a numeric array (e.g. "
                "x.astype('float32'))."
            )
    return list(arrays.values())


def _numpy_dtype(name: str) -> Any:
    """NumPy's dtype of that name, or None for torch-only dtypes (bfloat16, float8...)."""
    import numpy as np

    try:
        return np.dtype(name)
    except TypeError:
        return None


def _save_outputs(path: Path, names: list[str], results: list[Any]) -> Path:
    """Write to a temporary file in the same folder, then rename: a good file is never replaced by a partial one."""
    import numpy as np

    suffix = path.suffix.lower()
    if suffix not in (".npy", ".npz"):
        raise TrainwiseError(f"--output {path} must end in .npy (one output) or .npz (any number of outputs).")
    if suffix == ".npy" and len(results) != 1:
        raise TrainwiseError(
            f"the model has {len(results)} outputs and a .npy file holds one; use --output {path.with_suffix('.npz')}."
        )
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise TrainwiseError(f"folder {folder} does not exist; create it first or choose another --output.")
    from trainwise.checkpoint.io import atomic_write

    def write(handle: Any) -> None:
        if suffix == ".npy":
            np.save(handle, results[0])
        else:
            np.savez(handle, **dict(zip(names, results)))

    return atomic_write(path, write)
