"""Let Beam's ``ReadFromJson`` read a file without records as no rows (Beam fails it when built).

``apache_beam.dataframe.io._ReadFromPandas.expand`` (Beam 2.77; ``beam.io.ReadFromJson`` and Beam
YAML's ``ReadFromJson`` read through it with ``lines=True``) reads the first chunk of the first
file while the pipeline is built, to give the rows their Beam schema: ``next(stream)`` on
pandas' chunked JSON reader. A file holding no record (0 bytes, blank lines only) has no first
chunk, so ``StopIteration`` escapes and the whole pipeline fails when built: whether a release
happens then depends on the data (rule 7), e.g. on an empty nightly drop.

:func:`install` wraps that method once per process (``import beamsynth`` imports this module
first): for a pandas line reader, the sample read returns an empty frame (no columns) where the
stream has no first chunk, so the rows get a schema without fields and the run reads no rows, as
a header-only CSV file reads. Every other read is unchanged: Beam's reading step on the workers
gets pandas' own reader (it keeps a pandas reader by its name), and a file with a record reads
its first chunk as before. Whether a file is empty is never looked at before the run.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from beamsynth._csv_header_fix import wrap_dataframe_io

__all__ = ["install"]


class _FirstChunkOrEmpty:
    """A chunked pandas reader whose first ``next`` gives an empty frame where no chunk is."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __enter__(self) -> _FirstChunkOrEmpty:
        self._stream.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._stream.__exit__(*exc)

    def __iter__(self) -> _FirstChunkOrEmpty:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._stream)
        except StopIteration:
            import pandas

            return pandas.DataFrame()


def _sampling_reader(reader: Any) -> Any:
    # functools.wraps keeps pandas' module and name, by which Beam's read step on the workers
    # looks up pandas' own reader: only the sample read when built goes through this wrapper.
    @functools.wraps(reader)
    def read_or_empty(*args: Any, **kwargs: Any) -> Any:
        return _FirstChunkOrEmpty(reader(*args, **kwargs))

    return read_or_empty


def _sampling_empty(expand: Any) -> Any:
    @functools.wraps(expand)
    def expand_reading_empty(self: Any, root: Any) -> Any:
        reader = getattr(self, "reader", None)
        if not (getattr(self, "incremental", False)
                and getattr(reader, "__module__", "").startswith("pandas.")
                and getattr(reader, "__name__", "") == "read_json"):
            return expand(self, root)
        sampling = copy.copy(self)  # the transform may be applied again: never changed in place
        sampling.reader = _sampling_reader(reader)
        return expand(sampling, root)

    return expand_reading_empty


def install() -> bool:
    """Wrap Beam's pandas read transform once; False when this Beam has no such transform."""
    return wrap_dataframe_io("_ReadFromPandas", "expand", _sampling_empty)


install()
