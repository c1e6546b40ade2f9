"""Fixtures shared by the test layers (pipeline and audit)."""

from __future__ import annotations

import argparse
import bz2
import collections
import copy
import inspect
import logging
import os
import sys
import threading
import types
import weakref

import pytest


# Beam's pipeline construction re-inspects every method of a DoFn each time it asks whether the
# DoFn uses state or timers: apache_beam.transforms.userstate.get_dofn_specs runs inspect.signature
# over dir(dofn) (~30 methods), and Beam asks ~7 times per ParDo (ParDo init, to_runner_api, the
# direct runner's overrides, the DoFnRunner). H97, eighteenth session: 92 of 210 s of a profiled
# pipeline test (cProfile, which inflates it); run at the same moment with and without (load
# 10-12): test_api_windows + test_api 88.3 s -> 73.2 s of test time, five heavier files 429 s ->
# 368 s (pytest -n 2).
# The answer is a function of the DoFn object alone, so the test session keeps it per DoFn
# object (by identity, dropped with the object) and hands out copies; Beam's own function still
# computes every answer once (errors such as duplicate parameters are raised as before).
# tests/pipeline/test_beam_overhead.py checks the memo against Beam's function on a stateful DoFn.
# BEAMSYNTH_TEST_BEAM_MEMO=0 runs Beam's function unchanged (to rule the memo out, or time it).
def _memoize_dofn_specs() -> None:
    from apache_beam.runners.direct import transform_evaluator
    from apache_beam.transforms import userstate

    beam_get_dofn_specs = getattr(userstate.get_dofn_specs, "__wrapped__", userstate.get_dofn_specs)
    memo: dict[int, tuple[weakref.ref, tuple[set, set]]] = {}

    def get_dofn_specs(dofn):
        key = id(dofn)
        hit = memo.get(key)
        if hit is None or hit[0]() is not dofn:
            specs = beam_get_dofn_specs(dofn)
            try:
                ref = weakref.ref(dofn, lambda _ref, key=key: memo.pop(key, None))
            except TypeError:  # an object that takes no weak reference: not kept
                return specs
            hit = memo[key] = (ref, specs)
        state_specs, timer_specs = hit[1]
        return set(state_specs), set(timer_specs)

    get_dofn_specs.__wrapped__ = beam_get_dofn_specs
    userstate.get_dofn_specs = get_dofn_specs  # is_stateful_dofn, core, common, direct_runner
    if getattr(transform_evaluator, "get_dofn_specs", None) is beam_get_dofn_specs:
        transform_evaluator.get_dofn_specs = get_dofn_specs  # imported by name there


# Beam builds a fresh argparse parser and parses the pipeline's flags again each time it asks an
# options object for a view (PipelineOptions.view_as(cls) runs cls(flags)), and it asks very often
# while building and running: TypeOptions per type check (typehints.is_consistent_with), per
# applied transform, per inferred output type. H99, nineteenth session: view_as was 23 % of the
# samples of test_prefix_pipeline + test_streaming + test_api_late (py-spy, 50 Hz), mostly
# argparse's add_argument and gettext. What a view parses is a function of the class, the flags,
# sys.argv (when the flags are None) and BEAM_SERVICE_OVERRIDES (read by CrossLanguageOptions), so
# the test session parses each such key once with Beam's own class and hands every view a deep
# copy of the parsed values; the rest is Beam 2.77's view_as line by line (views share the source
# object's _all_options; values it already holds are kept). A class with its own __init__ or
# __new__, or flags that are not hashable, go to Beam's view_as unchanged.
# tests/pipeline/test_beam_overhead.py compares every registered options class's view with Beam's.
def _memoize_option_views() -> None:
    from apache_beam.options import pipeline_options

    options_cls = pipeline_options.PipelineOptions
    beam_view_as = getattr(options_cls.view_as, "__wrapped__", options_cls.view_as)
    parsed: dict[tuple, tuple[argparse.Namespace, list[str]]] = {}

    def view_as(self, cls):
        flags = self._flags
        if cls.__init__ is not options_cls.__init__ or cls.__new__ is not object.__new__:
            return beam_view_as(self, cls)
        try:
            key = (cls, None if flags is None else tuple(flags),
                   tuple(sys.argv) if flags is None else None,
                   os.environ.get("BEAM_SERVICE_OVERRIDES"))
            hit = parsed.get(key)
        except TypeError:  # flags that are not hashable
            return beam_view_as(self, cls)
        if hit is None:
            first = cls(flags)  # Beam's parse; its errors are raised as before
            hit = parsed[key] = (copy.deepcopy(first._visible_options),
                                 first._visible_option_list())
        namespace, names = hit
        logging.basicConfig()  # as PipelineOptions.__init__
        view = object.__new__(cls)
        view._flags = flags
        view._visible_options = copy.deepcopy(namespace)
        for name in names:
            if name not in self._all_options:
                self._all_options[name] = getattr(view._visible_options, name)
        view._all_options = self._all_options
        return view

    view_as.__wrapped__ = beam_view_as
    view_as.__doc__ = beam_view_as.__doc__
    options_cls.view_as = view_as


