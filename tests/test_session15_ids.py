"""Fifteenth session (H71): exact privacy ids where the reader keeps their digits.

H66 (0c046bd) reads every privacy id of 2**53 or more as its nearest float's value, because a
pandas reader (``beam.io.ReadFromCsv``/``ReadFromJson``, Beam YAML's) gives such a column as
floats beside a blank. Measured cost (10,000 rows, consecutive ids from 10**18, max_contributions
1): rows used 10,000 before 0c046bd, 79 after it in the CLI, through ``csv.DictReader`` and through
``ReadFromCsv`` alike. Now:

1. the CLI's readers keep every digit (CSV text, JSONL ints, Avro longs, Parquet int64 through
   ``to_pylist``; nulls ``None``, never a float column), so the CLI reads ids exactly (its
   ``synthesize``/``histogram``/``release`` encoder and the ``prefixes`` one): 10,000 used;
2. a schema may declare ``privacy_ids: exact`` (API/YAML users whose reader keeps digits); a
   float id of 2**53 or more is then a dead letter naming the read option;
3. the default (``rounded``) counts such ids in the manifest's private part
   (``operational.privacy_ids_rounded``); every manifest with an id column says which mode ran
   (``release.privacy_unit.ids``).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import apache_beam as beam
import numpy as np
import pandas as pd
import pytest

import beamsynth as bs
from beamsynth.pipelines.cli import main as cli
from beamsynth.pipelines.io.encode import encode_block, readers_keep_digits
from beamsynth.pipelines.io.read import iter_raw_blocks
from beamsynth.pipelines.io.records import RawBlock
from beamsynth.pipelines.methods.prefixes import encode_key_block
from beamsynth.schemas.keys import key_codec_from_spec
from beamsynth.schemas.schema import (
    SchemaError,
    count_rounded_ids,
    encode_privacy_ids,
    load_schema,
)

BIG = 2**53
SPEC = {"name": "ids", "privacy_id": "pid", "columns": [
    {"name": "c", "type": "categorical", "domain": {"kind": "categorical", "values": ["a", "b"]}}]}


def _schema(**extra):
    return load_schema({**SPEC, **extra})


def test_exact_mode_keeps_digits_and_rejects_lost_floats() -> None:
    """Both modes on the spellings readers give; one person per value in either mode."""
    values = [BIG + 1, str(BIG + 1), f"+0{BIG + 1}", f"{BIG + 1}.0", "9.007199254740993e15",
              10**18 + 1, 7, "07", 7.0, "1e23", "abc", float(BIG + 1), float(BIG - 1), None]
    rounded, why_r = encode_privacy_ids(values, "pid")
    exact, why_e = encode_privacy_ids(values, "pid", exact=True)
    assert list(rounded[:6]) == [str(BIG)] * 5 + [str(10**18)]
    assert list(exact[:6]) == [str(BIG + 1)] * 5 + [str(10**18 + 1)]
    assert list(exact[6:11]) == ["7", "7", "7", str(10**23), "abc"]
    assert exact[12] == rounded[12] == str(BIG - 1)
    assert set(why_r) == {13} and set(why_e) == {11, 13}  # the float 2**53 (+ 1?) and the null
    assert "privacy_ids: exact" in why_e[11] and "dtype={'pid': str}" in why_e[11]
    # rounded-mode count: ids of 2**53 or more (2**53 + 1 reads 2**53), each id alone
    assert count_rounded_ids(rounded) == 8 and count_rounded_ids(None) == 0


def test_privacy_ids_key_is_declared_and_validated() -> None:
    plain, exact = _schema(), _schema(privacy_ids="exact")
    assert plain.privacy_ids == "rounded" and exact.privacy_ids == "exact"
    assert plain.fingerprint() == load_schema(SPEC).fingerprint() != exact.fingerprint()
    assert "privacy_ids" not in plain.to_spec() and exact.to_spec()["privacy_ids"] == "exact"
    assert exact.select(["c"]).privacy_ids == "exact"
    assert load_schema(exact.to_spec()).fingerprint() == exact.fingerprint()
    for bad in ("Exact", True, "float"):
        with pytest.raises(SchemaError, match="privacy_ids .* must be one of"):
            _schema(privacy_ids=bad)
    spec = json.loads((Path(bs.__file__).resolve().parents[1] / "schemas" / "schema.json")
                      .read_text(encoding="utf-8"))
    assert spec["properties"]["privacy_ids"]["enum"] == ["rounded", "exact"]


def test_beam_yaml_rows_follow_the_declared_mode() -> None:
    """Beam YAML's steps encode rows with the schema's mode (no reader of their own): an int and
    its text are one person in both modes, a float of 2**53 or more merges (rounded) or is a dead
    letter (exact)."""
    from beamsynth.pipelines.yaml_transforms import encode_rows

    rows = [{"pid": BIG, "c": "a"}, {"pid": BIG + 1, "c": "b"}, {"pid": float(BIG + 1), "c": "a"},
            {"pid": str(BIG + 1), "c": "a"}]
    got = {}
    for mode in ("rounded", "exact"):
        batch, bad = encode_rows(_schema(privacy_ids=mode), rows)
        got[mode] = (list(batch.pids), [r.row for r in bad])
    assert got == {"rounded": ([str(BIG)] * 4, []),
                   "exact": ([str(BIG), str(BIG + 1), str(BIG + 1)], [3])}


def _write_inputs(folder: Path) -> dict[str, Path]:
    """The same records (ids 2**53 and 2**53 + 1, and a row without an id) in every CLI format."""
    rows = [{"pid": BIG, "c": "a"}, {"pid": BIG + 1, "c": "b"}, {"pid": None, "c": "a"}]
    paths = {f: folder / f"d.{f}" for f in ("csv", "jsonl", "parquet", "avro")}
    paths["csv"].write_text("pid,c\n" + "".join(f"{r['pid'] or ''},{r['c']}\n" for r in rows),
                            encoding="utf-8")
    paths["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    import fastavro
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"pid": pa.array([r["pid"] for r in rows], pa.int64()),
                             "c": [r["c"] for r in rows]}), paths["parquet"])
    with open(paths["avro"], "wb") as fh:
        fastavro.writer(fh, fastavro.parse_schema({"type": "record", "name": "r", "fields": [
            {"name": "pid", "type": ["null", "long"]}, {"name": "c", "type": "string"}]}), rows)
    return paths


def test_cli_readers_keep_every_digit(tmp_path: Path) -> None:
    """Every CLI format: the id column reaches the encoder as text or ints (a null as ``None``,
    never a float column), and the CLI's encoder reads it exactly: 2**53 and 2**53 + 1 are two
    persons beside a row without an id. The schema's default mode would merge them."""
    schema = _schema()
    for fmt, path in _write_inputs(tmp_path).items():
        blocks = [b for b in iter_raw_blocks(str(path)) if isinstance(b, RawBlock)]
        ids = [v for b in blocks for v in b.columns["pid"].tolist()]
        assert not any(isinstance(v, float) for v in ids), (fmt, ids)
        batch, bad = encode_block(readers_keep_digits(schema), blocks[0])
        assert sorted(batch.pids) == [str(BIG), str(BIG + 1)] and len(bad) == 1, (fmt, batch.pids)
        assert sorted(encode_block(schema, blocks[0])[0].pids) == [str(BIG)] * 2  # rounded
    adult = bs.load_schema("adult")
    assert readers_keep_digits(adult) is adult  # no id column: as it is
    # the prefixes command's encoder alike (a float of 2**53 or more: a dead letter)
    codec = key_codec_from_spec({"kind": "text", "column": "c", "alphabet": "ab", "max_length": 2})
    block = RawBlock("x", {"c": pd.Series(["a", "b", "a", "b"], dtype=object),
                           "pid": pd.Series([BIG, BIG + 1, None, float(BIG + 1)], dtype=object)},
                     np.arange(1, 5))
    batch, bad = encode_key_block(codec, "pid", block, exact_ids=True)
    assert list(batch.pids) == [str(BIG), str(BIG + 1)]
    assert [r.row for r in bad] == [3, 4] and "is missing" in bad[0].reason \
        and "privacy_ids: exact" in bad[1].reason


