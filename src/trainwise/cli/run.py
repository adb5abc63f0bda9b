"""``trainwise run SCRIPT [ARGS...]`` (or ``-m MODULE``): run a script as ``python`` would, with the runtime guards
on every model and optimizer it uses, after the doctor has read it.

The script runs in this process: ``__name__ == "__main__"``, ``sys.argv``, ``sys.path[0]`` (the script's folder,
symlinks resolved, or the current folder with ``-m``), stdin and stdout as ``python SCRIPT ARGS`` has them, and
its exit status (an uncaught exception prints its traceback through ``sys.excepthook`` and exits 1; a
KeyboardInterrupt ends the process by SIGINT after the report, as python's ends). Everything
trainwise says goes to stderr (or to ``--output``). Under torchrun every rank is guarded and the local rank 0
reports for all (docs/run.md).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import runpy
import sys
from typing import Any


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "run",
        help="run a training script unchanged, with the runtime guards on every model and optimizer",
        description="Run SCRIPT (or -m MODULE) with ARGS as python would, after the doctor has read it, with the "
        "runtime guards on every model and optimizer it uses; report each finding with the script's line, and a "
        "summary at exit. trainwise's options go before SCRIPT; everything after it is the script's. Exit with "
        "the script's status, or 1 with --fail-on when a finding matches (docs/run.md).",
    )
    parser.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE ...",
                        help="run a module as `python -m MODULE ...` does (the rest of the line is its arguments)")
    parser.add_argument("--format", choices=("text", "json", "sarif", "github"), default="text",
                        help="the report at exit (default text: a table); json, sarif and github as the doctor's")
    parser.add_argument("--output", metavar="FILE", help="write the report at exit to FILE instead of stderr")
    parser.add_argument("--select", action="append", default=None, metavar="CODES",
                        help="only these codes or prefixes, comma-separated (TW102,TW11), static and run time")
    parser.add_argument("--ignore", action="append", default=None, metavar="CODES",
                        help="leave out these codes or prefixes, comma-separated")
    parser.add_argument("--fail-on", action="append", default=None, metavar="CODES",
                        help="exit 1 when a finding (static or at run time) has one of these codes or prefixes, "
                        "or any with 'any', though the script succeeded")
    parser.add_argument("--no-doctor", action="store_true", help="do not run the doctor on the script first")
    parser.add_argument("--check-every", type=int, default=50, metavar="N",
                        help="read the device-side checks every N optimizer steps (default 50) and at exit")
    parser.add_argument("script", nargs="?", metavar="SCRIPT", help="the Python file to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's own arguments")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from trainwise.cli import run_report
    from trainwise.errors import TrainwiseError, printable

    if args.module is not None:
        if not args.module:
            raise TrainwiseError("-m needs a module name, as in `trainwise run -m package.train --epochs 3`.")
        target, script_args, is_module = args.module[0], args.module[1:], True
    elif args.script is None:
        raise TrainwiseError("name the script to run, as in `trainwise run train.py --epochs 3`.")
    else:
        target, script_args, is_module = args.script, args.args, False
        if not os.path.exists(target):
            raise TrainwiseError(f"{printable(target)} does not exist; check the path.")
    if args.check_every < 1:
        raise TrainwiseError(f"--check-every must be a positive integer, got {args.check_every}.")
    selection = run_report.Selection.parse(select=args.select, ignore=args.ignore, fail_on=args.fail_on)
    archive = None if is_module else _main_importer(target)
    if archive is not None and archive.find_spec("__main__") is None:
        return _no_main(target)
    ranks = run_report.Ranks.from_environment()
    source = _source_file(target) if is_module else _script_source(target, archive)
    static = []
    if not args.no_doctor and source is not None and ranks.reports:
        static = run_report.static_findings(source, selection)
    report = run_report.RunReport(selection, static, ranks, fmt=args.format, output=args.output, target=target)
    report.before_run()

    from trainwise.guards.auto import AutoGuard
    from trainwise.guards.user_code import UserCode

    auto = AutoGuard(codes=selection.guard_codes(), on_finding=report.live, check_every=args.check_every,
                     stop_at=_execute.__code__, user_code=UserCode(_own_code(target, is_module)))
    status, failure = _execute(target, script_args, is_module=is_module, archive=archive is not None, auto=auto)
    auto.close()
    if status == INTERRUPTED:
        report.interrupted()  # said once, before the report: no "failed" line besides it
        failure = None
    code = report.after_run(auto.findings, status, failure=failure, watched=(auto.watched_models, auto.watched_steps))
    return _die_of_sigint() if status == INTERRUPTED else code


def _source_file(module: str) -> str | None:
    """The .py file ``python -m module`` would run (its ``__main__.py`` for a package), without running it."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(f"{module}.__main__")
    except (ImportError, ValueError):
        return None
    origin = spec.origin if spec is not None else None
    return origin if origin and origin.endswith(".py") else None


