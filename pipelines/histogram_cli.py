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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.options.pipeline_options import PipelineOptions

from beamsynth.pipelines.io.dead_letters import write_rejected
from beamsynth.pipelines.io.manifest import build_manifest, manifest_path, write_json_atomic
from beamsynth.pipelines.io.preflight import (
    Required,
    add_check_arguments,
    check_noise_scales,
    cli_checks,
    cli_report,
    count_line,
)
from beamsynth.pipelines.io.read import ReadRecords
from beamsynth.pipelines.io.records import METRICS_NAMESPACE, rejected_path
from beamsynth.pipelines.io.single_file import remove_temp_folders_on_failure
from beamsynth.pipelines.io.write import WriteTables, ensure_parent
from beamsynth.pipelines.synthesize import counter_value
from beamsynth.pipelines.synthesize_cli import pipeline_options
from beamsynth.schemas.domains import CategoricalDomain, IntegerDomain, ProductDomain, StringDomain
from beamsynth.schemas.schema import Column, Schema, avro_field_name, load_schema
from beamsynth.transforms.budget import PrivacyAccountant, PureDP
from beamsynth.transforms.cathist import ColumnCells, DPCategoricalHistogram, histogram_table
from beamsynth.transforms.units import BoundContributions

__all__ = ["HistogramConfig", "add_parser", "parse_domain", "run_histogram"]

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


@dataclass
class HistogramConfig:
    """Everything a ``histogram`` run needs."""

    input: str
    column: Column
    output: str
    epsilon: float
    tolerance: float
    seed: int | None = None
    privacy_id: str | None = None
    max_contributions: int = 1
    domain_spec: str = ""


def _count_column_name(column: str) -> str:
    return "noisy_count" if column == "count" else "count"


def _to_table(released, column: Column):
    name = column.name
    return histogram_table(released, column.decode, column=name, count=_count_column_name(name))


def _count_out(table):
    beam.metrics.Metrics.counter(METRICS_NAMESPACE, "categories_released").inc(table.num_rows)
    return table


def run_histogram(cfg: HistogramConfig, options: PipelineOptions | None = None) -> dict[str, Any]:
    """Spend the budget, run the pipeline, write OUT, OUT.rejected.jsonl and the manifest."""
    k = cfg.max_contributions
    if cfg.privacy_id is None and k != 1:
        raise ValueError(f"max_contributions ({k}) needs --privacy-id; without one every record "
                         "is its own privacy unit")
    if cfg.privacy_id is not None and cfg.privacy_id == cfg.column.name:
        raise ValueError(f"privacy id column {cfg.privacy_id!r} must differ from the released column")
    schema = Schema(name="histogram", columns=(cfg.column,), privacy_id=cfg.privacy_id)
    cells = ColumnCells(cfg.column)
    budget = PureDP(epsilon=cfg.epsilon)  # raises on ε <= 0, echoing the value
    hist = DPCategoricalHistogram(domain=cells, budget=budget, tolerance=cfg.tolerance,
                                  max_contributions=k, seed=cfg.seed)
    accountant = PrivacyAccountant(total=budget)
    accountant.spend(f"cathist.{cfg.column.name}", budget,
                     mechanism="CatHist: discrete Laplace on every declared bin, keep ≥ τ",
                     details={"column": cfg.column.name, **hist.plan.details()})
    check_noise_scales(accountant.spends)
    start = time.time()
    p = beam.Pipeline(options=options or PipelineOptions([]))
    read = p | "Read" >> ReadRecords(cfg.input, schema)
    batches = read["batches"]
    # EncodedBatch (one column of cell codes)
    if cfg.privacy_id is not None:
        batches = batches | "BoundContributions" >> BoundContributions(max_contributions=k,
                                                                        seed=cfg.seed)
        # EncodedBatch, <= k rows per privacy id
    column = cfg.column
    tables = (
        batches
        | "CatHist" >> hist
        # ReleasedHistogram
        | "ToTable" >> beam.Map(_to_table, column)
        # pyarrow.Table (category, noisy count)
        | "CountOut" >> beam.Map(_count_out)
    )
    ensure_parent(cfg.output)
    names = [column.name, _count_column_name(column.name)]
    arrow = pa.schema([pa.field(names[0], pa.string()), pa.field(names[1], pa.int64())])
    avro = {"type": "record", "name": "histogram", "namespace": "beamsynth.release",
            "fields": [{"name": avro_field_name(names[0]), "type": ["null", "string"]},
                       {"name": avro_field_name(names[1]), "type": "long"}]}
    tables | "Write" >> WriteTables(cfg.output, column_names=names, arrow_schema=arrow,
                                    avro_schema=avro)
    write_rejected(read["rejected"], cfg.output)
    with remove_temp_folders_on_failure(p):  # a failed run leaves no .beamsynth-temp-* folder
        result = p.run()
        result.wait_until_finish()
    rej = [counter_value(result, n) for n in ("rows_rejected_unparseable", "rows_rejected_domain")]
    used, dropped = counter_value(result, "rows_encoded"), (
        counter_value(result, "rows_dropped_by_bound") if cfg.privacy_id else 0)
    counts = {"rows_read": counter_value(result, "rows_read"), "rows_dropped_by_bound": dropped,
              "rows_used": None if None in (used, dropped) else used - dropped,  # after bounding
              "rows_rejected": None if None in rej else sum(rej),
              "rows_out": counter_value(result, "categories_released"),
              "seconds": round(time.time() - start, 3)}
    manifest = build_manifest(
        command="histogram", method="cathist", inputs=[cfg.input],
        outputs={"histogram": cfg.output, "rejected": rejected_path(cfg.output),
                 "manifest": manifest_path(cfg.output)},
        schema_name=schema.name, schema_fingerprint=schema.fingerprint(),
        accountant=accountant.to_dict(), seed=cfg.seed,
        privacy_unit={"privacy_id": cfg.privacy_id, "max_contributions": k,
                      "neighbouring": "add/remove one privacy unit"},
        counts=counts,
        details={"column": column.name, "domain": cfg.domain_spec or column.domain.to_spec(),
                 **hist.plan.details(),
                 "empty_input": "still ε-DP: only random categories (none with probability ≥ ρ)"},
    )
    write_json_atomic(manifest_path(cfg.output), manifest)
    return manifest


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
    p.add_argument("--epsilon", type=float, required=True, help="ε of the release (> 0)")
    p.add_argument("--tolerance", type=float, default=None,
                   help="ρ in (0, 1): probability that no value from outside the data is "
                        "released (default: the schema column's open.tolerance)")
    p.add_argument("--output", required=True, help="output file (.csv, .jsonl, .avro, .parquet)")
    p.add_argument("--seed", type=int, default=None,
                   help="fixed seed for tests and demos: output is marked 'seeded: not for release'")
    p.add_argument("--privacy-id", default=None, help="column identifying a privacy unit")
    p.add_argument("--max-contributions", type=int, default=1,
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
                          domain_spec=args.domain)
    required = [Required(args.column, "named by --column")] + (
        [Required(args.privacy_id, "named by --privacy-id")] if args.privacy_id else [])
    options = pipeline_options(beam_args)
    schema = Schema(name="histogram", columns=(column,), privacy_id=args.privacy_id)
    cli_checks("histogram", args, options, required=required,
               read=lambda p: p | "Read" >> ReadRecords(args.input, schema))
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
