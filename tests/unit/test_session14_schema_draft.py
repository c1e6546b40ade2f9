"""Fourteenth session (H64, issue 18): ``schema draft`` reads SmartNoise metadata YAML, combines
dictionaries (``--with``) and orders columns by a data file's header line (``--header-from``).

Small inline files only; the shared PUMS files in the one slow, skip-if-absent test."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from beamsynth.pipelines.cli.main import main
from beamsynth.pipelines.schema_draft import data_header, draft_schema, read_draft
from beamsynth.schemas.schema import load_schema

SN = """\
Coll:
  Census:
    People:
      row_privacy: True
      rows: 1234
      censor_dims: False
      age:
        type: int
        lower: 0
        upper: 100
      sex:
        type: string
        cardinality: 2
      income:
        type: float
        lower: 0
        upper: 5000.5
      employed:
        type: boolean
        nullable: False
      seen:
        type: datetime
        lower: 2020-01-01
        upper: 2020-12-31
      weird:
        type: unknown
"""
SN_PID = """\
"":
  S:
    T:
      max_ids: 4
      sample_max_ids: True
      pid:
        type: int
        private_id: True
      age:
        type: int
        lower: 0
        upper: 100
        missing_value: 30
      code:
        type: string
"""
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "pums_smartnoise"


def _spec(text: str) -> dict:
    return yaml.safe_load(text)


def _cols(text: str) -> dict:
    return {c["name"]: c for c in _spec(text)["columns"]}


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_smartnoise_yaml_drafts_bounds_types_and_row_privacy(tmp_path):
    text = draft_schema(_write(tmp_path, "meta.yaml", SN))
    schema = load_schema(_spec(text))  # validates as drafted
    cols = _cols(text)
    assert list(cols) == ["age", "income", "employed", "seen"]  # declared order; string/unknown out
    assert cols["age"]["domain"] == {"kind": "integer", "low": 0, "high": 100}
    assert cols["age"]["nullable"] is True and cols["age"]["null_values"] == [""]  # SN default
    assert cols["income"]["type"] == "float" and cols["income"]["domain"]["low"] == 0
    assert cols["income"]["domain"]["high"] >= 5000.5
    assert cols["employed"]["domain"]["values"] == ["False", "True"]
    assert "nullable" not in cols["employed"]  # nullable: False kept
    assert cols["seen"]["domain"]["start"] == "2020-01-01"
    assert schema.privacy_id is None and "privacy_id: null\n" in text  # row_privacy: one record
    assert "row_privacy: true in table Census.People" in text
    # what cannot be drafted is said, with exactly what to declare; nothing is silent
    assert ('  # - name: "sex"   (not drafted: list the values, uncomment)\n'
            '  #   type: categorical\n'
            '  #   domain: {"kind": "categorical", "values": []}\n'
            '  #   nullable: true\n') in text
    assert "values: [...]} (the metadata's cardinality hint: about 2 values)" in text
    assert "Never list the values found in the data" in text
    assert '# - name: "weird"   (not drafted)' in text and "type unknown" in text
    assert "query-engine option(s) ['censor_dims']" in text
    assert "1234" not in text  # the metadata's row count is not copied


def test_private_id_and_max_ids_become_the_privacy_unit(tmp_path):
    text = draft_schema(_write(tmp_path, "pid.yaml", SN_PID))
    schema = load_schema(_spec(text))
    assert schema.privacy_id == "pid" and "pid" not in _cols(text)
    assert "--max-contributions 4" in text
    assert "query-engine option(s) ['sample_max_ids']" in text
    assert "missing_value 30: SmartNoise replaces a null by it" in text
    default = SN_PID.replace("      max_ids: 4\n", "")
    assert "max_ids 1 (SmartNoise's default)" in draft_schema(_write(tmp_path, "d.yaml", default))
    neither = SN_PID.replace("        private_id: True\n", "")
    text = draft_schema(_write(tmp_path, "n.yaml", neither))
    assert "sets neither row_privacy nor a private_id column" in text


def test_with_fills_categories_and_first_dictionary_wins_conflicts(tmp_path):
    meta = _write(tmp_path, "meta.yaml", SN)
    sizes = _write(tmp_path, "sizes.json", '{"age": 95, "sex": 2, "zip": 3}')
    text = draft_schema(meta, also=[sizes])
    cols = _cols(text)
    load_schema(_spec(text))
    assert cols["sex"]["type"] == "categorical"  # SmartNoise's string type, the codes as text
    assert cols["sex"]["domain"]["values"] == ["0", "1"] and cols["sex"]["nullable"] is True
    assert "categories from sizes.json: the codes 0..1" in text
    assert cols["age"]["domain"]["high"] == 100  # the first dictionary wins ...
    assert "conflict: sizes.json declares integer 0..94" in text  # ... and says so
    assert "kept meta.yaml's integer 0..100" in text
    assert cols["zip"]["domain"]["high"] == 2 and "only in sizes.json" in text
    # through the CLI, repeatable, and the other order: the domain JSON wins
    out = tmp_path / "o.yaml"
    assert main(["schema", "draft", str(sizes), "--with", str(meta), "--output", str(out)]) == 0
    swapped = out.read_text()
    assert _cols(swapped)["age"]["domain"]["high"] == 94
    assert "# REVIEW: from meta.yaml: row_privacy: true" in swapped  # the unit still declared
    assert "privacy_id: null\n" in swapped and "SmartNoise columns are nullable" not in swapped
    pid_meta = _write(tmp_path, "pid.yaml", SN_PID)
    text = draft_schema(_write(tmp_path, "s2.json", '{"pid": 9, "age": 101}'), also=[pid_meta])
    assert load_schema(_spec(text)).privacy_id == "pid" and "pid" not in _cols(text)
    assert "from pid.yaml: max_ids 4" in text and "is also a column of s2.json" in text


def test_header_from_orders_columns_reading_only_the_header(tmp_path):
    dom = _write(tmp_path, "dom.json", '{"b": 2, "a": 3, "c": 2}')
    # the header's order; a record that fits no domain is never read (only the first line)
    data = _write(tmp_path, "data.csv", "\ufeff\nc,extra,a\nnot,a,record\n")
    assert data_header(data) == ["c", "extra", "a"]
    text = draft_schema(dom, header_from=data)
    assert list(_cols(text)) == ["c", "a"]
    assert "left out (a declared column missing from the file" in text  # b
    assert "header has column(s) ['extra'] that no dictionary declares" in text
    assert "only that line was read" in text
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"a": [1], "zz": ["x"], "c": [0]}), tmp_path / "d.parquet")
    assert data_header(tmp_path / "d.parquet") == ["a", "zz", "c"]
    jsonl = _write(tmp_path, "d.jsonl", '{"a": 1}\n')
    with pytest.raises(ValueError, match="has no header line; order the columns"):
        draft_schema(dom, header_from=jsonl)
    assert main(["schema", "validate", "adult", "--header-from", str(data)]) == 2


def test_yaml_that_is_no_smartnoise_metadata_is_refused(tmp_path):
    schema_yaml = _write(tmp_path, "s.yaml", "name: x\ncolumns:\n  - name: a\n")
    with pytest.raises(ValueError, match="a beamsynth schema .* needs no draft"):
        read_draft(schema_yaml)
    other = _write(tmp_path, "o.yaml", "a: 1\nb: [2]\n")
    with pytest.raises(ValueError, match="no SmartNoise table"):
        read_draft(other)
    two = _write(tmp_path, "two.yaml", SN + "  Other:\n    T2:\n      x:\n        type: int\n"
                 "        lower: 0\n        upper: 1\n")
    with pytest.raises(ValueError, match=r"holds 2 tables \['Census.People', 'Other.T2'\]"):
        read_draft(two)
    assert [c.name for c in read_draft(two, table="T2").columns] == ["x"]


@pytest.mark.slow
@pytest.mark.skipif(not SHARED.exists(), reason="../shared/data/pums_smartnoise is absent")
def test_shared_pums_metadata_with_domain_sizes_reads_every_row(tmp_path):
    """PUMS.yaml + pums-domain.json, ordered by PUMS.csv's header: every row of the three
    SmartNoise files is read (no dead letter)."""
    from beamsynth.pipelines.io.encode import encode_block
    from beamsynth.pipelines.io.read import iter_raw_blocks

    for meta, data in (("PUMS", "PUMS"), ("PUMS_dup", "PUMS_dup"), ("PUMS_pid", "PUMS_pid")):
        text = draft_schema(SHARED / f"{meta}.yaml", also=[SHARED / "pums-domain.json"],
                            header_from=SHARED / f"{data}.csv")
        schema = load_schema(_spec(text))
        assert schema.names == ["age", "sex", "educ", "race", "income", "married"]
        used, bad = 0, 0
        for item in iter_raw_blocks(str(SHARED / f"{data}.csv")):
            batch, rejected = encode_block(schema, item)
            used, bad = used + len(batch), bad + len(rejected)
        assert bad == 0 and used == (1948 if meta == "PUMS_dup" else 1000)


def test_a_conflict_past_the_shown_categories_or_digits_is_named() -> None:
    """merge_drafts compared the domains' display text (first 8 categories, numbers as :g), so
    dictionaries differing in the 10th category or in 1234567 vs 1234568 were no conflict
    (review, lead); it now compares the declared domains."""
    from beamsynth.pipelines.schema_draft import DraftColumn, DraftTable, merge_drafts

    def table(source, *specs):
        return DraftTable("schema", [DraftColumn(s["name"], s) for s in specs], source=source)

    cats = [f"c{i}" for i in range(10)]
    a = table("a.json", {"name": "x", "type": "categorical",
                         "domain": {"kind": "categorical", "values": cats}},
              {"name": "n", "type": "integer",
               "domain": {"kind": "integer", "low": 0, "high": 1234567}})
    b = table("b.json", {"name": "x", "type": "categorical",
                         "domain": {"kind": "categorical", "values": [*cats[:9], "other"]}},
              {"name": "n", "type": "integer",
               "domain": {"kind": "integer", "low": 0, "high": 1234568}})
    merged = merge_drafts(a, [b])
    assert [sum(n.startswith("conflict: b.json") for n in c.notes) for c in merged.columns] == [1, 1]
    specs = [dict(c.spec) for c in a.columns]
    same = merge_drafts(table("a.json", *specs), [table("c.json", *specs)])
    assert not any(n.startswith("conflict") for c in same.columns for n in c.notes)
