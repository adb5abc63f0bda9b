"""Reading ``torch.distributed.checkpoint`` (DCP) folders without running code from their files.

DCP's own reader unpickles the folder's ``.metadata`` file with ``pickle.load`` and every non-tensor entry
of the ``.distcp`` files with ``torch.load(weights_only=False)``: a crafted folder runs any code it likes.
Every DCP read in trainwise goes through this module instead:

- :func:`read_dcp_metadata` unpickles ``.metadata`` with a restricted unpickler that knows only the DCP
  metadata classes, torch dtypes and layouts, ``torch.Size`` and paths, checks every field, and rebuilds
  the metadata from the checked values (DCP never sees an object the file made);
- :class:`SafeFileSystemReader` hands that checked metadata to DCP instead of unpickling the file again;
- :class:`SafeLoadPlanner` (and :class:`SafeFullStateLoadPlanner`) read non-tensor entries with
  ``torch.load(weights_only=True)``; tensors are read by DCP with ``weights_only=True`` already;
- :func:`sharded_folder` follows the ``sharded`` entry of a checkpoint file only to a plain
  ``sharded-stepN`` folder beside it, and only on an FSDP run.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import pickle
import re
from collections.abc import Callable
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, ClassVar

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    _MEM_FORMAT_ENCODING,
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from trainwise.errors import TrainwiseError, first_line, with_article
from trainwise.run_folder import SHARDED_NAME

METADATA_FILE = ".metadata"
_FIX = "use a sharded folder written by trainwise.save_sharded or torch.distributed.checkpoint"

# -- the restricted unpickler --------------------------------------------------------------------------------

_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_FILESYSTEM_MODULE = "torch.distributed.checkpoint.filesystem"
# Classes the file may instantiate (NEWOBJ, then BUILD with their own fields only): the DCP metadata.
_CLASSES: dict[tuple[str, str], type] = {
    (_METADATA_MODULE, "Metadata"): Metadata,
    (_METADATA_MODULE, "StorageMeta"): StorageMeta,
    (_METADATA_MODULE, "TensorStorageMetadata"): TensorStorageMetadata,
    (_METADATA_MODULE, "BytesStorageMetadata"): BytesStorageMetadata,
    (_METADATA_MODULE, "ChunkStorageMetadata"): ChunkStorageMetadata,
    (_METADATA_MODULE, "TensorProperties"): TensorProperties,
    (_METADATA_MODULE, "MetadataIndex"): MetadataIndex,
    (_FILESYSTEM_MODULE, "_StorageInfo"): _StorageInfo,
}


class _Refused(Exception):
    """A global or opcode the metadata never holds (carries the sentence's subject)."""


class _Invalid(Exception):
    """The metadata is not what DCP writes (carries the reason, a short phrase)."""


def _size(*args: Any) -> torch.Size:
    if len(args) != 1 or not isinstance(args[0], (tuple, list)) or not all(_is_int(n) for n in args[0]):
        raise _Invalid("a torch.Size of something other than integers")
    return torch.Size(args[0])


def _layout(*args: Any) -> torch.layout:
    layouts = {str(v): v for v in vars(torch).values() if isinstance(v, torch.layout)}
    if len(args) != 1 or not isinstance(args[0], str) or args[0] not in layouts:
        raise _Invalid("an unknown tensor layout")
    return layouts[args[0]]


def _memory_format(*args: Any) -> _MEM_FORMAT_ENCODING:
    if len(args) != 1 or args[0] not in {m.value for m in _MEM_FORMAT_ENCODING} or not _is_int(args[0]):
        raise _Invalid("an unknown memory format")
    return _MEM_FORMAT_ENCODING(args[0])


def _path(*args: Any) -> str:
    if not all(isinstance(part, str) for part in args):
        raise _Invalid("a path made of something other than strings")
    return str(PurePosixPath(*args)) if args else ""


def _windows_path(*args: Any) -> str:
    if not all(isinstance(part, str) for part in args):
        raise _Invalid("a path made of something other than strings")
    return str(PureWindowsPath(*args)) if args else ""


# Callables the file may call (REDUCE): stand-ins that check their arguments and build only plain values.
_CALLABLES: dict[tuple[str, str], Callable[..., Any]] = {
    ("torch", "Size"): _size,
    ("torch.serialization", "_get_layout"): _layout,
    (_METADATA_MODULE, "_MEM_FORMAT_ENCODING"): _memory_format,
}
for _module in ("pathlib", "pathlib._local"):  # StorageMeta.checkpoint_id: a path, kept as a string
    _CALLABLES.update({(_module, "PosixPath"): _path, (_module, "PurePosixPath"): _path, (_module, "Path"): _path,
                       (_module, "WindowsPath"): _windows_path, (_module, "PureWindowsPath"): _windows_path})
del _module
_DTYPES = {name: value for name, value in vars(torch).items() if isinstance(value, torch.dtype)}


def _refuse_opcode(name: str) -> Callable[[Any], None]:
    def refuse(unpickler: Any) -> None:
        raise _Refused(f"the pickle opcode {name}")

    return refuse


class _MetadataUnpickler(pickle._Unpickler):  # type: ignore[misc,name-defined]
    """Python's own unpickler with every way to reach a callable restricted to the DCP metadata classes."""

    dispatch: ClassVar[dict[int, Any]] = dict(pickle._Unpickler.dispatch)  # type: ignore[attr-defined]

    def find_class(self, module: str, name: str) -> Any:
        key = (module, name)
        if key in _CLASSES:
            return _CLASSES[key]
        if key in _CALLABLES:
            return _CALLABLES[key]
        if module == "torch" and name in _DTYPES:
            return _DTYPES[name]
        raise _Refused("the global " + _printable(f"{module}.{name}"))

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("a persistent id")

    def load_reduce(self) -> None:
        stack = self.stack
        args = stack.pop()
        func = stack[-1]
        if not isinstance(args, tuple) or not any(func is f for f in _CALLABLES.values()):
            raise _Refused(f"a call of {_describe(func)}")
        stack[-1] = func(*args)

    def load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        self.stack.append(_new(cls, args, {}))

    def load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        self.stack.append(_new(cls, args, kwargs))

    def load_build(self) -> None:
        stack = self.stack
        state = stack.pop()
        inst = stack[-1]
        if type(inst) not in _CLASSES.values():
            raise _Refused(f"setting the state of {_describe(inst)}")
        if type(inst) is TensorProperties:
            if not isinstance(state, tuple) or len(state) != 5:
                raise _Invalid("a TensorProperties state that is not five values")
            inst.__setstate__(state)
            return
        names = {f.name for f in dataclasses.fields(inst)}
        if not isinstance(state, dict) or not all(isinstance(k, str) and k in names for k in state):
            raise _Invalid(f"a {type(inst).__name__} with fields it does not have")
        inst.__dict__.update(state)

    # Dict keys are hashed as they are inserted: only names and checked MetadataIndex keys (hashing a
    # deeply nested tuple could exhaust the C stack).
    def load_setitem(self) -> None:
        stack = self.stack
        value = stack.pop()
        key = stack.pop()
        _target_dict(stack[-1])[_checked_key(key)] = value

    def load_setitems(self) -> None:
        items = self.pop_mark()
        target = _target_dict(self.stack[-1])
        for i in range(0, len(items) - 1, 2):
            target[_checked_key(items[i])] = items[i + 1]

    def load_dict(self) -> None:
        items = self.pop_mark()
        self.append({_checked_key(items[i]): items[i + 1] for i in range(0, len(items) - 1, 2)})

    dispatch[pickle.REDUCE[0]] = load_reduce
    dispatch[pickle.NEWOBJ[0]] = load_newobj
    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex
    dispatch[pickle.BUILD[0]] = load_build
    dispatch[pickle.SETITEM[0]] = load_setitem
    dispatch[pickle.SETITEMS[0]] = load_setitems
    dispatch[pickle.DICT[0]] = load_dict
    for _name in ("INST", "OBJ", "EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID", "EMPTY_SET", "ADDITEMS",
                  "FROZENSET"):
        dispatch[getattr(pickle, _name)[0]] = _refuse_opcode(_name)
    del _name


def _target_dict(target: Any) -> dict[Any, Any]:
    if type(target) is not dict:
        raise _Invalid("items set on something other than a dict")
    return target


def _checked_key(key: Any) -> Any:
    """A dict key DCP metadata uses: a name, or a MetadataIndex of a name and a size."""
    if type(key) is str:
        return key
    if type(key) is MetadataIndex:
        fqn = key.__dict__.get("fqn")
        offset = key.__dict__.get("offset")
        if type(fqn) is str and (offset is None or type(offset) is torch.Size):
            return key
    raise _Invalid("a dict key that is neither a name nor a storage index")


def _printable(text: str) -> str:
    return re.sub(r"[^\w.]", "?", text)[:120]


def _new(cls: Any, args: Any, kwargs: Any) -> Any:
    if not isinstance(cls, type) or cls not in _CLASSES.values():
        raise _Refused(f"creating {_describe(cls)}")
    if args or kwargs:
        raise _Invalid(f"a {cls.__name__} created with arguments")
    return object.__new__(cls)


def _describe(obj: Any) -> str:
    if isinstance(obj, type) or callable(obj):
        name = f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"
        return _printable(name)
    return with_article(type(obj).__name__)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# -- checking what came out ------------------------------------------------------------------------------------


def _fields(obj: Any, cls: type) -> dict[str, Any]:
    """The dataclass fields of an object the unpickler built (defaults for fields the file left out)."""
    if type(obj) is not cls:
        raise _Invalid(f"{with_article(type(obj).__name__)} where DCP writes {with_article(cls.__name__)}")
    values = {}
    for field in dataclasses.fields(cls):
        if field.name in obj.__dict__:
            values[field.name] = obj.__dict__[field.name]
        elif field.default is not dataclasses.MISSING:
            values[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            values[field.name] = field.default_factory()
        else:
            raise _Invalid(f"a {cls.__name__} without its {field.name}")
    if set(obj.__dict__) - set(values):
        raise _Invalid(f"a {cls.__name__} with fields it does not have")
    return values


def _ints(value: Any, what: str) -> torch.Size:
    if not isinstance(value, torch.Size) or not all(_is_int(n) and n >= 0 for n in value):
        raise _Invalid(f"{what} that is not a size of non-negative integers")
    return torch.Size(value)


def _check_properties(obj: Any) -> TensorProperties:
    f = _fields(obj, TensorProperties)
    if not isinstance(f["dtype"], torch.dtype) or not isinstance(f["layout"], torch.layout):
        raise _Invalid("a tensor whose dtype or layout is not a torch one")
    if not isinstance(f["memory_format"], torch.memory_format):
        raise _Invalid("a tensor whose memory format is not a torch one")
    if not isinstance(f["requires_grad"], bool) or not isinstance(f["pin_memory"], bool):
        raise _Invalid("a tensor whose flags are not booleans")
    return TensorProperties(**f)


def _check_tensor(fqn: str, obj: Any) -> TensorStorageMetadata:
    f = _fields(obj, TensorStorageMetadata)
    size = _ints(f["size"], f"tensor {fqn!r} with a size")
    if not isinstance(f["chunks"], list):
        raise _Invalid(f"tensor {fqn!r} without a list of chunks")
    chunks = []
    for chunk in f["chunks"]:
        c = _fields(chunk, ChunkStorageMetadata)
        offsets = _ints(c["offsets"], f"a chunk of {fqn!r} with offsets")
        sizes = _ints(c["sizes"], f"a chunk of {fqn!r} with sizes")
        if len(offsets) != len(size) or len(sizes) != len(size):
            raise _Invalid(f"a chunk of {fqn!r} with another number of dimensions than the tensor")
        if any(o + s > n for o, s, n in zip(offsets, sizes, size)):
            raise _Invalid(f"a chunk of {fqn!r} that reaches beyond the tensor")
        chunks.append(ChunkStorageMetadata(offsets, sizes))
    return TensorStorageMetadata(_check_properties(f["properties"]), size, chunks)


def _check_storage(folder: Path, key: Any, value: Any, file_sizes: dict[str, int]) -> tuple[MetadataIndex, Any]:
    k = _fields(key, MetadataIndex)
    if not isinstance(k["fqn"], str):
        raise _Invalid("a storage entry whose name is not a string")
    offset = None if k["offset"] is None else _ints(k["offset"], f"storage entry {k['fqn']!r} with an offset")
    if k["index"] is not None and not _is_int(k["index"]):
        raise _Invalid(f"storage entry {k['fqn']!r} with an index that is not an integer")
    v = _fields(value, _StorageInfo)
    name = v["relative_path"]
    if not isinstance(name, str) or not _plain_file_name(name):
        raise _Invalid(f"storage entry {k['fqn']!r} in a file outside the folder")
    if not (_is_int(v["offset"]) and _is_int(v["length"]) and v["offset"] >= 0 and v["length"] >= 0):
        raise _Invalid(f"storage entry {k['fqn']!r} with an offset or length that is not a non-negative integer")
    if v["transform_descriptors"] not in (None, [], ()):
        raise _Invalid(f"storage entry {k['fqn']!r} stored through a transform (compression), which is not read")
    if name not in file_sizes:
        path = folder / name
        if path.is_symlink() or not path.is_file():
            raise _Invalid(f"storage entry {k['fqn']!r} in {name}, which is not a file of the folder")
        file_sizes[name] = path.stat().st_size
    if v["offset"] + v["length"] > file_sizes[name]:
        raise _Invalid(f"storage entry {k['fqn']!r} that reaches beyond the end of {name}")
    return MetadataIndex(k["fqn"], offset, k["index"]), _StorageInfo(name, v["offset"], v["length"])


def _plain_file_name(name: str) -> bool:
    return (name not in ("", ".", "..") and "/" not in name and "\\" not in name and "\0" not in name
            and not PureWindowsPath(name).drive)


def _check_metadata(folder: Path, obj: Any) -> Metadata:
    """A new Metadata built from the checked values of the unpickled one."""
    f = _fields(obj, Metadata)
    entries = f["state_dict_metadata"]
    if not isinstance(entries, dict) or not all(isinstance(k, str) for k in entries):
        raise _Invalid("state_dict_metadata that is not a dict keyed by names")
    state_dict_metadata: dict[str, Any] = {}
    for fqn, entry in entries.items():
        if type(entry) is BytesStorageMetadata:
            _fields(entry, BytesStorageMetadata)
            state_dict_metadata[fqn] = BytesStorageMetadata()
        elif type(entry) is TensorStorageMetadata:
            state_dict_metadata[fqn] = _check_tensor(fqn, entry)
        else:
            raise _Invalid(f"entry {fqn!r} that is neither a tensor nor bytes")

    raw_storage = f["storage_data"]
    if not isinstance(raw_storage, dict):
        raise _Invalid("storage_data that is not a dict")
    file_sizes: dict[str, int] = {}
    storage_data = dict(_check_storage(folder, k, v, file_sizes) for k, v in raw_storage.items())

    for fqn, entry in state_dict_metadata.items():  # every piece has bytes behind it, enough for its size
        if isinstance(entry, BytesStorageMetadata):
            if MetadataIndex(fqn) not in storage_data:
                raise _Invalid(f"entry {fqn!r} with no stored bytes")
            continue
        stored = 0
        for chunk in entry.chunks:
            info = storage_data.get(MetadataIndex(fqn, chunk.offsets))
            if info is None:
                raise _Invalid(f"a chunk of {fqn!r} with no stored bytes")
            stored += info.length
        if math.prod(entry.size) * entry.properties.dtype.itemsize > stored:
            raise _Invalid(f"tensor {fqn!r} larger than the bytes stored for it")

    planner_data = f["planner_data"]
    if planner_data is not None:
        # the default planner's map of flat names to paths in the nested state; list indices are bounded
        # by the number of entries (DCP grows a list up to an index it finds there)
        limit = len(state_dict_metadata)
        if not isinstance(planner_data, dict) or not all(
            isinstance(k, str) and type(v) is tuple and v and type(v[0]) is str
            and all(type(p) is str or (type(p) is int and 0 <= p < limit) for p in v)
            for k, v in planner_data.items()
        ):
            raise _Invalid("planner_data that is not the default planner's map of names to paths")
        planner_data = dict(planner_data)

    storage_meta = f["storage_meta"]
    if storage_meta is not None:
        m = _fields(storage_meta, StorageMeta)
        if not all(m[name] is None or isinstance(m[name], str) for name in ("checkpoint_id", "save_id", "load_id")):
            raise _Invalid("storage_meta whose ids are not strings")
        if not isinstance(m["modules"], list) or not all(isinstance(x, str) for x in m["modules"]):
            raise _Invalid("storage_meta whose modules are not a list of names")
        storage_meta = StorageMeta(m["checkpoint_id"], m["save_id"], m["load_id"], list(m["modules"]))
    if f["version"] is not None and not isinstance(f["version"], str):
        raise _Invalid("a version that is not a string")
    return Metadata(state_dict_metadata, planner_data=planner_data, storage_data=storage_data,
                    storage_meta=storage_meta, version=f["version"])


# -- public API --------------------------------------------------------------------------------------------------


def check_dcp_folder(folder: str | os.PathLike[str]) -> Path:
    """``folder`` as a Path once it is an existing folder with a ``.metadata`` file, or a one-sentence error."""
    folder = Path(folder)
    if not folder.exists():
        raise TrainwiseError(f"the sharded checkpoint folder {folder} does not exist; check the path.")
    if not folder.is_dir():
        raise TrainwiseError(
            f"{folder} is not a folder; pass the sharded checkpoint folder (the one holding {METADATA_FILE})."
        )
    meta = folder / METADATA_FILE
    if meta.is_symlink() or not meta.is_file():
        raise TrainwiseError(
            f"{folder} has no {METADATA_FILE} file, so it is not a complete sharded checkpoint; {_FIX}."
        )
    return folder


def read_dcp_metadata(folder: str | os.PathLike[str]) -> Metadata:
    """The checked ``Metadata`` of a DCP folder, unpickled with nothing but the DCP metadata classes.

    Any other global (``os.system``, ``builtins.eval``...), opcode or malformed field is refused with a
    :class:`TrainwiseError` before anything from the file runs; the result is rebuilt from checked values.
    """
    folder = check_dcp_folder(folder)
    meta = folder / METADATA_FILE
    try:
        data = meta.read_bytes()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise TrainwiseError(f"{meta} could not be read ({reason}); check its permissions.") from None
    try:
        stream = io.BytesIO(data)
        obj = _MetadataUnpickler(stream).load()
        if stream.tell() != len(data):
            raise _Invalid("bytes after the end of its pickle")
        return _check_metadata(folder, obj)
    except _Refused as exc:
        raise TrainwiseError(
            f"{meta} asks for {exc}, which DCP metadata never holds, so it was refused before anything in it "
            f"could run; {_FIX}."
        ) from None
    except _Invalid as exc:
        raise TrainwiseError(f"{meta} is not valid DCP metadata (it holds {exc}); {_FIX}.") from None
    except Exception as exc:  # truncated, random or malformed pickles raise many kinds
        raise TrainwiseError(
            f"{meta} is not a readable DCP metadata file ({type(exc).__name__}: probably truncated or corrupt); "
            f"{_FIX}."
        ) from None


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` that gives DCP metadata already checked by :func:`read_dcp_metadata`."""

    def __init__(self, path: str | os.PathLike[str], metadata: Metadata | None = None) -> None:
        super().__init__(path)
        self._checked = metadata if metadata is not None else read_dcp_metadata(path)
        self._folder = Path(path)

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id and Path(checkpoint_id) != self._folder:
            raise TrainwiseError(f"this reader reads {self._folder} only; make a new one for {checkpoint_id}.")
        super().reset(checkpoint_id)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:  # per-rank metadata: not read (the checked global one is used)
            raise TrainwiseError(f"{self._folder} has no global {METADATA_FILE}; {_FIX}.")
        metadata = self._checked
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _load_bytes_safely(read_item: Any, value: io.BytesIO) -> Any:
    """A non-tensor entry of a ``.distcp`` file, with ``weights_only=True`` (DCP uses ``False``)."""
    try:
        return torch.load(value, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        what = f"needs {found.group(1)}" if found else "needs arbitrary unpickling"
        raise TrainwiseError(
            f"the non-tensor entry {read_item.dest_index.fqn!r} of the sharded checkpoint {what}, which could run "
            f"code, so it was refused; save only tensors and plain Python values in sharded checkpoints."
        ) from None
    except Exception as exc:
        raise TrainwiseError(
            f"the non-tensor entry {read_item.dest_index.fqn!r} of the sharded checkpoint could not be read "
            f"({type(exc).__name__}: probably truncated or corrupt); {_FIX}."
        ) from None


class _SafeBytesMixin:
    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._nested_dict import set_element

        loaded = _load_bytes_safely(read_item, value)
        fqn = read_item.dest_index.fqn
        if self.flatten_state_dict:  # type: ignore[attr-defined]
            set_element(self.original_state_dict, self.mappings[fqn], loaded)  # type: ignore[attr-defined]
        else:
            self.state_dict[fqn] = loaded  # type: ignore[attr-defined]


class SafeLoadPlanner(_SafeBytesMixin, DefaultLoadPlanner):
    """``DefaultLoadPlanner`` reading non-tensor entries with ``weights_only=True``."""


class SafeFullStateLoadPlanner(_SafeBytesMixin, _EmptyStateDictLoadPlanner):
    """The planner of ``dcp_to_torch_save`` (the whole state from the metadata), non-tensors ``weights_only``."""


def load_dcp(state: dict[str, Any], folder: str | os.PathLike[str], *, no_dist: bool = False) -> None:
    """``dcp.load(state, ...)`` from ``folder`` through the checked metadata and :class:`SafeLoadPlanner`
    (collective under a process group, like ``dcp.load``); every failure is a :class:`TrainwiseError`."""
    import torch.distributed.checkpoint as dcp

    reader = SafeFileSystemReader(folder)  # checks .metadata before DCP reads anything
    _reading(folder, lambda: dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=no_dist))


def read_dcp_state(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The whole state a DCP folder holds, as plain tensors and values, in this process (no group needed).

    What ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` reads, through the safe reader.
    """
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    reader = SafeFileSystemReader(folder)
    state: dict[str, Any] = {}
    _reading(folder, lambda: _load_state_dict(state, storage_reader=reader, planner=SafeFullStateLoadPlanner(),
                                              no_dist=True))
    return state


def _reading(folder: str | os.PathLike[str], load: Callable[[], Any]) -> None:
    """Run a DCP load; its failures (wrapped by DCP per rank) come out as one :class:`TrainwiseError`."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        load()
    except TrainwiseError:
        raise
    except CheckpointException as exc:
        failures = [f[0] if isinstance(f, tuple) else f for f in exc.failures.values()]
        for inner in failures:
            if isinstance(inner, TrainwiseError):
                raise TrainwiseError(str(inner)) from None
        inner = failures[0] if failures else exc
        raise TrainwiseError(
            f"the sharded checkpoint {folder} could not be loaded ({type(inner).__name__}: {_reason(inner)}); "
            "check that it was saved from this model and optimizer."
        ) from None
    except Exception as exc:
        raise TrainwiseError(
            f"the sharded checkpoint {folder} could not be loaded ({type(exc).__name__}: {_reason(exc)}); "
            "check that it was saved from this model and optimizer."
        ) from None


def sharded_folder(checkpoint: str | os.PathLike[str], name: Any, *, fsdp: bool) -> Path:
    """The folder the ``sharded`` entry of ``checkpoint`` names, once it is safe to follow.

    Only on an FSDP run, and only a plain ``sharded-stepN`` folder name that is a real folder (not a link)
    beside the checkpoint file, in the run's ``checkpoints/`` folder; anything else is a one-sentence error.
    """
    checkpoint = Path(checkpoint)
    if not fsdp:
        raise TrainwiseError(
            f"checkpoint {checkpoint} points to a sharded folder but this run is not an FSDP run; resume it under "
            "torchrun with distributed='fsdp', or resume from a checkpoint of a non-sharded run."
        )
    if not isinstance(name, str) or not SHARDED_NAME.fullmatch(name):
        shown = repr(name[:80]) if isinstance(name, str) else f"a {type(name).__name__}"
        raise TrainwiseError(
            f"checkpoint {checkpoint} names {shown} as its sharded folder, which is not a sharded-stepN folder "
            "beside it, so it was not followed; resume from an unaltered checkpoint."
        )
    home = checkpoint.parent
    folder = home / name
    if folder.is_symlink() or not folder.is_dir() or folder.resolve().parent != home.resolve():
        raise TrainwiseError(
            f"the sharded folder {folder} that checkpoint {checkpoint} names is missing or not a plain folder "
            "beside it; resume from a checkpoint whose sharded folder is still there."
        )
    return folder


def _reason(exc: BaseException | None) -> str:
    """An error's first line as a clause of one sentence: its own sentences joined with semicolons."""
    return first_line(exc, 200).replace(". ", "; ")


__all__ = [
    "METADATA_FILE",
    "SafeFileSystemReader",
    "SafeFullStateLoadPlanner",
    "SafeLoadPlanner",
    "check_dcp_folder",
    "load_dcp",
    "read_dcp_metadata",
    "read_dcp_state",
    "sharded_folder",
]
