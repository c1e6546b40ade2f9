"""beamsynth's Beam counters of a finished run, read once for every caller: the manifests' exact
counts (:func:`~beamsynth.pipelines.methods.synthesize.counter_value`), the run-time choices and
refinement picks of the methods, and the CLI's ``--fail-on-rejected`` pre-pass.

A counter's value is its committed figure where the runner reports one, else its attempted one
(Beam's DirectRunner reports both; a runner without committed metrics only attempted); a counter
reported in several parts (steps, workers) is summed by name.
"""

from __future__ import annotations

from typing import Any

from apache_beam.metrics.metric import MetricsFilter

from beamsynth.pipelines.io.records import METRICS_NAMESPACE

__all__ = ["run_counters"]


def run_counters(result: Any, *, name: str | None = None, prefix: str = "") -> dict[str, int] | None:
    """``counter name → value`` of the beamsynth counters of a finished run (``result``, a Beam
    ``PipelineResult``): only ``name`` when given, else every counter whose name starts with
    ``prefix``. ``None`` where the runner reports no metrics (its ``metrics()`` raises)."""
    wanted = MetricsFilter().with_namespace(METRICS_NAMESPACE)
    if name is not None:
        wanted = wanted.with_name(name)
    try:
        found = result.metrics().query(wanted)["counters"]
    except Exception:  # noqa: BLE001 - some runners do not report metrics
        return None
    out: dict[str, int] = {}
    for c in found:
        key = c.key.metric.name
        if key.startswith(prefix):
            value = c.committed if c.committed is not None else c.attempted
            out[key] = out.get(key, 0) + int(value or 0)
    return out
