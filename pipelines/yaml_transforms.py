"""beamsynth transforms as Beam YAML steps (see ``beamsynth_provider.yaml`` next to this module).

Beam YAML hands a step's ``config`` to the transform's constructor as keyword arguments and feeds
it a schema'd ``PCollection`` of ``beam.Row``. Beam field names must be identifiers, so columns
such as ``education-num`` travel as their Avro-safe names (``education_num``) both ways. :class:`Synthesize` turns such rows into a DP
synthetic ``PCollection[beam.Row]`` with one nullable string/int/float field per declared column,
so ``WriteToAvro``/``WriteToParquet``/``WriteToCsv`` can follow it. The budget is spent when the
step is constructed (when Beam YAML builds the pipeline, before any data is read).

Rows that do not fit the declared schema go to the dead-letter output named by Beam YAML's
``error_handling: {output: NAME}`` (rows ``{source, row, reason, raw}``) and are counted in the
``beamsynth`` metrics; without ``error_handling`` they are counted and dropped.

This module deliberately has no ``from __future__ import annotations``: Beam YAML reads the
constructor's annotations to build the step's config schema.
"""

import json
from typing import Any, Optional

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
from apache_beam.typehints.row_type import RowTypeConstraint

from beamsynth.pipelines.io import METRICS_NAMESPACE, EncodeBlocks, RawBlock, arrow_schema_for
from beamsynth.pipelines.synthesize import SynthesisConfig, plan_synthesis, synthesize_batches
from beamsynth.schemas.schema import Schema, avro_field_name, load_schema
from beamsynth.transforms.units import BoundContributions

__all__ = ["Synthesize", "rows_to_block", "row_type_for"]

def row_type_for(schema: Schema) -> RowTypeConstraint:
    """The Beam row type of synthetic output: nullable int/float/str per declared column."""
    fields = []
    for f in arrow_schema_for(schema):
        py = int if pa.types.is_integer(f.type) else float if pa.types.is_floating(f.type) else str
        fields.append((avro_field_name(f.name), Optional[py]))  # noqa: UP045 (Beam needs typing)
    return RowTypeConstraint.from_fields(fields)


def rows_to_block(rows: list[Any], *, source: str, first_row: int) -> RawBlock:
    """A list of ``beam.Row`` (or dicts) → a :class:`RawBlock` of raw string/None values."""
    dicts = [r if isinstance(r, dict) else r._asdict() for r in rows]
    names = list(dicts[0]) if dicts else []
    cols = {}
    for n in names:
        vals = []
        for d in dicts:
            v = d.get(n)
            if v is None or (isinstance(v, float) and np.isnan(v)):
                vals.append(None)
            else:
                vals.append(str(v))
        cols[n] = pd.Series(vals, dtype=object)
    return RawBlock(source=source, columns=cols,
                    rows=np.arange(first_row, first_row + len(dicts), dtype=np.int64), lines=None,
                    raw_rows=[json.dumps(d, default=str) for d in dicts])


def _to_block(rows: list[Any]) -> RawBlock:
    """A batch of Beam YAML rows → RawBlock (they carry no file position: numbered per batch)."""
    block = rows_to_block(list(rows), source="beam-yaml", first_row=1)
    beam.metrics.Metrics.counter(METRICS_NAMESPACE, "rows_read").inc(len(block))
    return block


def _table_rows(table, names: list[str]):
    fields = [avro_field_name(n) for n in names]  # Beam field names must be identifiers
    for rec in table.to_pylist():
        yield beam.Row(**{f: rec[n] for f, n in zip(fields, names)})


def _fail_on_rejected(r: Any) -> None:
    raise ValueError(
        f"BeamsynthSynthesize: input row {r.row} rejected: {r.reason}; configure "
        "'error_handling: {output: NAME}' on the step to route bad rows to a dead-letter output")


class Synthesize(beam.PTransform):
    """Beam YAML step ``BeamsynthSynthesize``: schema'd rows in, DP synthetic rows out.

    Config (keyword arguments): ``schema`` (a schema file or bundled name), ``epsilon`` (total ε
    of this step, > 0), ``delta`` (default 0), ``method`` (a registered method, default
    ``independent``), ``rows`` (rows to synthesize; default a DP count spending
    ``count_fraction`` of ε), ``privacy_id`` / ``max_contributions`` (privacy unit), ``seed``
    (tests only: output marked not for release), ``options`` (method options), ``batch_rows``.
    The privacy guarantee is the method's (see its docstring), for add/remove of one privacy unit.
    """

    def __init__(self, *, schema: str, epsilon: float, delta: float = 0.0,
                 method: str = "independent", rows: int | None = None,
                 count_fraction: float = 0.05, privacy_id: str | None = None,
                 max_contributions: int = 1, seed: int | None = None,
                 options: dict | None = None, batch_rows: int = 20_000,
                 error_handling: dict | None = None) -> None:
        super().__init__()
        if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
            raise ValueError(f"batch_rows ({batch_rows!r}) must be an int >= 1")
        if error_handling is not None and not (isinstance(error_handling, dict)
                                               and isinstance(error_handling.get("output"), str)):
            raise ValueError(f"error_handling ({error_handling!r}) must be {{output: NAME}}")
        cfg = SynthesisConfig(input="beam-yaml", schema=load_schema(schema), output="beam-yaml",
                              epsilon=epsilon, delta=delta, method=method, rows=rows,
                              privacy_id=privacy_id, max_contributions=max_contributions,
                              seed=seed, count_fraction=count_fraction,
                              options=dict(options or {}))
        self._plan = plan_synthesis(cfg)  # spends the budget now, before any data is read
        self._batch_rows = batch_rows
        self._errors = None if error_handling is None else error_handling["output"]

    @property
    def accountant(self):
        """The step's privacy accountant (every spend, for manifests)."""
        return self._plan.accountant

    def expand(self, pcoll):
        plan, cfg, schema = self._plan, self._plan.config, self._plan.schema
        enc = (
            pcoll
            | "Batch" >> beam.BatchElements(min_batch_size=1, max_batch_size=self._batch_rows)
            # list[beam.Row]
            | "ToBlocks" >> beam.Map(_to_block)
            # RawBlock
            | "Encode" >> EncodeBlocks(schema)
        )
        batches = enc["batches"]
        # EncodedBatch
        if schema.privacy_id is not None:
            batches = batches | "BoundContributions" >> BoundContributions(
                max_contributions=cfg.max_contributions, seed=cfg.seed)
            # EncodedBatch, <= k rows per privacy id
        tables, _models, _rows = synthesize_batches(batches, plan)
        # pyarrow.Table
        out = tables | "ToRows" >> beam.FlatMap(_table_rows, schema.names).with_output_types(
            row_type_for(schema))
        # beam.Row per synthetic record
        if self._errors is None:
            # Beam YAML's convention: without error_handling a bad row fails the step, loudly,
            # instead of being dropped (rows are never lost silently)
            _ = enc["rejected"] | "FailOnBadRow" >> beam.Map(_fail_on_rejected)
            return out
        rejected = enc["rejected"] | "RejectedRows" >> beam.Map(
            lambda r: beam.Row(source=r.source, row=r.row, reason=r.reason, raw=r.raw)
        ).with_output_types(RowTypeConstraint.from_fields(
            [("source", str), ("row", Optional[int]), ("reason", str), ("raw", str)]))  # noqa: UP045
        return {"output": out, self._errors: rejected}
