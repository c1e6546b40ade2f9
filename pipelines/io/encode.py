"""Encoding: :class:`~beamsynth.pipelines.io.records.RawBlock` →
:class:`~beamsynth.schemas.schema.EncodedBatch` for a declared schema, every row that cannot be
encoded a :class:`~beamsynth.pipelines.io.records.Rejected` with its reason
(:func:`encode_block`, :class:`EncodeBlocks`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import apache_beam as beam
import numpy as np
import pandas as pd
from apache_beam.metrics import Metrics

from beamsynth.pipelines.io.dead_letters import _apply_with_dead_letters, _check_flag
from beamsynth.pipelines.io.records import METRICS_NAMESPACE, RawBlock, Rejected
from beamsynth.schemas.schema import EncodedBatch, Schema, SchemaError, avro_field_name
from beamsynth.transforms.conventions import display_items, element_types

__all__ = [
    "EncodeBlocks",
    "READER_PRIVACY_IDS",
    "reader_privacy_ids",
    "readers_keep_digits",
]


def _row_text(block: RawBlock, i: int) -> str:
    return json.dumps({k: (None if v is None else str(v)) for k, v in
                       ((k, s.iat[i]) for k, s in block.columns.items())}, ensure_ascii=False)


def _align_columns(schema: Schema, columns: dict[str, pd.Series]) -> dict[str, pd.Series]:
    """Accept Avro-sanitized field names (``education_num``) for declared ``education-num``."""
    wanted = schema.names + ([schema.privacy_id] if schema.privacy_id else [])
    out = dict(columns)
    for name in wanted:
        alias = avro_field_name(name)
        if name not in out and alias != name and alias in out:
            out[name] = out.pop(alias)
    return out


def _record_key_checks(schema: Schema, block: RawBlock) -> tuple[dict[int, str], dict[str, pd.Series]]:
    """Per-record checks of a JSONL block: ``({row: reason}, declared columns)``.

    Each key set is checked against the schema alone: a declared nullable key it lacks is a
    null, a lacking non-nullable key (or privacy id) or, under ``extra_columns: reject``, an
    undeclared key rejects the records with that key set; an Avro-safe alias
    (``education_num``) stands for its declared name in the records that lack the name.
    """
    wanted = schema.names + ([schema.privacy_id] if schema.privacy_id else [])
    nullable = {c.name for c in schema.columns if c.nullable}
    n = len(block)
    absent = pd.Series([None] * n, dtype=object)
    cols = {name: block.columns.get(name, absent) for name in wanted}
    which = block.row_keys if block.row_keys is not None else np.zeros(n, np.int32)
    reasons: dict[int, str] = {}
    for k, keys in enumerate(block.key_sets or [()]):
        rows = np.flatnonzero(which == k)
        have = list(keys)
        for name in wanted:
            alias = avro_field_name(name)
            if name not in keys and alias != name and alias in keys:
                have[have.index(alias)] = name
                values = cols[name].copy() if cols[name] is not absent else absent.copy()
                values.iloc[rows] = block.columns[alias].iloc[rows].to_numpy()
                cols[name] = values
        try:
            schema.check_header(have + [c for c in wanted if c in nullable and c not in have])
        except SchemaError as exc:
            text = str(exc).replace("input header lacks", "record lacks").replace("; header is", "; its keys are")
            for i in rows:
                reasons[int(i)] = f"record keys: {text}"
    return reasons, cols


def _no_rows(schema: Schema) -> EncodedBatch:
    return EncodedBatch(np.zeros((0, len(schema.columns)), np.int32),
                        None if schema.privacy_id is None else np.zeros(0, dtype=object))


def encode_block(schema: Schema, block: RawBlock) -> tuple[EncodedBatch, list[Rejected]]:
    """Encode one raw block; every row that cannot be encoded becomes a :class:`Rejected`.

    A file header (CSV, Avro, Parquet) is public structure checked once for the block; JSONL
    records are checked one by one (:func:`_record_key_checks`)."""
    n = len(block)

    def dead(i: int, reason: str) -> Rejected:
        return Rejected(block.source, int(block.rows[i]), reason, raw=_row_text(block, i),
                        line=None if block.lines is None else int(block.lines[i]), part=block.part)

    if block.key_sets is None:
        block.columns = _align_columns(schema, block.columns)
        try:
            schema.check_header(list(block.columns))
        except SchemaError as exc:
            return _no_rows(schema), [dead(i, f"file header: {exc}") for i in range(n)]
        batch, bad = schema.encode_columns(dict(block.columns), n)
        return batch, [dead(i, reason) for i, reason in bad]
    key_bad, cols = _record_key_checks(schema, block)
    keep = np.ones(n, dtype=bool)
    keep[list(key_bad)] = False
    idx = np.flatnonzero(keep)
    if idx.size < n:
        cols = {k: v.iloc[idx].reset_index(drop=True) for k, v in cols.items()}
    batch, bad = schema.encode_columns(cols, int(idx.size)) if idx.size else (_no_rows(schema), [])
    reasons = {**key_bad, **{int(idx[i]): reason for i, reason in bad}}
    return batch, [dead(i, reasons[i]) for i in sorted(reasons)]


class _EncodeFn(beam.DoFn):
    def __init__(self, schema: Schema, tagged: bool = True) -> None:
        self._schema = schema
        self._tagged = tagged
        self._used = Metrics.counter(METRICS_NAMESPACE, "rows_encoded")
        self._rejected = Metrics.counter(METRICS_NAMESPACE, "rows_rejected_domain")

    def process(self, block: RawBlock):
        batch, rejected = encode_block(self._schema, block)
        self._used.inc(len(batch))
        self._rejected.inc(len(rejected))
        for r in rejected:
            yield beam.pvalue.TaggedOutput("rejected", r) if self._tagged else r
        if len(batch):
            yield batch


#: How the records of the CLI's readers (``pipelines/io/read*.py``) read privacy ids: the one
#: place the CLI decides it (H71, H79). The encoders of its commands (:class:`EncodeBlocks`,
#: ``prefixes``' ``encode_key_block``) read ids this way and every CLI manifest states it
#: (:func:`reader_privacy_ids`), so a command cannot read ids one way and state the other.
READER_PRIVACY_IDS = "exact"


def reader_privacy_ids(privacy_id: str | None) -> str | None:
    """What a CLI manifest states as ``release.privacy_unit.ids``: how its encoder read the ids
    (:data:`READER_PRIVACY_IDS`); ``None`` without an id column."""
    return None if privacy_id is None else READER_PRIVACY_IDS


def readers_keep_digits(schema: Schema) -> Schema:
    """``schema`` reading privacy ids as the CLI's readers need (:data:`READER_PRIVACY_IDS`,
    ``exact``; H71): the CLI's readers never give an id as a pandas float (CSV fields are text,
    JSONL numbers Python ints, Avro longs and Parquet int64 columns ints through ``to_pylist``,
    nulls ``None``), so an id beyond 2**53 is the same whatever the other rows and needs no
    rounding; a float id there is the file's own (a JSON ``1.0e18``, an Avro/Parquet double) and,
    if 2**53 or more, a dead letter. Beam YAML rows (``encode_block`` from ``yaml_transforms``)
    keep the schema's mode."""
    if schema.privacy_id is None or schema.privacy_ids == READER_PRIVACY_IDS:
        return schema
    return dataclasses.replace(schema, privacy_ids=READER_PRIVACY_IDS)


