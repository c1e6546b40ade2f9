"""`beamsynth synthesize --split-bytes`: a file read in parts gives the same release and dead
letters as one reader, and a quoted line break across a split point fails with a usable hint."""

import json
from pathlib import Path

import pandas as pd
import pytest

from beamsynth.pipelines.cli import main
from beamsynth.pipelines.io import rejected_path

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


def _synth(src, out, split):
    args = ["synthesize", str(src), "--schema", "adult", "--epsilon", "1", "--rows", "300",
            "--seed", "3", "--output", str(out), "--split-bytes", str(split), "--quiet"]
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


def test_quoted_line_break_across_split_point_names_the_option(tmp_path, capsys):
    df = pd.read_csv(ADULT, dtype=str, keep_default_na=False).drop(columns=["split"]).head(400)
    df["occupation"] = df["occupation"].where(df.index % 3 != 0, "Sales\nmore")  # quoted line breaks
    src = tmp_path / "quoted.csv"
    df.to_csv(src, index=False, lineterminator="\n")
    assert _synth(src, tmp_path / "o.csv", src.stat().st_size // 5) != 0
    assert "--split-bytes 0" in capsys.readouterr().err
    assert not (tmp_path / "o.csv").exists()  # nothing released
    assert _synth(src, tmp_path / "ok.csv", 0) == 0  # one reader: every line break stays in its field


def test_negative_split_bytes_is_refused(dirty_csv, tmp_path, capsys):
    assert _synth(dirty_csv, tmp_path / "o.csv", -1) != 0
    assert "split_bytes (-1)" in capsys.readouterr().err
