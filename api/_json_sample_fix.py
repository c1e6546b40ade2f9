"""Let Beam's ``ReadFromJson`` read a file without records as no rows (Beam fails it when built).

``apache_beam.dataframe.io._ReadFromPandas.expand`` (Beam 2.77; ``beam.io.ReadFromJson`` and Beam
YAML's ``ReadFromJson`` read through it) reads a sample of the first file while the pipeline is
built, to give the rows their Beam schema. With ``lines=True`` (the default) that is
``next(stream)`` on pandas' chunked JSON reader: a file holding no record (0 bytes, blank lines
only) has no first chunk, so ``StopIteration`` escapes and the whole pipeline fails when built:
whether a release happens then depends on the data (rule 7), e.g. on an empty nightly drop. With
``lines=False`` (one JSON document per file) the sample is ``pandas.read_json`` of the whole
first file: a 0-byte or blank file fails it when built (``ValueError: Expected object or
value``), and on the workers each such file failed the run the same way.

:func:`install` wraps that method once per process (``import beamsynth`` imports this module
first): for a pandas line reader, where the first file has no chunk the sample is the first
chunk of the pattern's other files (Beam samples only the first file it matches: a glob whose
first file is empty would otherwise type every record of the others as a row without fields),
else an empty frame (no columns): the rows get a schema without fields and the run reads no
rows, as a header-only CSV file reads. Every other read is unchanged: Beam's reading step on the workers
gets pandas' own reader (it keeps a pandas reader by its name), and a file with a record reads
its first chunk as before. Whether a file is empty is never looked at before the run.

For ``lines=False`` the reader itself is :class:`WholeJsonReader` (Beam's reading step on the
workers keeps it): a file without JSON text (0 bytes, blanks) is a frame without rows, as a
``[]`` file is; the build-time sample, where the first file has no row, is the first file of the
pattern with one, else a frame without columns. A file with JSON text is ``pandas.read_json``
of it, as before (an invalid one still fails, as Beam's reader does).
"""

from __future__ import annotations

import copy
import functools
import io
from typing import Any

from beamsynth._csv_header_fix import wrap_dataframe_io

__all__ = ["WholeJsonReader", "install"]


class _FirstChunkOrElsewhere:
    """A chunked pandas reader whose first ``next``, where the file has no chunk, gives the first
    chunk of the pattern's other files (``elsewhere()``), or an empty frame if none has one."""

    def __init__(self, stream: Any, elsewhere: Any) -> None:
        self._stream, self._elsewhere = stream, elsewhere

    def __enter__(self) -> _FirstChunkOrElsewhere:
        self._stream.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._stream.__exit__(*exc)

    def __iter__(self) -> _FirstChunkOrElsewhere:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._stream)
        except StopIteration:
            return self._elsewhere()


def _sampling_reader(reader: Any, elsewhere: Any) -> Any:
    # functools.wraps keeps pandas' module and name, by which Beam's read step on the workers
    # looks up pandas' own reader: only the sample read when built goes through this wrapper.
    @functools.wraps(reader)
    def read_or_elsewhere(*args: Any, **kwargs: Any) -> Any:
        return _FirstChunkOrElsewhere(reader(*args, **kwargs), elsewhere)

    return read_or_elsewhere


def _first_chunk_of_any_file(transform: Any, reader: Any) -> Any:
    """The first chunk of the first file of ``transform.path`` that has one (Beam samples only
    the first file it matches: a glob whose first file is empty would give every record of the
    others a schema without fields), else an empty frame (no file holds a record)."""
    from io import TextIOWrapper

    import pandas
    from apache_beam.io.filesystems import FileSystems

    kwargs = dict(transform.kwargs, chunksize=100)
    for meta in FileSystems.match([transform.path])[0].metadata_list:
        with FileSystems.open(meta.path) as handle:
            text = TextIOWrapper(handle, encoding=transform.kwargs.get("encoding", None))
            with reader(text, *transform.args, **kwargs) as stream:
                for chunk in stream:
                    return chunk
    return pandas.DataFrame()


class WholeJsonReader:
    """``pandas.read_json`` of one whole file (``ReadFromJson(lines=False)``) where a file without
    JSON text (0 bytes, blanks only) has no rows. The first call of a reader made with
    ``sample_from`` (a transform) is Beam's build-time sample: where that file has no row it
    gives the first frame with a row among the transform's other files, else a frame without
    columns. Every later call (the workers' reads) reads its own file only, and a file without
    rows there (blank, ``[]``) is the sample's columns without rows, the columns Beam's
    conversion to rows expects."""

    def __init__(self, sample_from: Any = None) -> None:
        self._sample_from, self._columns = sample_from, None

    def __getstate__(self) -> dict[str, Any]:
        return {"_sample_from": None, "_columns": self._columns}  # workers read their own files

    def __call__(self, handle: Any, *args: Any, **kwargs: Any) -> Any:
        transform, self._sample_from = self._sample_from, None  # only the first call samples
        frame = _whole_json(handle, args, kwargs)
        if not len(frame):
            if transform is not None:
                frame = next((f for f in _whole_json_frames(transform) if len(f)), frame)
            elif self._columns is not None:
                frame = self._columns.copy()
        if self._columns is None:
            self._columns = frame.iloc[:0]
        return frame


def _whole_json(handle: Any, args: Any, kwargs: Any) -> Any:
    import pandas

    text = handle.read()
    if not text.strip():  # a file without a JSON document: no rows
        return pandas.DataFrame()
    return pandas.read_json(io.StringIO(text), *args, **kwargs)


def _whole_json_frames(transform: Any) -> Any:
    """Each file of ``transform.path`` read whole, in Beam's match order (for the sample)."""
    from io import TextIOWrapper

    from apache_beam.io.filesystems import FileSystems

    for meta in FileSystems.match([transform.path])[0].metadata_list:
        with FileSystems.open(meta.path) as handle:
            text = TextIOWrapper(handle, encoding=transform.kwargs.get("encoding", None))
            yield _whole_json(text, transform.args, transform.kwargs)


def _is_pandas_read_json(reader: Any) -> bool:
    return (getattr(reader, "__module__", "").startswith("pandas.")
            and getattr(reader, "__name__", "") == "read_json")


def _sampling_empty(expand: Any) -> Any:
    @functools.wraps(expand)
    def expand_reading_empty(self: Any, root: Any) -> Any:
        reader = getattr(self, "reader", None)
        if not _is_pandas_read_json(reader):
            return expand(self, root)
        sampling = copy.copy(self)  # the transform may be applied again: never changed in place
        if getattr(self, "incremental", False):
            sampling.reader = _sampling_reader(reader, lambda: _first_chunk_of_any_file(self, reader))
        else:  # lines=False: the workers read through it too (an empty file is no rows there)
            sampling.reader = WholeJsonReader(sample_from=self)
        return expand(sampling, root)

    return expand_reading_empty


def install() -> bool:
    """Wrap Beam's pandas read transform once; False when this Beam has no such transform."""
    return wrap_dataframe_io("_ReadFromPandas", "expand", _sampling_empty)


install()
