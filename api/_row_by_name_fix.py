"""Turn a pandas chunk into Beam rows by column name (Beam zips them by position).

``apache_beam.typehints.pandas_type_compatibility.DataFrameBatchConverterDropIndex`` (Beam 2.77)
explodes each DataFrame batch of a DataFrame read (``beam.io.ReadFromJson``/``ReadFromCsv``,
Beam YAML's readers, ``to_pcollection``) into rows by zipping the batch's columns, in the batch's
own order, with the fields of the schema Beam sampled when the pipeline was built. pandas orders
a JSON chunk's columns as the chunk's first record lists its keys, so one record (the first of a
file, or of a 10,000-line chunk) with its keys in another order, or with a key the sample lacks
listed first, moved every value of its chunk's rows into another field, and a chunk without one
of the sampled keys (a one-record file lacking it) failed the whole run (``missing 1 required
positional argument``): one record decided how others were read, or whether anything was
released (rules 6 to 8; docs/audits.md "Nineteenth session", H100).

:func:`install` wraps the converter's column lookup once per process (``import beamsynth``
imports this module, so a worker that loads any beamsynth step has it too): a batch whose
columns are the fields in order is read as before; any other batch with text column names gives
each field its own column by name, a field the batch lacks null, a column no field names
unread. A batch with other column names (numbers) keeps Beam's lookup.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["install"]


def _by_name(get_series: Any) -> Any:
    @functools.wraps(get_series)
    def series_by_name(self: Any, batch: Any) -> list[Any]:
        columns = list(batch.columns)
        fields = list(self._columns)
        if columns == fields or not all(isinstance(c, str) for c in columns):
            return get_series(self, batch)
        import pandas

        missing = pandas.Series([None] * len(batch), index=batch.index, dtype=object)
        return [batch[f] if f in batch.columns else missing for f in fields]

    return series_by_name


def install() -> bool:
    """Wrap Beam's DataFrame → row column lookup once; False when this Beam has no such class."""
    try:
        from apache_beam.typehints import pandas_type_compatibility as compat
    except ImportError:  # pragma: no cover - a Beam without its pandas batching
        return False
    cls = getattr(compat, "DataFrameBatchConverterDropIndex", None)
    original = getattr(cls, "_get_series", None)
    if original is None or not hasattr(cls, "explode_batch"):
        return False
    if not getattr(original, "beamsynth_wrapped", False):
        wrapped = _by_name(original)
        wrapped.beamsynth_wrapped = True
        cls._get_series = wrapped
    return True


install()


# -- a chunk without one of the sampled columns --------------------------------------------------
# Beam's ``ReadViaPandas`` (``beam.io.ReadFromJson``/``ReadFromCsv``) turns every sampled object
# column into text with ``df[col].astype(StringDtype)``, evaluated on each chunk: a chunk that lacks
# the column (a one-record file or chunk without that key, a CSV file whose header lacks it) raised
# ``KeyError`` in the workers and failed the whole run, so one record decided whether anything was
# released (rules 7, 8; lead, nineteenth session: a JSON file holding one ``{"sex": "Male"}``
# beside the Adult records failed the run with ``KeyError: 'workclass'``). Each chunk the read
# makes now carries every sampled column, null where it lacks one, before any of Beam's per-chunk
# expressions runs; its other columns stay (``job.private`` reads declared ones by name).

def _columns_of(frame: Any) -> list[Any] | None:
    expr = getattr(frame, "_expr", None)
    try:
        return list(expr.proxy().columns)
    except Exception:  # noqa: BLE001 - not a DataFrame read's frame: leave Beam's behaviour
        return None


def _remember_columns(expand: Any) -> Any:
    @functools.wraps(expand)
    def expand_and_remember(self: Any, root: Any) -> Any:
        frame = expand(self, root)
        columns = _columns_of(frame)
        pcoll = getattr(getattr(frame, "_expr", None), "_reference", None)
        fn = getattr(getattr(getattr(pcoll, "producer", None), "transform", None), "fn", None)
        if columns is not None and fn is not None and hasattr(fn, "beamsynth_columns"):
            fn.beamsynth_columns = columns
        return frame

    return expand_and_remember


def _with_every_column(process: Any) -> Any:
    @functools.wraps(process)  # Beam reads the signature (RestrictionParam) through __wrapped__
    def process_with_every_column(self: Any, *args: Any, **kwargs: Any) -> Any:
        columns = getattr(self, "beamsynth_columns", None)
        for frame in process(self, *args, **kwargs):
            if columns and hasattr(frame, "columns"):
                for name in columns:
                    if name not in frame.columns:
                        frame[name] = None
            yield frame

    return process_with_every_column


def install_sampled_columns() -> bool:
    """Give every chunk of a DataFrame read the sampled columns (null where it lacks one) once
    per process; False when this Beam has no such read."""
    try:
        from apache_beam.dataframe import io as dataframe_io
    except ImportError:  # pragma: no cover - a Beam without its DataFrame API
        return False
    fn_cls = getattr(dataframe_io, "_ReadFromPandasDoFn", None)
    read_cls = getattr(dataframe_io, "_ReadFromPandas", None)
    if fn_cls is None or read_cls is None or not hasattr(fn_cls, "process"):
        return False
    if not getattr(fn_cls.process, "beamsynth_wrapped", False):
        fn_cls.beamsynth_columns = None
        wrapped = _with_every_column(fn_cls.process)
        wrapped.beamsynth_wrapped = True
        fn_cls.process = wrapped
    if not getattr(read_cls.expand, "beamsynth_columns_wrapped", False):
        wrapped = _remember_columns(read_cls.expand)
        wrapped.beamsynth_columns_wrapped = True
        wrapped.beamsynth_wrapped = getattr(read_cls.expand, "beamsynth_wrapped", False)
        read_cls.expand = wrapped
    return True


install_sampled_columns()
