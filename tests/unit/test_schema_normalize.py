"""Declared normalisation of categorical/text input values (issue 19, item 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from beamsynth.pipelines.cli.main import main
from beamsynth.schemas.schema import Normalization, SchemaError, load_schema

WORDS = ["smith", "johnson", "garcia", "müller", "straße", "o'brien"]


def _schema(normalize=None, **extra):
    col = {"name": "surname", "type": "categorical",
           "domain": {"kind": "categorical", "values": WORDS}, "nullable": True,
           "null_values": ["N"], **extra}
    if normalize is not None:
        col["normalize"] = normalize
    return load_schema({"name": "names", "columns": [col]})


RAW = ["SMITH", "Johnson", "GARCIA ", "MÜLLER", "N", "unknown", "O'BRIEN", "smith"]


def test_without_normalisation_upper_case_is_rejected():
    codes, reasons = _schema().columns[0].encode(RAW)
    assert sorted(reasons) == [0, 1, 2, 3, 5, 6]  # 'GARCIA ' is not stripped into a match either


def test_case_lower_uses_upper_case_values_and_keeps_null_tokens():
    col = _schema({"case": "lower"}).columns[0]
    codes, reasons = col.encode(RAW)
    assert list(reasons) == [5] and "'unknown'" in reasons[5]
    # 'N' is a declared null token: matched on the raw value, never lower-cased into 'n'
    assert codes.tolist() == [0, 1, 2, 3, col.null_index, -1, 5, 0]


def test_fold_unicode_and_strip():
    col = _schema({"case": "fold", "unicode": "NFKC", "strip": True}).columns[0]
    raw = ["STRASSE", "  Smith\t", "ＳＭＩＴＨ", "Mu\u0308ller"]  # full-width, combining diaeresis
    codes, reasons = col.encode(raw)
    # casefold gives 'strasse' for both 'STRASSE' and 'Straße': the declared 'straße' is not in
    # folded form, so neither matches (declare the domain in normalised form)
    assert reasons.keys() == {0}
    assert codes.tolist()[1:] == [0, 0, 3]
    assert col.encode(["Straße"])[0].tolist() == [-1]


def test_normalisation_is_in_the_spec_and_fingerprint():
    plain, lower = _schema(), _schema({"case": "lower"})
    assert lower.to_spec()["columns"][0]["normalize"] == {"case": "lower"}
    assert "normalize" not in plain.to_spec()["columns"][0]
    assert plain.fingerprint() != lower.fingerprint()
    assert load_schema(lower.to_spec()).fingerprint() == lower.fingerprint()


@pytest.mark.parametrize("spec, message", [
    ({"case": "title"}, "normalize.case ('title') must be one of ['none', 'lower', 'upper', 'fold']"),
    ({"unicode": "nfc"},
     "normalize.unicode ('nfc') must be one of ['none', 'NFC', 'NFKC', 'NFD', 'NFKD']"),
    ({"strip": "yes"}, "normalize.strip ('yes') must be true or false"),
    ({"lower": True}, "normalize has unknown key(s) ['lower'] (allowed: ['case', 'unicode', 'strip'])"),
    ("lower", "normalize must be a mapping {case: lower|upper|fold|none, unicode: "
              "NFC|NFKC|NFD|NFKD|none, strip: true|false}, got 'lower'"),
])
def test_bad_options_echo_the_value(spec, message):
    with pytest.raises(SchemaError) as err:
        _schema(spec)
    assert str(err.value) == f"schema, column 'surname': {message}"


def test_numeric_columns_refuse_normalisation():
    with pytest.raises(SchemaError, match=r"column 'age': normalize applies to categorical/string/"
                                          r"text columns only, not 'integer'"):
        load_schema({"columns": [{"name": "age", "type": "integer", "normalize": {"case": "lower"},
                                  "domain": {"kind": "integer", "low": 0, "high": 9}}]})


def test_normalization_value_type_validates_directly():
    with pytest.raises(ValueError, match=r"normalize.case \('LOWER'\)"):
        Normalization(case="LOWER")
    assert Normalization(case="upper").apply(pd.Series(["a", 3, None])).tolist() == ["A", 3, None]


def test_cli_upper_case_surnames_against_lower_case_word_list(tmp_path, capsys):
    """The newcomer's case: a lower-case word list, upper-case surnames in the data."""
    words = tmp_path / "words.txt"
    words.write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    data = tmp_path / "names.csv"
    names = ["SMITH", "JOHNSON", "GARCIA", "MÜLLER", "O'BRIEN"] * 40
    data.write_text("surname\n" + "\n".join(names) + "\n", encoding="utf-8")
    runs = {}
    for label, normalize in (("plain", None), ("lower", {"case": "lower"})):
        col = {"name": "surname", "type": "text", "domain": {"kind": "categorical",
                                                             "values_file": str(words)}}
        if normalize:
            col["normalize"] = normalize
        schema = tmp_path / f"{label}.json"
        schema.write_text(json.dumps({"name": label, "columns": [col]}), encoding="utf-8")
        out = tmp_path / f"{label}.csv"
        code = main(["synthesize", str(data), "--schema", str(schema), "--epsilon", "1",
                     "--seed", "3", "--rows", "50", "--output", str(out)])
        runs[label] = (code, out)
    err = capsys.readouterr().err
    assert runs["plain"][0] == 0 and "rejected 200" in err  # every row rejected without it
    code, out = runs["lower"]
    assert code == 0
    manifest = json.loads(out.with_name("lower.csv.manifest.json").read_text())
    assert manifest["operational"]["rows_read"] == 200
    assert manifest["operational"]["rows_rejected"] == 0
    assert set(pd.read_csv(out, dtype=str)["surname"]) <= set(WORDS)


def test_json_schema_documents_normalize():
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema not installed")
    spec = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "schema.json").read_text())
    good = _schema({"case": "fold", "unicode": "NFKC", "strip": True}).to_spec()
    jsonschema.validate(json.loads(json.dumps(good)), spec)
    good["columns"][0]["normalize"] = {"case": "title"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(good, spec)
