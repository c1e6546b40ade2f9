"""Files read in byte-range parts: same batches, dead letters and seeded synthesis as one reader,
on one process and on 2 worker processes."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import apache_beam as beam
import numpy as np
import pandas as pd
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that

import beamsynth.pipelines.methods.synthesize as syn
from beamsynth.pipelines.io.read import ReadRecords
from beamsynth.pipelines.methods.synthesize import SynthesisConfig, run_synthesis
from beamsynth.runners.presets import options_for
from beamsynth.schemas.schema import load_schema

ADULT = Path(__file__).resolve().parents[2] / "examples" / "data" / "adult" / "adult.csv"  # bundled
IN_PROCESS = ["--direct_running_mode=in_memory"]
SPLIT = 40_000  # bytes: the ~600 kB input below is read in 16 parts


def _input(folder: Path) -> Path:
    """6,000 Adult rows, 3 per privacy id, with dead letters spread over the file."""
    if not ADULT.exists():
        pytest.skip(f"example data not found: {ADULT}")
    df = pd.read_csv(ADULT, nrows=6000, dtype=str, keep_default_na=False)
    df.insert(0, "pid", [f"u{i // 3}" for i in range(len(df))])
    for i in range(5, 6000, 701):
        df.loc[i, "age"] = "200"  # out of domain: rejected by the encoder
    text = df.to_csv(index=False).splitlines(keepends=True)
    for i in (900, 3100, 5555):
        text[i] = "ragged,line\n"  # rejected by the reader
    text.insert(2000, "\n")  # a blank line: not a record, but a line
    path = folder / "input.csv"
    path.write_text("".join(text), encoding="utf-8")
    return path


def _dead(path: Path) -> list[tuple]:
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    return sorted((r["row"], r["line"], r["reason"], r["raw"]) for r in rows)


def _synthesize(options: PipelineOptions, folder: Path, split_bytes: int, monkeypatch) -> dict:
    monkeypatch.setattr(syn, "ReadRecords", partial(ReadRecords, split_bytes=split_bytes))
    folder.mkdir()
    out = folder / "synthetic.csv"
    cfg = SynthesisConfig(input=str(_input(folder)), schema=load_schema("adult"), output=str(out),
                          epsilon=1.0, seed=20261122, privacy_id="pid", max_contributions=2,
                          block_rows=500, shard_rows=1500)
    manifest = run_synthesis(cfg, options)
    lines = out.read_text(encoding="utf-8").splitlines()
    op = manifest["operational"]
    return {"header": lines[0], "rows": sorted(lines[1:]), "rejected": _dead(Path(f"{out}.rejected.jsonl")),
            "counts": (op["rows_read"], op["rows_used"] + op["rows_dropped_by_bound"], op["rows_rejected"])}


def test_split_synthesize_equals_one_reader_on_one_and_two_processes(tmp_path, monkeypatch):
    whole = _synthesize(PipelineOptions(IN_PROCESS), tmp_path / "whole", 0, monkeypatch)
    read, used, rejected = whole["counts"]  # used: encoded rows, before the contribution bound
    assert read == 6000 and rejected == 3 + 9 and used == read - rejected
    lines = {r[1] for r in whole["rejected"]}
    assert {901, 3102, 5557} <= lines  # sequential line numbers (header = line 1, blank line 2001)
    split = _synthesize(PipelineOptions(IN_PROCESS), tmp_path / "split", SPLIT, monkeypatch)
    assert split == whole
    multi = _synthesize(options_for(["--runner", "direct-multi"]), tmp_path / "multi", SPLIT, monkeypatch)
    assert multi == whole


def _sorted_codes(batches: list) -> np.ndarray:
    codes = np.concatenate([b.codes for b in batches])
    return codes[np.lexsort(codes.T[::-1])]


def _dead_tuple(r) -> tuple:
    return (r.source, r.row, r.line, r.reason, r.raw, r.part)


def _matches(expected, convert):
    def check(actual):
        got = convert(actual)
        same = np.array_equal(got, expected) if isinstance(expected, np.ndarray) else got == expected
        if not same:
            raise AssertionError(f"split read differs from one reader: {len(actual)} elements")
    return check


@pytest.mark.parametrize("single_output", [False, True])
def test_split_read_records_gives_the_same_batches_and_dead_letters(tmp_path, single_output):
    from beamsynth.pipelines.io.encode import encode_block
    from beamsynth.pipelines.io.read import iter_raw_blocks
    from beamsynth.pipelines.io.records import RawBlock

    path = _input(tmp_path)
    schema = load_schema("adult")
    batches, dead = [], []
    for item in iter_raw_blocks(str(path), block_rows=700):  # one sequential reader, Beam-free
        if isinstance(item, RawBlock):
            batch, rej = encode_block(schema, item)
            batches.append(batch)
            dead += rej
        else:
            dead.append(item)
    want_codes = _sorted_codes(batches)
    want_dead = sorted(_dead_tuple(r) for r in dead)
    assert len(want_dead) == 12
    with beam.Pipeline(options=PipelineOptions(IN_PROCESS)) as p:
        out = p | ReadRecords(str(path), schema, block_rows=700, single_output=single_output,
                              split_bytes=SPLIT)
        assert_that(out["batches"], _matches(want_codes, _sorted_codes), label="Batches")
        assert_that(out["rejected"], _matches(want_dead, lambda rs: sorted(_dead_tuple(r) for r in rs)),
                    label="DeadLetters")


def test_unnumbered_dead_letters_renumbered_by_the_writer_match(tmp_path):
    from beamsynth.pipelines.io.dead_letters import write_rejected
    from beamsynth.pipelines.io.records import rejected_path

    path = _input(tmp_path)
    schema = load_schema("adult")
    files = {}
    for number in (True, False):
        out = str(tmp_path / f"out_{number}.csv")
        with beam.Pipeline(options=PipelineOptions(IN_PROCESS)) as p:
            read = p | ReadRecords(str(path), schema, block_rows=700, split_bytes=SPLIT,
                                   number_rejected=number)
            write_rejected(read["rejected"], out, part_counts=None if number else read["parts"])
        files[number] = Path(rejected_path(out)).read_bytes()
    assert files[False] == files[True] and files[True].count(b"\n") == 12
