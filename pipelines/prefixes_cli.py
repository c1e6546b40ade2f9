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
import hashlib
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics

from beamsynth.pipelines.io import preflight
from beamsynth.pipelines.io.dead_letters import write_rejected
from beamsynth.pipelines.io.encode import _row_text
from beamsynth.pipelines.io.manifest import build_manifest, manifest_path, write_json_atomic
from beamsynth.pipelines.io.read import ReadRawBlocks
from beamsynth.pipelines.io.records import METRICS_NAMESPACE, RawBlock, Rejected, rejected_path
from beamsynth.pipelines.io.single_file import remove_temp_folders_on_failure
from beamsynth.pipelines.io.write import WriteTables, ensure_parent
from beamsynth.pipelines.synthesize import counter_value
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
from beamsynth.schemas.schema import EncodedBatch
from beamsynth.transforms.budget import PrivacyAccountant, PureDP
from beamsynth.transforms.conventions import display_items, element_types
from beamsynth.transforms.prefix import (
    CALIBRATIONS,
    DISCOUNTS,
    DecodeLeaves,
    DPBasicPrefixHistogram,
    DPDirectPrefixSynthesis,
    DPImprovedPrefixHistogram,
    release_to_table,
)
from beamsynth.transforms.units import BoundContributions

__all__ = ["EncodeKeys", "add_parser", "build_codec", "build_prefix_pipeline", "run_prefixes", "tree_path"]

METHODS = ("basic", "improved", "direct")


def tree_path(output: str) -> str:
    """Where the released tree of a run writing ``output`` goes."""
    return f"{output}.tree.csv"


# -- encoding ----------------------------------------------------------------------------------------
class _EncodeKeysFn(beam.DoFn):
    """RawBlock → EncodedBatch of key symbols (main) and Rejected rows (tag ``rejected``)."""

    def __init__(self, codec: KeyCodec, privacy_id: str | None) -> None:
        self._codec, self._pid = codec, privacy_id
        self._used = Metrics.counter(METRICS_NAMESPACE, "rows_encoded")
        self._rejected = Metrics.counter(METRICS_NAMESPACE, "rows_rejected_domain")

    def process(self, block: RawBlock):
        batch, rejected = encode_key_block(self._codec, self._pid, block)
        self._used.inc(len(batch))
        self._rejected.inc(len(rejected))
        for r in rejected:
            yield beam.pvalue.TaggedOutput("rejected", r)
        if len(batch):
            yield batch


def encode_key_block(codec: KeyCodec, privacy_id: str | None, block: RawBlock
                     ) -> tuple[EncodedBatch, list[Rejected]]:
    """Encode one raw block (Beam-free); every row not encoded becomes a :class:`Rejected`."""
    n = len(block)
    need = list(codec.input_columns) + ([privacy_id] if privacy_id else [])
    missing = [c for c in need if c not in block.columns]

    def rej(i: int, reason: str) -> Rejected:
        return Rejected(block.source, int(block.rows[i]), reason, raw=_row_text(block, i),
                        line=None if block.lines is None else int(block.lines[i]))

    empty = EncodedBatch(np.zeros((0, codec.depth), codec.symbol_dtype),
                         None if privacy_id is None else np.zeros(0, dtype=object))
    if missing:
        return empty, [rej(i, f"file header lacks column(s) {missing}") for i in range(n)]
    bad: dict[int, str] = {}
    pids = None
    if privacy_id:
        pids = block.columns[privacy_id].astype(str).to_numpy(dtype=object)
        nulls = block.columns[privacy_id].isna().to_numpy() | (pids == "")
        bad.update({int(i): f"privacy id {privacy_id!r} is missing" for i in np.flatnonzero(nulls)})
    codes, key_bad = codec.encode(block.columns)
    ok_rows = np.setdiff1d(np.arange(n), [i for i, _ in key_bad]) if key_bad else np.arange(n)
    for i, reason in key_bad:
        bad.setdefault(i, reason)
    keep = np.array([i not in bad for i in ok_rows.tolist()], dtype=bool)
    codes = codes[keep]
    if pids is not None:
        pids = pids[ok_rows[keep]]
    return EncodedBatch(codes, pids), [rej(i, r) for i, r in sorted(bad.items())]


@element_types(input=RawBlock, outputs={"batches": EncodedBatch, "rejected": Rejected})
class EncodeKeys(beam.PTransform):
    """``RawBlock`` → ``{"batches": EncodedBatch, "rejected": Rejected}`` for a key codec."""

    def __init__(self, *, codec: KeyCodec, privacy_id: str | None = None, label: str | None = None) -> None:
        super().__init__(label)
        if not isinstance(codec, KeyCodec):
            raise TypeError(f"codec must be a KeyCodec, got {type(codec).__name__}")
        self._codec, self._pid = codec, privacy_id

    def display_data(self) -> dict[str, Any]:
        """The declared key (no data values)."""
        return display_items(step="encode declared keys (dead letters tagged 'rejected')",
                             key=self._codec.kind, fanout=self._codec.fanout,
                             privacy_id=self._pid)

    def expand(self, blocks):
        out = blocks | "EncodeKeys" >> beam.ParDo(_EncodeKeysFn(self._codec, self._pid)).with_outputs(
            "rejected", main="batches")
        # batches: EncodedBatch (codes (n, depth) symbols, pids), rejected: Rejected
        return {"batches": out.batches, "rejected": out.rejected}


