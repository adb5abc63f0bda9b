"""Seeded, structure-aware mutations for fuzz tests of file loaders (checkpoints, configs, exported archives).

Every function takes a ``random.Random`` so that a fixed seed gives the same cases on every run, and returns
new bytes; none of them runs anything. Generic pieces, meant for reuse with other formats (.pt2 archives,
DCP folders):

- :func:`mutate_bytes`: bit flips, interesting integers, inserted, deleted, duplicated or cut bytes.
- :func:`mutate_zip`: members dropped, duplicated, renamed, swapped, truncated, compressed, declared huge,
  or their content mutated or replaced (``payloads`` go into members that ``is_pickle`` selects).
- :func:`pickle_payloads`: pickles that create ``marker`` when they are unpickled unsafely, through every
  opcode that can call code (GLOBAL, STACK_GLOBAL, REDUCE, INST, OBJ, BUILD with ``__setstate__``,
  NEWOBJ_EX), in protocols 0, 2 and 4.
- :func:`inject_pickle`: a payload spliced into a valid pickle at an opcode boundary, or replacing it.
- :func:`mutate_pickle_stream`: the same for a stream of several pickles (torch's legacy format).
- :func:`mutate_safetensors`: a safetensors header with huge lengths, negative or overlapping offsets,
  unknown dtypes, wrong shapes, invalid UTF-8...
- :func:`mutate_text`: text files (TOML, JSON): garbage, invalid UTF-8, cut lines, odd values.
"""

from __future__ import annotations

import io
import json
import pickle
import pickletools
import random
import shlex
import struct
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

INTERESTING_INTS = (0, 1, 2, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**64 - 1)


# -- bytes ---------------------------------------------------------------------------------------------------


def mutate_bytes(data: bytes, rng: random.Random, *, rounds: int | None = None) -> bytes:
    """``data`` with 1-3 random byte-level mutations (never longer than ``len(data) + 4 KiB``)."""
    out = bytearray(data)
    for _ in range(rounds or rng.randint(1, 3)):
        op = rng.choice(("flip", "byte", "int", "insert", "delete", "duplicate", "truncate"))
        if not out:
            out += rng.randbytes(rng.randint(1, 16))
            continue
        at = rng.randrange(len(out))
        if op == "flip":
            out[at] ^= 1 << rng.randrange(8)
        elif op == "byte":
            out[at] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        elif op == "int":
            width = rng.choice((1, 2, 4, 8))
            value = rng.choice(INTERESTING_INTS) & ((1 << (8 * width)) - 1)
            out[at:at + width] = value.to_bytes(width, "little")
        elif op == "insert":
            out[at:at] = rng.randbytes(rng.choice((1, 2, 8, 64, 1024)))
        elif op == "delete":
            del out[at:at + rng.choice((1, 2, 8, 64, 1024))]
        elif op == "duplicate":
            chunk = out[at:at + rng.choice((1, 8, 64, 512))]
            where = rng.randrange(len(out) + 1)
            out[where:where] = chunk
        else:
            del out[at:]
    return bytes(out)


# -- pickles -------------------------------------------------------------------------------------------------


class Touch:
    """Creates the file its pickled state names, from ``__setstate__`` (a BUILD payload that really runs)."""

    def __setstate__(self, state: str) -> None:
        Path(state).write_text("code from a pickle ran")


def touch(path: str) -> None:
    """A plain function a REDUCE payload calls (importable, so an unsafe load really runs it)."""
    Path(path).write_text("code from a pickle ran")


class _ReduceToTouch:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[[str], None], tuple[str]]:
        return (touch, (self.marker,))


def _unicode(text: str) -> bytes:
    """BINUNICODE: ``X`` + 4-byte length + UTF-8."""
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def _short(text: str) -> bytes:
    """SHORT_BINUNICODE (protocol 4): ``\\x8c`` + 1-byte length + UTF-8."""
    raw = text.encode()
    assert len(raw) < 256
    return b"\x8c" + bytes([len(raw)]) + raw


