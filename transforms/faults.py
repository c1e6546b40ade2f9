"""Fault injection for tests of retry behaviour: a pass-through DoFn that fails exactly once.

Runners retry a failed bundle (the bundle-based DirectRunner up to 4 times, Dataflow/Flink by
policy) and discard whatever the failed attempt emitted. A DP pipeline must then release the
same thing (up to fresh noise in secure mode) and never release twice. :class:`FailOnceFn`
raises :class:`InjectedFault` in the middle of a bundle, after ``after`` elements have been
emitted, the first time any worker reaches that point: the "already failed" state is a flag file
created atomically (``open(path, "x")``), so it works across processes, workers and retries
without any shared memory.

With ``record=True`` the failing attempt writes the element it was about to emit into the flag
file (:func:`recorded_element`): what a failed attempt computed may already have escaped (a side
effect, a log line), so the audits compare it with what the retry releases.

:class:`FreshEntropySecret` is the broken variant of the run secret for audits: a secure source
keyed by it draws fresh OS entropy for every word, like ``RandomSource`` before issue 15, so a
re-executed step re-draws its noise. Swapped in for :class:`~beamsynth.transforms.noise.RunSecret`
(``noise._SECRET_FACTORY``) it travels in the job graph to every worker; the audits must catch it.

Never use it outside tests: it exists so the fault-injection tests can run the real Beam graph.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import struct
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import apache_beam as beam

from beamsynth.transforms.noise import RunSecret

__all__ = ["FailOnceFn", "FreshEntropySecret", "InjectedFault", "LoggedSecret", "fail_first_call",
           "read_call_log", "read_stream_log", "recorded_element"]


class InjectedFault(RuntimeError):
    """The one-time failure raised by :class:`FailOnceFn`."""


class FailOnceFn(beam.DoFn):
    """Pass elements through unchanged, but fail once mid-bundle (flag-file controlled).

    Args:
      flag_path: a path on a file system shared by all workers; created when the fault fires.
        If it exists already, the DoFn never fails.
      after: elements emitted in the bundle before the failure (0 fails on the first one).
      record: write the element of the failing call into the flag file (pickled; read it back
        with :func:`recorded_element`).
    """

    def __init__(self, flag_path: str, *, after: int = 1, record: bool = False) -> None:
        if not isinstance(flag_path, str) or not flag_path:
            raise ValueError(f"flag_path ({flag_path!r}) must be a non-empty path")
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise ValueError(f"after ({after!r}) must be an int >= 0")
        self._flag, self._after, self._record = flag_path, after, bool(record)
        self._seen = 0

    def start_bundle(self) -> None:
        self._seen = 0

    def process(self, element: Any) -> Iterable[Any]:
        if self._seen >= self._after and self._claim(element):
            raise InjectedFault(f"injected one-time failure after {self._seen} element(s) in this bundle")
        self._seen += 1
        yield element

    def _claim(self, element: Any) -> bool:
        """True for exactly one caller across all processes: whoever creates the flag file."""
        try:
            fd = os.open(self._flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        try:
            if self._record:
                os.write(fd, pickle.dumps(element))
        finally:
            os.close(fd)
        return True


def recorded_element(flag_path: str) -> Any:
    """The element a :class:`FailOnceFn` with ``record=True`` saw when it failed."""
    with open(flag_path, "rb") as fh:
        return pickle.load(fh)


class _FreshStream:
    def read(self, nbytes: int) -> bytes:
        return os.urandom(nbytes)


class FreshEntropySecret(RunSecret):
    """Broken variant for audits: every stream reads fresh OS entropy (the pre-issue-15 secure
    mode), so the same (secret, labels) gives different draws on each execution."""

    __slots__ = ()

    def stream(self, labels: tuple[Hashable, ...]) -> _FreshStream:  # type: ignore[override]
        return _FreshStream()



class _LoggedStream:
    def __init__(self, inner: Any, log_path: str, labels: tuple[Hashable, ...]) -> None:
        self._inner, self._log, self._labels, self._offset = inner, log_path, labels, 0

    def read(self, nbytes: int) -> bytes:
        data = self._inner.read(nbytes)
        # the first word at this offset: a keyed stream gives it whatever the read size
        line = f"{self._labels!r}\t{self._offset}\t{data[:8].hex()}\t{nbytes}\n"
        with open(self._log, "a", encoding="utf-8") as fh:
            fh.write(line)
        self._offset += nbytes
        return data


class LoggedSecret(RunSecret):
    """Audit variant of the run secret that logs, from whichever process uses it, every read of
    every stream it keys: ``labels, offset, first word read, bytes read``. Re-executions show up as the
    same (labels, offset) read more than once; the fix makes every such read give the same word
    (a keystream position's bytes do not depend on the read size, and a re-execution on other
    input may read other sizes). ``fresh=True`` makes it the broken variant (fresh entropy, as
    :class:`FreshEntropySecret`) with the same log."""

    __slots__ = ("_log", "_fresh")

    def __init__(self, key: bytes | None = None, *, log_path: str, fresh: bool = False) -> None:
        super().__init__(key)
        self._log, self._fresh = str(log_path), bool(fresh)

    def stream(self, labels: tuple[Hashable, ...]) -> _LoggedStream:  # type: ignore[override]
        inner = _FreshStream() if self._fresh else super().stream(labels)
        return _LoggedStream(inner, self._log, tuple(labels))

    def __getstate__(self) -> tuple[bytes, str, bool]:  # type: ignore[override]
        return self._key, self._log, self._fresh

    def __setstate__(self, state: tuple[bytes, str, bool]) -> None:  # type: ignore[override]
        self._key, self._log, self._fresh = state


def read_stream_log(log_path: str) -> dict[tuple[str, int], list[tuple[str, int]]]:
    """(labels repr, offset) → (first word in hex, bytes read) of every read logged by
    :class:`LoggedSecret`."""
    reads: dict[tuple[str, int], list[tuple[str, int]]] = {}
    with open(log_path, encoding="utf-8") as fh:
        for line in fh:
            labels, offset, word, nbytes = line.rstrip("\n").rsplit("\t", 3)
            reads.setdefault((labels, int(offset)), []).append((word, int(nbytes)))
    return reads


def _call_key(element: Any, args: tuple[Any, ...]) -> str:
    return hashlib.sha256(pickle.dumps((element, args))).hexdigest()


def fail_first_call(process: Callable[..., Any], flag_path: str, log_path: str) -> Callable[..., Any]:
    """Wrap a DoFn's ``process`` so that its first call anywhere computes its outputs, records
    them and raises :class:`InjectedFault`: the runner retries the bundle and the DoFn runs again
    on the same input. Every later call appends ``(input key, outputs)`` to ``log_path``. The
    failed attempt's ``(input key, outputs)`` is in ``flag_path`` (:func:`recorded_element`).

    Patch it onto a DoFn class in-process (``monkeypatch.setattr(Fn, "process", ...)``); Beam
    reads the DoFn's parameters (``window=DoFn.WindowParam``) through ``functools.wraps``.
    """

    @functools.wraps(process)
    def wrapped(self: Any, element: Any, *args: Any, **kwargs: Any) -> Iterable[Any]:
        out = list(process(self, element, *args, **kwargs) or ())
        record = (_call_key(element, args), pickle.dumps(out))
        try:
            fd = os.open(flag_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            blob = pickle.dumps(record)
            with open(log_path, "ab") as fh:
                fh.write(struct.pack("<Q", len(blob)) + blob)
            yield from out
            return
        try:
            os.write(fd, pickle.dumps(record))
        finally:
            os.close(fd)
        raise InjectedFault(f"injected failure after {type(self).__name__}.process computed its output")

    return wrapped


def read_call_log(log_path: str) -> list[tuple[str, bytes]]:
    """The ``(input key, pickled outputs)`` records appended by :func:`fail_first_call`."""
    out: list[tuple[str, bytes]] = []
    if not os.path.exists(log_path):
        return out
    with open(log_path, "rb") as fh:
        data = fh.read()
    pos = 0
    while pos < len(data):
        (size,) = struct.unpack_from("<Q", data, pos)
        out.append(pickle.loads(data[pos + 8: pos + 8 + size]))
        pos += 8 + size
    return out
