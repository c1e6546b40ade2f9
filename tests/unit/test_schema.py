"""Schema loading, validation messages, encoding with reasons, Avro derivation."""

import fastavro
import numpy as np
import pytest

from beamsynth.schemas.schema import SchemaError, load_schema


def _write(tmp_path, text, name="s.yaml"):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_bundled_adult_schema():
    s = load_schema("adult")
    assert len(s.columns) == 15 and "split" not in s.names
    assert s.column("sex").domain.values == ["Female", "Male"]
    assert s.column("workclass").domain.values[-1] == "?"
    assert s.privacy_id is None
    assert len(s.fingerprint()) == 64


def test_errors_name_file_column_and_problem(tmp_path):
    p = _write(tmp_path, """
columns:
  - name: age
    type: integer
    domain: {kind: integer, low: 0, high: 120}
  - name: color
    type: categorical
""")
    with pytest.raises(SchemaError) as err:
        load_schema(p)
    msg = str(err.value)
    assert str(p) in msg and "column 'color'" in msg and "no declared domain" in msg


@pytest.mark.parametrize("body,match", [
    ("columns: []", "'columns' must be a non-empty list"),
    ("columns:\n  - {name: a, type: blob, domain: {kind: integer, low: 0, high: 1}}", "type \\('blob'\\)"),
    ("columns:\n  - {name: a, type: integer, domain: {kind: categorical, values: [x]}}",
     "a integer column cannot have a categorical domain"),
    ("columns:\n  - {name: a, type: categorical, domain: {kind: categorical, values: [x]}, "
     "on_out_of_domain: other}", "needs a categorical domain with an 'other' label"),
    ("columns:\n  - {name: a, type: categorical, domain: {kind: categorical, values: [x]}, "
     "open: {tolerance: 1.5}}", "open.tolerance \\(1.5\\) must be in \\(0, 1\\)"),
    ("columns:\n  - {name: a, type: categorical, domain: {kind: categorical, values: [x]}, colour: 1}",
     "unknown key\\(s\\) \\['colour'\\]"),
    ("privacy_id: a\ncolumns:\n  - {name: a, type: categorical, domain: {kind: categorical, values: [x]}}",
     "privacy_id column 'a' must not also be a synthesized column"),
    ("bogus: 1\ncolumns: []", "unknown top-level key"),
])
def test_validation_messages(tmp_path, body, match):
    with pytest.raises(SchemaError, match=match):
        load_schema(_write(tmp_path, body))


def test_json_schema_file_and_missing_file(tmp_path):
    p = _write(tmp_path, '{"columns": [{"name": "a", "type": "categorical", '
                         '"domain": {"kind": "categorical", "values": ["x", "y"]}}]}', "s.json")
    assert load_schema(p).shape == (2,)
    with pytest.raises(SchemaError, match="no such file, and not a bundled schema name"):
        load_schema(tmp_path / "missing.yaml")


def test_encode_with_nulls_other_and_reasons(tmp_path):
    s = load_schema(_write(tmp_path, """
privacy_id: pid
columns:
  - {name: c, type: categorical, domain: {kind: categorical, values: [x, y], other: OTHER},
     on_out_of_domain: other}
  - {name: n, type: integer, domain: {kind: integer, low: 0, high: 9}, nullable: true,
     null_values: ["", "NA"]}
  - {name: k, type: categorical, domain: {kind: categorical, values: [p, q]}}
"""))
    cols = {"c": ["x", "zzz", "y", "x"], "n": ["3", "NA", "12", ""], "k": ["p", "q", "q", ""],
            "pid": ["u1", "u2", "u3", "u4"]}
    batch, bad = s.encode_columns(cols, 4)
    assert batch.codes.tolist() == [[0, 3, 0], [2, 10, 1]]
    assert batch.pids.tolist() == ["u1", "u2"]
    assert bad == [(2, "column 'n': value '12' is outside the declared integer domain [0, 9]"),
                   (3, "column 'k': null in a non-nullable column")]
    decoded = s.decode_rows(batch.codes)
    assert decoded["c"] == ["x", "OTHER"] and decoded["n"] == [3, None]


def test_header_checks():
    s = load_schema("adult")
    with pytest.raises(SchemaError, match="lacks declared column"):
        s.check_header(["age"])
    s.check_header(s.names + ["split"])  # extra columns ignored by default


def test_avro_schema_parses_and_roundtrips(tmp_path):
    s = load_schema("adult")
    parsed = fastavro.parse_schema(s.avro_schema())
    rec = {c.name.replace("-", "_"): (1 if c.type == "integer" else "x") for c in s.columns}
    out = tmp_path / "x.avro"
    with open(out, "wb") as fh:
        fastavro.writer(fh, parsed, [rec])
    with open(out, "rb") as fh:
        assert list(fastavro.reader(fh))[0]["age"] == 1
    assert np.all([f["name"].isidentifier() for f in s.avro_schema()["fields"]])


def test_whitespace_is_stripped_by_default_and_can_be_kept(tmp_path):
    s = load_schema(_write(tmp_path, """
columns:
  - {name: c, type: categorical, domain: {kind: categorical, values: [x, y]}}
  - {name: e, type: categorical, domain: {kind: categorical, values: [x]}, strip_whitespace: false}
"""))
    batch, bad = s.encode_columns({"c": [" x", "y  "], "e": ["x", " x"]}, 2)
    assert batch.codes.tolist() == [[0, 0]]
    assert bad == [(1, "column 'e': value ' x' is outside the declared categorical domain (to keep such rows, declare a catch-all cell, other: OTHER in the domain, and on_out_of_domain: other; docs/schema-format.md)")]
