"""Fault injection for tests of retry behaviour: a pass-through DoFn that fails exactly once.

Runners retry a failed bundle (the bundle-based DirectRunner up to 4 times, Dataflow/Flink by
policy) and discard whatever the failed attempt emitted. A DP pipeline must then release the
same thing (up to fresh noise in secure mode) and never release twice. :class:`FailOnceFn`
raises :class:`InjectedFault` in the middle of a bundle, after ``after`` elements have been
emitted, the first time any worker reaches that point: the "already failed" state is a flag file
created atomically (``open(path, "x")``), so it works across processes, workers and retries
without any shared memory.

Never use it outside tests: it exists so the fault-injection tests can run the real Beam graph.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import apache_beam as beam

__all__ = ["FailOnceFn", "InjectedFault"]


class InjectedFault(RuntimeError):
    """The one-time failure raised by :class:`FailOnceFn`."""


class FailOnceFn(beam.DoFn):
    """Pass elements through unchanged, but fail once mid-bundle (flag-file controlled).

    Args:
      flag_path: a path on a file system shared by all workers; created when the fault fires.
        If it exists already, the DoFn never fails.
      after: elements emitted in the bundle before the failure (0 fails on the first one).
    """

    def __init__(self, flag_path: str, *, after: int = 1) -> None:
        if not isinstance(flag_path, str) or not flag_path:
            raise ValueError(f"flag_path ({flag_path!r}) must be a non-empty path")
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise ValueError(f"after ({after!r}) must be an int >= 0")
        self._flag, self._after = flag_path, after
        self._seen = 0

    def start_bundle(self) -> None:
        self._seen = 0

    def process(self, element: Any) -> Iterable[Any]:
        if self._seen >= self._after and self._claim():
            raise InjectedFault(f"injected one-time failure after {self._seen} element(s) in this bundle")
        self._seen += 1
        yield element

    def _claim(self) -> bool:
        """True for exactly one caller across all processes: whoever creates the flag file."""
        try:
            fd = os.open(self._flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.close(fd)
        return True
