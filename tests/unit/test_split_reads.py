"""Reading CSV/JSONL files in byte-range parts gives exactly what one sequential reader gives.

Beam-free: every part of :func:`plan_parts` is read with :func:`iter_raw_blocks`, the part
counts renumber rows, lines and dead letters (:func:`number_rejected`), and the result is compared
with the unsplit read, for every split size from 1 byte to the whole file.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from beamsynth.pipelines.io import records as bio
from beamsynth.pipelines.io.dead_letters import number_rejected
from beamsynth.pipelines.io.planning import plan_parts
from beamsynth.pipelines.io.read import ReadRawBlocks, iter_raw_blocks
from beamsynth.pipelines.io.records import FilePart, PartCount, Rejected


def _read(path: str, parts: list[FilePart]) -> tuple[list, list]:
    """(rows as (row, line, values), dead letters as (row, line, reason, raw)) in file numbering."""
    rows, rejected, counts = [], [], []
    for part in parts:
        whole = part.index == 0 and part.stop is None
        state = bio._PartState()
        local = []
        for item in iter_raw_blocks(path, block_rows=5, part=None if whole else part, counts=state):
            if isinstance(item, Rejected):
                rejected.append(item)
                continue
            assert item.part == part.index
            for i in range(len(item)):
                local.append((int(item.rows[i]), None if item.lines is None else int(item.lines[i]),
                              tuple(str(s.iat[i]) for s in item.columns.values())))
        rows.append(local)
        if not whole:
            counts.append(PartCount(path, part.index, state.records, state.lines))
    row_off = line_off = 0
    flat = []
    for i, local in enumerate(rows):
        flat += [(r + row_off, None if ln is None else ln + line_off, v) for r, ln, v in local]
        if counts:
            row_off += counts[i].records
            line_off += counts[i].lines
    if counts:
        rejected = number_rejected((path, rejected + counts))
    return flat, sorted((r.row or 0, r.line or 0, r.reason, r.raw) for r in rejected)


def _csv_text(rng: random.Random, n: int, eol: str) -> str:
    out = [("\ufeff" if rng.random() < 0.2 else "") + "a,b,c" + eol]
    for i in range(n):
        k = rng.random()
        if k < 0.05:
            out.append(eol)  # blank line: not a record
        elif k < 0.10:
            out.append(f"{i},ragged{eol}")  # dead letter
        elif k < 0.14:
            out.append(f'{i},"q,uo""te",\xe9{eol}')  # quoted field without a line break
        elif k < 0.17:
            out.append(f"{i},bad\udce9byte,x{eol}")  # undecodable byte
        else:
            out.append(f"{i},{rng.choice('xyz')},{rng.randint(0, 99)}{eol}")
    text = "".join(out)
    return text.rstrip("\r\n") if rng.random() < 0.3 else text


def _jsonl_text(rng: random.Random, n: int, eol: str) -> str:
    out = []
    for i in range(n):
        k = rng.random()
        if k < 0.05:
            out.append(eol)
        elif k < 0.10:
            out.append("{not json" + eol)
        elif k < 0.12:
            out.append("[1, 2]" + eol)
        else:
            out.append(json.dumps({"a": i, "b": "é☃"}, ensure_ascii=False) + eol)
    return "".join(out)


def _write(path: Path, text: str) -> str:
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    return str(path)


@pytest.mark.parametrize("seed", range(12))
def test_parts_read_exactly_what_one_reader_reads(tmp_path, seed):
    rng = random.Random(seed)
    eol = ["\n", "\r\n", "\r"][seed % 3]
    fmt = "csv" if seed % 2 == 0 else "jsonl"
    text = (_csv_text if fmt == "csv" else _jsonl_text)(rng, rng.randint(0, 120), eol)
    path = _write(tmp_path / f"t.{fmt}", text)
    size = Path(path).stat().st_size
    ref = _read(path, [FilePart(path, 0, 0, None)])
    for split in sorted({1, 2, 3, 7, 19, 64, max(1, size // 2), size, size + 1}):
        parts = plan_parts([(path, size)], split)
        assert len(parts) == (1 if split >= size else -(-size // split))
        assert _read(path, parts) == ref, f"split_bytes={split}"


def test_quoted_line_break_across_a_split_point_reads_what_one_reader_reads(tmp_path):
    """One record per line (max_record_lines=1): a quoted field with a line break is rejected
    line by line, so every split point gives one reader's result (it used to raise)."""
    path = _write(tmp_path / "q.csv", 'a,b\n1,"x\ny"\n2,z\n3,"p\nq\nr"\n4,w\n' * 10)
    size = Path(path).stat().st_size
    ref = _read(path, [FilePart(path, 0, 0, None)])
    for split in range(1, 80):
        assert _read(path, plan_parts([(path, size)], split)) == ref, f"split_bytes={split}"


def test_only_uncompressed_files_larger_than_split_bytes_are_split():
    # CSV/JSONL split by byte range; Parquet (row groups) and Avro (sync blocks) are split too
    # since the splittable columnar reads; compressed text and unknown sizes are read whole.
    parts = plan_parts([("a.csv", 100), ("b.jsonl", 10), ("c.csv.gz", 100), ("d.parquet", 100),
                        ("e.avro", 100), ("f.csv", None)], 30)
    quarters = [(0, 0, 25), (1, 25, 50), (2, 50, 75), (3, 75, None)]
    assert [(p.path, p.index, p.start, p.stop) for p in parts] == [
        *[("a.csv", *q) for q in quarters], ("b.jsonl", 0, 0, None), ("c.csv.gz", 0, 0, None),
        *[("d.parquet", *q) for q in quarters], *[("e.avro", *q) for q in quarters],
        ("f.csv", 0, 0, None)]
    assert len(plan_parts([("a.csv", 100)], 0)) == 1


def test_number_rejected_offsets_parts_by_the_records_and_lines_before_them():
    counts = [PartCount("f", 0, 3, 5), PartCount("f", 1, 2, 2), PartCount("f", 2, 4, 4)]
    rejected = [Rejected("f", 2, "r0", line=3), Rejected("f", 1, "r1", line=1, part=1),
                Rejected("f", 4, "r2", line=4, part=2), Rejected("f", None, "unreadable", part=2)]
    got = number_rejected(("f", [*rejected, *counts]))
    assert [(r.row, r.line, r.reason) for r in got] == [
        (2, 3, "r0"), (4, 6, "r1"), (9, 11, "r2"), (None, None, "unreadable")]
    assert all(r.part == 0 for r in got)
    with pytest.raises(ValueError, match="incomplete"):
        number_rejected(("f", [rejected[1], counts[1]]))


def test_split_bytes_is_validated(tmp_path):
    path = _write(tmp_path / "t.csv", "a\n1\n")
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(ValueError, match=r"split_bytes \(.*\) must be an int >= 0"):
            ReadRawBlocks(path, split_bytes=bad)
    assert len(ReadRawBlocks(path, split_bytes=1).parts) == 4


def test_a_part_of_a_compressed_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match="cannot be read in parts"):
        list(iter_raw_blocks(str(tmp_path / "x.csv.gz"), part=FilePart(str(tmp_path / "x.csv.gz"), 1, 5, None)))
