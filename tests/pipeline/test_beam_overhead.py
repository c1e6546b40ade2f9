"""The test session's shortcut for Beam's DoFn introspection (tests/conftest.py): it answers what
Beam answers, and stateful DoFns still run with their state and timers."""

from __future__ import annotations

import os

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.runners.direct import transform_evaluator
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import userstate
from apache_beam.transforms.timeutil import TimeDomain

BAG = userstate.BagStateSpec("bag", VarIntCoder())
FLUSH = userstate.TimerSpec("flush", TimeDomain.WATERMARK)
BAG_STATE = beam.DoFn.StateParam(BAG)
FLUSH_TIMER = beam.DoFn.TimerParam(FLUSH)


class _Tally(beam.DoFn):
    """Per key: the values in a bag, emitted by an event-time timer at the end of the window."""

    def process(self, element, bag=BAG_STATE, flush=FLUSH_TIMER, window=beam.DoFn.WindowParam):
        bag.add(element[1])
        flush.set(window.end)

    @userstate.on_timer(FLUSH)
    def emit(self, key=beam.DoFn.KeyParam, bag=BAG_STATE):
        yield key, sorted(bag.read())


class _Twice(beam.DoFn):
    def process(self, element, a=beam.DoFn.KeyParam, b=beam.DoFn.KeyParam):
        yield element


@pytest.mark.skipif(os.environ.get("BEAMSYNTH_TEST_BEAM_MEMO") == "0", reason="memo switched off")
def test_the_memo_answers_what_beam_answers_and_hands_out_copies():
    beam_specs = userstate.get_dofn_specs.__wrapped__  # set by tests/conftest.py
    assert transform_evaluator.get_dofn_specs is userstate.get_dofn_specs
    fn = _Tally()
    first = userstate.get_dofn_specs(fn)
    assert first == beam_specs(fn) == ({BAG}, {FLUSH})
    first[0].clear()  # a caller's change stays its own
    assert userstate.get_dofn_specs(fn) == ({BAG}, {FLUSH})
    assert userstate.is_stateful_dofn(fn) and not userstate.is_stateful_dofn(beam.DoFn())
    with pytest.raises(ValueError, match="duplicate process method parameters"):
        userstate.get_dofn_specs(_Twice())


def test_a_stateful_dofn_runs_with_its_state_and_timer():
    with test_pipeline.TestPipeline(options=beam.options.pipeline_options.PipelineOptions(
            ["--direct_running_mode=in_memory"])) as p:
        got = (p | beam.Create([("a", 3), ("b", 1), ("a", 1), ("a", 2)])
               | beam.ParDo(_Tally()))
        assert_that(got, equal_to([("a", [1, 2, 3]), ("b", [1])]))
