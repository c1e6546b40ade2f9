"""The fields of rows from a Beam DataFrame read, declared by ``job.private`` (not by a sample).

Beam 2.77's DataFrame reads (``beam.io.ReadFromJson``, ``ReadFromCsv``, Beam YAML's readers,
``to_pcollection``) turn each pandas chunk into rows in one ``ParDo(DataFrameToRowsFn)`` whose
row type comes from a proxy read when the pipeline is built: for ``ReadFromJson`` the first
chunk (≤ 100 records) of the first file its match lists that holds a record. A column no sampled
record carries is no field of any row of any file; a sampled record without ``age`` made every
row of every file lack ``age``, so one record moved every other record to the dead letters
(rules 6, 7; docs/audits.md, "Nineteenth session", H100 found it, H103 fixed it).

:func:`declare_fields` (``job.private`` calls it when built, before it reads the input's type)
gives that step's rows every field ``job.private`` reads, whatever was sampled: each declared
field (declared columns, privacy id, key columns, the position field) is typed
``Optional[Any]`` (the value pandas read for that record, null where its chunk lacks the column:
``api/_row_by_name_fix.py`` gives each field its column by name), and the sampled fields no
schema declares keep Beam's types. Only the row type and the step's row converter change (no
data is read); other consumers of the same rows see the added fields, null where unread.

A Beam DataFrame read behind other steps (``read | beam.Filter(...) | job.private(...)``) cannot
be retyped (a user step may depend on the fields it was built with): :func:`dataframe_read_behind`
finds it, and ``job.private`` warns when built, the same words whatever was sampled.
"""

from __future__ import annotations

import keyword
from collections.abc import Sequence
from typing import Any, Optional

__all__ = ["dataframe_read_behind", "declare_fields", "rows_step"]

_MAX_STEPS_BACK = 20  # how far dataframe_read_behind walks back through single-input steps


def _is_rows_step(applied: Any) -> bool:
    try:
        from apache_beam.dataframe.convert import DataFrameToRowsFn
    except ImportError:  # pragma: no cover - a Beam without DataFrames
        return False
    return isinstance(getattr(getattr(applied, "transform", None), "fn", None), DataFrameToRowsFn)


def rows_step(pcoll: Any) -> Any:
    """The ``ParDo(DataFrameToRowsFn)`` step that made ``pcoll`` (its main output), else None."""
    applied = getattr(pcoll, "producer", None)
    if applied is None or not _is_rows_step(applied):
        return None
    return applied if applied.outputs.get(None) is pcoll else None


def dataframe_read_behind(pcoll: Any) -> int:
    """How many steps behind ``pcoll`` a DataFrame read's rows step is (0: it made ``pcoll``;
    -1: none within 20 single-input steps). Looks at the graph only, never at data."""
    for depth in range(_MAX_STEPS_BACK):
        applied = getattr(pcoll, "producer", None)
        if applied is None:
            return -1
        if _is_rows_step(applied):
            return depth
        inputs = [i for i in getattr(applied, "main_inputs", {}).values()]
        if len(inputs) != 1:
            return -1
        pcoll = inputs[0]
    return -1


def _field_name(name: Any) -> bool:
    # a generated row type is a NamedTuple: identifiers, no keyword, no leading underscore
    return (isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)
            and not name.startswith("_"))


def declare_fields(pcoll: Any, names: Sequence[str]) -> bool:
    """Give the rows of a DataFrame read's rows step (``pcoll``'s producer) every name of
    ``names`` as a field typed ``Optional[Any]`` (names that cannot be a row field, e.g.
    ``education-num``, are left out); the other fields keep their order and types. True when the
    type changed. Build time only: reads the graph, never data; idempotent."""
    applied = rows_step(pcoll)
    if applied is None:
        return False
    import pandas as pd
    from apache_beam.typehints.batch import BatchConverter
    from apache_beam.typehints.row_type import RowTypeConstraint

    old = pcoll.element_type
    if not isinstance(old, RowTypeConstraint):
        return False
    wanted = {n for n in names if _field_name(n)}
    declared = Optional[Any]  # noqa: UP045 (a Beam type hint)
    fields = [(n, declared if n in wanted else t) for n, t in old._fields]
    have = {n for n, _ in fields}
    fields += [(n, declared) for n in dict.fromkeys(names) if n in wanted and n not in have]
    if fields == list(old._fields):
        return False
    new = RowTypeConstraint.from_fields(fields, field_options=dict(old._field_options) or None)
    fn = applied.transform.fn
    fn.output_batch_converter = BatchConverter.from_typehints(element_type=new,
                                                              batch_type=pd.DataFrame)
    pcoll.element_type = new
    return True