def test_cli_run_uses_every_big_id_and_says_exact(tmp_path: Path) -> None:
    """The CLI end to end: 300 rows with consecutive ids from 10**18, max_contributions 1: every
    row used (3 before this change: floats 128 apart), manifest ``privacy_unit.ids: exact``."""
    (tmp_path / "d.csv").write_text(
        "pid,c\n" + "".join(f"{10**18 + i},{'ab'[i % 2]}\n" for i in range(300)), encoding="utf-8")
    (tmp_path / "s.json").write_text(json.dumps(SPEC), encoding="utf-8")
    out = tmp_path / "o.csv"
    assert cli.main(["synthesize", str(tmp_path / "d.csv"), "--schema", str(tmp_path / "s.json"),
                     "--epsilon", "1", "--output", str(out), "--rows", "5", "--seed", "1"]) == 0
    manifest = json.loads((tmp_path / "o.csv.manifest.json").read_text(encoding="utf-8"))
    assert manifest["operational"]["rows_used"] == 300
    assert manifest["release"]["privacy_unit"]["ids"] == "exact"


def _run_jobs(tmp_path: Path, runs: dict[str, tuple[str, str]]) -> dict[str, tuple]:
    """``job.private`` → ``bs.Count`` per run (tag: (input, mode)) in one pipeline: input ``d``
    read by ``csv.DictReader`` (ids as text), ``b`` by ``ReadFromCsv`` (``b_text``: with
    ``dtype={"pid": str}``); (rows used, rejected,
    privacy_ids_rounded, manifest's ids) and the dead letters' reasons."""
    with beam.Pipeline() as p:
        for tag, (data, mode) in runs.items():
            job = bs.PrivacyJob(epsilon=1.0, seed=1, disjoint=True, name=tag,
                                privacy_unit=bs.PrivacyUnit(id_column="pid"))
            path = str(tmp_path / f"{data[0]}.csv")
            rows = (p | f"Rows[{tag}]" >> beam.Create(list(csv.DictReader(open(path, encoding="utf-8"))))
                    if data == "d" else p | f"Read[{tag}]" >> beam.io.ReadFromCsv(
                        path, **({"dtype": {"pid": str}} if data == "b_text" else {})))
            private = rows | f"Private[{tag}]" >> job.private(_schema(privacy_ids=mode))
            _ = private | f"Count[{tag}]" >> bs.Count(epsilon=1.0)
            _ = (private.dead_letters | f"Reasons[{tag}]" >> beam.Map(lambda d: d.reason)
                 | f"WriteReasons[{tag}]" >> beam.io.WriteToText(str(tmp_path / f"{tag}.dead")))
            _ = p | f"Manifest[{tag}]" >> bs.WriteManifest(job=job, path=str(tmp_path / f"{tag}.json"))
    got = {}
    for tag in runs:
        m = json.loads((tmp_path / f"{tag}.json").read_text(encoding="utf-8"))
        op = m["operational"]
        reasons = "".join(f.read_text(encoding="utf-8") for f in tmp_path.glob(f"{tag}.dead*"))
        got[tag] = (op["rows_used"], op["rows_rejected"], op.get("privacy_ids_rounded"),
                    m["release"]["privacy_unit"]["ids"], reasons)
    return got


