"""Progress on the terminal for long runs: stage lines and running row counts (stderr).

Row counts are exact (they describe private input) and go only to the operator's terminal,
never into released files. ``--quiet`` silences them.
"""

from __future__ import annotations

import sys
import time
from typing import IO

import apache_beam as beam

__all__ = ["Progress", "RowProgressFn"]


class Progress:
    """Stage and row-count messages on the terminal (stderr); silent when ``quiet``."""

    def __init__(self, *, quiet: bool = False, stream: IO[str] | None = None) -> None:
        self.quiet = bool(quiet)
        self._stream = stream
        self._t0 = time.time()

    def __call__(self, message: str) -> None:
        """Print one progress line with the elapsed time."""
        if not self.quiet:
            stream = self._stream or sys.stderr
            print(f"[{time.time() - self._t0:6.1f}s] {message}", file=stream, flush=True)


class RowProgressFn(beam.DoFn):
    """Passes encoded batches through and prints the running number of rows used (stderr) per
    worker: rows that were read, not rejected and kept by the contribution bound."""

    def __init__(self, label: str) -> None:
        self._label = label
        self._rows = 0

    def process(self, batch):
        self._rows += len(batch)
        print(f"         {self._label}: rows used {self._rows}", file=sys.stderr, flush=True)
        yield batch
