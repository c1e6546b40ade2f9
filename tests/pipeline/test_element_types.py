"""A PCollection of unknown element type (``Any``) is checked element by element (issue 16).

``ReadFromText | Map(json.loads)`` is typed ``Any``, so a mechanism cannot refuse it when the
pipeline is built; the first step inside the mechanism checks each element and fails the run with
the same message as the build-time check (it used to fail deep in a DoFn with ``'dict' object has
no attribute 'codes'``).
"""

import json

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to

from beamsynth.schemas.schema import EncodedBatch
from beamsynth.transforms.budget import PureDP
from beamsynth.transforms.conventions import API_HINT
from beamsynth.transforms.synthesis import DPCount

OPTIONS = {"runner": "DirectRunner", "direct_running_mode": "in_memory"}


def test_untyped_dicts_fail_at_the_first_element_with_the_build_time_message():
    with pytest.raises(Exception) as err:
        with BeamTestPipeline(options=PipelineOptions.from_dictionary(OPTIONS)) as p:
            dicts = p | beam.Create(['{"age": 30}']) | beam.Map(json.loads)
            assert dicts.element_type == beam.typehints.Any  # nothing to check when built
            _ = dicts | DPCount(budget=PureDP(epsilon=1.0))
    assert f"DPCount takes EncodedBatch elements; got dict — {API_HINT}" in str(err.value)


def test_untyped_batches_pass_the_check():
    codes = np.zeros((5, 2), dtype=np.int64)
    with BeamTestPipeline(options=PipelineOptions.from_dictionary(OPTIONS)) as p:
        untyped = p | beam.Create([0]) | beam.Map(lambda _: EncodedBatch(codes)).with_output_types(
            beam.typehints.Any)
        counts = untyped | DPCount(budget=PureDP(epsilon=1.0), seed=3)
        # the elements went through the check step and were counted: one NoisyCount, scale 1/ε
        assert_that(counts | beam.Map(lambda c: (type(c).__name__, c.scale)),
                    equal_to([("NoisyCount", 1.0)]))
    labels = [t.unique_name for t in p.to_runner_api().components.transforms.values()]
    assert any(name.endswith("DPCount/CheckElements") for name in labels)
