"""``trainwise export`` and ``trainwise predict``: deployable artifacts from a checkpoint, and running them.

    trainwise export --demo                                                 # the demo CNN -> digits-cnn.pt2
    trainwise export runs/x/best-weights.pt --demo --format onnx
    trainwise export ckpt.pt --model mypkg.models:make_net --example-shape 1,3,32,32 --format torchscript
    trainwise export --model mypkg.models:make_bert --example-shape 1,16 --example-dtype int64 --outputs logits
    trainwise predict digits-cnn.pt2 batch.npy                              # prints outputs (and argmax)
    trainwise predict digits-cnn.pt2 batch.npy --output logits.npy

See docs/export.md. Every user mistake is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from trainwise.errors import TrainwiseError, show, with_article
from trainwise.run_folder import CHECKPOINTS, FIT, exported_name

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
    exporter.add_argument("checkpoint", nargs="?", metavar="CHECKPOINT",
                          help="weights file, shard index or save_pretrained folder (optional with --demo)")
    exporter.add_argument("--model", metavar="MODULE:FACTORY", help="package.module:function that builds the model")
    exporter.add_argument("--model-kwargs", metavar="JSON", default="{}", help="factory arguments as JSON")
    exporter.add_argument("--demo", action="store_true", help=f"the demo's CNN ({DEMO_FACTORY}, shape {DEMO_SHAPE})")
    exporter.add_argument("--example-shape", metavar="N,C,...", help="shape of the example input, batch first")
    exporter.add_argument("--example-dtype", default="float32", choices=DTYPES, help="dtype of the example input")
    exporter.add_argument("--format", default="torch.export", choices=FORMATS, help="default torch.export")
    exporter.add_argument(
        "--output", "-o", metavar="PATH",
        help="artifact path (default: RUN/model.pt2 for RUN/checkpoints/*.pt, else the checkpoint's name)",
    )
    exporter.add_argument("--static-batch", action="store_true", help="fix the batch size to the example's")
    exporter.add_argument(
        "--dims", metavar="JSON",
        help='free or fix dimensions by input name, e.g. \'{"input_ids": {"1": null}}\' fixes the sequence length '
             "(integer inputs keep dimension 1 free as 'sequence' by default)",
    )
    exporter.add_argument(
        "--outputs", metavar="NAME[,NAME...]",
        help="export these fields of a model that returns a ModelOutput, dict or dataclass (e.g. logits)",
    )
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
    predictor.add_argument(
        "--trust-code", action="store_true",
        help="run a TorchScript file (a program) or an unchecked ONNX graph: only for files you trust like code",
    )
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
    refuse_an_example_too_large(shape_text, shape, args.example_dtype, free_batch=not args.static_batch)
    kwargs = _model_kwargs(args.model_kwargs)
    checkpoint = Path(args.checkpoint) if args.checkpoint else None
    if checkpoint is not None and not os.path.lexists(checkpoint):
        raise TrainwiseError(f"checkpoint {checkpoint} does not exist; check the path.")

    if args.output:
        output = Path(args.output)
    elif checkpoint is not None:
        output = default_output(checkpoint, args.format)
    else:
        output = Path(("digits-cnn" if args.demo else "model") + SUFFIXES[args.format])
    if checkpoint is not None and _same_file(output, checkpoint):
        raise TrainwiseError(
            f"--output {output} is the checkpoint being exported, which the artifact would replace; choose another "
            "path."
        )

    model = _build_model(spec, kwargs)
    if checkpoint is not None:
        _load_checkpoint(model, checkpoint, spec)
    example = example_input(shape, args.example_dtype)
    with _torch_output_held() as held:
        report = export(
            model,
            example,
            output,
            args.format,
            dynamic_batch=not args.static_batch,
            dims=_dims(args.dims),
            atol=args.atol,
            rtol=args.rtol,
            outputs=parse_outputs(args.outputs),
        )
    sys.stderr.write(held.getvalue())  # warnings of an export that worked; a failed one says it in one line
    if checkpoint is None and not args.json:
        print(
            f"trainwise export: no CHECKPOINT given, so {spec} was exported with freshly initialised weights (seed 0).",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(report.to_dict(), default=str))
    else:
        print(f"trainwise export: {report}; sidecar {report.sidecar}")
    return 0


def default_output(checkpoint: Path, format: str) -> Path:
    """Where ``export CHECKPOINT`` writes without ``--output``: ``runs/NAME/model.pt2`` for a checkpoint in a
    run's ``checkpoints/`` folder, else beside the checkpoint with the format's suffix (never the checkpoint)."""
    from trainwise.exporting import SUFFIXES

    suffix = SUFFIXES[format]
    if checkpoint.parent.name == CHECKPOINTS:
        return checkpoint.parent.parent / exported_name(suffix)
    output = checkpoint.with_suffix(suffix)
    if output.name == checkpoint.name:  # a checkpoint already named .pt2
        output = checkpoint.with_name(f"{checkpoint.stem}-exported{suffix}")
    return output


def _dims(text: str | None) -> dict[str, dict[int, str | None]] | None:
    """``--dims`` JSON as export()'s ``dims=``: dimension numbers given as JSON strings become ints."""
    if text is None:
        return None
    try:
        data = json.loads(text)
        return {name: {int(dim): symbol for dim, symbol in spec.items()} for name, spec in data.items()}
    except (ValueError, TypeError, AttributeError):
        raise TrainwiseError(
            f"--dims must be a JSON object of input names to {{dimension: name or null}}, e.g. "
            f"'{{\"input_ids\": {{\"1\": null}}}}', got {text[:80]!r}."
        ) from None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and a.samefile(b))
    except OSError:
        return False


