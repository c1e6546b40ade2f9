"""Dead letters stream to ``OUT.rejected.jsonl``: sorted runs where rows are rejected, one merge.

``write_rejected`` used Beam's ``WriteToText(num_shards=1)``, which groups every rejected row under
one key (held in memory by the DirectRunner). Now rows never cross a shuffle
(``WriteSortedLines`` in ``pipelines/io/single_file.py``), the file is ordered by (source, row,
line), and a failed run leaves no temporary folder behind.
"""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beamsynth.pipelines.io import single_file
from beamsynth.pipelines.io.dead_letters import write_rejected
from beamsynth.pipelines.io.manifest import manifest_path
from beamsynth.pipelines.io.read import ReadRecords
from beamsynth.pipelines.io.records import Rejected, rejected_path
from beamsynth.pipelines.io.single_file import (
    TEMP_PREFIX,
    WriteSortedLines,
    _MergeRunsFn,
    remove_temp_folders,
)
from beamsynth.pipelines.methods.synthesize import SynthesisConfig, run_synthesis
from beamsynth.schemas.schema import load_schema
from beamsynth.transforms.faults import InjectedFault

OPTIONS = ["--direct_running_mode=in_memory"]
RETRYING = "BundleBasedDirectRunner"
SCHEMA = {"columns": [
    {"name": "a", "type": "categorical", "domain": {"kind": "categorical", "values": ["x", "y"]}},
    {"name": "n", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 9, "bins": 5}},
]}


def _temp_folders(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(TEMP_PREFIX)]


def _keyed(n: int, *, start: int = 0) -> list[tuple[bytes, str]]:
    """``n`` (key, line) pairs whose keys sort in a different order than they are created."""
    return [(b"%08d" % ((i * 7919) % 100_003), json.dumps({"i": i, "pad": "x" * (i % 50)}))
            for i in range(start, start + n)]


def _write_lines(items, path: Path, *, run_bytes: int = 1 << 20, runner: str | None = None):
    opts = PipelineOptions(OPTIONS) if runner is None else PipelineOptions(runner=runner)
    with beam.Pipeline(options=opts) as p:
        _ = p | beam.Create(items, reshuffle=False) | WriteSortedLines(str(path), run_bytes=run_bytes)


def _expected(items) -> str:
    return "".join(line + "\n" for _key, line in sorted(items, key=lambda kv: kv[0] + b"\t" + kv[1].encode()))


@pytest.mark.parametrize("run_bytes", [1 << 20, 2_000])
def test_sorted_lines_hold_every_line_once_in_key_order(tmp_path, run_bytes, monkeypatch):
    """One run or many (more than the merge fan-in: several merge passes)."""
    monkeypatch.setattr(single_file, "_MAX_FAN_IN", 3)
    items = _keyed(3_000)
    path = tmp_path / "out.jsonl"
    _write_lines(items, path, run_bytes=run_bytes)
    assert path.read_text(encoding="utf-8") == _expected(items)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]


def test_sorted_lines_do_not_depend_on_arrival_order(tmp_path):
    items = _keyed(500)
    _write_lines(items, tmp_path / "a.jsonl", run_bytes=3_000)
    _write_lines(items[::-1], tmp_path / "b.jsonl", run_bytes=5_000)
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_empty_input_writes_an_empty_file(tmp_path):
    _write_lines([], tmp_path / "out.jsonl")
    assert (tmp_path / "out.jsonl").read_bytes() == b""
    assert _temp_folders(tmp_path) == []


def test_bad_keys_and_run_bytes_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"run_bytes \(0\) must be an int >= 1"):
        WriteSortedLines(str(tmp_path / "x"), run_bytes=0)
    with pytest.raises(Exception, match="must hold no tab or line break"):
        _write_lines([(b"a\tb", "line")], tmp_path / "x.jsonl")


def _inputs(tmp_path: Path) -> list[str]:
    """Two CSV files with ragged lines, out-of-domain values and rows in reverse file order."""
    a = tmp_path / "in" / "a.csv"
    b = tmp_path / "in" / "b.csv"
    a.parent.mkdir()
    a.write_text("a,n\n" + "".join(("q,1\n" if i % 3 == 0 else "x,1,extra\n" if i % 5 == 0
                                    else "y,2\n") for i in range(200)), encoding="utf-8")
    b.write_text("a,n\n" + "".join("x,99\n" if i % 2 else "x,3\n" for i in range(150)),
                 encoding="utf-8")
    return [str(b), str(a)]


