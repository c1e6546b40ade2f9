"""``beamsynth schema draft``: a schema from a public data dictionary, never from the data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from beamsynth.pipelines.cli.main import main
from beamsynth.pipelines.io.encode import encode_block
from beamsynth.pipelines.io.read import iter_raw_blocks
from beamsynth.pipelines.schema_draft import draft_schema, nice_step, read_dictionary
from beamsynth.schemas.schema import load_schema

DATA = Path(__file__).resolve().parents[2] / "examples" / "data"
SDNIST = DATA / "acs_nist_sdnist" / "data_dictionary.json"
ACS = DATA / "acs_nist_sdnist" / "national2019_2k.csv"
ADULT_DOMAIN = DATA / "adult" / "adult-domain.json"
ADULT = DATA / "adult" / "adult.csv"
CODEBOOK = """column,type,values,min,max,null_values,granularity,description
age,integer,,17,90,,,Age in years
workclass,categorical,Private|Self-emp-not-inc|Self-emp-inc|Federal-gov|Local-gov|State-gov|Without-pay|Never-worked,,,?,,Employer
capital-loss,float,,0,3683,,,Capital loss (dictionary maximum)
hours-per-week,float,,1,99,,,
income,categorical,<=50K|>50K,,,,,
"""


def _read(schema, path):
    """(rows used, dead-letter reasons) of a file read with ``schema``."""
    used, reasons = 0, []
    for item in iter_raw_blocks(str(path)):
        if hasattr(item, "columns"):
            batch, bad = encode_block(schema, item)
            used += len(batch)
            reasons += [r.reason for r in bad]
        else:
            reasons.append(item.reason)
    return used, reasons


def _draft_cli(tmp_path, capsys, dictionary, *extra):
    out = tmp_path / f"{Path(dictionary).stem}.yaml"
    assert main(["schema", "draft", str(dictionary), "--output", str(out), *extra]) == 0
    err = capsys.readouterr().err
    assert f"drafted {out} from {dictionary}:" in err and "'# REVIEW:'" in err
    assert main(["schema", "validate", str(out)]) == 0  # as the user checks it
    assert " is valid: " in capsys.readouterr().out
    return out


def test_nice_step():
    assert [nice_step(w, 50) for w in (1_478_116, 10_000, 3684, 100)] == [50_000, 200, 100, 2]
    with pytest.raises(ValueError, match=r"width \(0\) must be > 0 and target \(50\) >= 1"):
        nice_step(0, 50)


def test_sdnist_dictionary_drafts_a_schema_that_reads_the_data(tmp_path, capsys):
    out = _draft_cli(tmp_path, capsys, SDNIST)
    text = out.read_text(encoding="utf-8")
    schema = load_schema(out)
    # N/A codes became null tokens; codes stay strings; ranges from min/max; INDP (no values) left out
    msp = schema.column("MSP")
    assert msp.nullable and msp.null_values == ("N",) and msp.domain.values == list("123456")
    assert schema.column("AGEP").domain.to_spec() == {"kind": "integer", "low": 0, "high": 99}
    assert "INDP" not in schema.names and '# - name: "INDP"   (not drafted)' in text
    assert schema.column("NOC").domain.to_spec()["low"] == 0  # code 0 beside min 1
    assert "# REVIEW: range 1..19 extended to 0..19 to hold the declared code(s) 0" in text
    pincp = schema.column("PINCP").domain
    assert pincp.size <= 60 and pincp.low <= -9000 and pincp.high >= 1_341_000
    assert "# REVIEW: max rounded up from 1341000 to 1349999" in text
    used, reasons = _read(schema, ACS)
    assert (used, reasons) == (2000, [])


def test_domain_json_drafts_adult(tmp_path, capsys):
    out = _draft_cli(tmp_path, capsys, ADULT_DOMAIN, "--format", "json")
    text = out.read_text(encoding="utf-8")
    assert "# REVIEW: '?' looks like a missing-value marker; kept as a declared category" in text
    assert "# REVIEW: max rounded up from 1490400 to 1499999" in text
    schema = load_schema(out)
    assert schema.column("fnlwgt").domain.size == 30 and schema.column("age").domain.size == 74
    sample = tmp_path / "adult.csv"
    sample.write_text("".join(ADULT.read_text(encoding="utf-8").splitlines(keepends=True)[:3001]))
    assert _read(schema, sample) == (3000, [])


def test_csv_codebook(tmp_path, capsys):
    book = tmp_path / "codebook.csv"
    book.write_text(CODEBOOK, encoding="utf-8")
    out = _draft_cli(tmp_path, capsys, book)
    text = out.read_text(encoding="utf-8")
    # the dictionary's maximum 3683 is rounded up: data at 3683.9 is kept
    assert "# REVIEW: range 0..3683 rounded out to 0..3800, 19 bins of 200" in text
    schema = load_schema(out)
    assert schema.column("workclass").null_values == ("?",)
    assert schema.column("hours-per-week").type == "float"
    data = tmp_path / "data.csv"
    data.write_text("age,workclass,capital-loss,hours-per-week,income\n"
                    "39,State-gov,3683.9,40,<=50K\n50,?,0,13.5,>50K\n", encoding="utf-8")
    assert _read(schema, data) == (2, [])


def test_privacy_id_and_every_guess_are_marked_for_review():
    text = draft_schema(SDNIST)
    assert "privacy_id: null   # REVIEW:" in text
    assert text.count("# REVIEW:") >= 20
    assert "never from the data" in text


@pytest.mark.parametrize("content, fmt, message", [
    ("name,kind\na,b\n", "csv", "a CSV codebook needs a header with at least 'column' and 'type'"),
    ("[1, 2]", "auto", "expected a JSON object of columns"),
    ("{not json", "auto", "not valid JSON"),
])
def test_bad_dictionaries_are_refused(tmp_path, content, fmt, message):
    path = tmp_path / ("d.csv" if fmt == "csv" else "d.json")
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        read_dictionary(path, fmt)


def test_bad_format_and_undraftable_dictionary(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"format \('xml'\) must be one of \['auto', 'sdnist', "
                                         r"'domain-json', 'csv', 'smartnoise'\]"):
        read_dictionary(SDNIST, "xml")
    path = tmp_path / "d.json"
    path.write_text('{"a": {"description": "free text"}}', encoding="utf-8")
    assert main(["schema", "draft", str(path)]) == 2
    assert "no column could be drafted" in capsys.readouterr().err


def test_code_label_map_is_drafted_as_categories(tmp_path, capsys):
    """{column: {code: label}} (German credit's values_maps.json shape) drafts the codes as the
    declared categories; before, 'no column could be drafted' without naming the accepted forms."""
    path = tmp_path / "values_maps.json"
    path.write_text(json.dumps({
        "status": {"A11": "... < 0 DM", "A12": "0 <= ... < 200 DM", "A14": "no checking account"},
        "credit": {"1": "good", "2": "bad"}}), encoding="utf-8")
    fmt, cols = read_dictionary(path)
    assert fmt == "domain-json"
    assert [c.spec["domain"]["values"] for c in cols] == [["A11", "A12", "A14"], ["1", "2"]]
    assert cols[0].notes[0].startswith("a code -> label map: the codes are the declared categories (A11 = ")
    bad = tmp_path / "d.json"
    bad.write_text('{"a": [1, 2]}', encoding="utf-8")
    assert main(["schema", "draft", str(bad)]) == 2
    assert "a CSV codebook (column,type" in capsys.readouterr().err