@contextlib.contextmanager
def _torch_output_held() -> Any:
    """Hold what torch prints while exporting (a failed torch.export prints its partial graph, torch logs
    warnings) so that a failure is the one line of its TrainwiseError; the caller shows it after a success."""
    import io
    import logging

    held = io.StringIO()
    level = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stderr(held):
            yield held
    finally:
        logging.disable(level)


def parse_outputs(text: str | None) -> tuple[str, ...] | None:
    """``"logits"`` -> ``("logits",)``, ``"logits,pooler_output"`` -> both; None without ``--outputs``."""
    if text is None:
        return None
    names = tuple(name.strip() for name in text.split(","))
    if not all(names):
        raise TrainwiseError(
            f"--outputs {text!r} has an empty name; write field names separated by commas, e.g. logits,pooler_output."
        )
    return names


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


def refuse_an_example_too_large(text: str, shape: tuple[int, ...], dtype_name: str, *, free_batch: bool) -> None:
    """An example tensor larger than the memory available here is one sentence with its size, before anything
    is allocated (torch's allocator would fail with a traceback, or the system kill the process)."""
    import math

    import torch

    itemsize = torch.empty((), dtype=getattr(torch, dtype_name)).element_size()
    size = math.prod(shape) * itemsize
    available = available_memory()
    if available is None or size <= available:
        return
    if shape[0] > 1 and size // shape[0] <= available:
        fix = f"pass the shape of one small batch, such as {','.join(map(str, (1, *shape[1:])))}"
        fix += " (the batch dimension stays free in the artifact)" if free_batch else ""
    else:
        fix = "pass a smaller --example-shape"
    raise TrainwiseError(f"--example-shape {text} makes {with_article(dtype_name)} example of {_bytes_text(size)}, "
                         f"more than the {_bytes_text(available)} of memory available here; {fix}.")


