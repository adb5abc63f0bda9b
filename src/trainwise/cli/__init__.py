"""``trainwise`` command line: one module per subcommand; user errors exit 2 with one line, no traceback.

Output piped into a reader that stops early (``trainwise doctor --explain TW102 | head -n 1``) ends quietly
with exit code 0, as Unix tools do; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from trainwise._version import __version__
from trainwise.errors import NonFiniteLossError, TrainwiseError

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


# One module per subcommand, each with register(subparsers); imported lazily so that no subcommand's
# dependencies (torch above all) load before they are needed.
SUBCOMMANDS = ("demo", "fit", "export", "ckpt", "doctor", "lab", "run")


class Parser(argparse.ArgumentParser):
    """argparse with usage errors in one line (``trainwise demo: error: ...; see trainwise demo --help.``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message}; see {self.prog} --help.\n")


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = Parser(
        prog="trainwise",
        description="Train PyTorch models with the fundamentals right by construction.",
    )
    parser.add_argument("--version", action="version", version=f"trainwise {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")  # subparsers are Parsers too
    for name in SUBCOMMANDS:
        importlib.import_module(f"trainwise.cli.{name}").register(sub)
    parser.set_defaults(subcommand_parsers=dict(sub.choices))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code (0 also when stdout was closed by the reader, e.g. ``head``)."""
    try:
        try:
            code = _main(argv)
        except SystemExit:  # --help, --version and usage errors: their output is flushed here too
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # a closed pipe shows up now, not as "Exception ignored" at interpreter exit
        return code
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # a pipe of our own (a worker's), not the reader going away: a real failure
        _silence_stdout()
        return 0


def _main(argv: Sequence[str] | None) -> int:
    from trainwise.cli.spelling import cli_spelling

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        parser.print_help()
        return EXIT_USER_ERROR
    if extra:
        args.subcommand_parsers[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.run(args) or 0)
    except NonFiniteLossError as exc:
        print(f"trainwise {args.command}: error: {cli_spelling(str(exc), args.command)}", file=sys.stderr)
        return 1
    except TrainwiseError as exc:
        print(f"trainwise {args.command}: error: {cli_spelling(str(exc), args.command)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt as exc:
        return interrupted(args.command, getattr(getattr(exc, "result", None), "run_dir", None))


def interrupted(command: str, run_dir: Any = None) -> int:
    """Say that ``command`` was interrupted (and where its run's log is), in one line; the exit code 130."""
    where = f"; what was logged is in {run_dir}" if run_dir else ""
    print(f"trainwise {command}: interrupted{where}.", file=sys.stderr)
    return EXIT_INTERRUPTED


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll reports an error on its write end)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by a StringIO (tests), closed
        return False
    try:
        import select

        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll() (Windows): the usual cause is the reader
        return True


def _silence_stdout() -> None:
    """Point stdout at devnull, so that the interpreter's last flush at exit has somewhere to go (the Python
    docs' recipe for SIGPIPE: https://docs.python.org/3/library/signal.html#note-on-sigpipe)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