def test_api_exact_mode_and_rounded_count(tmp_path: Path) -> None:
    """``csv.DictReader`` rows (ids as text) of 300 consecutive ids from 10**18,
    max_contributions 1: 3 persons when rounded (all 300 counted in the manifest's private
    part), 300 when declared exact; the manifest says which mode ran."""
    (tmp_path / "d.csv").write_text(
        "pid,c\n" + "".join(f"{10**18 + i},{'ab'[i % 2]}\n" for i in range(300)), encoding="utf-8")
    got = _run_jobs(tmp_path, {"rounded": ("d", "rounded"), "exact": ("d", "exact")})
    assert got == {"rounded": (3, 0, 300, "rounded", ""), "exact": (300, 0, None, "exact", "")}


def test_api_exact_mode_dead_letters_lost_floats(tmp_path: Path) -> None:
    """``ReadFromCsv`` beside a blank id gives floats (2**53 + 1 reads 2**53): under
    ``privacy_ids: exact`` both are dead letters naming the read option (the reader is not as
    declared; rounded mode merges them, as H66's audit pair checks); read with
    ``dtype={"pid": str}``, as the reason says, both are used."""
    (tmp_path / "b.csv").write_text(f"pid,c\n{BIG},a\n{BIG + 1},b\n,a\n", encoding="utf-8")
    got = _run_jobs(tmp_path, {"x": ("b", "exact"), "text": ("b_text", "exact")})
    (used, rejected, rounded, ids, reasons) = got["x"]
    assert (used, rejected, rounded, ids) == (0, 3, None, "exact")
    assert reasons.count("dtype={'pid': str}") == 2 and "is empty" in reasons
    # read as the reason says: both persons used (2 persons, 1 row per person), the blank rejected
    assert got["text"][:4] == (2, 1, None, "exact") and "dtype" not in got["text"][4]
