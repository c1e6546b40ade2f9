"""The ``prefixes`` pipeline: one key per row encoded with a declared codec
(:mod:`beamsynth.schemas.keys`), contributions bounded per privacy unit, one of seed 003's
algorithms (:mod:`beamsynth.transforms.prefix`), then ``OUT`` (synthetic keys), ``OUT.tree.csv``
(the released prefix tree), ``OUT.rejected.jsonl`` and ``OUT.manifest.json``
(:func:`run_prefixes`). The command line is :mod:`beamsynth.pipelines.cli.prefixes`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics

from beamsynth.pipelines.io import preflight
from beamsynth.pipelines.io.dead_letters import write_rejected
from beamsynth.pipelines.io.encode import _row_text, reader_privacy_ids
from beamsynth.pipelines.io.manifest import build_manifest, manifest_path, write_json_atomic
from beamsynth.pipelines.io.read import ReadRawBlocks
from beamsynth.pipelines.io.records import (
    METRICS_NAMESPACE,
    RawBlock,
    Rejected,
    empty_input_note,
    rejected_gate_note,
    rejected_path,
)
from beamsynth.pipelines.io.single_file import remove_temp_folders_on_failure
from beamsynth.pipelines.io.write import WriteTables, ensure_parent
from beamsynth.pipelines.methods.synthesize import counter_value
from beamsynth.schemas.keys import KeyCodec
from beamsynth.schemas.schema import EncodedBatch, encode_privacy_ids
from beamsynth.transforms.budget import PrivacyAccountant, PureDP
from beamsynth.transforms.conventions import display_items, element_types
from beamsynth.transforms.prefix_decode import DecodeLeaves, release_to_table
from beamsynth.transforms.prefix_levels import (
    DPBasicPrefixHistogram,
    DPDirectPrefixSynthesis,
    DPImprovedPrefixHistogram,
)
from beamsynth.transforms.units import BoundContributions

__all__ = [
    "EncodeKeys",
    "build_prefix_pipeline",
    "run_prefixes",
    "tree_path",
]


METHODS = ("basic", "improved", "direct")


def tree_path(output: str) -> str:
    """Where the released tree of a run writing ``output`` goes."""
    return f"{output}.tree.csv"


# -- encoding ----------------------------------------------------------------------------------------
class _EncodeKeysFn(beam.DoFn):
    """RawBlock → EncodedBatch of key symbols (main) and Rejected rows (tag ``rejected``)."""

    def __init__(self, codec: KeyCodec, privacy_id: str | None, exact_ids: bool) -> None:
        self._codec, self._pid, self._exact = codec, privacy_id, exact_ids
        self._used = Metrics.counter(METRICS_NAMESPACE, "rows_encoded")
        self._rejected = Metrics.counter(METRICS_NAMESPACE, "rows_rejected_domain")

    def process(self, block: RawBlock):
        batch, rejected = encode_key_block(self._codec, self._pid, block, exact_ids=self._exact)
        self._used.inc(len(batch))
        self._rejected.inc(len(rejected))
        for r in rejected:
            yield beam.pvalue.TaggedOutput("rejected", r)
        if len(batch):
            yield batch


def encode_key_block(codec: KeyCodec, privacy_id: str | None, block: RawBlock, *,
                     exact_ids: bool) -> tuple[EncodedBatch, list[Rejected]]:
    """Encode one raw block (Beam-free); every row not encoded becomes a :class:`Rejected`.

    ``exact_ids``: privacy ids read exactly (the CLI's mode, ``reader_privacy_ids``), decided
    when the pipeline is built and carried to the workers (a worker's fresh module is not read).
    """
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
        # 7.0 = 7; digits kept beyond 2**53 (the CLI's readers keep them; H71)
        pids, why = encode_privacy_ids(block.columns[privacy_id].tolist(), privacy_id,
                                       exact=exact_ids,
                                       nan_is_empty=True)
        bad.update({i: f"privacy id {privacy_id!r} is missing" if r.endswith("is empty") else r
                    for i, r in why.items()})
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
        # how ids are read, decided here (build time) as the manifest states it (H71, H89)
        self._exact_ids = reader_privacy_ids(privacy_id) == "exact"

    def display_data(self) -> dict[str, Any]:
        """The declared key (no data values)."""
        return display_items(step="encode declared keys (dead letters tagged 'rejected')",
                             key=self._codec.kind, fanout=self._codec.fanout,
                             privacy_id=self._pid)

    def expand(self, blocks):
        out = blocks | "EncodeKeys" >> beam.ParDo(_EncodeKeysFn(self._codec, self._pid, self._exact_ids)).with_outputs(
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
                          restore_discount: int | None = None, reduce: bool = False) -> dict[str, Any]:
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
    keys = (released | "Synthesize" >> DecodeLeaves(codec=codec, seed=seed, restore_discount=restore_discount,
                                                    reduce=reduce)
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
                 options: Any = None, restore: bool = False, reduce: bool | None = None,
                 empty_input_refused: bool = False, fail_on_rejected: float | None = None,
                 **method_args: Any) -> dict[str, Any]:
    """Build (spending the budget), run, write the manifest; returns the manifest.

    ``reduce`` (direct only; default on for direct): put unresolved mass on the nearest released
    complete keys before writing (:func:`~beamsynth.transforms.prefix.reduce_to_ancestor`,
    post-processing), so ``OUT`` holds the noisy total.
    """
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
    if reduce is None:
        reduce = method == "direct"
    if reduce and method != "direct":
        raise ValueError(f"reduce-to-ancestor applies to the direct method, not {method!r}")
    build_prefix_pipeline(p, input=input, codec=codec, transform=transform, output=output,
                          privacy_id=privacy_id, max_contributions=max_contributions, seed=seed,
                          restore_discount=restore_t, reduce=reduce)
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
              "mass_reduced_to_keys": counter_value(result, "mass_reduced_to_keys") if reduce else None,
              "seconds": round(time.time() - start, 3)}
    spec = codec.to_spec()
    manifest = build_manifest(
        command="prefixes", method=method, inputs=[input],
        outputs={"synthetic": output, "tree": tree_path(output), "rejected": rejected_path(output),
                 "manifest": manifest_path(output)},
        schema_name=f"key:{codec.kind}",
        schema_fingerprint=hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest(),
        accountant=accountant.to_dict(), seed=seed,
        privacy_unit={"privacy_id": privacy_id, "max_contributions": max_contributions,
                      "neighbouring": "add/remove one privacy unit",
                      **empty_input_note(empty_input_refused), **rejected_gate_note(fail_on_rejected)},
        counts=counts, privacy_ids=reader_privacy_ids(privacy_id),  # as encode_key_block read them
        details={"key": spec, "accounting": transform.accounting.to_dict(),
                 "restore_discount": bool(restore), "reduce_to_ancestor": bool(reduce),
                 "tree_note": "improved: internal nodes carry no count (only split "
                              "decisions are released); leaves with count <= 0 omitted"})
    write_json_atomic(manifest_path(output), manifest)
    return manifest