def pickle_payloads(marker: str | Path) -> dict[str, bytes]:
    """Complete pickles (PROTO ... STOP) that would create ``marker`` if they were unpickled unsafely.

    ``NEWOBJ_EX subprocess.Popen`` only calls ``Popen.__new__`` (harmless even unsafely); every other
    payload really creates the marker under ``pickle.loads`` (see :data:`RUNS_UNSAFELY`).
    """
    m = str(marker)
    cmd = f"touch {shlex.quote(m)}"
    code = f"open({m!r}, 'w').write('ran')"
    here = Touch.__module__.encode()  # "_mutate" under pytest; whatever name this module was imported by
    assert "\n" not in m and "\\" not in m
    text_cmd = cmd.encode("raw_unicode_escape")
    text_code = code.encode("raw_unicode_escape")
    return {
        # protocol 0, text opcodes
        "p0 GLOBAL os.system REDUCE": b"cos\nsystem\n(V" + text_cmd + b"\ntR.",
        "p0 GLOBAL posix.system REDUCE": b"cposix\nsystem\n(V" + text_cmd + b"\ntR.",
        "p0 INST os.system": b"(V" + text_cmd + b"\nios\nsystem\n.",
        "p0 OBJ os.system": b"(cos\nsystem\nV" + text_cmd + b"\no.",
        "p0 GLOBAL builtins.exec": b"cbuiltins\nexec\n(V" + text_code + b"\ntR.",
        "p0 GLOBAL __builtin__.eval": b"c__builtin__\neval\n(V" + text_code + b"\ntR.",
        # protocol 2, binary opcodes
        "p2 GLOBAL posix.system REDUCE": b"\x80\x02cposix\nsystem\n" + _unicode(cmd) + b"\x85R.",
        "p2 GLOBAL builtins.exec REDUCE": b"\x80\x02cbuiltins\nexec\n" + _unicode(code) + b"\x85R.",
        "p2 __import__ getattr chain": (
            b"\x80\x02cbuiltins\ngetattr\ncbuiltins\n__import__\n" + _unicode("os") + b"\x85R"
            + _unicode("system") + b"\x86R" + _unicode(cmd) + b"\x85R."
        ),
        "p2 __reduce__ to a function": pickle.dumps(_ReduceToTouch(m), protocol=2),
        "p2 BUILD with __setstate__": b"\x80\x02c" + here + b"\nTouch\n)\x81" + _unicode(m) + b"b.",
        # protocol 4: STACK_GLOBAL and NEWOBJ_EX
        "p4 STACK_GLOBAL os.system": b"\x80\x04" + _short("os") + _short("system") + b"\x93" + _short(cmd)
        + b"\x85R.",
        "p4 STACK_GLOBAL builtins.exec": b"\x80\x04" + _short("builtins") + _short("exec") + b"\x93"
        + _unicode(code) + b"\x85R.",
        "p4 NEWOBJ_EX subprocess.Popen": b"\x80\x04" + _short("subprocess") + _short("Popen") + b"\x93"
        + b"](" + _short("touch") + _unicode(m) + b"e\x85}\x92.",
    }


RUNS_UNSAFELY = frozenset(name for name in pickle_payloads("/tmp/x") if "Popen" not in name)


def _body(payload: bytes) -> bytes:
    """The payload without its PROTO header and STOP: ops that push exactly one object."""
    start = 2 if payload[:1] == b"\x80" else 0
    assert payload.endswith(b".")
    return payload[start:-1]


def opcode_offsets(data: bytes) -> list[int]:
    """Offsets of every opcode of the first pickle in ``data`` (up to and including its STOP)."""
    return [pos for _, _, pos in pickletools.genops(io.BytesIO(data))]


def inject_pickle(data: bytes, payload: bytes, rng: random.Random) -> bytes:
    """``payload`` spliced into the pickle ``data``: replacing it, before its STOP, or at an opcode boundary."""
    way = rng.choice(("replace", "result", "boundary", "boundary"))
    if way == "replace":
        return payload
    try:
        offsets = opcode_offsets(data)
    except Exception:  # not a valid pickle (already mutated): append
        return data + payload
    stop = offsets[-1]
    if way == "result":  # drop the real object, return the payload's
        return data[:stop] + b"0" + _body(payload) + data[stop:]
    at = rng.choice(offsets[1:] or offsets)  # after PROTO; the payload's object is popped again (POP)
    return data[:at] + _body(payload) + b"0" + data[at:]


def pickle_spans(data: bytes, *, limit: int = 8) -> list[tuple[int, int]]:
    """``(start, end)`` of the consecutive pickles at the start of ``data`` (torch's legacy format has 5)."""
    spans: list[tuple[int, int]] = []
    start = 0
    while start < len(data) and len(spans) < limit:
        try:
            end = start + opcode_offsets(data[start:])[-1] + 1
        except Exception:
            break
        spans.append((start, end))
        start = end
    return spans


def mutate_pickle_stream(data: bytes, rng: random.Random, payloads: dict[str, bytes] | None = None) -> bytes:
    """Mutate one pickle of a stream of pickles followed by raw data, or the raw data, or the whole stream."""
    spans = pickle_spans(data)
    if not spans or rng.random() < 0.15:
        return mutate_bytes(data, rng)
    start, end = rng.choice(spans)
    piece = data[start:end]
    if payloads and rng.random() < 0.6:
        piece = inject_pickle(piece, payloads[rng.choice(sorted(payloads))], rng)
    else:
        piece = mutate_bytes(piece, rng)
    return data[:start] + piece + data[end:]


