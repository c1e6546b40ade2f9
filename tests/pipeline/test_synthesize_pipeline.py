"""Pipeline tests: the measurement and synthesis transforms on the DirectRunner."""

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to, is_not_empty

from beamsynth.pipelines.io.read import ReadRecords
from beamsynth.schemas.schema import EncodedBatch, load_schema
from beamsynth.transforms.budget import PureDP
from beamsynth.transforms.measure import DPMarginals, noisy_marginals
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.synthesis import DPIndependentMarginals, SampleSynthetic
from beamsynth.transforms.units import BoundContributions

SCHEMA = {"privacy_id": "pid", "columns": [
    {"name": "a", "type": "categorical", "domain": {"kind": "categorical", "values": ["x", "y", "z"]}},
    {"name": "n", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 9, "bins": 5}},
]}


def _csv(tmp_path, rows):
    p = tmp_path / "in.csv"
    p.write_text("pid,a,n\n" + "".join(f"{r[0]},{r[1]},{r[2]}\n" for r in rows), encoding="utf-8")
    return str(p)


def _opts():
    return PipelineOptions(["--runner=DirectRunner"])


def test_read_records_splits_good_and_rejected(tmp_path):
    path = _csv(tmp_path, [("u1", "x", 1), ("u2", "q", 2), ("u3", "y", 99), ("u4", "z", 9)])
    schema = load_schema(SCHEMA)
    with BeamTestPipeline(options=_opts()) as p:
        out = p | ReadRecords(path, schema)
        rows = out["batches"] | "Rows" >> beam.FlatMap(lambda b: b.codes.tolist())
        reasons = out["rejected"] | "Reasons" >> beam.Map(lambda r: (r.row, r.reason))
        assert_that(rows, equal_to([[0, 0], [2, 4]]), label="good")
        assert_that(reasons, equal_to([
            (2, "column 'a': value 'q' is outside the declared categorical domain (to keep such rows, declare a catch-all cell, other: OTHER in the domain, and on_out_of_domain: other; docs/schema-format.md)"),
            (3, "column 'n': value '99' is outside the declared integer domain [0, 9]")]),
            label="bad")


def test_dp_marginals_in_pipeline_equal_beam_free_core(tmp_path):
    rows = [(f"u{i}", "xyz"[i % 3], i % 10) for i in range(60)]
    path = _csv(tmp_path, rows)
    schema = load_schema(SCHEMA).select(["a", "n"])
    budgets = [PureDP(epsilon=0.5), PureDP(epsilon=0.5)]
    specs = [(0,), (0, 1)]
    # the Beam-free computation with the stream the transform derives: (seed, label, window)
    exact_a = np.bincount([["x", "y", "z"].index("xyz"[i % 3]) for i in range(60)], minlength=3)
    exact_an = np.zeros((3, 5), dtype=np.int64)
    for i in range(60):
        exact_an["xyz".index("xyz"[i % 3]), (i % 10) // 2] += 1
    expected = noisy_marginals([exact_a, exact_an], specs=specs, names=schema.names, budgets=budgets,
                               sensitivity=1.0, rs=RandomSource(seed=42).child("marginals", "global"))
    with BeamTestPipeline(options=_opts()) as p:
        batches = (p | ReadRecords(path, load_schema(SCHEMA)))["batches"]
        out = batches | "M" >> DPMarginals(specs=specs, shape=schema.shape, names=schema.names,
                                           budgets=budgets, seed=42)
        values = out | beam.Map(lambda ms: [m.values.tolist() for m in ms])
        assert_that(values, equal_to([[m.values.tolist() for m in expected]]))


def test_empty_input_still_releases_noisy_tables():
    schema = load_schema(SCHEMA)
    with BeamTestPipeline(options=_opts()) as p:
        empty = p | beam.Create([]).with_output_types(EncodedBatch)
        out = empty | DPMarginals(specs=[(0,)], shape=schema.shape, names=schema.names,
                                  budgets=[PureDP(epsilon=1.0)], seed=1)
        assert_that(out | beam.Map(lambda ms: ms[0].values.shape), equal_to([(3,)]))


def test_bounding_then_synthesis_end_to_end(tmp_path):
    rows = [("heavy", "x", 1)] * 500 + [(f"u{i}", "y", 3) for i in range(50)]
    path = _csv(tmp_path, rows)
    schema = load_schema(SCHEMA)
    with BeamTestPipeline(options=_opts()) as p:
        batches = (p | ReadRecords(path, schema))["batches"]
        bounded = batches | BoundContributions(max_contributions=2, seed=3)
        n_rows = bounded | "Len" >> beam.Map(len) | "N" >> beam.CombineGlobally(sum)
        assert_that(n_rows, equal_to([52]), label="bounded")
        models = bounded | DPIndependentMarginals(schema=schema, budget=PureDP(epsilon=1.0),
                                                  max_contributions=2, seed=3)
        tables = (models | beam.Map(lambda m: (m, 1234))
                  | SampleSynthetic(schema=schema, seed=3, shard_rows=500))
        total = tables | "NumRows" >> beam.Map(lambda t: t.num_rows) | "Total" >> beam.CombineGlobally(sum)
        assert_that(total, equal_to([1234]), label="rows")
        valid = tables | "Valid" >> beam.FlatMap(
            lambda t: [v for v in t.column("a").to_pylist() if v not in ("x", "y", "z")])
        assert_that(valid, equal_to([]), label="in-domain")
        assert_that(tables | beam.Map(lambda t: isinstance(t, pa.Table)), is_not_empty(), label="tables")