# Beam reads a function's signature (inspect.signature, through typehints.decorators.
# get_signature) for every DoFn method it wraps: ParDo init, to_runner_api, the direct runner's
# overrides and evaluators, the bundle processor; DoFns that Beam unpickles are new objects, which
# the per-DoFn memo above does not know. A signature is a function of the function object (a
# bound method's is its function's without the first parameter, whatever it is bound to), so the
# test session keeps Beam's answer per function object (by identity, dropped with the function;
# inspect.Signature is immutable). Anything but a plain function or a method bound to one goes to
# Beam's function. tests/pipeline/test_beam_overhead.py compares the memo with Beam's function.
def _memoize_signatures() -> None:
    import apache_beam  # noqa: F401 (every module that imports get_signature by name)
    from apache_beam.typehints import decorators

    beam_get_signature = getattr(decorators.get_signature, "__wrapped__", decorators.get_signature)
    memo: dict[tuple[int, bool], tuple[weakref.ref, inspect.Signature]] = {}

    def get_signature(func):
        bound = isinstance(func, types.MethodType)
        target = func.__func__ if bound else func
        if not isinstance(target, types.FunctionType):
            return beam_get_signature(func)
        key = (id(target), bound)
        hit = memo.get(key)
        if hit is None or hit[0]() is not target:
            signature = beam_get_signature(func)
            ref = weakref.ref(target, lambda _ref, key=key: memo.pop(key, None))
            hit = memo[key] = (ref, signature)
        return hit[1]

    get_signature.__wrapped__ = beam_get_signature
    for name, module in list(sys.modules.items()):
        if (name.startswith("apache_beam.")
                and getattr(module, "get_signature", None) is beam_get_signature):
            module.get_signature = get_signature  # decorators, core, ptransform, util


class _BytesMemo:
    """``func(data, ...)`` of a bytes-to-bytes function, the most recent answers kept up to
    ``limit`` bytes of keys and answers (thread-safe; the function runs outside the lock)."""

    def __init__(self, func, limit: int) -> None:
        self.__wrapped__, self._limit = func, limit
        self._memo: collections.OrderedDict[tuple, bytes] = collections.OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def __call__(self, data, *args, **kwargs):
        key = (bytes(data), args, tuple(sorted(kwargs.items())))
        with self._lock:
            hit = self._memo.get(key)
            if hit is not None:
                self._memo.move_to_end(key)
                return hit
        answer = self.__wrapped__(data, *args, **kwargs)
        with self._lock:
            if key not in self._memo:
                self._memo[key] = answer
                self._size += len(key[0]) + len(answer)
            while self._size > self._limit:
                (data, _, _), old = self._memo.popitem(last=False)
                self._size -= len(data) + len(old)
        return answer


