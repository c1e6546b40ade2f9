"""`beamsynth synthesize --split-bytes`: a file read in parts gives the same release and dead
letters as one reader, also when quoted fields hold line breaks (dead letters, line by line)."""

import json
from pathlib import Path

import pandas as pd
import pytest

from beamsynth.pipelines.cli.main import main
from beamsynth.pipelines.io.records import rejected_path

ADULT = Path(__file__).resolve().parents[2] / "examples" / "data" / "adult" / "adult.csv"


@pytest.fixture(scope="module")
def dirty_csv(tmp_path_factory):
    """2,000 Adult rows with a bad value every 97 rows and a ragged line every 151."""
    df = pd.read_csv(ADULT, dtype=str, keep_default_na=False).drop(columns=["split"]).head(2000)
    df.loc[df.index % 97 == 5, "age"] = "not-a-number"
    path = tmp_path_factory.mktemp("split") / "dirty.csv"
    lines = df.to_csv(index=False, lineterminator="\n").splitlines()
    for i in range(151, len(lines), 151):
        lines[i] = lines[i] + ",extra,fields"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _synth(src, out, split, *extra):
    args = ["synthesize", str(src), "--schema", "adult", "--epsilon", "1", "--rows", "300",
            "--seed", "3", "--output", str(out), "--split-bytes", str(split), "--quiet", *extra]
    return main(args)


def test_split_read_same_release_and_dead_letters(dirty_csv, tmp_path):
    whole, parts = tmp_path / "whole.csv", tmp_path / "parts.csv"
    assert _synth(dirty_csv, whole, 0) == 0
    size = dirty_csv.stat().st_size
    assert _synth(dirty_csv, parts, size // 7) == 0  # 7+ parts
    assert whole.read_bytes() == parts.read_bytes()
    assert Path(rejected_path(str(whole))).read_bytes() == Path(rejected_path(str(parts))).read_bytes()
    rej = [json.loads(x) for x in Path(rejected_path(str(parts))).read_text().splitlines()]
    assert len(rej) >= 20 and [r["row"] for r in rej] == sorted(r["row"] for r in rej)
    m = json.loads(Path(f"{parts}.manifest.json").read_text())["operational"]
    assert m["rows_read"] == 2000 and m["rows_used"] + m["rows_rejected"] == 2000


def test_quoted_line_breaks_are_dead_letters_and_split_reads_agree(tmp_path):
    """A quoted field holding a line break is not one record (max_record_lines = 1): each of its
    lines is used or rejected on its own, so a split point inside it changes nothing and the run
    is released (it used to fail the whole run: whether a release happens depended on one record)."""
    df = pd.read_csv(ADULT, dtype=str, keep_default_na=False).drop(columns=["split"]).head(400)
    df["occupation"] = df["occupation"].where(df.index % 3 != 0, "Sales\nmore")  # quoted line breaks
    src = tmp_path / "quoted.csv"
    df.to_csv(src, index=False, lineterminator="\n")
    split, whole = tmp_path / "split.csv", tmp_path / "whole.csv"
    assert _synth(src, split, src.stat().st_size // 5) == 0
    assert _synth(src, whole, 0) == 0
    assert split.read_bytes() == whole.read_bytes()
    dead = Path(rejected_path(str(split))).read_bytes()
    assert dead == Path(rejected_path(str(whole))).read_bytes()
    reasons = [json.loads(x)["reason"] for x in dead.decode().splitlines()]
    assert len(reasons) == 2 * 134  # each broken record: its first line and its continuation
    assert sum("unbalanced quote" in r for r in reasons) == 134
    m = json.loads(Path(f"{split}.manifest.json").read_text())["operational"]
    assert (m["rows_read"], m["rows_used"], m["rows_rejected"]) == (534, 266, 268)


def test_max_record_lines_reads_quoted_line_breaks_as_one_record(tmp_path, capsys):
    df = pd.read_csv(ADULT, dtype=str, keep_default_na=False).drop(columns=["split"]).head(400)
    df["occupation"] = df["occupation"].where(df.index % 3 != 0, "Sales\nmore")
    src = tmp_path / "quoted.csv"
    df.to_csv(src, index=False, lineterminator="\n")
    out = tmp_path / "o.csv"
    assert _synth(src, out, 0, "--max-record-lines", "3") == 0
    manifest = json.loads(Path(f"{out}.manifest.json").read_text())
    m = manifest["operational"]
    assert (m["rows_read"], m["rows_used"], m["rows_rejected"]) == (400, 266, 134)  # not in the domain
    unit = manifest["release"]["privacy_unit"]
    assert unit["csv_max_record_lines"] == 3 and unit["csv_records_one_record_may_change"] == 3
    with pytest.raises(SystemExit) as exc:  # refused while parsing, in the flag's words (6e69db5)
        _synth(src, tmp_path / "bad.csv", 0, "--max-record-lines", "0")
    assert exc.value.code == 2
    assert "argument --max-record-lines: '0' is not a whole number in [1, 1000]" in capsys.readouterr().err


def test_negative_split_bytes_is_refused(dirty_csv, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:  # refused while parsing, in the flag's words (6e69db5)
        _synth(dirty_csv, tmp_path / "o.csv", -1)
    assert exc.value.code == 2
    assert "argument --split-bytes: '-1' is not a whole number >= 0" in capsys.readouterr().err
    assert not (tmp_path / "o.csv").exists()
