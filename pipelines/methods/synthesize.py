"""The ``synthesize`` pipeline: read → bound → measure (DP) → fit → sample → write, + manifest.

:func:`plan_synthesis` builds the accountant and every spend **before** any data is read; a
configuration that would overspend raises :class:`~beamsynth.transforms.budget.BudgetExceededError`
there. :func:`build_synthesis` wires the Beam graph; :func:`run_synthesis` runs it and writes the
manifest atomically next to the output.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.options.pipeline_options import PipelineOptions

from beamsynth.pipelines.io.dead_letters import write_rejected
from beamsynth.pipelines.io.encode import reader_privacy_ids
from beamsynth.pipelines.io.manifest import build_manifest, manifest_path, write_json_atomic
from beamsynth.pipelines.io.metrics import run_counters
from beamsynth.pipelines.io.preflight import check_noise_scales
from beamsynth.pipelines.io.read import ReadRecords
from beamsynth.pipelines.io.records import (
    DEFAULT_SPLIT_BYTES,
    METRICS_NAMESPACE,
    empty_input_note,
    record_lines_note,
    rejected_gate_note,
    rejected_path,
)
from beamsynth.pipelines.io.single_file import remove_temp_folders_on_failure
from beamsynth.pipelines.io.write import WriteTables, ensure_parent
from beamsynth.pipelines.methods.progress import Progress, RowProgressFn
from beamsynth.pipelines.methods.registry import Method, get_method
from beamsynth.pipelines.methods.wording import Vocabulary
from beamsynth.runners.presets import is_beam_dask, is_dask
from beamsynth.schemas.schema import Schema
from beamsynth.schemas.tables import arrow_schema_for
from beamsynth.transforms.budget import (
    BudgetExceededError,
    PrivacyAccountant,
    as_budget,
    check_rows,
)
from beamsynth.transforms.synthesis import DEFAULT_SHARD_ROWS, DPCount, SampleSynthetic
from beamsynth.transforms.units import BoundContributions

__all__ = [
    "SynthesisConfig",
    "SynthesisPlan",
    "build_synthesis",
    "counter_value",
    "plan_synthesis",
    "run_synthesis",
    "synthesize_batches",
]

log = logging.getLogger("beamsynth")


@dataclass
class SynthesisConfig:
    """Everything a ``synthesize`` run needs (the CLI fills it from its arguments)."""

    input: str | list[str]
    schema: Schema
    output: str
    epsilon: float
    delta: float = 0.0
    method: str = "independent"
    rows: int | None = None
    privacy_id: str | None = None
    max_contributions: int = 1
    seed: int | None = None
    count_fraction: float = 0.05
    count_epsilon: float | None = None
    options: dict[str, Any] = field(default_factory=dict)
    shard_rows: int = DEFAULT_SHARD_ROWS
    block_rows: int = 20_000
    split_bytes: int = DEFAULT_SPLIT_BYTES  # CSV/JSONL larger than this: read in parts (0: never)
    max_record_lines: int = 1  # physical lines one CSV record may span (1: exactly stable)
    empty_input_refused: bool = False  # the caller refused an input with no record (CLI default, releases)
    fail_on_rejected: float | None = None  # the caller's --fail-on-rejected gate (None: none)


@dataclass
class SynthesisPlan:
    """The validated configuration with its budget spends (made before any data is read)."""

    config: SynthesisConfig
    schema: Schema
    accountant: PrivacyAccountant
    method: Method
    count_budget: Any | None


def plan_synthesis(cfg: SynthesisConfig, *, vocabulary: Vocabulary | None = None) -> SynthesisPlan:
    """Validate the configuration and spend the budget; raises before any data is read.
    ``vocabulary``: how the method's messages spell options (default the CLI's flags)."""
    check_rows(cfg.rows, shown=(vocabulary or Vocabulary()).option("rows", cfg.rows))
    if isinstance(cfg.split_bytes, bool) or not isinstance(cfg.split_bytes, int) or cfg.split_bytes < 0:
        raise ValueError(f"split_bytes ({cfg.split_bytes!r}) must be an int >= 0 (0: one reader per file)")
    if not (0 < cfg.count_fraction < 1):
        raise ValueError(f"count_fraction ({cfg.count_fraction!r}) must be in (0, 1)")
    if isinstance(cfg.max_contributions, bool) or not isinstance(cfg.max_contributions, int) or cfg.max_contributions < 1:
        raise ValueError(f"max_contributions ({cfg.max_contributions!r}) must be an int >= 1")
    schema = cfg.schema
    if cfg.privacy_id is not None and cfg.privacy_id != schema.privacy_id:
        if cfg.privacy_id in schema.names:
            raise ValueError(
                f"privacy id column {cfg.privacy_id!r} is a synthesized column of the schema; "
                "a privacy id must not be released"
            )
        schema = dataclasses.replace(schema, privacy_id=cfg.privacy_id)
    if schema.privacy_id is None and cfg.max_contributions != 1:
        raise ValueError(
            f"max_contributions ({cfg.max_contributions}) needs a privacy id column; without one "
            "every record is its own privacy unit"
        )
    total = as_budget(cfg.epsilon, cfg.delta)
    accountant = PrivacyAccountant(total=total)
    count_budget = None
    method_budget = total
    if cfg.rows is None:
        if cfg.count_epsilon is not None:
            count_budget = as_budget(cfg.count_epsilon)
        else:
            count_budget = total.split({"count": cfg.count_fraction, "rest": 1 - cfg.count_fraction})["count"]
            count_budget = as_budget(count_budget.epsilon)  # the count is pure ε
        accountant.spend(
            "row_count", count_budget, mechanism="discrete Laplace on the record count",
            details={"sensitivity": cfg.max_contributions,
                     "scale": cfg.max_contributions / count_budget.epsilon},
        )
        eps_left, _ = accountant.remaining
        if eps_left <= 1e-12 * total.epsilon:
            raise BudgetExceededError(
                f"the row count takes ε={count_budget.epsilon:g} of the total ε={total.epsilon:g}, "
                f"leaving nothing for method {cfg.method!r}; lower --count-epsilon or pass --rows"
            )
        method_budget = as_budget(eps_left, total.delta)
    method_cls = get_method(cfg.method)
    method = method_cls(schema=schema, accountant=accountant, budget=method_budget,
                        max_contributions=cfg.max_contributions, seed=cfg.seed,
                        options={**cfg.options, "rows": cfg.rows},  # the CLI's vars(args) has rows too
                        vocabulary=vocabulary)
    return SynthesisPlan(cfg, schema, accountant, method, count_budget)


def build_synthesis(p: beam.Pipeline, plan: SynthesisPlan, *,
                    progress_label: str | None = None) -> dict[str, Any]:
    """Wire the synthesis graph into ``p``; returns the main PCollections.

    ``progress_label``: print running row counts (stderr, :class:`RowProgressFn`) under that label.
    The progress step is wired with the sinks, before the last step: a runner that computes only
    the last-applied step (Beam's own DaskRunner) still runs the sinks and the progress step.
    """
    cfg, schema = plan.config, plan.schema
    dask_safe = is_dask(p.options)  # no multi-output ParDos, one sink (docs/runners.md)
    # dead letters stay numbered per file part and are renumbered while their file is merged
    # (no Flatten/GroupByKey holding every rejected row); the Dask path keeps the merged form
    read = p | "Read" >> ReadRecords(cfg.input, schema, block_rows=cfg.block_rows,
                                     single_output=dask_safe, split_bytes=cfg.split_bytes,
                                     max_record_lines=cfg.max_record_lines,
                                     number_rejected=dask_safe)
    batches = read["batches"]
    # EncodedBatch
    if schema.privacy_id is not None:
        batches = batches | "BoundContributions" >> BoundContributions(
            max_contributions=cfg.max_contributions, seed=cfg.seed)
        # EncodedBatch, <= k rows per privacy id
    shown = None
    if progress_label is not None:
        shown = batches | "Progress" >> beam.ParDo(RowProgressFn(progress_label))
        # EncodedBatch (unchanged), after printing the running row count
    # the model as a side input: beamsynth's DaskRunner sends it to each worker once (inside
    # every shard element, a worker held one copy per sampling partition); Beam's gets it wrong
    tables, models, _rows = synthesize_batches(batches, plan,
                                               side_input=not is_beam_dask(p.options))
    # pyarrow.Table of synthetic rows
    tables = tables | "CountOut" >> beam.Map(_count_out).with_output_types(pa.Table)
    # pyarrow.Table (typed: its coder estimates sizes without pickling, transforms/coders.py)
    ensure_parent(cfg.output)
    written = tables | "Write" >> WriteTables(cfg.output, column_names=schema.names,
                                              avro_schema=schema.avro_schema(),
                                              arrow_schema=arrow_schema_for(schema))
    written_rejected = write_rejected(read["rejected"], cfg.output, part_counts=read.get("parts"))
    if dask_safe:  # Beam's DaskRunner computes only the last step's graph: make it depend on all
        sinks = [written, written_rejected]
        if shown is not None:
            sinks.append(shown | "ProgressDone" >> beam.FlatMap(_nothing))
        tuple(sinks) | "JoinSinks" >> beam.Flatten()
    return {"batches": batches, "models": models, "tables": tables, "rejected": read["rejected"]}


def synthesize_batches(
    batches: beam.PCollection, plan: SynthesisPlan, *, side_input: bool = True
) -> tuple[beam.PCollection, beam.PCollection | None, beam.PCollection]:
    """Bounded ``EncodedBatch`` records → (synthetic ``pyarrow.Table`` shards, models or None,
    rows to synthesize per window).

    The one place that wires a method's model, the row count (``--rows`` or the DP count) and
    sharded sampling; ``synthesize``, releases, windowed streams and the Beam YAML step share it.
    Methods that release records themselves (``expand_tables``) get ``None`` for models.
    """
    cfg, schema = plan.config, plan.schema
    direct = plan.method.releases_records()
    models = None if direct else plan.method.expand_model(batches)
    # SynthesisModel per window
    if cfg.rows is None:
        counts = batches | "DPCount" >> DPCount(
            budget=plan.count_budget, max_contributions=cfg.max_contributions, seed=cfg.seed)
        rows = counts | "Rows" >> beam.Map(lambda c: c.rows)
    else:
        fixed = cfg.rows
        base = models if models is not None else batches.pipeline | "RowsOnce" >> beam.Create([None])
        rows = base | "Rows" >> beam.Map(lambda _m: fixed)
    # int rows per window
    if direct:
        return plan.method.expand_tables(batches, rows), None, rows
    model_rows = (
        (models | "KeyModel" >> beam.Map(lambda m: (0, ("model", m))),
         rows | "KeyRows" >> beam.Map(lambda r: (0, ("rows", r))))
        | "JoinModelRows" >> beam.Flatten()
        | "Group" >> beam.GroupByKey()
        | "Pair" >> beam.Map(_pair_model_rows)
    )
    # (SynthesisModel, rows) per window
    tables = model_rows | "Sample" >> SampleSynthetic(
        schema=schema, seed=cfg.seed, shard_rows=cfg.shard_rows, side_input=side_input)
    return tables, models, rows


def _nothing(_item: Any) -> tuple[()]:
    return ()


def _pair_model_rows(kv):
    parts = dict(kv[1])
    return parts["model"], parts["rows"]


def _count_out(table):
    beam.metrics.Metrics.counter(METRICS_NAMESPACE, "rows_synthesized").inc(table.num_rows)
    return table


def counter_value(result: Any, name: str) -> int | None:
    """Sum of the beamsynth Beam counter ``name`` in a finished run (None if the runner has none)."""
    found = run_counters(result, name=name)
    return None if found is None else found.get(name, 0)


def run_synthesis(cfg: SynthesisConfig, pipeline_options: PipelineOptions | None = None,
                  *, command: str = "synthesize", progress: Progress | None = None) -> dict[str, Any]:
    """Plan (spending the budget), run the pipeline, write the manifest; returns the manifest."""
    progress = progress or Progress(quiet=True)
    plan = plan_synthesis(cfg)
    check_noise_scales(plan.accountant.spends)  # every mechanism's scale is drawable, before data
    progress(f"planned: {plan.method.name}, spends "
             + ", ".join(f"{s.step} {s.budget}" for s in plan.accountant.spends))
    options = pipeline_options or PipelineOptions([])
    start = time.time()
    p = beam.Pipeline(options=options)
    built = build_synthesis(p, plan, progress_label=None if progress.quiet else "synthesize")
    progress("reading, measuring and sampling")
    with remove_temp_folders_on_failure(p):  # a failed run leaves no .beamsynth-temp-* folder
        result = p.run()
        result.wait_until_finish()
    progress("pipeline finished; writing the manifest")
    plan.method.collect_metrics(result)
    for note in getattr(plan.method, "run_notes", list)():  # e.g. privbayes' model that ran
        progress(note)
    read = counter_value(result, "rows_read")
    rej_parse = counter_value(result, "rows_rejected_unparseable")
    rej_dom = counter_value(result, "rows_rejected_domain")
    used = counter_value(result, "rows_encoded")
    out_rows = counter_value(result, "rows_synthesized")
    rejected = None if rej_parse is None or rej_dom is None else rej_parse + rej_dom
    dropped = counter_value(result, "rows_dropped_by_bound") if plan.schema.privacy_id else 0
    counts = {"rows_read": read, "rows_rejected": rejected, "rows_dropped_by_bound": dropped,
              "rows_used": None if used is None or dropped is None else used - dropped,  # after bounding
              "rows_out": out_rows, "seconds": round(time.time() - start, 3)}
    method_operational = plan.method.operational()
    if method_operational:
        counts["method"] = method_operational
    del built
    manifest = build_manifest(
        command=command,
        method=plan.method.name,
        inputs=[cfg.input] if isinstance(cfg.input, str) else list(cfg.input),
        outputs={"synthetic": cfg.output, "rejected": rejected_path(cfg.output),
                 "manifest": manifest_path(cfg.output)},
        schema_name=plan.schema.name,
        schema_fingerprint=plan.schema.fingerprint(),
        accountant=plan.accountant.to_dict(),
        seed=cfg.seed,
        privacy_unit={"privacy_id": plan.schema.privacy_id,
                      "max_contributions": cfg.max_contributions,
                      "neighbouring": "add/remove one privacy unit",
                      **record_lines_note(cfg.max_record_lines), **empty_input_note(cfg.empty_input_refused),
                      **rejected_gate_note(cfg.fail_on_rejected)},
        counts=counts, privacy_ids=reader_privacy_ids(plan.schema.privacy_id),  # as ReadRecords read
        details={"method": plan.method.details(), "rows_requested": cfg.rows},
    )
    if getattr(plan.method, "non_dp_warning", None):  # e.g. plausible's Privacy Test 1 (--allow-non-dp)
        manifest["release"] = {"WARNING": plan.method.non_dp_warning, **manifest["release"]}
    write_json_atomic(manifest_path(cfg.output), manifest)
    return manifest
