"""The memoized column encoder of the dicts path equals Schema.encode_columns on tricky values."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from beamsynth.schemas.schema import load_schema
from beamsynth.transforms.column_memo import ColumnMemo, SchemaMemo
from beamsynth.transforms.inputs import KeyLayout, encode_elements

SCHEMA = load_schema("adult")
TRICKY = [None, "", "?", 39, "39", " 39", "39.0", "1e1", 39.0, -0.0, 0.0, 0, 1, True, False,
          float("nan"), 10**30, "Male", " Male", "male", "Private", "<=50K", "United-States",
          17, "17", 99, 100, "100", [1], {"a": 1}, ("t",), b"39", 1.5]


HASHABLE = [v for v in TRICKY if not isinstance(v, (list, dict))]


def _reference(column, values):
    return column.encode(pd.Series(np.array(values + [None], dtype=object)[:-1], dtype=object))


def _outcome(encode, values):
    try:
        codes, reasons = encode(values)
    except TypeError as exc:  # Column.encode refuses unhashable values in categorical columns
        return "TypeError", str(exc)
    return codes.tolist(), reasons


@pytest.mark.parametrize("name", ["age", "sex", "capital-gain", "native-country", "fnlwgt"])
def test_column_memo_equals_column_encode_batch_after_batch(name):
    column = SCHEMA.column(name)
    memo = ColumnMemo(column, max_size=8)  # small: the table is emptied and refilled too
    rnd = random.Random(3)
    for _ in range(40):
        values = [rnd.choice(TRICKY) for _ in range(rnd.randint(0, 12))]
        assert _outcome(memo.encode, values) == _outcome(
            lambda v: _reference(column, v), values), values


def test_one_and_true_are_not_merged_whatever_the_order():
    """1 is a valid capital-gain, True is not: neither decides the other's fate (stability)."""
    memo = SchemaMemo(SCHEMA)
    j = SCHEMA.names.index("capital-gain")
    for values in ([1, True], [True, 1], [1], [True], [0, False, 0.0, -0.0]):
        codes, reasons = memo.encode(j, values)
        ref_codes, ref_reasons = _reference(SCHEMA.columns[j], values)
        assert (codes.tolist(), reasons) == (ref_codes.tolist(), ref_reasons)
    assert memo.encode(j, [True])[1] == {0: "column 'capital-gain': value True is not a valid integer"}


def _record(rnd, i):
    r = {c.name: str(c.domain.decode(0)) for c in SCHEMA.columns}
    r["age"], r["fnlwgt"] = 17 + i % 80, str(1000 + i)
    for _ in range(rnd.randint(0, 2)):
        r[rnd.choice(SCHEMA.names)] = rnd.choice(HASHABLE)
    return r


def test_encode_elements_with_a_warm_memo_equals_schema_encode_columns():
    rnd = random.Random(7)
    layout, memo = KeyLayout(SCHEMA), SchemaMemo(SCHEMA)
    for _ in range(6):
        records = [_record(rnd, i) for i in range(60)]
        batches, dead = encode_elements(layout, records, source="s", memo=memo)
        columns = {n: [r[n] for r in records] for n in SCHEMA.names}
        ref, bad = SCHEMA.encode_columns(columns, len(records))
        assert np.array_equal(batches[0].codes, ref.codes)
        assert batches[0].codes.dtype == ref.codes.dtype
        assert [d.reason for d in dead] == [why for _, why in bad]


def test_missing_extra_and_aliased_fields_are_still_judged_per_record():
    layout, memo = KeyLayout(SCHEMA), SchemaMemo(SCHEMA)
    good = {c.name: str(c.domain.decode(0)) for c in SCHEMA.columns}
    missing = dict(good)
    del missing["sex"]
    aliased = {k.replace("-", "_"): v for k, v in good.items()}
    for records in ([good, missing, {**good, "extra": 1}, aliased], [aliased, good]):
        batches, dead = encode_elements(layout, records, source="s", memo=memo)
        assert sum(len(b) for b in batches) == len(records) - len(dead)
        assert [d.reason for d in dead] == (["required field 'sex' is missing"]
                                            if missing in records else [])


def test_an_unhashable_value_dead_letters_only_its_record():
    good = {c.name: str(c.domain.decode(0)) for c in SCHEMA.columns}
    records = [good, {**good, "sex": {"a": 1}}, {**good, "age": [1]}, good]
    batches, dead = encode_elements(KeyLayout(SCHEMA), records, source="s", memo=SchemaMemo(SCHEMA))
    assert sum(len(b) for b in batches) == 2
    assert [d.reason for d in dead] == [
        "column 'sex': value {'a': 1} is a dict, not one value; flatten nested fields before "
        "job.private (e.g. in a beam.Map)",
        "column 'age': value [1] is not a valid integer"]


def test_memo_validation_messages():
    with pytest.raises(TypeError, match=r"column must be a Column, got str \('age'\)"):
        ColumnMemo("age")
    with pytest.raises(ValueError, match=r"max_size \(0\) must be an int >= 1"):
        ColumnMemo(SCHEMA.columns[0], max_size=0)
    with pytest.raises(TypeError, match="schema must be a Schema, got dict"):
        SchemaMemo({})
