"""The fields of rows from a Beam DataFrame read, declared by ``job.private`` (not by a sample).

Beam 2.77's DataFrame reads (``beam.io.ReadFromJson``, ``ReadFromCsv``, Beam YAML's readers,
``to_pcollection``) turn each pandas chunk into rows in one ``ParDo(DataFrameToRowsFn)`` whose
row type comes from a proxy read when the pipeline is built: for ``ReadFromJson`` the first
chunk (≤ 100 records) of the first file its match lists that holds a record. A column no sampled
record carries is no field of any row of any file; a sampled record without ``age`` made every
row of every file lack ``age``, so one record moved every other record to the dead letters
(rules 6, 7; docs/audits.md, "Nineteenth session", H100 found it, H103 fixed it).

:func:`with_declared_fields` (``job.private`` and Beam YAML's beamsynth steps apply it when
built) makes the rows they read again from the same frames (the rows step's input), typed with
every field they read, whatever was sampled: each declared field (declared columns, privacy id,
key columns, the position field) is typed ``Optional[Any]`` (the value pandas read for that
record, null where its chunk lacks the column: ``api/_row_by_name_fix.py`` gives each field its
column by name); the sampled fields no schema declares keep Beam's types. No data is read when
built, and Beam's own rows are left as they are (a step of the user's that batches them, e.g.
``WriteToJson``, was built for their type: changing it in place failed such a run).

A Beam DataFrame read behind other steps (``read | beam.Filter(...) | job.private(...)``) cannot
be retyped (a user step may depend on the fields it was built with): :func:`dataframe_read_behind`
finds it, and ``job.private`` warns when built, the same words whatever was sampled.
"""


import keyword
from collections.abc import Iterable, Sequence
from typing import Any, Optional

import apache_beam as beam
import pandas as pd

__all__ = ["dataframe_read_behind", "declared_row_type", "rows_step", "with_declared_fields"]

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


def declared_row_type(pcoll: Any, names: Sequence[str]) -> Any:
    """The row type :func:`with_declared_fields` gives ``pcoll`` when a DataFrame read's rows step
    made it (else None): ``pcoll``'s fields in their order, those in ``names`` typed
    ``Optional[Any]``, then the names it lacks (names that cannot be a row field, e.g.
    ``education-num``, are left out). Build time only: reads the graph, never data."""
    from apache_beam.typehints.row_type import RowTypeConstraint

    old, step = getattr(pcoll, "element_type", None), rows_step(pcoll)
    if step is None or not isinstance(old, RowTypeConstraint) or \
            getattr(step.transform.fn, "_include_indexes", False):  # index fields: Beam's rows
        return None
    wanted = {n for n in names if _field_name(n)}
    declared = Optional[Any]  # noqa: UP045 (a Beam type hint)
    fields = [(n, declared if n in wanted else t) for n, t in old._fields]
    have = {n for n, _ in fields}
    fields += [(n, declared) for n in dict.fromkeys(names) if n in wanted and n not in have]
    return RowTypeConstraint.from_fields(fields)


class _DeclaredRowsFn(beam.DoFn):
    """The frames of a DataFrame read → rows of a declared type (Beam's ``DataFrameToRowsFn``
    with another output type: the frame's columns become fields by name, a missing one null)."""

    def __init__(self, row_type: Any) -> None:
        self._row_type = row_type

    @beam.DoFn.yields_batches
    def process(self, element: pd.DataFrame) -> Iterable[pd.DataFrame]:
        yield element  # each chunk as pandas read it; the batch converter makes the rows

    def infer_output_type(self, input_element_type: Any) -> Any:
        return self._row_type


def with_declared_fields(pcoll: Any, names: Sequence[str], label: str = "DeclaredFields") -> Any:
    """Inside an ``expand``: rows of a DataFrame read's rows step (``pcoll``'s producer) made
    again from the same frames with every name of ``names`` a field (:func:`declared_row_type`),
    whatever Beam sampled; any other ``pcoll`` as it is. Beam's own rows (``pcoll``) are not
    changed: other steps reading them keep their type."""
    row_type = declared_row_type(pcoll, names)
    if row_type is None:
        return pcoll
    (frames,) = rows_step(pcoll).main_inputs.values()
    return frames | label >> beam.ParDo(_DeclaredRowsFn(row_type))
    # rows of row_type, one per record of each frame
