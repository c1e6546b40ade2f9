"""Deterministic synthetic load for scale tests and benchmarks (importable by every worker).

:class:`ResampleBatchesFn` turns a batch start offset into an ``EncodedBatch`` of rows drawn
i.i.d. (with replacement) from a code matrix saved as ``.npy``; batch ``s`` always gets the same
rows (numpy PCG64 seeded by ``s``), whatever worker draws it. This is benchmark input only: it
is public-data resampling, not a privacy mechanism, so it does not use ``RandomSource``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import apache_beam as beam
import numpy as np

from beamsynth.schemas.schema import EncodedBatch

__all__ = ["METRICS_NAMESPACE", "ResampleBatchesFn", "batch_starts", "resample_rows", "save_tables"]

METRICS_NAMESPACE = "beamsynth.loadgen"


def resample_rows(codes: np.ndarray, start: int, n: int) -> np.ndarray:
    """Rows of batch ``start``: ``n`` rows drawn from ``codes`` with PCG64(start)."""
    idx = np.random.Generator(np.random.PCG64(start)).integers(0, codes.shape[0], n)
    return codes[idx]


def batch_starts(rows: int, batch: int) -> list[int]:
    """Start offsets of the batches covering ``rows``."""
    if rows < 0 or batch < 1:
        raise ValueError(f"rows ({rows}) must be >= 0 and batch ({batch}) >= 1")
    return list(range(0, rows, batch))


class ResampleBatchesFn(beam.DoFn):
    """``start`` → ``EncodedBatch`` of ``min(batch, rows - start)`` resampled rows.

    The code matrix is loaded once per worker in ``setup`` from ``codes_path`` (``.npy``), so it
    is not pickled into the pipeline. Counts the batches each worker process drew in the
    counter ``batches@<pid>`` (namespace :data:`METRICS_NAMESPACE`), to see how work was spread.
    """

    def __init__(self, *, codes_path: str, rows: int, batch: int) -> None:
        if rows < 0 or batch < 1:
            raise ValueError(f"rows ({rows}) must be >= 0 and batch ({batch}) >= 1")
        self._path, self._rows, self._batch = codes_path, rows, batch
        self._codes: np.ndarray | None = None

    def setup(self) -> None:
        self._codes = np.load(self._path)
        self._counter = beam.metrics.Metrics.counter(METRICS_NAMESPACE, f"batches@{os.getpid()}")

    def process(self, start: int) -> Iterable[EncodedBatch]:
        self._counter.inc()
        yield EncodedBatch(resample_rows(self._codes, start, min(self._batch, self._rows - start)))


def save_tables(tables: tuple[np.ndarray, ...], path: str) -> None:
    """Write count tables to ``path`` (``.npz``; arrays ``t0``, ``t1``, ...)."""
    np.savez(path, **{f"t{i}": t for i, t in enumerate(tables)})
