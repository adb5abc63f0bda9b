"""``trainwise`` command line: one module per subcommand; user errors exit 2 with one line, no traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from trainwise import __version__
from trainwise.errors import NonFiniteLossError, TrainwiseError

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


# One module per subcommand, each with register(subparsers); imported lazily so that no subcommand's
# dependencies (torch above all) load before they are needed.
SUBCOMMANDS = ("demo", "fit", "export", "ckpt", "doctor")


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(
        prog="trainwise",
        description="Train PyTorch models with the fundamentals right by construction.",
    )
    parser.add_argument("--version", action="version", version=f"trainwise {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"trainwise.cli.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USER_ERROR
    try:
        return int(args.run(args) or 0)
    except NonFiniteLossError as exc:
        print(f"trainwise {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except TrainwiseError as exc:
        print(f"trainwise {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(f"trainwise {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