@element_types(input=RawBlock, outputs={"batches": EncodedBatch, "rejected": Rejected})
class EncodeBlocks(beam.PTransform):
    """``RawBlock`` → ``EncodedBatch`` (main) and ``Rejected`` (tag ``rejected``) for a schema.

    The blocks come from the CLI's own readers (``pipelines/io/read*.py``), which keep every
    digit of a privacy id, so ids are read exactly (:func:`readers_keep_digits`)."""

    def __init__(self, schema: Schema, *, single_output: bool = False,
                 label: str | None = None) -> None:
        super().__init__(label)
        if not isinstance(schema, Schema):
            raise TypeError(f"schema must be a Schema, got {type(schema).__name__}")
        self._schema = readers_keep_digits(schema)
        self._single_output = _check_flag("single_output", single_output)

    def display_data(self) -> dict[str, Any]:
        """The declared schema's size (no data values)."""
        return display_items(step="encode raw blocks to declared cells (dead letters tagged "
                                  "'rejected')", schema=self._schema.name,
                             columns=len(self._schema.columns),
                             declared_cells=sum(self._schema.shape))

    def expand(self, blocks):
        batches, rejected = _apply_with_dead_letters(
            blocks, _EncodeFn, (self._schema,), main="batches",
            single_output=self._single_output, label="Encode", main_type=EncodedBatch)
        return {"batches": batches, "rejected": rejected}
