"""Session 12 red team (H39): the eleventh session's changes (48bec24..6afdca7) against the privacy
rules, with neighbour pairs through the real entry points. Each test failed on the code before its
fix.

1. ``beamsynth schema draft`` reads ``{column: {code: label}}`` maps since d659b93. pandas'
   default JSON export of a *data table* (``DataFrame.to_json()``, orient ``columns``:
   ``{column: {row: value}}``) has that shape, so drafting from the data file itself (as a user
   did with a CSV data file, 30d11d5) wrote a schema whose categories were the row numbers
   ``"0" .. "n-1"`` (the row count as a declared domain size: D and D + one row drafted different
   schemas) and the first six records' values in its REVIEW notes, under the header "Every domain
   below comes from that dictionary, never from the data" (rule 1). The same held for orient
   ``index`` (``{row: {column: value}}``: one drafted column per record). A JSON object whose
   entries all share one key set and hold repeated or numeric values is a table of records, not a
   dictionary: it is refused, naming no value.
2. The manifests state the guarantee that follows from a refusal since 5b66ac3, but only for the
   empty input. ``--fail-on-rejected F`` (synthesize, histogram, prefixes) refuses a run when more
   than F of the exact rows are rejected (docs/methods.md: "makes whether a release happens
   depend on the data"), and the published manifest of a run it let through still stated plain
   "add/remove one privacy unit" (rule 2): neighbours D (2 of 40 rows rejected, 5%) and D + one
   bad row (7.3%) at F = 0.06 gave a release with that statement and a refusal. The manifest's
   ``privacy_unit.fail_on_rejected`` now says the release exists only on one side of F.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from beamsynth.pipelines.cli.main import main
from beamsynth.pipelines.schema_draft import read_dictionary

pytestmark = pytest.mark.audit

ROOT = Path(__file__).resolve().parents[2]
ADULT = ROOT / "examples" / "data" / "adult" / "adult.csv"
needs_adult = pytest.mark.skipif(not ADULT.exists(), reason="examples/data/adult/adult.csv absent")


# -- 1. schema draft must never draft from the data ------------------------------------------------
@needs_adult
@pytest.mark.parametrize("orient", ["columns", "index"])
@pytest.mark.parametrize("columns", [["sex", "race", "income"], None])
def test_schema_draft_refuses_a_data_table_exported_as_json(tmp_path, capsys, orient, columns):
    """Neighbours D (40 Adult rows) and D + 1 row, exported with pandas' to_json: before, both
    drafted a schema (rc 0) with 40 vs 41 row-number categories and data values in the notes."""
    frame = pd.read_csv(ADULT, skipinitialspace=True)
    frame = frame if columns is None else frame[columns]
    outputs = []
    for n in (40, 41):
        path = tmp_path / f"data{n}.json"
        frame.head(n).to_json(path, orient=orient)
        out = tmp_path / f"draft{n}.yaml"
        rc = main(["schema", "draft", str(path), "--output", str(out)])
        err = capsys.readouterr().err
        assert rc == 2, f"drafted a schema from a data table ({orient}, {n} rows)"
        assert not out.exists()
        assert "a table of records, not a dictionary" in err
        # the path is the user's own (pytest's tmp dir may hold "39", as /tmp/.../pytest-139/ did)
        said = err.replace(str(path), "PATH")
        for value in ("Male", "White", "<=50K", "State-gov", "39"):
            assert value not in said  # the refusal names no data value
        outputs.append(said)
    assert outputs[0] == outputs[1]  # D and D + 1: the same refusal


def test_schema_draft_still_reads_code_maps_sharing_their_codes(tmp_path):
    """Genuine dictionaries keep drafting: every column coded 1/2 with its own labels, and a single
    column whose codes are 0..k-1."""
    path = tmp_path / "codes.json"
    path.write_text(json.dumps({"q1": {"1": "Yes", "2": "No"}, "q2": {"1": "Agree", "2": "Disagree"},
                                "q3": {"1": "Yes", "2": "No"}}), encoding="utf-8")
    fmt, cols = read_dictionary(path)
    assert [c.spec["domain"]["values"] for c in cols] == [["1", "2"]] * 3
    zero_based = tmp_path / "zero.json"  # 0-based codes shared by every column, own labels
    zero_based.write_text(json.dumps({"sex": {"0": "Female", "1": "Male"},
                                      "race": {"0": "White", "1": "Black", "2": "Other"}}),
                          encoding="utf-8")
    assert [c.spec["domain"]["values"] for c in read_dictionary(zero_based)[1]] == [
        ["0", "1"], ["0", "1", "2"]]
    single = tmp_path / "single.json"
    single.write_text(json.dumps({"level": {"0": "none", "1": "low", "2": "high"}}), encoding="utf-8")
    assert read_dictionary(single)[1][0].spec["domain"]["values"] == ["0", "1", "2"]


# -- 2. a run gated by --fail-on-rejected says so in its manifest -------------------------------------
def _toy(path: Path, good: int, bad: int) -> None:
    rows = ["age,sex,income"] + [f"{30 + i % 40},{'Male' if i % 2 else 'Female'},<=50K"
                                 for i in range(good)] + ["999,M@le,<=50K"] * bad
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


@pytest.mark.parametrize("command", ["synthesize", "histogram", "prefixes"])
def test_fail_on_rejected_gate_is_stated_in_the_manifest(tmp_path, capsys, command):
    """Neighbours D (38 good + 2 bad rows) and D + one bad row at --fail-on-rejected 0.06: D
    releases, D + row is refused (as documented); D's manifest must say that its existence depends
    on the rejected share (before: plain 'add/remove one privacy unit')."""
    schema = tmp_path / "toy.yaml"
    schema.write_text("name: toy\ncolumns:\n"
                      "  - {name: age, type: integer, domain: {kind: integer, low: 17, high: 90}}\n"
                      "  - {name: sex, type: categorical, domain: {kind: categorical, values: [Female, Male]}}\n"
                      "  - {name: income, type: categorical, domain: {kind: categorical, values: ['<=50K', '>50K']}}\n",
                      encoding="utf-8")
    args = {"synthesize": ["--schema", str(schema), "--method", "independent", "--epsilon", "1"],
            "histogram": ["--column", "age", "--domain", "int:17:90", "--epsilon", "1",
                          "--tolerance", "0.5"],
            "prefixes": ["--kind", "text", "--column", "sex", "--max-length", "6", "--epsilon", "1"]
            }[command]  # the bad rows (age 999, sex 'M@le') are rejected by each command
    outcomes = []
    for name, bad in (("d", 2), ("d1", 3)):
        data, out = tmp_path / f"{name}.csv", tmp_path / f"{name}_out.csv"
        _toy(data, 38, bad)
        outcomes.append(main([command, str(data), "--output", str(out), "--seed", "1",
                              "--fail-on-rejected", "0.06", *args]))
        capsys.readouterr()
    assert outcomes == [0, 2]
    manifest = json.loads((tmp_path / "d_out.csv.manifest.json").read_text())
    unit = manifest["release"]["privacy_unit"]
    assert "--fail-on-rejected 0.06" in unit.get("fail_on_rejected", ""), unit
    # without the gate nothing is added
    _toy(tmp_path / "d.csv", 38, 2)
    assert main([command, str(tmp_path / "d.csv"), "--output", str(tmp_path / "plain.csv"),
                 "--seed", "1", *args]) == 0
    assert "fail_on_rejected" not in json.loads(
        (tmp_path / "plain.csv.manifest.json").read_text())["release"]["privacy_unit"]
