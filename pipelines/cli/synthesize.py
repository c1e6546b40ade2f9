"""``beamsynth synthesize INPUT --schema S --epsilon E --output OUT [...]``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from apache_beam.options.pipeline_options import PipelineOptions

from beamsynth.pipelines.cli.console import (
    add_check_arguments,
    allowed_columns,
    cli_checks,
    cli_report,
    count_line,
    ignored_columns_note,
    method_advice,
)
from beamsynth.pipelines.io.manifest import manifest_path
from beamsynth.pipelines.io.preflight import check_noise_scales, schema_requirements
from beamsynth.pipelines.io.read import ReadRecords
from beamsynth.pipelines.io.records import (
    DEFAULT_SPLIT_BYTES,
    MAX_RECORD_LINES_LIMIT,
    rejected_path,
)
from beamsynth.pipelines.methods.options import (
    AT_LEAST_ONE,
    DELTA_NUMBER,
    OPEN_FRACTION,
    POSITIVE_NUMBER,
    Limit,
    cli_number,
)
from beamsynth.pipelines.methods.progress import Progress
from beamsynth.pipelines.methods.registry import (
    METHODS,
    _load_optional_methods,
    options_for_other_methods,
)
from beamsynth.pipelines.methods.synthesize import SynthesisConfig, plan_synthesis, run_synthesis
from beamsynth.schemas.schema import load_schema

__all__ = ["add_parser", "pipeline_options"]

COUNT_FRACTION = SynthesisConfig.count_fraction  # --count-fraction's default


def pipeline_options(beam_args: list[str]) -> PipelineOptions:
    """Beam options from the arguments the CLI did not consume (runner presets apply here)."""
    try:
        from beamsynth.runners.presets import options_for
    except ImportError:  # runner presets not installed in this build
        return PipelineOptions(beam_args)
    return options_for(beam_args)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``synthesize`` subcommand and every registered method's options."""
    _load_optional_methods()
    p = sub.add_parser(
        "synthesize", help="write a differentially private synthetic table",
        description="Read INPUT, measure it with a DP mechanism, write synthetic rows to OUTPUT "
                    "and OUTPUT.manifest.json. Extra --options go to Beam (e.g. --runner).")
    p.add_argument("input", help="input file or glob (.csv, .csv.gz, .jsonl, .avro, .parquet)")
    p.add_argument("--schema", required=True, help="schema file or bundled name (adult)")
    p.add_argument("--epsilon", type=POSITIVE_NUMBER, required=True, help="total ε of this release (> 0)")
    p.add_argument("--delta", type=DELTA_NUMBER, default=0.0, help="total δ (default 0)")
    p.add_argument("--output", required=True, help="output file (.csv, .jsonl, .avro, .parquet)")
    p.add_argument("--method", default="independent", choices=sorted(METHODS),
                   help="synthesis mechanism (default independent)")
    p.add_argument("--rows", type=int, default=None,
                   help="rows to synthesize (default: a DP estimate of the input size, which "
                        "spends --count-fraction of ε)")
    p.add_argument("--count-fraction", type=OPEN_FRACTION, default=COUNT_FRACTION,
                   help="share of ε for the DP row count when --rows is not given (default "
                        f"{COUNT_FRACTION:g})")
    p.add_argument("--count-epsilon", type=POSITIVE_NUMBER, default=None,
                   help="absolute ε for the DP row count (instead of --count-fraction)")
    p.add_argument("--privacy-id", default=None, help="column identifying a privacy unit")
    p.add_argument("--max-contributions", type=AT_LEAST_ONE, default=1,
                   help="records kept per privacy unit (needs --privacy-id; default 1)")
    p.add_argument("--split-bytes", type=cli_number(int, Limit(0)), default=DEFAULT_SPLIT_BYTES, metavar="N",
                   help="read uncompressed CSV/JSONL/Avro/Parquet files larger than N bytes in parallel parts "
                        f"(default {DEFAULT_SPLIT_BYTES >> 20} MiB; 0: one reader per file)")
    p.add_argument("--max-record-lines", type=cli_number(int, Limit(1, MAX_RECORD_LINES_LIMIT)), default=1, metavar="L",
                   help="physical lines one CSV record may span (a quoted field with line breaks; "
                        "default 1: every line is one record, exactly stable; L >= 2: one record may "
                        "change up to L used records, see docs/schema-format.md)")
    p.add_argument("--seed", type=int, default=None,
                   help="fixed seed for tests and demos: output is marked 'seeded: not for release'")
    add_check_arguments(p)
    for cls in METHODS.values():
        group = p.add_argument_group(f"method {cls.name}")
        cls.add_arguments(group)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace, beam_args: list[str]) -> int:
    schema = load_schema(args.schema)
    cfg = SynthesisConfig(
        input=args.input, schema=schema, output=args.output, epsilon=args.epsilon,
        delta=args.delta, method=args.method, rows=args.rows, privacy_id=args.privacy_id,
        max_contributions=args.max_contributions, seed=args.seed,
        count_fraction=args.count_fraction, count_epsilon=args.count_epsilon,
        split_bytes=args.split_bytes, max_record_lines=args.max_record_lines,
        empty_input_refused=not args.allow_empty, fail_on_rejected=args.fail_on_rejected,
        options=vars(args).copy())
    quiet = getattr(args, "quiet", False)
    for flag, owners in options_for_other_methods(args.method, vars(args)).items():
        print(f"beamsynth synthesize: warning: {flag} is not used by --method {args.method} "
              f"(it is an option of --method {' / '.join(owners)})", file=sys.stderr)
    if args.rows is not None:  # a public row count: no DP count is made (H101)
        for flag, given in (("--count-epsilon", args.count_epsilon is not None),
                            ("--count-fraction", args.count_fraction != COUNT_FRACTION)):
            if given:
                print(f"beamsynth synthesize: warning: {flag} is not used with --rows "
                      f"{args.rows} (a public row count: no DP count of the records is made, "
                      "and none of ε is spent on one)", file=sys.stderr)
    pid_schema = schema if args.privacy_id is None else dataclasses.replace(schema, privacy_id=args.privacy_id)
    # options, spends and noise scales are refused before any input file is opened
    check_noise_scales(plan_synthesis(cfg).accountant.spends)
    advice = method_advice(method=args.method, epsilon=args.epsilon, rows=args.rows,
                           columns=len(schema.columns), sizing=getattr(args, "pb_sizing", None))
    if advice and not quiet:
        print(f"beamsynth synthesize: note: {advice}", file=sys.stderr)
    if not quiet:
        print(f"beamsynth synthesize: {args.method} on {args.input} (ε={args.epsilon:g}"
              + (f", δ={args.delta:g}" if args.delta else "") + ")", file=sys.stderr)
    options = pipeline_options(beam_args)
    required = schema_requirements(schema, privacy_id=args.privacy_id)
    report = cli_checks("synthesize", args, options, required=required,
                        reject_extra=allowed_columns(pid_schema),
                        read=lambda p: p | "Read" >> ReadRecords(
                            args.input, pid_schema, split_bytes=args.split_bytes,
                            max_record_lines=args.max_record_lines))
    ignored = ignored_columns_note(report, pid_schema, required)
    if ignored and not quiet:
        print(f"beamsynth synthesize: note: {ignored}", file=sys.stderr)
    manifest = run_synthesis(cfg, options, progress=Progress(quiet=quiet))
    op, rel = manifest["operational"], manifest["release"]
    cli_report("synthesize", args, op, rejected_path(args.output))
    if args.rows is None and not advice:
        advice = method_advice(method=args.method, epsilon=args.epsilon, rows=rel.get("rows_out"),
                               columns=len(schema.columns), sizing=getattr(args, "pb_sizing", None))
        if advice and not quiet:  # from the released DP row count
            print(f"beamsynth synthesize: note: {advice}", file=sys.stderr)
    if not quiet:
        print(f"  {count_line(op)} → wrote {rel['rows_out']} synthetic rows to {args.output}",
              file=sys.stderr)
        for s in rel["budget"]["spends"]:
            print(f"  spent ε={s['epsilon']:g} δ={s['delta']:g} on {s['step']} ({s['mechanism']})",
                  file=sys.stderr)
        print(f"  total ε={rel['budget']['spent']['epsilon']:g} of {rel['budget']['total']['epsilon']:g}"
              f"; manifest: {manifest_path(args.output)}"
              + ("  [seeded: not for release]" if args.seed is not None else ""), file=sys.stderr)
    json.dumps(manifest, default=str)
    return 0