def _dead_letters(paths: list[str], out: str, block_rows: int) -> None:
    with beam.Pipeline(options=PipelineOptions(OPTIONS)) as p:
        read = p | ReadRecords(paths, load_schema(SCHEMA), block_rows=block_rows)
        write_rejected(read["rejected"], out)


def test_rejected_file_is_ordered_by_source_and_row_and_has_the_old_lines(tmp_path):
    """Same lines as Beam's WriteToText wrote (same JSON), now ordered by (source, row), the same
    bytes for any block size (other bundles, other runs)."""
    paths = _inputs(tmp_path)
    out = tmp_path / "o" / "syn.csv"
    out.parent.mkdir()
    _dead_letters(paths, str(out), block_rows=7)
    got = Path(rejected_path(str(out))).read_text(encoding="utf-8").splitlines()
    with beam.Pipeline(options=PipelineOptions(OPTIONS)) as p:
        read = p | ReadRecords(paths, load_schema(SCHEMA), block_rows=7)
        _ = (read["rejected"] | beam.Map(lambda r: r.to_json())
             | beam.io.WriteToText(str(tmp_path / "old.jsonl"), num_shards=1, shard_name_template=""))
    assert sorted(got) == sorted((tmp_path / "old.jsonl").read_text(encoding="utf-8").splitlines())
    rows = [json.loads(line) for line in got]
    keys = [(r["source"], r["row"]) for r in rows]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert {r["source"] for r in rows} == set(paths)
    assert len(rows) == 200 // 3 + 1 + 75 + sum(1 for i in range(200) if i % 5 == 0 and i % 3)
    first = out.parent / "first.jsonl"
    os.replace(rejected_path(str(out)), first)
    _dead_letters(paths, str(out), block_rows=1000)
    assert Path(rejected_path(str(out))).read_bytes() == first.read_bytes()
    assert _temp_folders(out.parent) == []


def test_rejected_sort_key_orders_rows_numerically():
    from beamsynth.pipelines.io.dead_letters import _rejected_sort_key

    rs = [Rejected("b.csv", 2, "r"), Rejected("a.csv", 10, "r"), Rejected("a.csv", 9, "r"),
          Rejected("a.csv", None, "unreadable"), Rejected("a.csv.gz", 1, "r")]
    got = sorted(rs, key=_rejected_sort_key)
    assert [(r.source, r.row) for r in got][:3] == [("a.csv", None), ("a.csv", 9), ("a.csv", 10)]
    assert {(r.source, r.row) for r in got[3:]} == {("b.csv", 2), ("a.csv.gz", 1)}


def _synth_all_rejected(tmp_path: Path, rows: int) -> tuple[SynthesisConfig, Path]:
    src = tmp_path / "bad.csv"
    src.write_text("A,n\n" + "".join(f"x,{i % 10}\n" for i in range(rows)), encoding="utf-8")
    out = tmp_path / "out" / "syn.csv"
    return SynthesisConfig(input=str(src), schema=load_schema(SCHEMA), output=str(out), epsilon=1.0,
                           rows=20, seed=3, block_rows=500), out


def test_every_row_rejected_counts_add_up_and_file_is_in_row_order(tmp_path):
    cfg, out = _synth_all_rejected(tmp_path, 2_345)
    m = run_synthesis(cfg)
    ops = m["operational"]
    assert ops["rows_read"] == 2_345 == ops["rows_used"] + ops["rows_rejected"]
    assert ops["rows_rejected"] == 2_345
    rows = [json.loads(line) for line in Path(rejected_path(str(out))).read_text().splitlines()]
    assert [r["row"] for r in rows] == list(range(1, 2_346))
    assert all(r["reason"].startswith("file header") for r in rows)
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(
        ["syn.csv", "syn.csv.rejected.jsonl", "syn.csv.manifest.json"])


def _fail_join(monkeypatch, fail_on: str):
    """Make the join step of the writer named ``fail_on`` ('output' or 'rejected') raise, after
    every part was written."""
    original = single_file.join_part_files

    def join(part_paths, parts_dir, path, write, **kw):
        if path.endswith(".rejected.jsonl") == (fail_on == "rejected"):
            assert part_paths and all(os.path.exists(p) for p in part_paths)
            raise InjectedFault(f"injected failure joining {path}")
        return original(part_paths, parts_dir, path, write, **kw)

    monkeypatch.setattr(single_file, "join_part_files", join)