# -- zip archives --------------------------------------------------------------------------------------------


def _is_pickle(name: str) -> bool:
    return name.endswith(".pkl")


def read_zip(data: bytes) -> list[tuple[zipfile.ZipInfo, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return [(info, archive.read(info)) for info in archive.infolist()]


def write_zip(members: list[tuple[zipfile.ZipInfo | str, bytes]], *, compression: int = zipfile.ZIP_STORED) -> bytes:
    out = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Duplicate name": wanted here
        with zipfile.ZipFile(out, "w", compression=compression) as archive:
            for info, content in members:
                archive.writestr(info, content)
    return out.getvalue()


def mutate_zip(
    data: bytes,
    rng: random.Random,
    *,
    payloads: dict[str, bytes] | None = None,
    is_pickle: Callable[[str], bool] = _is_pickle,
) -> bytes:
    """A structure-aware mutation of the zip archive ``data`` (falls back to :func:`mutate_bytes`)."""
    try:
        members = read_zip(data)
    except Exception:
        return mutate_bytes(data, rng)
    if not members:
        return mutate_bytes(data, rng)
    op = rng.choice(("drop", "duplicate", "rename", "swap", "content", "content", "payload", "payload",
                     "payload", "truncate", "compress", "huge", "reorder", "raw"))
    if op == "payload" and not payloads:
        op = "content"
    index = rng.randrange(len(members))
    info, content = members[index]
    if op == "drop":
        del members[index]
    elif op == "duplicate":
        other = (info, mutate_bytes(content, rng) if rng.random() < 0.5 else content)
        members.insert(rng.randrange(len(members) + 1), other)
    elif op == "rename":
        name = info.filename
        folder, _, base = name.rpartition("/")
        new = rng.choice((f"other/{base}", base, f"{folder}/{folder}/{base}", f"../../{base}", f"/{name}",
                          f"{folder}/data.pkl", f"{folder}/data/0", name.upper(), f"{name}\x00x", f"{folder}/"))
        members[index] = (_renamed(info, new), content)
    elif op == "swap" and len(members) > 1:
        other = rng.randrange(len(members))
        members[index], members[other] = (info, members[other][1]), (members[other][0], content)
    elif op == "content":
        members[index] = (info, mutate_bytes(content, rng))
    elif op == "payload":
        pickles = [i for i, (m, _) in enumerate(members) if is_pickle(m.filename)] or [index]
        index = rng.choice(pickles)
        info, content = members[index]
        payload = payloads[rng.choice(sorted(payloads))]  # type: ignore[index]
        members[index] = (info, inject_pickle(content, payload, rng))
    elif op == "truncate":
        members[index] = (info, content[: rng.randrange(len(content) + 1)])
    elif op == "compress":
        return write_zip([(m.filename, c) for m, c in members], compression=zipfile.ZIP_DEFLATED)
    elif op == "huge":
        return declare_huge_sizes(write_zip(members), rng)
    elif op == "reorder":
        rng.shuffle(members)
    else:
        return mutate_bytes(write_zip(members), rng)
    return write_zip(members)


def _renamed(info: zipfile.ZipInfo, name: str) -> zipfile.ZipInfo:
    new = zipfile.ZipInfo(name, date_time=info.date_time)
    new.compress_type = info.compress_type
    return new


def declare_huge_sizes(data: bytes, rng: random.Random) -> bytes:
    """The archive with the sizes in (some of) its central directory and local headers set to huge values."""
    out = bytearray(data)
    huge = rng.choice((2**32 - 2, 2**31, 10**9, 2**32 - 1))
    for signature, offsets in ((b"PK\x01\x02", (20, 24)), (b"PK\x03\x04", (18, 22))):
        start = 0
        while (start := out.find(signature, start)) >= 0:
            if rng.random() < 0.7:
                for offset in offsets if rng.random() < 0.5 else offsets[1:]:
                    out[start + offset:start + offset + 4] = huge.to_bytes(4, "little")
            start += 4
    return bytes(out)


# -- safetensors ---------------------------------------------------------------------------------------------


def split_safetensors(data: bytes) -> tuple[dict, bytes]:
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + length]), data[8 + length:]


def join_safetensors(header: object, body: bytes, *, length: int | None = None, raw: bytes | None = None) -> bytes:
    text = raw if raw is not None else json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text) if length is None else length % 2**64) + text + body