# -- the pipeline -------------------------------------------------------------------------------------
def make_transform(*, method: str, codec: KeyCodec, epsilon: float, max_contributions: int,
                   seed: int | None, accountant: PrivacyAccountant, max_depth: int | None = None,
                   discount: str = "proportional", threshold: float | None = None,
                   final_fraction: float = 0.25, calibration: str = "tight",
                   prune: bool | None = None, terminal_budget: bool = True) -> beam.PTransform:
    """The method's PTransform; spends the budget on ``accountant`` now (build time)."""
    budget = PureDP(epsilon=epsilon)
    if method == "basic":
        return DPBasicPrefixHistogram(codec=codec, budget=budget, max_depth=max_depth,
                                      max_contributions=max_contributions, final_fraction=final_fraction,
                                      threshold=threshold, seed=seed, accountant=accountant)
    if method == "improved":
        return DPImprovedPrefixHistogram(codec=codec, budget=budget, max_contributions=max_contributions,
                                         discount=discount, threshold=threshold, calibration=calibration,
                                         seed=seed, accountant=accountant)
    if method == "direct":
        return DPDirectPrefixSynthesis(codec=codec, budget=budget, max_depth=max_depth,
                                       max_contributions=max_contributions, prune=prune,
                                       terminal_budget=terminal_budget, seed=seed, accountant=accountant)
    raise ValueError(f"method ({method!r}) must be one of {METHODS}")


def _count_rows(table: pa.Table) -> pa.Table:
    Metrics.counter(METRICS_NAMESPACE, "rows_synthesized").inc(table.num_rows)
    return table


def build_prefix_pipeline(p: beam.Pipeline, *, input: str | Sequence[str], codec: KeyCodec,
                          transform: beam.PTransform, output: str, privacy_id: str | None,
                          max_contributions: int, seed: int | None,
                          restore_discount: int | None = None) -> dict[str, Any]:
    """Wire read → encode → bound → levels → decode → write into ``p``."""
    raw = p | "Read" >> ReadRawBlocks(input)
    # blocks: RawBlock, rejected: Rejected
    enc = raw["blocks"] | "Encode" >> EncodeKeys(codec=codec, privacy_id=privacy_id)
    batches = enc["batches"]
    # EncodedBatch of key symbols
    if privacy_id:
        batches = batches | "BoundContributions" >> BoundContributions(
            max_contributions=max_contributions, seed=seed)
        # EncodedBatch, <= k rows per privacy id
    released = batches | "Prefixes" >> transform
    # LevelRelease per level and window
    keys = (released | "Synthesize" >> DecodeLeaves(codec=codec, seed=seed, restore_discount=restore_discount)
            | "CountOut" >> beam.Map(_count_rows))
    # pyarrow.Table of synthetic keys
    ensure_parent(output)
    keys | "WriteKeys" >> WriteTables(output, column_names=list(codec.output_columns))
    tree = released | "TreeRows" >> beam.Map(release_to_table, codec)
    # pyarrow.Table (depth, prefix, count, leaf)
    tree | "WriteTree" >> WriteTables(tree_path(output), column_names=["depth", "prefix", "count", "leaf"])
    rejected = (raw["rejected"], enc["rejected"]) | "MergeRejected" >> beam.Flatten()
    write_rejected(rejected, output)
    return {"batches": batches, "released": released, "keys": keys, "rejected": rejected}


