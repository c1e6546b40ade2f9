"""What a user meets on data the project was not tuned on (issue 18, H51: benchmarks/unseen_shared.py)."""

import pandas as pd

from beamsynth.pipelines.cli.main import main

SCHEMA = """name: t
extra_columns: ignore
columns:
  - name: AGEP
    type: integer
    domain: {kind: integer, low: 0, high: 99}
  - name: SEX
    type: categorical
    domain: {kind: categorical, values: ["1", "2"]}
"""


def _synthesize(tmp_path, frame, capsys):
    data, schema, out = tmp_path / "in.csv", tmp_path / "s.yaml", tmp_path / "out.csv"
    frame.to_csv(data, index=False)
    schema.write_text(SCHEMA)
    assert main(["synthesize", str(data), "--schema", str(schema), "--epsilon", "1", "--rows", "20",
                 "--output", str(out), "--seed", "0"]) == 0
    return capsys.readouterr().err, pd.read_csv(out, dtype=str)


def test_input_columns_left_out_by_the_schema_are_named(tmp_path, capsys):
    """SDNist's dictionary declares no domain for INDP, so the drafted schema leaves it out
    (extra_columns: ignore): the run used to say nothing and the output simply lacked it."""
    frame = pd.DataFrame({"AGEP": ["30", "41"] * 10, "INDP": ["7870", "N"] * 10,
                          "SEX": ["1", "2"] * 10})
    err, out = _synthesize(tmp_path, frame, capsys)
    assert list(out.columns) == ["AGEP", "SEX"]
    assert ("note: input column 'INDP' is not in schema 't' and is not synthesized "
            "(extra_columns: ignore)") in err
    err, _ = _synthesize(tmp_path, frame.drop(columns=["INDP"]), capsys)
    assert "not synthesized" not in err