# Beam's pickler bz2-compresses (level 9) every pickled DoFn, coder and transform payload, and the
# same payloads again and again (Pipeline._verify_runner_api_compatible pickles the whole pipeline
# before each run, to_runner_api again, the runners unpickle them per bundle): bz2 was 5.4 % of the
# py-spy samples (the largest leaf) and decompress 1.3 % after the memos above (H99, nineteenth
# session), and 85 % of the calls in test_prefix_pipeline + test_streaming repeated an earlier
# input. bz2 is a function of its input, so the test session keeps the most recent answers (up to
# 64 MB); the pickled bytes are the same bytes. Workers in other processes use Beam's own.
def _memoize_pickle_compression() -> None:
    from apache_beam.internal import cloudpickle_pickler

    class _Bz2:
        compress = _BytesMemo(bz2.compress, 64 << 20)
        decompress = _BytesMemo(bz2.decompress, 64 << 20)

        def __getattr__(self, name):
            return getattr(bz2, name)

    if cloudpickle_pickler.bz2 is bz2:  # Beam's default pickler (dill is not installed)
        cloudpickle_pickler.bz2 = _Bz2()


if os.environ.get("BEAMSYNTH_TEST_BEAM_MEMO", "1") != "0":
    _memoize_dofn_specs()
    _memoize_option_views()
    _memoize_signatures()
    _memoize_pickle_compression()


def _close_dask_clients() -> None:
    """Close the Clients the DaskRunner opened (one per run, never closed by it)."""
    import distributed

    for client in list(distributed.client._global_clients.values()):
        client.close()


@pytest.fixture(scope="session")
def _dask_cluster():
    """A local dask.distributed cluster with 2 single-threaded worker processes, one per test
    process: with ``-n 2 --dist loadfile`` at most two start in a run, instead of one per module
    (each ~1.5 s to start and ~1-2 s to close idle, ~14 s at load 10; H99, nineteenth session).
    The runner's own cluster (``--runner dask`` without an address, the user's way) is started by
    tests/pipeline/test_session14_runners.py and test_cli_progress.py."""
    distributed = pytest.importorskip("distributed", reason="pip install 'beamsynth[dask]'")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None)
    try:
        yield cluster
    finally:
        _close_dask_clients()  # before the cluster
        cluster.close()


@pytest.fixture(scope="module")
def dask_address(_dask_cluster):
    """The shared cluster's scheduler address; the module's DaskRunner Clients close at its end."""
    try:
        yield _dask_cluster.scheduler_address
    finally:
        _close_dask_clients()


@pytest.fixture(autouse=True, scope="session")
def _quiet_unrecorded_jobs():
    """Most tests build jobs without bs.WriteManifest on purpose; the warning for that
    (transforms.private.WARN_UNRECORDED) is checked in a fresh interpreter by
    tests/pipeline/test_unrecorded_job.py."""
    from beamsynth.transforms import private

    private.WARN_UNRECORDED = False
    yield


# Guard for the default suite's time (H61, fourteenth session): CI's 2 cores have 15 minutes for
# the default run (`-m 'not slow'`), so a default test over SLOW_TEST_SECONDS (setup + call +
# teardown, on an unloaded machine) should be made cheaper or marked @pytest.mark.slow with the
# default test that still covers its behaviour named in a comment. This only warns: a loaded
# machine slows everything, so the list is a prompt to look, never a failure.
SLOW_TEST_SECONDS = float(os.environ.get("BEAMSYNTH_SLOW_TEST_SECONDS", "20"))
_test_seconds: dict[str, float] = {}
_slow_marked: set[str] = set()


def pytest_runtest_logreport(report):
    _test_seconds[report.nodeid] = _test_seconds.get(report.nodeid, 0.0) + report.duration
    if "slow" in report.keywords:
        _slow_marked.add(report.nodeid)


def pytest_terminal_summary(terminalreporter):
    over = sorted(((s, n) for n, s in _test_seconds.items()
                   if s > SLOW_TEST_SECONDS and n not in _slow_marked), reverse=True)
    if not over:
        return
    terminalreporter.write_sep(
        "=", f"{len(over)} unmarked test(s) over {SLOW_TEST_SECONDS:g} s "
             "(make cheaper or @pytest.mark.slow; see DEVELOPERS.md 'Test time')", yellow=True)
    for seconds, nodeid in over:
        terminalreporter.write_line(f"{seconds:7.1f}s {nodeid}")
