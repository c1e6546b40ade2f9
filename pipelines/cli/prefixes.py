"""``beamsynth prefixes INPUT --kind text|spatial|hierarchy ... --method M --epsilon E --output OUT``.

Reads INPUT, encodes one key per row with a declared codec (:mod:`beamsynth.schemas.keys`),
bounds contributions per privacy unit, runs one of seed 003's algorithms
(:mod:`beamsynth.transforms.prefix`) and writes:

* ``OUT``: the synthetic keys, one per row (complete strings for text; points for spatial;
  one column per level for hierarchies);
* ``OUT.tree.csv``: the released prefix tree (depth, prefix, noisy count, leaf);
* ``OUT.rejected.jsonl``: rows that could not be encoded, each with its reason;
* ``OUT.manifest.json``: budget spends, accounting, key declaration, exact operational counts.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import apache_beam as beam

from beamsynth.pipelines.cli import console
from beamsynth.pipelines.io import preflight
from beamsynth.pipelines.io.manifest import manifest_path
from beamsynth.pipelines.io.read import ReadRawBlocks
from beamsynth.pipelines.io.records import rejected_path
from beamsynth.pipelines.methods.options import (
    AT_LEAST_ONE,
    OPEN_FRACTION,
    POSITIVE_NUMBER,
    Limit,
    cli_number,
)
from beamsynth.pipelines.methods.prefixes import METHODS, EncodeKeys, run_prefixes, tree_path
from beamsynth.schemas.keys import (
    DEFAULT_ALPHABET,
    WORLD_BOX,
    HierarchyKeyCodec,
    KeyCodec,
    SpatialKeyCodec,
    TextKeyCodec,
    load_key_spec,
    load_tree,
)
from beamsynth.transforms.prefix_accounting import CALIBRATIONS
from beamsynth.transforms.prefix_tree import DISCOUNTS

__all__ = [
    "add_parser",
    "build_codec",
]


# -- command line --------------------------------------------------------------------------------------
def _parse_box(text: str, dims: int) -> list[tuple[float, float]]:
    if text == "world":
        if dims != 2:
            raise ValueError(f"--box world needs two columns (lat, lon), got {dims}")
        return [tuple(p) for p in WORLD_BOX]  # type: ignore[misc]
    parts = [p for p in text.split(";") if p.strip()]
    try:
        box = [tuple(float(x) for x in p.split(",")) for p in parts]
    except ValueError as exc:
        raise ValueError(f"--box ({text!r}) must be 'world' or 'lo,hi;lo,hi;...'") from exc
    if len(box) != dims or any(len(b) != 2 for b in box):
        raise ValueError(f"--box ({text!r}) needs one 'lo,hi' pair per column ({dims})")
    return box  # type: ignore[return-value]


def _parse_map(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for it in items:
        if "=" not in it or len(it.split("=", 1)[0]) != 1:
            raise ValueError(f"--map ({it!r}) must look like 'X=Y' (one character X, Y may be empty)")
        k, v = it.split("=", 1)
        out[k] = v
    return out


def build_codec(args: argparse.Namespace) -> KeyCodec:
    """The key codec from ``--key-spec`` or the kind-specific flags."""
    if args.key_spec:
        return load_key_spec(args.key_spec)
    if args.kind == "text":
        if not args.column:
            raise ValueError("--kind text needs --column")
        return TextKeyCodec(column=args.column, alphabet=args.alphabet, max_length=args.max_length,
                            casefold=not args.no_casefold, char_map=_parse_map(args.map or []),
                            on_other=args.on_other, on_too_long=args.on_too_long, strip=args.strip)
    cols = [c.strip() for c in (args.columns or "").split(",") if c.strip()]
    if not cols:
        raise ValueError(f"--kind {args.kind} needs --columns A,B,...")
    if args.kind == "spatial":
        return SpatialKeyCodec(columns=cols, box=_parse_box(args.box, len(cols)), depth=args.depth,
                               on_outside=args.on_outside)
    if not args.tree:
        raise ValueError("--kind hierarchy needs --tree FILE (YAML nested mapping)")
    return HierarchyKeyCodec(columns=cols, tree=load_tree(args.tree))


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``prefixes`` subcommand."""
    p = sub.add_parser(
        "prefixes", help="DP prefix tree and synthetic keys for text, spatial or hierarchical keys",
        description="Hierarchical prefix counting and synthesis (adaptive histograms, direct "
                    "synthesis). Writes OUT, OUT.tree.csv, OUT.rejected.jsonl, OUT.manifest.json.")
    p.add_argument("input", help="input file or glob (.csv, .csv.gz, .jsonl, .avro, .parquet)")
    p.add_argument("--kind", choices=("text", "spatial", "hierarchy"), default="text")
    p.add_argument("--key-spec", default=None, help="YAML file with a top-level 'key:' declaration")
    p.add_argument("--method", choices=METHODS, default="improved")
    p.add_argument("--epsilon", type=POSITIVE_NUMBER, required=True, help="total ε (> 0)")
    p.add_argument("--output", required=True, help="synthetic keys file (.csv, .jsonl, ...)")
    p.add_argument("--privacy-id", default=None, help="column identifying a privacy unit")
    p.add_argument("--max-contributions", type=AT_LEAST_ONE, default=1, help="rows kept per unit (default 1)")
    p.add_argument("--seed", type=int, default=None, help="tests/demos only: 'seeded: not for release'")
    g = p.add_argument_group("text keys")
    g.add_argument("--column", default=None, help="the text column")
    g.add_argument("--alphabet", default=DEFAULT_ALPHABET, help="declared characters (default a-z0-9 space .)")
    g.add_argument("--max-length", type=cli_number(int, Limit(1, 1000)), default=20, help="longest string (default 20)")
    g.add_argument("--no-casefold", action="store_true", help="do not fold case")
    g.add_argument("--map", action="append", help="character map X=Y (repeatable; Y may be empty)")
    g.add_argument("--on-other", choices=("reject", "drop"), default="reject",
                   help="characters outside the alphabet: reject the row or drop the character")
    g.add_argument("--on-too-long", choices=("reject", "truncate"), default="reject")
    g.add_argument("--strip", action="store_true", help="strip surrounding whitespace")
    g = p.add_argument_group("spatial and hierarchy keys")
    g.add_argument("--columns", default=None, help="coordinate or level columns, comma-separated")
    g.add_argument("--box", default="world", help="'world' (lat,lon) or 'lo,hi;lo,hi;...' per column")
    g.add_argument("--depth", type=AT_LEAST_ONE, default=16, help="spatial levels (default 16)")
    g.add_argument("--on-outside", choices=("reject", "clip"), default="reject")
    g.add_argument("--tree", default=None, help="hierarchy: YAML nested mapping of declared values")
    g = p.add_argument_group("method options")
    g.add_argument("--max-depth", type=AT_LEAST_ONE, default=None,
                   help="basic/direct: levels measured (default: the key's full depth)")
    g.add_argument("--discount", choices=DISCOUNTS, default="proportional", help="improved: discount rule (default proportional)")
    g.add_argument("--threshold", type=POSITIVE_NUMBER, default=None,
                   help="split threshold b (default 2·scale·ln(fanout), from public parameters)")
    g.add_argument("--restore-discount", action="store_true",
                   help="improved: give the discounted records back to the leaves (post-processing "
                        "of the released tree) before writing synthetic keys")
    g.add_argument("--final-fraction", type=OPEN_FRACTION, default=0.25,
                   help="basic: share of ε for re-measuring the leaves (default 0.25)")
    g.add_argument("--calibration", choices=CALIBRATIONS, default="tight",
                   help="improved: noise/threshold/discount from the exact worst-case loss (tight, "
                        "default) or the paper's Theorem 3 split (theorem3)")
    g.add_argument("--no-prune", dest="prune", action="store_const", const=False, default=None,
                   help="direct, text keys: Center over every child (the paper's Figure 4) instead of "
                        "only the children whose noisy count reaches the public threshold (by default only "
                        "text keys are pruned)")
    g.add_argument("--no-terminal-budget", dest="terminal_budget", action="store_false",
                   help="direct: measure end-of-string cells at the same scale as every other cell "
                        "instead of giving them the budget the record's shorter path leaves unused")
    g.add_argument("--no-reduce", dest="reduce", action="store_false",
                   help="direct: drop unresolved mass (prefixes that are no key) instead of putting it on "
                        "the nearest released complete keys (post-processing; by default OUT holds the "
                        "noisy total)")
    console.add_check_arguments(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace, beam_args: list[str]) -> int:
    from beamsynth.pipelines.cli.synthesize import pipeline_options

    codec = build_codec(args)
    method_args: dict[str, Any] = {"threshold": args.threshold}
    if args.method in ("basic", "direct"):
        method_args["max_depth"] = args.max_depth
    if args.method == "basic":
        method_args["final_fraction"] = args.final_fraction
    if args.method == "improved":
        method_args["discount"] = args.discount
        method_args["restore"] = args.restore_discount
        method_args["calibration"] = args.calibration
    if args.method == "direct":
        method_args.pop("threshold")
        method_args["prune"] = args.prune
        method_args["terminal_budget"] = args.terminal_budget
        method_args["reduce"] = args.reduce
    quiet = getattr(args, "quiet", False)
    if not quiet:
        print(f"beamsynth prefixes: {args.method} on {args.input} ({codec.kind}, ε={args.epsilon:g})",
              file=sys.stderr)
    flag = "--key-spec" if args.key_spec else ("--column" if args.kind == "text" else "--columns")
    required = [preflight.Required(c, f"named by {flag}") for c in codec.input_columns] + (
        [preflight.Required(args.privacy_id, "named by --privacy-id")] if args.privacy_id else [])
    options = pipeline_options(beam_args)

    def read(p: beam.Pipeline) -> None:
        raw = p | "Read" >> ReadRawBlocks(args.input)
        _ = raw["blocks"] | "Encode" >> EncodeKeys(codec=codec, privacy_id=args.privacy_id)

    console.cli_checks("prefixes", args, options, required=required, read=read,
                       outputs=[tree_path(args.output)])
    manifest = run_prefixes(input=args.input, codec=codec, method=args.method, epsilon=args.epsilon,
                            output=args.output, privacy_id=args.privacy_id,
                            max_contributions=args.max_contributions, seed=args.seed,
                            options=options, empty_input_refused=not args.allow_empty,
                            fail_on_rejected=args.fail_on_rejected, **method_args)
    op, rel = manifest["operational"], manifest["release"]
    console.cli_report("prefixes", args, op, rejected_path(args.output))
    if not quiet:
        print(f"  {console.count_line(op)} → {rel['rows_out']} synthetic keys in {args.output}, tree in "
              f"{tree_path(args.output)}", file=sys.stderr)
        for s in rel["budget"]["spends"]:
            print(f"  spent ε={s['epsilon']:g} on {s['step']} ({s['mechanism']})", file=sys.stderr)
        print(f"  manifest: {manifest_path(args.output)}"
              + ("  [seeded: not for release]" if args.seed is not None else ""), file=sys.stderr)
    return 0
