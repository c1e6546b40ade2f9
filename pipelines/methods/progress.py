"""Progress on the terminal for long runs: stage lines and running row counts (stderr).

Row counts are exact (they describe private input) and go only to the operator's terminal,
never into released files. ``--quiet`` silences them.

The running count of :class:`RowProgressFn` is one per process and run: every bundle and every
copy of the DoFn in a process adds to it, so the lines a process prints only go up. A line is
printed when the count passes the next of 1, 2, 5, 10, 20, 50, ... rows, or when
``HEARTBEAT_SECONDS`` have passed since the process's last line: a few lines per process however
many bundles there are. Worker processes (``--runner direct-multi``, Dask, ...) cannot add their
counts together, so each prints its own, tagged ``[worker PID]``; the exact total is the
manifest's (the CLI prints it at the end). Each line says ``so far``: the last one printed is
the last milestone passed, not the total (Adult's 48,842 rows end on ``rows used 20000 so far``;
before the nineteenth session it read ``rows used 20000``, as if it were the count).
"""

from __future__ import annotations

import itertools
import os
import socket
import sys
import threading
import time
from typing import IO

import apache_beam as beam

__all__ = ["HEARTBEAT_SECONDS", "Progress", "RowProgressFn", "next_milestone"]

HEARTBEAT_SECONDS = 30.0  # a process prints at least this often while it counts rows

_RUNS = itertools.count()  # one running count per RowProgressFn made in this process
_LOCK = threading.Lock()
_COUNTS: dict[tuple[str, int, int, str], tuple[int, float]] = {}  # (maker's host, pid, run, label)
# → rows so far, time of the last line


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


def next_milestone(rows: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... greater than ``rows``."""
    step = 1
    while True:
        for m in (step, 2 * step, 5 * step):
            if m > rows:
                return m
        step *= 10


class RowProgressFn(beam.DoFn):
    """Passes encoded batches through and prints the running number of rows used (stderr): rows
    that were read, not rejected and kept by the contribution bound, counted per process over
    every bundle (module docstring), so each process's lines only go up."""

    def __init__(self, label: str) -> None:
        self._label = label
        # this run, wherever the DoFn is unpickled; host and pid tell the launching process
        self._key = (socket.gethostname(), os.getpid(), next(_RUNS), label)

    def process(self, batch):
        now = time.monotonic()
        with _LOCK:  # bundles may run in threads of one process
            before, last = _COUNTS.get(self._key, (0, now))
            rows = before + len(batch)
            show = rows >= next_milestone(before) or now - last >= HEARTBEAT_SECONDS
            _COUNTS[self._key] = (rows, now if show else last)
            if show:
                here = (socket.gethostname(), os.getpid())
                where = "" if here == self._key[:2] else f" [worker {os.getpid()}]"
                print(f"         {self._label}{where}: rows used {rows} so far", file=sys.stderr,
                      flush=True)  # a running count: the exact total is the manifest's
        yield batch