# a container's memory limit and what it uses: cgroup v2, then v1 (where "no limit" is a huge number)
_CGROUP_MEMORY = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                  ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def available_memory() -> int | None:
    """Bytes this process can still allocate: the system's available memory (Linux ``MemAvailable``, else the
    physical memory), less under a container's memory limit; None where neither can be read."""
    found = []
    try:
        with open("/proc/meminfo", encoding="ascii") as file:
            found += [int(line.split()[1]) * 1024 for line in file if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        with contextlib.suppress(AttributeError, ValueError, OSError):
            found.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    for limit, usage in _CGROUP_MEMORY:
        with contextlib.suppress(OSError, ValueError):  # "max" (no limit) is not a number
            found.append(int(Path(limit).read_text()) - int(Path(usage).read_text()))
            break
    return max(0, min(found)) if found else None


def _bytes_text(size: int) -> str:
    """``4_000_000_000_000_000`` -> ``"3.6 PiB"``."""
    value, unit = float(size), "bytes"
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if value < 1024 or unit == "EiB":
            break
        value /= 1024
    return f"{size} bytes" if unit == "bytes" else f"{value:.1f} {unit}"


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
        raise TrainwiseError(
            f"--model {spec} returned {with_article(type(model).__name__)}; it must return a torch.nn.Module.")
    return model


def _load_checkpoint(model: Any, path: Path, spec: str) -> None:
    """Any common checkpoint layout, wrapper prefixes handled, read with weights_only=True (fundamental 8)."""
    from trainwise.checkpoint import load_weights
    from trainwise.checkpoint.weights import WeightsMismatchError

    try:
        load_weights(model, path, strict=True)
    except WeightsMismatchError as exc:  # its table is many lines: one sentence with the first difference
        report = exc.report
        if report.mismatched:
            key, saved, built = report.mismatched[0]
            example = f"{show(key, 80)} is {tuple(saved)} in the checkpoint but {tuple(built)} in the model"
        elif report.missing:
            example = f"the model's {show(report.missing[0], 80)} is not in the checkpoint"
        else:
            example = f"the checkpoint's {show(report.unexpected[0], 80)} has no place in the model"
        raise TrainwiseError(
            f"the weights in {path} do not fit the model of {spec}: {report.summary()} (e.g. {example}); pass the "
            "--model and --model-kwargs that built them (trainwise ckpt inspect shows the checkpoint's tensors)."
        ) from None


# -- predict -----------------------------------------------------------------------------------------------


def run_predict(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from trainwise.exporting import NotAnArtifactError, load_exported

    source = Path(args.input)
    try:
        artifact = load_exported(args.artifact, format=args.format, trust_code=args.trust_code)
    except NotAnArtifactError as exc:
        raise TrainwiseError(_export_first(exc, source, args.format)) from None
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


def _export_first(exc: Any, source: Path, format: str | None) -> str:
    """One sentence for a checkpoint given to predict: what it is, and the export command that makes an artifact
    of it (the model from the run's fit.json or the demo's, the example shape from the input file)."""
    import shlex

    from trainwise.errors import printable

    checkpoint: Path = exc.path
    spec, kwargs = _model_of(checkpoint, exc.shapes)
    command = ["trainwise", "export", str(checkpoint)]
    if spec == DEMO_FACTORY and not kwargs:
        command.append("--demo")
    else:
        command += ["--model", spec or "package.module:factory"]
        if kwargs:
            command += ["--model-kwargs", json.dumps(kwargs, separators=(",", ":"))]
    shape = _input_shape(source)
    if shape and not (spec == DEMO_FACTORY and shape[1:] == (1, 8, 8)):
        command += ["--example-shape", ",".join(map(str, (1, *shape[1:])))]
    elif spec != DEMO_FACTORY:
        command += ["--example-shape", "N,..."]
    output = default_output(checkpoint, format or "torch.export")
    if format and format != "torch.export":
        command += ["--format", format]
    predict = ["trainwise", "predict", str(output), str(source)]
    guess = "" if spec else " (with the factory that builds your model)"
    return printable(
        f"{checkpoint} is {with_article(exc.kind)}, not an exported model; make an artifact from it with "
        f"`{shlex.join(command)}`{guess}, then run `{shlex.join(predict)}`.",
        2000,
    )


def _model_of(checkpoint: Path, shapes: dict[str, tuple[int, ...]]) -> tuple[str | None, dict[str, Any]]:
    """The model factory that built the checkpoint's weights: the ``[model]`` of ``trainwise fit``'s record in
    the run folder, or the demo's CNN when the weights have its names and shapes; ``(None, {})`` otherwise."""
    import re

    for folder in (checkpoint.parent.parent, checkpoint.parent) if checkpoint.parent.name == CHECKPOINTS else ():
        record = folder / FIT
        try:
            if not record.is_file() or record.stat().st_size > 1 << 20:
                continue
            entry = json.loads(record.read_text(encoding="utf-8")).get("model")
        except (OSError, ValueError, AttributeError, RecursionError):
            continue
        if isinstance(entry, dict) and isinstance(entry.get("factory"), str):
            spec, kwargs = entry["factory"], entry.get("kwargs") or {}
            if re.fullmatch(r"[\w.]{1,200}:[\w.]{1,200}", spec) and isinstance(kwargs, dict):
                return spec, kwargs
    if shapes and _without_wrapper_prefixes(shapes) == _demo_shapes():
        return DEMO_FACTORY, {}
    return None, {}


def _without_wrapper_prefixes(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The names as the model has them: ``module.``, ``_orig_mod.`` or ``model.`` shared by all removed."""
    from trainwise.checkpoint.weights import WRAPPER_PREFIXES

    stripped = True
    while stripped and shapes:
        stripped = False
        for prefix in WRAPPER_PREFIXES:
            if all(key.startswith(prefix) for key in shapes):
                shapes = {key[len(prefix):]: shape for key, shape in shapes.items()}
                stripped = True
    return shapes


def _demo_shapes() -> dict[str, tuple[int, ...]]:
    from trainwise.demo import make_model

    return {key: tuple(value.shape) for key, value in make_model().state_dict().items()}


def _input_shape(path: Path) -> tuple[int, ...] | None:
    """The shape of the array in a .npy file, read from its header (nothing unpickled); None if unreadable."""
    import numpy as np

    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception:  # missing, damaged, an .npz: the command then shows a placeholder
        return None
    shape = getattr(array, "shape", None)
    return tuple(shape) if isinstance(array, np.ndarray) and shape else None


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
    from trainwise.files import atomic_write

    def write(handle: Any) -> None:
        if suffix == ".npy":
            np.save(handle, results[0])
        else:
            np.savez(handle, **dict(zip(names, results)))

    return atomic_write(path, write)
