"""``LocalDirectRunner``: Beam's DirectRunner without its attempt to switch to Prism.

apache-beam 2.77's ``DirectRunner`` first tries to run every pipeline it considers compatible on
the Prism runner: it downloads a Go binary from github.com (on every run, unless cached), and
when that works the pipeline runs on Prism instead of the Python FnApiRunner that beamsynth is
tested on; offline, the download fails after a network timeout and it falls back, having built
and serialized the pipeline once more for nothing (Adult histograms: 0.57 → 0.39 CPU-s without the
attempt). The ``direct`` / ``direct-multi`` presets and the CLI's default therefore use this
runner: it is the DirectRunner in every other respect (FnApiRunner for batch pipelines in
``in_memory`` or ``multi_processing`` mode, the BundleBasedDirectRunner for streaming and
``TestStream``). Pass ``--runner DirectRunner`` to get Beam's own switching behaviour.

How: Beam's Prism check declines pipelines whose options set ``allow_unsafe_triggers`` (an
option read only when triggers are applied, at graph construction, which is over when
``run_pipeline`` is called); this runner sets it for the duration of ``run_pipeline`` and
restores it.

In ``multi_processing`` mode (``direct-multi``) the worker processes run
:mod:`beamsynth.runners.sdk_worker` (Beam's ``sdk_worker_main`` without its three startup lines
on the terminal) instead of ``apache_beam.runners.worker.sdk_worker_main``: Beam builds that
command inside ``FnApiRunner.run_pipeline``, so :func:`_worker_command` rewrites it there, for
the duration of ``run_pipeline`` only. Nothing else changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, TypeOptions
from apache_beam.runners.direct.direct_runner import DirectRunner
from apache_beam.transforms.environments import SubprocessSDKEnvironment

__all__ = ["LOCAL_DIRECT_RUNNER", "LocalDirectRunner"]

LOCAL_DIRECT_RUNNER = "beamsynth.runners.local.LocalDirectRunner"
BEAM_WORKER = "-m apache_beam.runners.worker.sdk_worker_main"  # Beam's worker command (2.77)
QUIET_WORKER = "-m beamsynth.runners.sdk_worker"


@contextlib.contextmanager
def _worker_command() -> Iterator[None]:
    """While it is open, a subprocess environment made from Beam's worker command runs
    :mod:`beamsynth.runners.sdk_worker` instead (any other command is left as it is)."""
    made = SubprocessSDKEnvironment.__dict__.get("from_command_string")
    if not isinstance(made, classmethod):  # another Beam version: its own worker, its own lines
        yield
        return

    def from_command_string(cls: type, command_string: str) -> Any:
        if command_string.endswith(BEAM_WORKER):
            command_string = command_string[: -len(BEAM_WORKER)] + QUIET_WORKER
        return made.__func__(cls, command_string)

    SubprocessSDKEnvironment.from_command_string = classmethod(from_command_string)
    try:
        yield
    finally:
        SubprocessSDKEnvironment.from_command_string = made


class LocalDirectRunner(DirectRunner):
    """The DirectRunner, never switching to (or downloading) Prism. See the module docstring."""

    def run_pipeline(self, pipeline: Any, options: PipelineOptions) -> Any:
        types = options.view_as(TypeOptions)
        before = types.allow_unsafe_triggers
        types.allow_unsafe_triggers = True  # makes DirectRunner's Prism support check decline
        quiet = options.view_as(DirectOptions).direct_running_mode == "multi_processing"
        try:
            with _worker_command() if quiet else contextlib.nullcontext():
                return super().run_pipeline(pipeline, options)
        finally:
            types.allow_unsafe_triggers = before