@pytest.mark.parametrize("fail_on", ["output", "rejected"])
def test_failed_run_leaves_no_temporary_folder(tmp_path, monkeypatch, fail_on):
    """A pipeline failing after the parts are written: no .beamsynth-temp-* folder, no manifest."""
    cfg, out = _synth_all_rejected(tmp_path, 300)
    src = Path(cfg.input)
    src.write_text("a,n\n" + "".join(f"{'xq'[i % 2]},{i % 10}\n" for i in range(300)), encoding="utf-8")
    _fail_join(monkeypatch, fail_on)
    with pytest.raises(Exception, match="injected failure joining"):
        run_synthesis(cfg)
    assert _temp_folders(out.parent) == []
    assert not os.path.exists(manifest_path(str(out)))


def test_remove_temp_folders_finds_every_writer(tmp_path):
    p = beam.Pipeline(options=PipelineOptions(OPTIONS))
    _ = p | "A" >> beam.Create([(b"k", "l")]) | "WA" >> WriteSortedLines(str(tmp_path / "a.jsonl"))
    _ = p | "B" >> beam.Create([(b"k", "l")]) | "WB" >> WriteSortedLines(str(tmp_path / "b.jsonl"))
    assert remove_temp_folders(p) == []  # nothing written yet
    for name in ("a.jsonl", "b.jsonl"):
        folder = next(t.transform for t in _applied(p) if t.full_label == f"W{name[0].upper()}")
        os.makedirs(folder.temp_folder)
        Path(folder.temp_folder, "run-x").write_text("k\tl\n")
    assert len(remove_temp_folders(p)) == 2
    assert _temp_folders(tmp_path) == []


def _applied(p: beam.Pipeline) -> list:
    found = []

    class V(beam.pipeline.PipelineVisitor):
        def enter_composite_transform(self, node):
            found.append(node)

    p.visit(V())
    return found


def test_join_retry_after_completion_re_emits_the_path(tmp_path):
    """A retried join step whose first attempt completed (parts deleted, output renamed) does not
    fail and does not change the output."""
    items = _keyed(50)
    path = tmp_path / "out.jsonl"
    folder = tmp_path / ".beamsynth-temp-out.jsonl-x"
    folder.mkdir()
    runs = []
    for i in range(0, 50, 20):
        run = folder / f"run-{i}"
        run.write_bytes(b"".join(sorted(k + b"\t" + v.encode() + b"\n" for k, v in items[i:i + 20])))
        runs.append(str(run))
    fn = _MergeRunsFn(str(folder), str(path))
    assert list(fn.process((None, [None, *runs[::-1]]))) == [str(path)]
    first = path.read_bytes()
    assert first.decode() == _expected(items) and not folder.exists()
    assert list(fn.process((None, [None, *runs]))) == [str(path)]
    assert path.read_bytes() == first


def test_join_retry_after_a_failed_merge_writes_the_file_once(tmp_path, monkeypatch):
    """The join step fails half-way through the merge once (retrying runner): the retry writes the
    whole file (the failed attempt's staged file is never renamed) and removes the folder."""
    flag = tmp_path / "flag"
    original = single_file._merge_into

    def merge_into(paths, out, *, strip_keys, **kw):
        if strip_keys and not flag.exists():
            flag.touch()
            out.write(b"half a file\n")
            raise InjectedFault("injected failure while merging")
        return original(paths, out, strip_keys=strip_keys, **kw)

    monkeypatch.setattr(single_file, "_merge_into", merge_into)
    items = _keyed(400)
    path = tmp_path / "out" / "out.jsonl"
    path.parent.mkdir()
    _write_lines(items, path, run_bytes=4_000, runner=RETRYING)
    assert flag.exists()
    assert path.read_text() == _expected(items)
    assert sorted(p.name for p in path.parent.iterdir()) == ["out.jsonl"]


def _rejected_rows(n: int):
    for i in range(n):
        yield Rejected("in.csv", i + 1, "file header: wrong", raw="x" * 200, line=i + 2)


