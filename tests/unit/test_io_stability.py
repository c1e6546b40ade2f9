"""Readers judge every record alone: bad quotes, key sets, bytes, blocks and row groups affect
only their own record (or block), never the records around them."""

import io
import json

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beamsynth.pipelines.io.encode import encode_block
from beamsynth.pipelines.io.read import ReadRawBlocks, iter_raw_blocks
from beamsynth.pipelines.io.read_avro import iter_avro_blocks, read_avro_header
from beamsynth.pipelines.io.records import MAX_RECORD_LINES_LIMIT, Rejected
from beamsynth.schemas.schema import load_schema

COLS = [
    {"name": "a", "type": "categorical", "domain": {"kind": "categorical", "values": ["x", "y", "x,y"]}},
    {"name": "n", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 9}},
    {"name": "note", "type": "categorical", "nullable": True,
     "domain": {"kind": "categorical", "values": ["p", "q"]}},
]


def _schema(**extra):
    return load_schema({"columns": COLS, **extra})


def _run(path, schema=None, **kw):
    schema = schema or _schema()
    used, rejected = [], []
    for item in iter_raw_blocks(str(path), block_rows=2, **kw):
        if isinstance(item, Rejected):
            rejected.append(item)
            continue
        batch, bad = encode_block(schema, item)
        rows = [r for r in item.rows.tolist() if r not in {b.row for b in bad}]
        used += rows
        rejected += bad
        assert len(rows) == len(batch)
    return used, sorted(rejected, key=lambda r: (r.row or 0))


# -- JSONL -----------------------------------------------------------------------------------------
def test_jsonl_nullable_key_absent_from_every_record_is_null(tmp_path):
    p = tmp_path / "in.jsonl"
    p.write_text('{"a": "x", "n": 1}\n{"a": "y", "n": 2}\n', encoding="utf-8")
    assert _run(p) == ([1, 2], [])  # the old reader rejected both ("header lacks 'note'")


def test_jsonl_missing_required_key_rejects_that_record_only(tmp_path):
    p = tmp_path / "in.jsonl"
    p.write_text('{"a": "x", "n": 1}\n{"a": "y"}\n{"a": "y", "n": 3, "note": "p"}\n', encoding="utf-8")
    used, rej = _run(p)
    assert used == [1, 3] and [r.row for r in rej] == [2]
    assert rej[0].reason == "record keys: record lacks declared column(s) ['n']; its keys are ['a', 'note']"
    assert rej[0].line == 2


def test_jsonl_extra_key_under_reject_rejects_that_record_only(tmp_path):
    p = tmp_path / "in.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in [
        {"a": "x", "n": 1}, {"a": "x", "n": 2, "zz": 1}, {"a": "y", "n": 3}, {"a": "y", "n": 4}]),
        encoding="utf-8")
    used, rej = _run(p, _schema(extra_columns="reject"))
    assert used == [1, 3, 4] and [r.row for r in rej] == [2] and "'zz'" in rej[0].reason
    assert _run(p)[0] == [1, 2, 3, 4]  # extra_columns: ignore


def test_jsonl_avro_safe_alias_is_judged_per_record(tmp_path):
    schema = load_schema({"columns": [
        {"name": "a-b", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 9}}]})
    p = tmp_path / "in.jsonl"
    p.write_text('{"a_b": 1}\n{"a-b": 2}\n{"a_b": 3}\n', encoding="utf-8")
    assert _run(p, schema) == ([1, 2, 3], [])


def test_jsonl_invalid_utf8_rejects_its_line(tmp_path):
    p = tmp_path / "in.jsonl"
    p.write_bytes(b'{"a": "x", "n": 1}\n{"a": "\xff", "n": 2}\n{"a": "y", "n": 3}\n')
    used, rej = _run(p)
    assert used == [1, 3] and rej[0].row == 2 and rej[0].reason.startswith("invalid UTF-8")
    json.loads(rej[0].to_json())


# -- CSV -------------------------------------------------------------------------------------------
def test_csv_unbalanced_quote_rejects_its_own_line_only(tmp_path):
    p = tmp_path / "in.csv"
    p.write_text('a,n,note\nx,1,\n"x,2,\ny,3,p\n"x,y",4,q\nx,"5\ny,6,\n', encoding="utf-8")
    used, rej = _run(p)
    assert used == [1, 3, 4, 6]
    assert [(r.row, r.line) for r in rej] == [(2, 3), (5, 6)]
    assert all("unbalanced quote" in r.reason for r in rej)


def test_csv_header_is_first_non_blank_line_and_data_never_becomes_a_header(tmp_path):
    p = tmp_path / "in.csv"
    p.write_bytes(b"\xef\xbb\xbf\n\r\na,n,note\r\nx,1,\r\n\r\na,n,note\r\n\xef\xbb\xbfy,2,\r\ny,3,q\r\n")
    used, rej = _run(p)
    assert used == [1, 4]  # blank lines are not records; the BOM counts only at offset 0
    assert [(r.row, r.line) for r in rej] == [(2, 6), (3, 7)]
    assert "value 'a'" in rej[0].reason and "'\\ufeffy'" in rej[1].reason