def run_prefixes(*, input: str, codec: KeyCodec, method: str, epsilon: float, output: str,
                 privacy_id: str | None = None, max_contributions: int = 1, seed: int | None = None,
                 options: Any = None, restore: bool = False, **method_args: Any) -> dict[str, Any]:
    """Build (spending the budget), run, write the manifest; returns the manifest."""
    from apache_beam.options.pipeline_options import PipelineOptions

    if privacy_id is None and max_contributions != 1:
        raise ValueError(f"--max-contributions ({max_contributions}) needs --privacy-id")
    accountant = PrivacyAccountant(total=PureDP(epsilon=epsilon))
    transform = make_transform(method=method, codec=codec, epsilon=epsilon,
                               max_contributions=max_contributions, seed=seed, accountant=accountant,
                               **method_args)
    preflight.check_noise_scales(accountant.spends)
    start = time.time()
    p = beam.Pipeline(options=options or PipelineOptions([]))
    if restore and method != "improved":
        raise ValueError(f"--restore-discount applies to the improved method, not {method!r}")
    restore_t = transform.accounting.discount if restore else None
    build_prefix_pipeline(p, input=input, codec=codec, transform=transform, output=output,
                          privacy_id=privacy_id, max_contributions=max_contributions, seed=seed,
                          restore_discount=restore_t)
    with remove_temp_folders_on_failure(p):  # a failed run leaves no .beamsynth-temp-* folder
        result = p.run()
        result.wait_until_finish()
    rej = [counter_value(result, "rows_rejected_unparseable"), counter_value(result, "rows_rejected_domain")]
    used, dropped = counter_value(result, "rows_encoded"), (
        counter_value(result, "rows_dropped_by_bound") if privacy_id else 0)
    counts = {"rows_read": counter_value(result, "rows_read"), "rows_dropped_by_bound": dropped,
              "rows_used": None if None in (used, dropped) else used - dropped,  # after bounding
              "rows_rejected": None if None in rej else sum(rej),  # type: ignore[arg-type]
              "rows_out": counter_value(result, "rows_synthesized"),
              "incomplete_leaf_mass_dropped": counter_value(result, "incomplete_leaf_mass_dropped"),
              "seconds": round(time.time() - start, 3)}
    spec = codec.to_spec()
    manifest = build_manifest(
        command="prefixes", method=method, inputs=[input],
        outputs={"synthetic": output, "tree": tree_path(output), "rejected": rejected_path(output),
                 "manifest": manifest_path(output)},
        schema_name=f"key:{codec.kind}",
        schema_fingerprint=hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest(),
        accountant=accountant.to_dict(), seed=seed,
        privacy_unit={"privacy_id": privacy_id, "max_contributions": max_contributions},
        counts=counts, details={"key": spec, "accounting": transform.accounting.to_dict(),
                                "restore_discount": bool(restore),
                                "tree_note": "improved: internal nodes carry no count (only split "
                                             "decisions are released); leaves with count <= 0 omitted"})
    write_json_atomic(manifest_path(output), manifest)
    return manifest


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
    p.add_argument("--epsilon", type=float, required=True, help="total ε (> 0)")
    p.add_argument("--output", required=True, help="synthetic keys file (.csv, .jsonl, ...)")
    p.add_argument("--privacy-id", default=None, help="column identifying a privacy unit")
    p.add_argument("--max-contributions", type=int, default=1, help="rows kept per unit (default 1)")
    p.add_argument("--seed", type=int, default=None, help="tests/demos only: 'seeded: not for release'")
    g = p.add_argument_group("text keys")
    g.add_argument("--column", default=None, help="the text column")
    g.add_argument("--alphabet", default=DEFAULT_ALPHABET, help="declared characters (default a-z0-9 space .)")
    g.add_argument("--max-length", type=int, default=20, help="longest string (default 20)")
    g.add_argument("--no-casefold", action="store_true", help="do not fold case")
    g.add_argument("--map", action="append", help="character map X=Y (repeatable; Y may be empty)")
    g.add_argument("--on-other", choices=("reject", "drop"), default="reject",
                   help="characters outside the alphabet: reject the row or drop the character")
    g.add_argument("--on-too-long", choices=("reject", "truncate"), default="reject")
    g.add_argument("--strip", action="store_true", help="strip surrounding whitespace")
    g = p.add_argument_group("spatial and hierarchy keys")
    g.add_argument("--columns", default=None, help="coordinate or level columns, comma-separated")
    g.add_argument("--box", default="world", help="'world' (lat,lon) or 'lo,hi;lo,hi;...' per column")
    g.add_argument("--depth", type=int, default=16, help="spatial levels (default 16)")
    g.add_argument("--on-outside", choices=("reject", "clip"), default="reject")
    g.add_argument("--tree", default=None, help="hierarchy: YAML nested mapping of declared values")
    g = p.add_argument_group("method options")
    g.add_argument("--max-depth", type=int, default=None,
                   help="basic/direct: levels measured (default: the key's full depth)")
    g.add_argument("--discount", choices=DISCOUNTS, default="proportional", help="improved: discount rule (default proportional)")
    g.add_argument("--threshold", type=float, default=None,
                   help="split threshold b (default 2·scale·ln(fanout), from public parameters)")
    g.add_argument("--restore-discount", action="store_true",
                   help="improved: give the discounted records back to the leaves (post-processing "
                        "of the released tree) before writing synthetic keys")
    g.add_argument("--final-fraction", type=float, default=0.25,
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
    preflight.add_check_arguments(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace, beam_args: list[str]) -> int:
    from beamsynth.pipelines.synthesize_cli import pipeline_options

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

    preflight.cli_checks("prefixes", args, options, required=required, read=read)
    manifest = run_prefixes(input=args.input, codec=codec, method=args.method, epsilon=args.epsilon,
                            output=args.output, privacy_id=args.privacy_id,
                            max_contributions=args.max_contributions, seed=args.seed,
                            options=options, **method_args)
    op, rel = manifest["operational"], manifest["release"]
    preflight.cli_report("prefixes", args, op, rejected_path(args.output))
    if not quiet:
        print(f"  {preflight.count_line(op)} → {rel['rows_out']} synthetic keys in {args.output}, tree in "
              f"{tree_path(args.output)}", file=sys.stderr)
        for s in rel["budget"]["spends"]:
            print(f"  spent ε={s['epsilon']:g} on {s['step']} ({s['mechanism']})", file=sys.stderr)
        print(f"  manifest: {manifest_path(args.output)}"
              + ("  [seeded: not for release]" if args.seed is not None else ""), file=sys.stderr)
    return 0
