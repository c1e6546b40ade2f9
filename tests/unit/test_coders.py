"""ColumnarCoder: pickle round trip, size estimates without serializing, typed PCollections use it."""

from __future__ import annotations

import pickle

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa

from beamsynth.pipelines.io.read import ReadRecords
from beamsynth.pipelines.io.records import RawBlock
from beamsynth.schemas.schema import EncodedBatch, load_schema
from beamsynth.transforms.coders import ColumnarCoder, estimate_nbytes


def _block() -> RawBlock:
    return RawBlock("f.csv", {"a": pd.Series(["x", "yy", None], dtype=object)},
                    np.arange(1, 4, dtype=np.int64))


def test_round_trip_equals_pickle() -> None:
    coder = ColumnarCoder()
    batch = EncodedBatch(np.arange(12, dtype=np.int32).reshape(6, 2), None)
    out = coder.decode(coder.encode(batch))
    np.testing.assert_array_equal(out.codes, batch.codes)
    table = pa.table({"a": ["x", "y"]})
    assert coder.decode(coder.encode(table)).equals(table)
    blk = coder.decode(coder.encode(_block()))
    assert list(blk.columns["a"]) == ["x", "yy", None] and list(blk.rows) == [1, 2, 3]


def test_estimate_reads_buffer_sizes_without_pickling(monkeypatch) -> None:
    batch = EncodedBatch(np.zeros((1000, 4), dtype=np.int32), None)

    def refuse(*_a, **_k):
        raise AssertionError("estimate_size serialized the element")

    impl = ColumnarCoder().get_impl()
    monkeypatch.setattr(pickle, "dumps", refuse)
    assert impl.estimate_size(batch) == 16_000
    assert impl.estimate_size(pa.table({"a": np.arange(10, dtype=np.int64)})) == 80
    assert estimate_nbytes(_block()) > 24  # rows (24 bytes) + the column's pointers


def test_read_and_encode_outputs_are_typed_with_the_columnar_coder(tmp_path) -> None:
    path = tmp_path / "in.csv"
    path.write_text("age\n30\n")
    p = beam.Pipeline()
    out = p | ReadRecords(str(path), load_schema("adult"))
    batches = out["batches"]
    assert batches.element_type is EncodedBatch
    assert isinstance(beam.coders.registry.get_coder(batches.element_type), ColumnarCoder)
    assert isinstance(beam.coders.registry.get_coder(RawBlock), ColumnarCoder)
    assert isinstance(beam.coders.registry.get_coder(pa.Table), ColumnarCoder)
