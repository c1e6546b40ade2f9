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
