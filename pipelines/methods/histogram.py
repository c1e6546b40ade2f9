"""The ``histogram`` pipeline: an ε-DP histogram of one column over a declared, possibly huge
domain with CatHist (seed 000, Algorithm 1; :mod:`beamsynth.transforms.cathist`).
:func:`run_histogram` spends the budget, runs the pipeline and writes OUT (one row per released
category with its noisy count), ``OUT.rejected.jsonl`` and ``OUT.manifest.json`` (the spend
with τ, ρ and n). The command line is :mod:`beamsynth.pipelines.cli.histogram`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.options.pipeline_options import PipelineOptions

from beamsynth.pipelines.io.dead_letters import write_rejected
from beamsynth.pipelines.io.encode import reader_privacy_ids
from beamsynth.pipelines.io.manifest import build_manifest, manifest_path, write_json_atomic
from beamsynth.pipelines.io.preflight import check_noise_scales
from beamsynth.pipelines.io.read import ReadRecords
from beamsynth.pipelines.io.records import (
    METRICS_NAMESPACE,
    empty_input_note,
    rejected_gate_note,
    rejected_path,
)
from beamsynth.pipelines.io.single_file import remove_temp_folders_on_failure
from beamsynth.pipelines.io.write import WriteTables, ensure_parent
from beamsynth.pipelines.methods.synthesize import counter_value
from beamsynth.schemas.schema import Column, Schema, avro_field_name
from beamsynth.transforms.budget import PrivacyAccountant, PureDP
from beamsynth.transforms.cathist import ColumnCells, DPCategoricalHistogram, histogram_table
from beamsynth.transforms.units import BoundContributions

__all__ = [
    "HistogramConfig",
    "run_histogram",
]


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
    empty_input_refused: bool = False  # the caller refused an input with no record (CLI default, releases)
    fail_on_rejected: float | None = None  # the caller's --fail-on-rejected gate (None: none)


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
                      "neighbouring": "add/remove one privacy unit", **empty_input_note(cfg.empty_input_refused),
                      **rejected_gate_note(cfg.fail_on_rejected)},
        counts=counts, privacy_ids=reader_privacy_ids(cfg.privacy_id),  # as ReadRecords read them
        details={"column": column.name, "domain": cfg.domain_spec or column.domain.to_spec(),
                 **hist.plan.details(),
                 "empty_input": ("refused by the command (privacy_unit.empty_input); " if cfg.empty_input_refused
                                 else "") + "the mechanism is still ε-DP on an empty input: only random "
                                            "categories (none with probability ≥ ρ)"},
    )
    write_json_atomic(manifest_path(cfg.output), manifest)
    return manifest
