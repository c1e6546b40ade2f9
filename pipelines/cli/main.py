"""The ``beamsynth`` command line.

Subcommands live in their own modules, each exposing ``add_parser(subparsers)`` which registers
the subcommand and sets ``func(args, beam_args) -> int``. Adding one is one line in
``_COMMAND_MODULES``. Arguments the subcommand does not know go to Beam as pipeline options
(``--runner``, ``--direct_num_workers``, ...) only if a registered Beam ``PipelineOptions`` class
parses them; anything else (a mistyped ``--rowz 10``) exits 2 before anything is read or spent,
with the closest flag as a suggestion (:func:`beamsynth.runners.options.check_pipeline_args`).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from beamsynth.runners.options import UnknownOptionError, check_pipeline_args

__all__ = ["main", "build_parser"]

_COMMAND_MODULES = [
    "beamsynth.pipelines.cli.synthesize",
    "beamsynth.pipelines.cli.schema",
    "beamsynth.pipelines.cli.histogram",
    "beamsynth.pipelines.cli.release",
    "beamsynth.pipelines.cli.prefixes",
]


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="beamsynth",
        description="Differentially private synthetic data and statistics on Apache Beam.",
    )
    parser.add_argument("--quiet", action="store_true", help="print only errors")
    parser.add_argument("--verbose", action="store_true", help="print Beam's own progress logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for mod in _COMMAND_MODULES:
        importlib.import_module(mod).add_parser(sub)
    return parser


def _own_flags(parser: argparse.ArgumentParser, command: str) -> list[str]:
    """The ``--flags`` of the top-level parser and of ``command``'s subparser."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    parsers = [parser, *(s.choices[command] for s in subs if command in s.choices)]
    return [o for p in parsers for a in p._actions for o in a.option_strings if o.startswith("--")]


class _DropBeamImportNoise(logging.Filter):
    """Beam logs an 'apitools not found' warning on import when GCP extras are absent."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "apitools not found" not in record.getMessage()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``beamsynth`` console script."""
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_DropBeamImportNoise())
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # --quiet/--verbose may also follow the subcommand; they never go to Beam.
    flags = [a for a in argv if a in ("--quiet", "--verbose")]
    rest = [a for a in argv if a not in ("--quiet", "--verbose")]
    args, beam_args = parser.parse_known_args(flags + rest)
    unknown = [a for a in beam_args if a.startswith("-") and not a.startswith("--")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        check_pipeline_args(beam_args, own_flags=_own_flags(parser, args.command))
    except UnknownOptionError as exc:
        print(f"beamsynth {args.command}: error: {exc}", file=sys.stderr)
        return 2
    logging.getLogger().setLevel(
        logging.ERROR if args.quiet else (logging.INFO if args.verbose else logging.WARNING))
    if not args.verbose:
        logging.getLogger("apache_beam").setLevel(logging.ERROR)
    elif not any(a.startswith("--default_sdk_harness_log_level") for a in beam_args):
        beam_args = [*beam_args, "--default_sdk_harness_log_level=INFO"]  # presets quiet workers
    try:
        code = int(args.func(args, beam_args) or 0)
        sys.stdout.flush()  # a closed pipe (`beamsynth schema avro adult | head`) shows here
        return code
    except BrokenPipeError:  # the reader went away: stop quietly (Python docs, signal notes)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"beamsynth {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