def mutate_safetensors(data: bytes, rng: random.Random, payloads: dict[str, bytes] | None = None) -> bytes:
    """A mutation of the safetensors file ``data`` aimed at its JSON header (or, rarely, at any byte)."""
    try:
        header, body = split_safetensors(data)
    except Exception:
        return mutate_bytes(data, rng)
    if not isinstance(header, dict) or rng.random() < 0.15:
        return mutate_bytes(data, rng)
    names = [k for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
    name = rng.choice(names) if names else "x"
    entry = header.get(name) if name in names else {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
    entry.setdefault("data_offsets", [0, 4])
    op = rng.choice(("length", "negative", "overlap", "beyond", "dtype", "shape", "metadata", "not-dict",
                     "utf8", "duplicate", "padding", "missing", "key", "trailing", "huge-shape", "payload"))
    text = None
    length = None
    if op == "length":
        length = rng.choice((0, 1, 2**63, 2**64 - 1, 2**32, 100_000_001, len(json.dumps(header)) + 1))
    elif op == "negative":
        entry["data_offsets"] = [-1, 4] if rng.random() < 0.5 else [0, -8]
    elif op == "overlap" and len(names) > 1:
        header[names[0]]["data_offsets"] = header[names[1]].get("data_offsets")
    elif op == "beyond":
        entry["data_offsets"] = [0, len(body) + rng.choice((1, 4096, 2**40))]
    elif op == "dtype":
        entry["dtype"] = rng.choice(("F128", "", "f32", "I4", 5, None, "BOOL", "F8_E4M3", "C64", "U64"))
    elif op == "shape":
        entry["shape"] = rng.choice(([], [0], [-1], [2, -2], "4", [1.5], [[2]], None, [3, 3, 3]))
    elif op == "huge-shape":
        entry["shape"] = rng.choice(([2**62, 2**62], [2**64 - 1], [2**32, 2**32, 2**32]))
    elif op == "metadata":
        header["__metadata__"] = rng.choice(({"a": 1}, {"a": {"b": "c"}}, ["x"], "text", {"x": "\x1b[2J" * 1000},
                                             {str(i): "v" for i in range(5000)}))
    elif op == "not-dict":
        text = json.dumps(rng.choice(([], "header", 3, None, [header]))).encode()
    elif op == "utf8":
        text = json.dumps(header).encode().replace(b'"', b'"\xff\xfe', 1)
    elif op == "duplicate":
        raw = json.dumps(header)
        text = (raw[:-1] + "," + json.dumps({name: entry})[1:]).encode()
    elif op == "padding":
        text = json.dumps(header).encode() + b" " * rng.choice((1, 7, 1000))
    elif op == "missing":
        entry.pop(rng.choice(sorted(entry)), None)
    elif op == "key":
        header[rng.choice(("", "\x1b[2J", "a" * 10_000, "__metadata__x", "\u202e\u2028"))] = dict(entry)
    elif op == "trailing":
        body += rng.randbytes(rng.choice((1, 100)))
    elif op == "payload" and payloads:
        payload = payloads[rng.choice(sorted(payloads))]
        header["__metadata__"] = {"format": "pt", "pickle": payload.decode("latin-1")}
        body = payload + body[len(payload):] if rng.random() < 0.5 else body
    if name in header or op in ("negative", "beyond", "dtype", "shape", "huge-shape", "missing"):
        header[name] = entry
    return join_safetensors(header, body, length=length, raw=text)


# -- text ----------------------------------------------------------------------------------------------------


def mutate_text(text: str, rng: random.Random) -> bytes:
    """A text file (TOML, JSON) with lines cut, duplicated or swapped, bytes garbled, or invalid UTF-8."""
    lines = text.splitlines(keepends=True)
    op = rng.choice(("cut", "duplicate", "swap", "bytes", "utf8", "garbage", "bom", "nul", "crlf"))
    if op == "cut" and lines:
        del lines[rng.randrange(len(lines))]
    elif op == "duplicate" and lines:
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(lines))
    elif op == "swap" and len(lines) > 1:
        a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[a], lines[b] = lines[b], lines[a]
    elif op == "bytes":
        return mutate_bytes(text.encode(), rng)
    elif op == "utf8":
        raw = text.encode()
        at = rng.randrange(len(raw) + 1)
        return raw[:at] + rng.choice((b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80")) + raw[at:]
    elif op == "garbage":
        return rng.randbytes(rng.choice((1, 16, 512)))
    elif op == "bom":
        return b"\xef\xbb\xbf" + text.encode()
    elif op == "nul":
        return text.encode().replace(b"\n", b"\x00\n", 1)
    else:
        return text.replace("\n", "\r\n").encode()
    return "".join(lines).encode()
