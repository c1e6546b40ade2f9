"""DPCategoricalHistogram in a pipeline: global window (incl. empty input), windows, sampling."""

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window

from beamsynth.schemas.domains import CategoricalDomain, ProductDomain
from beamsynth.schemas.schema import EncodedBatch
from beamsynth.transforms.budget import PureDP
from beamsynth.transforms.cathist import DPCategoricalHistogram, SampleCategoricalColumn
from beamsynth.transforms.windows import DeclaredWindows

WORDS = CategoricalDomain([f"w{i}" for i in range(2000)])
PAIRS = ProductDomain([WORDS, WORDS])  # 4,000,000 cells


def _options():
    return PipelineOptions(["--runner=DirectRunner"])


def _batches():
    codes = np.repeat(np.array([[11], [42], [4_000]], dtype=np.int64), [600, 300, 2], axis=0)
    return [EncodedBatch(part) for part in np.array_split(codes, 5)]


def _summary(rel):
    return (rel.plan.tau, bool(np.all(rel.counts >= rel.plan.tau)), 11 in rel.cells.tolist(),
            42 in rel.cells.tolist(), bool(np.all(np.diff(rel.cells) > 0)))


def test_release_in_global_window():
    hist = DPCategoricalHistogram(domain=PAIRS, budget=PureDP(epsilon=1.0), tolerance=0.5, seed=3)
    tau = hist.plan.tau
    with BeamTestPipeline(options=_options()) as p:
        out = p | beam.Create(_batches()) | hist
        assert_that(out | beam.Map(_summary), equal_to([(tau, True, True, True, True)]))


def test_empty_input_still_releases_once():
    hist = DPCategoricalHistogram(domain=PAIRS, budget=PureDP(epsilon=1.0), tolerance=0.5, seed=4)
    with BeamTestPipeline(options=_options()) as p:
        out = p | beam.Create([], reshuffle=False).with_output_types(EncodedBatch) | hist
        assert_that(out | beam.Map(lambda r: bool(np.all(r.counts >= r.plan.tau))), equal_to([True]))


def test_one_release_per_window():
    hist = DPCategoricalHistogram(domain=PAIRS, budget=PureDP(epsilon=1.0), tolerance=0.5, seed=5)
    stamped = [window.TimestampedValue(b, t) for b, t in zip(_batches(), [1, 2, 61, 62, 63])]
    with BeamTestPipeline(options=_options()) as p:
        out = (p | beam.Create(stamped) | beam.WindowInto(DeclaredWindows(start=0, end=120, size=60)) | hist
               | beam.Map(lambda r: (11 in r.cells.tolist(), 42 in r.cells.tolist())))
        # window [0,60): the first 2 batches (only value 11); window [60,120): the rest
        assert_that(out, equal_to([(True, False), (True, True)]))


def test_sampled_synthetic_column():
    hist = DPCategoricalHistogram(domain=PAIRS, budget=PureDP(epsilon=1.0), tolerance=0.9, seed=6)
    with BeamTestPipeline(options=_options()) as p:
        tables = (p | beam.Create(_batches()) | hist
                  | SampleCategoricalColumn(domain=PAIRS, rows=500, name="pair", seed=6))

        def check(t: pa.Table):
            vals = t.column("pair").to_pylist()
            return (t.num_rows, vals.count(PAIRS.decode(11)) > 250)

        assert_that(tables | beam.Map(check), equal_to([(500, True)]))
