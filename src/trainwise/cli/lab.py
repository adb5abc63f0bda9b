"""``trainwise lab``: list the labs, run one or all; ``--json`` prints the measured figures, ``--plot DIR``
writes the pictures of the labs that have one."""

from __future__ import annotations

import argparse
import json
import stat
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "lab",
        help="each fundamental as an experiment that measures the wrong way and the right way",
        description="Run the labs: each fundamental as a small experiment that measures the wrong way and the "
                    "right way side by side, in seconds on a CPU. Without NAME: the list.",
    )
    parser.add_argument("name", nargs="?", metavar="NAME", help="a lab's name, or all")
    parser.add_argument("--json", action="store_true", help="print the measured figures as JSON (one line per lab)")
    parser.add_argument("--plot", metavar="DIR", default=None,
                        help="write the labs' pictures (PNG, needs matplotlib) into DIR")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from trainwise.errors import TrainwiseError
    from trainwise.labs import LAB_MODULES, all_labs, find_lab

    if args.name is None:
        for lab in all_labs():
            codes = f"  ({', '.join(lab.codes)})" if lab.codes else ""
            print(f"{lab.name:<15} {lab.fundamental:>2}. {lab.title}{codes}")
        print(f"\n{len(LAB_MODULES)} labs; run one with trainwise lab NAME, or all of them with trainwise lab all.")
        return 0
    labs = all_labs() if args.name == "all" else [find_lab(args.name)]
    folder = None
    if args.plot is not None:
        folder = Path(args.plot)
        _refuse_a_file(folder)
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise TrainwiseError("--plot needs matplotlib; install it with pip install 'trainwise[plot]'.") from None
        _make_folder(folder)
    failed = 0
    for lab in labs:
        failed += _run_one(lab, folder, as_json=args.json)
    return 1 if failed else 0


def _refuse_a_file(folder: Path) -> None:
    """A ``--plot`` path that is a file, or that cannot be looked at (a folder above it without search
    permission), is one sentence before any lab runs; a missing one is made later."""
    from trainwise.errors import TrainwiseError

    try:
        st = folder.stat()
    except (FileNotFoundError, NotADirectoryError):
        return  # made (or refused in one sentence) by _make_folder
    except OSError as exc:  # Path.exists() raises PermissionError here
        raise TrainwiseError(f"--plot {folder} cannot be reached ({exc.strerror or type(exc).__name__}); choose a "
                             "folder you can write to.") from None
    if not stat.S_ISDIR(st.st_mode):
        raise TrainwiseError(f"--plot {folder} is a file, not a folder; choose a folder.")


def _make_folder(folder: Path) -> None:
    """Create the ``--plot`` folder before any lab runs; one that cannot be made is one sentence."""
    from trainwise.errors import TrainwiseError

    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise TrainwiseError(f"--plot {folder} cannot be created because a part of its path is a file; choose "
                             "another folder.") from None
    except OSError as exc:  # no permission, a read-only file system, a path under /proc
        raise TrainwiseError(f"--plot {folder} cannot be created ({exc.strerror or type(exc).__name__}); choose "
                             "a folder you can write to.") from None


def _run_one(lab: Any, folder: Path | None, *, as_json: bool) -> int:
    from trainwise.labs import format_figure, run_lab
    from trainwise.progress import format_duration

    result = run_lab(lab)
    picture = lab.plot(result, folder) if folder is not None and lab.plot is not None else None
    if as_json:
        print(json.dumps({"lab": lab.name, "fundamental": lab.fundamental, "codes": list(lab.codes),
                          "figures": result.figures, "shown": result.shown, "seconds": round(result.seconds, 3),
                          "reading": result.reading, "plot": str(picture) if picture else None}))
    else:
        print(f"{lab.name}: {lab.title} (fundamental {lab.fundamental})")
        width = max(len(name) for name in result.figures)
        for name, value in result.figures.items():
            print(f"  {name:<{width}}  {format_figure(value)}")
        print(f"  {result.reading}")
        if picture:
            print(f"  picture: {picture}")
        if not result.shown:
            print("  the expected effect did NOT show in this run; please report it.")
        print(f"  ({format_duration(result.seconds)})\n")
    return 0 if result.shown else 1
