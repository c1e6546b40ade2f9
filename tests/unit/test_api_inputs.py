"""Encoding user elements for the public API (transforms/inputs.py): exact codes and reasons."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest

from beamsynth.schemas.keys import TextKeyCodec
from beamsynth.schemas.schema import load_schema
from beamsynth.transforms.inputs import EncodeElements, KeyLayout, encode_elements

SCHEMA = load_schema({
    "name": "toy",
    "columns": [
        {"name": "sex", "type": "categorical", "domain": {"kind": "categorical", "values": ["F", "M"]}},
        {"name": "age-band", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 3},
         "nullable": True},
    ],
})


def _encode(elements, schema=SCHEMA, keys=None, position_field=None):
    batches, dead = encode_elements(KeyLayout(schema, keys), elements, source="src",
                                    position_field=position_field)
    codes = np.concatenate([b.codes for b in batches]) if batches else np.zeros((0, 2))
    return codes, [(d.position, d.reason) for d in dead], dead


def test_dicts_missing_nullable_is_null_and_bad_elements_are_dead_letters_alone():
    codes, reasons, dead = _encode([
        {"sex": "M", "age-band": 2, "extra": "ignored"},
        {"sex": "F"},                                  # missing nullable → null cell (4)
        {"age-band": 1, "line": 7},                    # missing required
        {"sex": "X", "age-band": 1, "line": 8},        # out of domain
        {"sex": "F", "age_band": "3"},                 # identifier form of 'age-band'
        "not a record",
    ], position_field="line")
    assert codes.tolist() == [[1, 2], [0, 4], [0, 3]]
    assert reasons == [
        (None, "element of type str is not a dict, beam.Row, named tuple or Arrow table"),
        (7, "required field 'sex' is missing"),
        (8, "column 'sex': value 'X' is outside the declared categorical domain (to keep such rows, declare a catch-all cell, other: OTHER in the domain, and on_out_of_domain: other; docs/schema-format.md)"),
    ]
    assert dead[1].element == '{"age-band": 1, "line": 7}'
    assert dead[1].source == "src"


def test_rows_named_tuples_and_arrow_tables_encode_like_dicts():
    table = pa.table({"sex": ["F", "M", None], "age_band": [0, None, 1]})
    codes, reasons, _ = _encode([beam.Row(sex="M", age_band=1), table])
    assert sorted(codes.tolist()) == sorted([[0, 0], [1, 4], [1, 1]])
    assert reasons == [(None, "column 'sex': null in a non-nullable column")]


def test_arrow_table_missing_required_field_names_it():
    _, reasons, _ = _encode([pa.table({"age-band": [1, 2]})])
    assert reasons == [(None, "required field 'sex' is missing")] * 2


def test_extra_columns_reject_dead_letters_only_that_element():
    strict = load_schema({**SCHEMA.to_spec(), "extra_columns": "reject"})
    codes, reasons, _ = _encode([{"sex": "M", "age-band": 1}, {"sex": "F", "age-band": 0, "x": 1}],
                                schema=strict)
    assert codes.tolist() == [[1, 1]]
    assert reasons == [(None, "undeclared field(s) ['x'] and the schema says extra_columns: reject")]


def test_declared_keys_follow_the_schema_columns_and_reject_alone():
    codec = TextKeyCodec(column="name", alphabet="ab", max_length=2)
    layout = KeyLayout(SCHEMA, {"name": codec})
    batches, dead = encode_elements(layout, [{"sex": "M", "name": "ab"}, {"sex": "F", "name": "zz"}],
                                    source="s")
    assert [d.reason for d in dead] == ["key 'name': characters outside the declared alphabet: 'z'"]
    (b,) = batches
    assert b.codes[:, :2].tolist() == [[1, 4]]
    assert layout.key_codes(b, "name").codes.tolist() == codec.encode_strings(["ab"]).tolist()


def test_privacy_id_travels_with_the_rows():
    schema = load_schema({**SCHEMA.to_spec(), "privacy_id": "uid"})
    batches, dead = encode_elements(KeyLayout(schema), [{"sex": "M", "uid": 5}, {"sex": "F"}],
                                    source="s")
    assert batches[0].pids.tolist() == ["5"]
    assert [d.reason for d in dead] == ["required field 'uid' is missing"]  # no uid key


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_rows": 0}, "batch_rows (0) must be an int >= 1"),
    ({"position_field": ""}, "position_field ('') must be None or a field name"),
])
def test_encode_elements_validation(kwargs, message):
    with pytest.raises(ValueError) as err:
        EncodeElements(layout=KeyLayout(SCHEMA), source="s", **kwargs)
    assert str(err.value) == message


def test_an_arrow_element_that_cannot_be_read_is_one_dead_letter():
    table = pa.table({"sex": pa.array([[1, 2]], type=pa.list_(pa.int64())), "age-band": [1]})
    ok = pa.table({"sex": ["F"], "age-band": [1]})
    codes, reasons, _ = _encode([table, ok])
    assert codes.tolist() == [[0, 1]]
    assert reasons == [(None, "column 'sex': value [1, 2] is a list, not one value; flatten nested "
                              "fields before job.private (e.g. in a beam.Map)")]  # as a dict's



def test_an_unhashable_value_in_a_dict_rejects_only_its_element():
    codes, reasons, _ = _encode([{"sex": ["M"], "age-band": 1}, {"sex": "F", "age-band": 2}])
    assert codes.tolist() == [[0, 2]]
    assert len(reasons) == 1 and reasons[0][1].startswith("column 'sex': value ['M'] is a list")


def _as_mappings(rows):
    """The same rows as dicts (the mapping path), for comparison with the tuple path."""
    return [r._asdict() for r in rows]


@pytest.mark.parametrize("fields", [("sex", "age_band", "line"), ("age_band", "line"),
                                    ("sex", "line"), ("line", "sex", "age_band", "extra")])
def test_named_tuple_rows_of_one_type_encode_like_their_dicts(fields):
    """Rows of one generated type are transposed column-wise; codes, dead letters (reasons,
    positions, element text) and their order equal those of the same rows as dicts."""
    from collections import namedtuple

    row = namedtuple("Row", fields)
    values = {"sex": ["M", "F", None, "X", 3, "M"], "age_band": [1, None, 2, 0, "7", True],
              "line": [1, 2, 3, 4, 5, 6], "extra": ["e"] * 6}
    rows = [row(*[values[f][i] for f in fields]) for i in range(6)]
    tuples = _encode(rows, position_field="line")
    mappings = _encode(_as_mappings(rows), position_field="line")
    assert tuples[0].tolist() == mappings[0].tolist()
    assert tuples[1] == mappings[1] and tuples[1]
    assert [d.element for d in tuples[2]] == [d.element for d in mappings[2]]


def test_named_tuple_rows_with_a_privacy_id_keep_it():
    import dataclasses
    from collections import namedtuple

    schema = dataclasses.replace(SCHEMA, privacy_id="uid")
    row = namedtuple("Row", ("uid", "sex", "age_band"))
    rows = [row("a", "M", 1), row(7, "F", 0), row("", "F", 0), row(None, "M", 2)]
    for elements in (rows, _as_mappings(rows)):
        batches, dead = encode_elements(KeyLayout(schema), elements, source="s")
        assert batches[0].pids.tolist() == ["a", "7"]
        assert [d.reason for d in dead] == ["privacy id column 'uid' is empty"] * 2