def test_csv_records_spanning_lines_with_max_record_lines(tmp_path):
    p = tmp_path / "in.csv"
    p.write_text('a,n,note\n"x\n,y",1,\nx,2,\n"x,3,\ny,4,\nx,"5\n', encoding="utf-8")
    used, rej = _run(p, max_record_lines=3)
    assert used == [2, 4]  # row 1 ("x\n,y" is not in the domain) rejected by the encoder
    assert [(r.row, r.line) for r in rej] == [(1, 2), (3, 5), (5, 7)]
    assert "not closed within 3 lines" in rej[1].reason
    assert "outside the declared" in rej[0].reason and '"x\\n,y"' in rej[0].raw
    # one line per record: the two-line record is two bad lines, the rest is unchanged
    used1, rej1 = _run(p)
    assert used1 == [3, 5] and len(rej1) == 4


def test_csv_line_that_could_close_a_field_never_opens_one(tmp_path):
    p = tmp_path / "in.csv"
    # '",""' reads as an opener and as a closer: it is rejected, and x,1 stays its own record
    p.write_text('a,n,note\n",""\nx,1,\n",p\n', encoding="utf-8")
    used, rej = _run(p, max_record_lines=5)
    assert used == [2] and [r.row for r in rej] == [1, 3]


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, MAX_RECORD_LINES_LIMIT + 1])
def test_max_record_lines_is_validated(tmp_path, bad):
    p = tmp_path / "in.csv"
    p.write_text("a,n,note\nx,1,\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"max_record_lines \({bad!r}\) must be an int in \[1, 1000\]"):
        list(iter_raw_blocks(str(p), max_record_lines=bad))
    with pytest.raises(ValueError, match=r"max_record_lines"):
        ReadRawBlocks(str(p), max_record_lines=bad)


def test_csv_with_records_spanning_lines_is_read_by_one_reader(tmp_path):
    p = tmp_path / "in.csv"
    p.write_text("a,n,note\n" + "x,1,\n" * 5000, encoding="utf-8")
    assert len(ReadRawBlocks(str(p), split_bytes=1000).parts) > 1
    assert len(ReadRawBlocks(str(p), split_bytes=1000, max_record_lines=2).parts) == 1


# -- Avro and Parquet ------------------------------------------------------------------------------
AVRO = {"type": "record", "name": "r", "fields": [
    {"name": "a", "type": "string"}, {"name": "n", "type": "long"},
    {"name": "note", "type": ["null", "string"]}]}


def _avro_bytes(n):
    buf = io.BytesIO()
    fastavro.writer(buf, fastavro.parse_schema(AVRO),
                    [{"a": "x", "n": i % 10, "note": None} for i in range(n)],
                    codec="deflate", sync_interval=200)
    return buf.getvalue()


def test_avro_corrupt_block_is_one_dead_letter_and_reading_goes_on(tmp_path):
    data = bytearray(_avro_bytes(300))
    header = read_avro_header(io.BytesIO(bytes(data)))
    blocks = list(iter_avro_blocks(io.BytesIO(bytes(data)), header))
    assert len(blocks) >= 4 and all(b.records is not None for b in blocks)
    bad = blocks[1]
    mid = (bad.start + bad.stop) // 2
    data[mid:mid + 8] = b"\xff" * 8  # the deflate stream of block 2 no longer decodes
    p = tmp_path / "in.avro"
    p.write_bytes(bytes(data))
    used, rej = _run(p)
    lost = len(blocks[1].records)
    assert len(used) == 300 - lost and len(rej) == 1
    assert rej[0].block == f"bytes {bad.start}-{bad.stop}" and "corrupt Avro block" in rej[0].reason
    assert json.loads(rej[0].to_json())["block"] == rej[0].block


def test_avro_block_ranges_read_every_block_once():
    data = _avro_bytes(500)
    header = read_avro_header(io.BytesIO(data))
    whole = [(b.start, len(b.records)) for b in iter_avro_blocks(io.BytesIO(data), header)]
    cuts = [0, len(data) // 3, len(data) // 2, 2 * len(data) // 3, None]
    parts = [(b.start, len(b.records)) for lo, hi in zip(cuts, cuts[1:], strict=False)
             for b in iter_avro_blocks(io.BytesIO(data), header, lo, hi)]
    assert parts == whole and sum(n for _, n in whole) == 500


def test_parquet_corrupt_row_group_is_one_dead_letter_and_reading_goes_on(tmp_path):
    table = pa.table({"a": ["x", "y"] * 150, "n": [i % 10 for i in range(300)], "note": [None] * 300})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=100, write_page_checksum=True, compression="none",
                   use_dictionary=False)
    data = bytearray(buf.getvalue())
    col = pq.ParquetFile(io.BytesIO(bytes(data))).metadata.row_group(1).column(1)
    end = col.data_page_offset + col.total_compressed_size
    data[end - 16:end - 8] = b"\x01" * 8  # values of row group 2's page: its checksum fails
    p = tmp_path / "in.parquet"
    p.write_bytes(bytes(data))
    used, rej = _run(p)
    assert used == list(range(1, 101)) + list(range(201, 301))
    assert len(rej) == 1 and rej[0].block == "row group 1, rows 101-200" and rej[0].row == 101