def _peak_traced(rows: int, folder: Path) -> int:
    tracemalloc.start()
    try:
        with beam.Pipeline(options=PipelineOptions(OPTIONS)) as p:
            counts = p | beam.Create([rows // 4] * 4, reshuffle=False)
            write_rejected(counts | beam.FlatMap(_rejected_rows), str(folder / f"{rows}.csv"))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow  # 176 s in the default suite (scale test: many rejected rows, two sizes)
def test_dead_letter_write_memory_is_flat_in_rows(tmp_path):
    """Python-heap peak of rejecting and writing 200k rows is within 1.5x that of 20k rows
    (runs of 8 MiB; Beam's grouped ``WriteToText(num_shards=1)``, which held every row: 9.5x)."""
    _peak_traced(1_000, tmp_path)  # first run: one-time allocations of the runner
    small = _peak_traced(20_000, tmp_path)
    large = _peak_traced(200_000, tmp_path)
    assert large < 1.5 * small, (small, large)
    lines = Path(rejected_path(str(tmp_path / "200000.csv"))).read_text().splitlines()
    assert len(lines) == 200_000
    assert [json.loads(x)["row"] for x in lines[:3]] == [1, 1, 1]  # four sources of the same rows


def test_several_dead_letter_inputs_are_merged_into_one_ordered_file(tmp_path):
    """``write_rejected((a, b), out)`` (each written where produced, no Flatten of rows) gives the
    file of ``write_rejected(a + b, out)``."""
    a = [Rejected("in.csv", i, "ragged", raw=f"r{i}") for i in range(1, 400, 2)]
    b = [Rejected("in.csv", i, "domain", raw=f"r{i}", line=i + 1) for i in range(2, 400, 2)]
    with beam.Pipeline(options=PipelineOptions(OPTIONS)) as p:
        write_rejected((p | "A" >> beam.Create(a), p | "B" >> beam.Create(b)), str(tmp_path / "two"))
    with beam.Pipeline(options=PipelineOptions(OPTIONS)) as p:
        write_rejected(p | "AB" >> beam.Create(b + a), str(tmp_path / "one"))
    two = Path(rejected_path(str(tmp_path / "two"))).read_bytes()
    assert two == Path(rejected_path(str(tmp_path / "one"))).read_bytes()
    assert [json.loads(x)["row"] for x in two.decode().splitlines()] == list(range(1, 400))


def _split_read_dead_letters(src: str, out: str, *, renumber_in_writer: bool) -> bytes:
    from beamsynth.pipelines.io.encode import EncodeBlocks
    from beamsynth.pipelines.io.read import ReadRawBlocks

    with beam.Pipeline(options=PipelineOptions(OPTIONS)) as p:
        if renumber_in_writer:
            raw = p | ReadRawBlocks(src, block_rows=5, split_bytes=300)
            enc = raw["blocks"] | EncodeBlocks(load_schema(SCHEMA))
            write_rejected((raw["rejected"], enc["rejected"]), out, part_counts=raw["parts"])
        else:
            read = p | ReadRecords(src, load_schema(SCHEMA), block_rows=5, split_bytes=300)
            write_rejected(read["rejected"], out)
    return Path(rejected_path(out)).read_bytes()


def test_split_read_dead_letters_renumbered_while_merging(tmp_path):
    """A file read in byte-range parts: dead letters written with ``part_counts`` (renumbered at
    the merge, no GroupByKey of rows) give the bytes of ``NumberRejected`` + write."""
    src = tmp_path / "in.csv"
    src.write_text("a,n\n" + "".join(("q,1\n" if i % 3 == 0 else "x,1,extra\n" if i % 5 == 0
                                      else "y,2\n") for i in range(400)), encoding="utf-8")
    merged = _split_read_dead_letters(str(src), str(tmp_path / "m.csv"), renumber_in_writer=True)
    grouped = _split_read_dead_letters(str(src), str(tmp_path / "g.csv"), renumber_in_writer=False)
    assert merged == grouped
    rows = [json.loads(x) for x in merged.decode().splitlines()]
    want = [i + 1 for i in range(400) if i % 3 == 0 or i % 5 == 0]
    assert [r["row"] for r in rows] == want and [r["line"] for r in rows] == [w + 1 for w in want]


def test_renumbering_with_incomplete_part_counts_raises():
    from beamsynth.pipelines.io.dead_letters import _keyed_json, _renumber_lines
    from beamsynth.pipelines.io.records import PartCount

    rewrite = _renumber_lines([PartCount("a.csv", 0, 10, 11), PartCount("a.csv", 2, 10, 10)])
    key, line = _keyed_json(Rejected("a.csv", 3, "domain", line=3, part=2))
    with pytest.raises(ValueError, match=r"part counts of 'a.csv' are incomplete"):
        rewrite(key, line.encode() + b"\n")
    key, line = _keyed_json(Rejected("a.csv", 3, "domain", line=4, part=0))
    assert rewrite(key, line.encode() + b"\n") == line.encode() + b"\n"