def _main_importer(target: str) -> Any:
    """The importer python runs ``target``'s ``__main__`` from (a folder or a zip file), or None for a script
    file, chosen as python chooses: by the path hooks."""
    import pkgutil

    return pkgutil.get_importer(target)


def _no_main(target: str) -> int:
    """A folder or zip file without ``__main__``: python's one line (the path as python names it), and its 1."""
    path = target if os.path.isabs(target) else os.path.join(os.getcwd(), target)
    print(f"trainwise run: can't find '__main__' module in {path!r}; name the script to run inside it, or add a "
          "__main__.py.", file=sys.stderr)
    return 1


def _script_source(target: str, archive: Any) -> str | None:
    """The .py file the doctor reads for ``target``: the script, a folder's ``__main__.py``, none in a zip file."""
    if archive is None:
        return target
    main = os.path.join(target, "__main__.py")
    return main if os.path.isfile(main) else None


def _own_code(target: str, is_module: bool) -> list[str]:
    """The files that are the user's code wherever they lie: the script, folder or zip file run, or with ``-m``
    the top-level package (or module) of the module run, though it be installed."""
    if not is_module:
        return [target]
    import importlib.util

    try:
        spec = importlib.util.find_spec(target.partition(".")[0])
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    return list(spec.submodule_search_locations or ([spec.origin] if spec.origin else []))


# _execute's status for a script that a KeyboardInterrupt ended: the process then dies of SIGINT, as python's does
INTERRUPTED = -2


def _execute(target: str, argv: list[str], *, is_module: bool, archive: bool, auto: Any) -> tuple[int, str | None]:
    """Run the script or module as ``__main__`` with the guards on: its exit status as python gives it
    (``INTERRUPTED`` for a KeyboardInterrupt), and the uncaught exception that ended it, in one line (None when
    it ended or exited)."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    launcher = os.path.dirname(os.path.realpath(sys.argv[0])) if sys.argv and sys.argv[0] else None
    if sys.path and launcher and os.path.realpath(sys.path[0] or ".") == launcher:
        del sys.path[0]  # the console script's folder is where python puts the script's
    if not archive:  # a folder or zip file: runpy puts it first, as python does
        sys.path.insert(0, os.getcwd() if is_module else os.path.dirname(os.path.realpath(target)))
    sys.argv = [target, *argv]
    auto.install()
    try:
        if is_module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        elif archive:  # a folder or zip file with a __main__
            runpy.run_path(target, run_name="__main__")
        else:
            _run_file(target)
    except SystemExit as exc:
        return _exit_status(exc.code), None
    except BaseException as exc:  # what python prints for an uncaught exception, from the script's frames on
        sys.stdout.flush()
        exc.__traceback__ = _user_traceback(exc.__traceback__)
        sys.excepthook(type(exc), exc, exc.__traceback__)
        return (INTERRUPTED if type(exc) is KeyboardInterrupt else 1), _one_line(exc)
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path + [p for p in sys.path if p not in saved_path]
    return 0, None


def _one_line(exc: BaseException) -> str:
    """``Type: message``, the message's first line, at most 200 characters."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _die_of_sigint() -> int:
    """End as python ends a script that a KeyboardInterrupt stopped: wait for the threads that are not daemons,
    run the atexit handlers, flush the standard streams, then kill this process with SIGINT at its default
    action, so that the parent sees it killed by SIGINT (a shell running a list of commands then stops too).
    Where there is no such signal (Windows) the status is 130."""
    import atexit
    import signal
    import threading

    if os.name != "posix":
        return 130
    threading._shutdown()  # what the interpreter's own exit does first; later calls return at once
    atexit._run_exitfuncs()  # the script's handlers (a logger's flush, a last checkpoint), then torch's
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):  # closed or replaced by the script
            stream.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    return 130  # not reached unless the signal is blocked


def _run_file(path: str) -> None:
    """Run a .py file as python runs its script: a fresh ``__main__`` module (kept in ``sys.modules``, so that
    what it defines pickles, as under python), ``__file__`` and code names absolute, ``sys.argv[0]`` as given."""
    import builtins
    import importlib.machinery
    import types

    absolute = os.path.abspath(path)
    with open(absolute, "rb") as fh:  # bytes: compile() reads the encoding cookie as python does
        source = fh.read()
    code = compile(source, absolute, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=absolute, __builtins__=builtins, __cached__=None, __annotations__={},
                         __loader__=importlib.machinery.SourceFileLoader("__main__", absolute))
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _exit_status(code: Any) -> int:
    """What ``sys.exit(code)`` makes the process exit with: 0 for None, the number, else 1 after printing it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _user_traceback(tb: Any) -> Any:
    """The traceback without this module's and runpy's frames, as python shows a script's."""
    skipped = (os.path.abspath(runpy.__file__), os.path.abspath(__file__), "<frozen runpy>")
    while tb is not None and tb.tb_frame.f_code.co_filename in skipped:
        tb = tb.tb_next
    return tb
