"""The test session's shortcuts for Beam's DoFn introspection, options views and signatures
(tests/conftest.py): they answer what Beam answers, and stateful DoFns still run with their state
and timers."""

from __future__ import annotations

import base64
import bz2
import copy
import gc
import inspect
import os

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.options.pipeline_options import (
    DebugOptions,
    PipelineOptions,
    StandardOptions,
    TypeOptions,
)
from apache_beam.runners.direct import transform_evaluator
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import userstate
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.typehints import decorators

from beamsynth.runners.options import BeamsynthOptions

MEMO_OFF = pytest.mark.skipif(os.environ.get("BEAMSYNTH_TEST_BEAM_MEMO") == "0",
                              reason="memo switched off")

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


@MEMO_OFF
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


def _option_classes(cls=PipelineOptions):
    for sub in cls.__subclasses__():
        yield sub
        yield from _option_classes(sub)


FLAGS = [["--runner", "DirectRunner", "--direct_num_workers", "2", "--experiments", "a",
          "--beamsynth_epsilon", "1.5", "--type_check_strictness", "ALL_REQUIRED", "--unknown"],
         [], None]


def _state(view):
    return (type(view), view._flags, vars(view._visible_options), view._all_options)


@MEMO_OFF
@pytest.mark.parametrize("flags", FLAGS, ids=["flags", "empty", "argv"])
def test_option_views_are_what_beam_makes(flags):
    beam_view_as = PipelineOptions.view_as.__wrapped__  # set by tests/conftest.py
    classes = sorted(set(_option_classes()), key=lambda c: (c.__module__, c.__name__))
    assert BeamsynthOptions in classes and len(classes) > 15
    ours, beams = PipelineOptions(flags), PipelineOptions(flags)
    for _ in range(2):  # the second round reads the memo
        for cls in classes:
            view, beam_view = ours.view_as(cls), beam_view_as(beams, cls)
            assert _state(view) == _state(beam_view), cls
            assert view._all_options is ours._all_options and view._flags is ours._flags
            assert str(view) == str(beam_view)
    view = ours.view_as(StandardOptions)
    view.streaming = True  # a view writes through to the options and its other views
    assert ours.view_as(StandardOptions).streaming and ours.get_all_options()["streaming"]


@MEMO_OFF
def test_option_views_share_no_values_between_options_objects():
    first = PipelineOptions(["--experiments", "a"])
    first.view_as(DebugOptions).add_experiment("b")
    first.view_as(TypeOptions).pipeline_type_check = False
    second = PipelineOptions(["--experiments", "a"])
    assert second.view_as(DebugOptions).experiments == ["a"]
    assert second.view_as(TypeOptions).pipeline_type_check
    assert first.view_as(DebugOptions).experiments == ["a", "b"]


@MEMO_OFF
def test_option_views_of_a_class_with_its_own_init_and_bad_flags_go_to_beam():
    made = []

    class _OwnInit(PipelineOptions):
        @classmethod
        def _add_argparse_args(cls, parser):
            parser.add_argument("--own", default="x")

        def __init__(self, flags=None, **kwargs):
            made.append(flags)
            super().__init__(flags, **kwargs)

    options = PipelineOptions(["--own", "y"])
    assert options.view_as(_OwnInit).own == options.view_as(_OwnInit).own == "y"
    assert made == [["--own", "y"]] * 2  # constructed by Beam's view_as each time
    with pytest.raises(ValueError, match="single string"):
        PipelineOptions("--runner").view_as(StandardOptions)


def _plain(a, b=2, *, c=3):
    return a, b, c


class _Methods:
    def method(self, x, y=beam.DoFn.WindowParam):
        return x, y


@MEMO_OFF
def test_signatures_are_what_beam_reads_and_are_dropped_with_the_function():
    beam_signature = decorators.get_signature.__wrapped__  # set by tests/conftest.py
    from apache_beam.transforms import core, ptransform, util
    assert core.get_signature is ptransform.get_signature is util.get_signature
    assert core.get_signature is decorators.get_signature
    obj = _Methods()
    for func in (_plain, obj.method, _Methods.method, str.upper, int, len, print, copy.copy,
                 lambda z, w=1: z):
        assert decorators.get_signature(func) == beam_signature(func), func
        assert decorators.get_signature(func) == beam_signature(func), func  # from the memo
    assert str(decorators.get_signature(obj.method)) == "(x, y=WindowParam)"
    assert core.get_function_args_defaults(_Methods().method) == (["x", "y"],
                                                                  [beam.DoFn.WindowParam])

    def make(default):
        def inner(v=default):
            return v
        return inner

    first = make(1)
    assert decorators.get_signature(first).parameters["v"].default == 1
    del first
    gc.collect()
    assert decorators.get_signature(make(2)).parameters["v"].default == 2  # a new function
    assert inspect.signature(_plain) == decorators.get_signature(_plain)


@MEMO_OFF
def test_pickled_payloads_are_the_bytes_beam_makes():
    from apache_beam.internal import cloudpickle_pickler, pickler

    from tests.conftest import _BytesMemo

    assert cloudpickle_pickler.bz2.compress.__wrapped__ is bz2.compress  # set by tests/conftest.py
    for fn in (_Tally(), _Twice(), _Tally()):
        expected = base64.b64encode(bz2.compress(cloudpickle_pickler._dumps(fn), compresslevel=9))
        assert pickler.dumps(fn) == expected == pickler.dumps(fn)  # the second from the memo
        assert type(pickler.loads(expected)) is type(fn)
    memo = _BytesMemo(bz2.compress, limit=3_000)
    texts = [bytes(range(i, 256)) * 4 for i in range(6)]
    for text in texts * 2:
        assert memo(text, compresslevel=9) == bz2.compress(text, 9) != memo(text, 1)
        assert 0 < memo._size <= 3_000 and len(memo._memo) < 6
