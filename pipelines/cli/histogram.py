"""``beamsynth histogram INPUT --column C --domain DOMAIN --epsilon E --tolerance RHO --output OUT``.

Releases an ε-DP histogram of one column over a declared, possibly huge domain with CatHist
(seed 000, Algorithm 1; :mod:`beamsynth.transforms.cathist`). OUT gets one row per released
category with its noisy count, ``OUT.rejected.jsonl`` the rows whose value is outside the declared
domain (or unreadable), ``OUT.manifest.json`` the spend with τ, ρ and n.

DOMAIN forms (all declared, never read off the data):

* ``FILE`` — a word list, one value per line (e.g. ``/usr/share/dict/words``);
* ``SCHEMA.yaml:COLUMN`` — the domain of a column of a schema file (its ``open.tolerance`` is the
  default ρ);
* ``words:FILE`` — same as ``FILE``;
* ``pairs:FILE`` — every pair ``"w1 w2"`` of words of FILE (n = |FILE|²);
* ``string:ALPHABET:MINLEN:MAXLEN`` — every string over ALPHABET with length in the range;
* ``int:LOW:HIGH`` — the integers LOW..HIGH;
* ``list:A,B,C`` — the listed categories.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from beamsynth.pipelines.cli.console import add_check_arguments, cli_checks, cli_report, count_line
from beamsynth.pipelines.cli.synthesize import pipeline_options
from beamsynth.pipelines.io.manifest import manifest_path
from beamsynth.pipelines.io.preflight import Required
from beamsynth.pipelines.io.read import ReadRecords
from beamsynth.pipelines.io.records import rejected_path
from beamsynth.pipelines.methods.histogram import HistogramConfig, run_histogram
from beamsynth.pipelines.methods.options import AT_LEAST_ONE, OPEN_FRACTION, POSITIVE_NUMBER
from beamsynth.schemas.domains import CategoricalDomain, IntegerDomain, ProductDomain, StringDomain
from beamsynth.schemas.schema import Column, Schema, load_schema

__all__ = [
    "add_parser",
    "parse_domain",
]


DOMAIN_FORMS = ("FILE", "SCHEMA.yaml:COLUMN", "words:FILE", "pairs:FILE",
                "string:ALPHABET:MINLEN:MAXLEN", "int:LOW:HIGH", "list:A,B,C")


def _int(text: str, what: str, spec: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"domain {spec!r}: {what} ({text!r}) must be an integer") from None


def parse_domain(spec: str, *, column: str) -> Column:
    """A :class:`Column` named ``column`` for a DOMAIN argument (see the module docstring)."""
    kind, _, rest = spec.partition(":")
    if kind == "words" and rest:
        return Column(name=column, type="categorical", domain=CategoricalDomain.from_file(rest))
    if kind == "pairs" and rest:
        words = CategoricalDomain.from_file(rest)
        return Column(name=column, type="categorical", domain=ProductDomain([words, words]))
    if kind == "string" and rest:
        parts = rest.rsplit(":", 2)
        if len(parts) != 3:
            raise ValueError(f"domain {spec!r}: use string:ALPHABET:MINLEN:MAXLEN")
        dom = StringDomain(alphabet=parts[0], min_length=_int(parts[1], "MINLEN", spec),
                           max_length=_int(parts[2], "MAXLEN", spec))
        return Column(name=column, type="string", domain=dom)
    if kind == "int" and rest:
        low, sep, high = rest.rpartition(":")
        if not sep:
            raise ValueError(f"domain {spec!r}: use int:LOW:HIGH")
        dom = IntegerDomain(low=_int(low, "LOW", spec), high=_int(high, "HIGH", spec))
        return Column(name=column, type="integer", domain=dom)
    if kind == "list" and rest:
        return Column(name=column, type="categorical",
                      domain=CategoricalDomain([v for v in rest.split(",") if v]))
    head, sep, col = spec.rpartition(":")
    if sep and Path(head).suffix.lower() in (".yaml", ".yml", ".json") and Path(head).is_file():
        found = load_schema(head).column(col)
        return dataclasses.replace(found, name=column)
    if Path(spec).is_file():
        return Column(name=column, type="categorical", domain=CategoricalDomain.from_file(spec))
    raise ValueError(f"domain {spec!r} is not an existing file nor one of the forms "
                     f"{', '.join(DOMAIN_FORMS)}")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``histogram`` subcommand."""
    p = sub.add_parser(
        "histogram", help="ε-DP histogram of one column over a declared (huge) domain (CatHist)",
        description="Release the categories of one column with noisy counts over a declared "
                    "domain, without ever listing the domain: CatHist (seed 000). DOMAIN is one of "
                    + ", ".join(DOMAIN_FORMS) + ".")
    p.add_argument("input", help="input file or glob (.csv, .csv.gz, .jsonl, .avro, .parquet)")
    p.add_argument("--column", required=True, help="the column to release")
    p.add_argument("--domain", required=True, help="declared domain: " + " | ".join(DOMAIN_FORMS))
    p.add_argument("--epsilon", type=POSITIVE_NUMBER, required=True, help="ε of the release (> 0)")
    p.add_argument("--tolerance", type=OPEN_FRACTION, default=None,
                   help="ρ in (0, 1): probability that no value from outside the data is "
                        "released (default: the schema column's open.tolerance)")
    p.add_argument("--output", required=True, help="output file (.csv, .jsonl, .avro, .parquet)")
    p.add_argument("--seed", type=int, default=None,
                   help="fixed seed for tests and demos: output is marked 'seeded: not for release'")
    p.add_argument("--privacy-id", default=None, help="column identifying a privacy unit")
    p.add_argument("--max-contributions", type=AT_LEAST_ONE, default=1,
                   help="records kept per privacy unit (needs --privacy-id; default 1)")
    add_check_arguments(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace, beam_args: list[str]) -> int:
    column = parse_domain(args.domain, column=args.column)
    tolerance = args.tolerance if args.tolerance is not None else column.tolerance
    if tolerance is None:
        raise ValueError("--tolerance is required (the domain's schema column is not open)")
    cfg = HistogramConfig(input=args.input, column=column, output=args.output,
                          epsilon=args.epsilon, tolerance=tolerance, seed=args.seed,
                          privacy_id=args.privacy_id, max_contributions=args.max_contributions,
                          domain_spec=args.domain, empty_input_refused=not args.allow_empty,
                          fail_on_rejected=args.fail_on_rejected)
    required = [Required(args.column, "named by --column")] + (
        [Required(args.privacy_id, "named by --privacy-id")] if args.privacy_id else [])
    options = pipeline_options(beam_args)
    schema = Schema(name="histogram", columns=(column,), privacy_id=args.privacy_id)
    cli_checks("histogram", args, options, required=required,
               read=lambda p: p | "Read" >> ReadRecords(args.input, schema))
    if not getattr(args, "quiet", False):  # before the run, as synthesize and prefixes say theirs
        print(f"beamsynth histogram: cathist on {args.input} (column {args.column!r}, "
              f"ε={args.epsilon:g})", file=sys.stderr, flush=True)
    manifest = run_histogram(cfg, options)
    op = manifest["operational"]
    cli_report("histogram", args, op, rejected_path(args.output))
    if op.get("rows_read") and not op.get("rows_used"):  # exact, operator-only (not released)
        print(f"beamsynth histogram: warning: none of the {op['rows_read']} rows was usable (wrong "
              f"--column or domain?); the release holds only random categories. Reasons: "
              f"{rejected_path(args.output)}", file=sys.stderr)
    if not getattr(args, "quiet", False):
        rel, op, d = manifest["release"], manifest["operational"], manifest["release"]["details"]
        print(f"beamsynth histogram: {rel['rows_out']} categories of {args.column!r} released to "
              f"{args.output} (ε={args.epsilon:g}, n={d['domain_size']}, τ={d['tau']}, "
              f"ρ={d['tolerance']:g} → achieved {d['achieved_tolerance']:.4g})", file=sys.stderr)
        print(f"  {count_line(op)} (see {rejected_path(args.output)}); manifest: "
              f"{manifest_path(args.output)}" + ("  [seeded: not for release]"
                                                 if args.seed is not None else ""), file=sys.stderr)
    return 0
