"""Fuzzed bad input (hypothesis) against the readers and the schema encoders.

Generated files mix valid rows with wrong types, NaN/±inf, nulls where not allowed, huge and
unicode strings, NUL bytes, invalid UTF-8, ragged rows, duplicate/missing header columns, empty
files, invalid JSON lines, Avro unions of any type and truncated Avro files. For every file:
nothing raises, every input row is either encoded or rejected with a reason
(``rows written = used + rejected``), every code is inside the declared shape, and every
dead-letter row serializes to valid UTF-8 JSON (it is written to ``OUT.rejected.jsonl``).

Case counts: the default suite runs ``FUZZ_FAST`` examples per format; the slow tests run
``FUZZ_SLOW`` per format (3 formats × 3,400 = 10,200 ≥ 10,000). ``BEAMSYNTH_FUZZ_EXAMPLES``
overrides both.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from typing import Any

import fastavro
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beamsynth.pipelines.io.encode import encode_block
from beamsynth.pipelines.io.read import iter_raw_blocks
from beamsynth.pipelines.io.records import MAX_RECORD_LINES_LIMIT, Rejected
from beamsynth.schemas.schema import load_schema

pytestmark = pytest.mark.audit

_ENV = os.environ.get("BEAMSYNTH_FUZZ_EXAMPLES")
FUZZ_FAST = int(_ENV) if _ENV else 25
FUZZ_SLOW = int(_ENV) if _ENV else 3_400

SCHEMA = load_schema({
    "name": "fuzz",
    "privacy_id": "pid",
    "columns": [
        {"name": "cat", "type": "categorical",
         "domain": {"kind": "categorical", "values": ["a", "b", "ü ☃", "1"]}},
        {"name": "num", "type": "integer", "nullable": True,
         "domain": {"kind": "integer", "low": 0, "high": 100, "edges": [0, 10, 50, 101]}},
        {"name": "flt", "type": "float", "domain": {"kind": "float", "low": 0, "high": 1, "bins": 4}},
        {"name": "when", "type": "datetime", "nullable": True,
         "domain": {"kind": "datetime", "start": "2020-01-01", "end": "2020-12-31"}},
        {"name": "word", "type": "string",
         "domain": {"kind": "string", "alphabet": "abc", "max_length": 3}},
        {"name": "other", "type": "categorical", "on_out_of_domain": "other",
         "domain": {"kind": "categorical", "values": ["x"], "other": "OTHER"}},
    ],
})
NAMES = [*SCHEMA.names, "pid"]

_HUGE = ("A" * 140_000, "☃" * 70_000, "b" * 1_000_000)
VALID = {
    "cat": st.sampled_from(["a", "b", "ü ☃", "1", 1]),
    "num": st.one_of(st.integers(0, 100), st.just(""), st.just("42")),
    "flt": st.one_of(st.floats(0, 1), st.just("0.5")),
    "when": st.sampled_from(["2020-02-29", "2020-12-31", "", "2020-01-01T10:00:00"]),
    "word": st.sampled_from(["", "a", "abc", "cab"]),
    "other": st.sampled_from(["x", "y", "", "ü"]),
    "pid": st.sampled_from(["p1", "p2", "ü", "0"]),
}
BAD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, "NaN", "inf", "-Infinity", "1e400", "0x10",
                     "  7 ", "\x00", "a\x00b", "\ufeffa", "ü", "\u2028", "NULL", "null", "None"]),
    st.text(max_size=30),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=8),
    st.binary(max_size=8).map(lambda b: b.decode("utf-8", "surrogateescape")),
    st.sampled_from(_HUGE),
)


def _value(col: str) -> st.SearchStrategy[Any]:
    return st.one_of(VALID[col], VALID[col], BAD)


ROW = st.fixed_dictionaries({c: _value(c) for c in NAMES})
ROWS = st.lists(ROW, max_size=25)


def _as_text(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bytes):
        return v.decode("latin-1")
    return str(v)


def _run(path: str, block_rows: int, max_record_lines: int = 1) -> tuple[int, list[Rejected]]:
    """Read and encode a file as the pipeline does; check codes and dead letters."""
    used, rejected = 0, []
    for item in iter_raw_blocks(path, block_rows=block_rows, max_record_lines=max_record_lines):
        if isinstance(item, Rejected):
            rejected.append(item)
            continue
        batch, bad = encode_block(SCHEMA, item)
        assert batch.codes.shape == (len(batch), len(SCHEMA.columns))
        if len(batch):
            assert (batch.codes >= 0).all() and (batch.codes < np.array(SCHEMA.shape)).all()
            assert batch.pids is not None and len(batch.pids) == len(batch)
        assert len(batch) + len(bad) == len(item)
        assert len({r.row for r in bad}) == len(bad)  # one dead letter per bad row
        used += len(batch)
        rejected.extend(bad)
    for r in rejected:
        assert r.reason and isinstance(r.reason, str)
        json.loads(r.to_json().encode("utf-8"))  # the dead-letter file is UTF-8 JSON lines
    return used, rejected


def _check_counts(written: int, used: int, rejected: list[Rejected], *, file_level_ok: bool) -> None:
    per_row = [r for r in rejected if r.row is not None]
    file_level = [r for r in rejected if r.row is None]
    assert used + len(per_row) == written, (used, len(per_row), written, rejected[:3])
    if not file_level_ok:
        assert not file_level, file_level


# -- CSV -------------------------------------------------------------------------------------------
HEADERS = st.sampled_from(["ok", "duplicate declared", "duplicate extra", "missing", "shuffled", "padded"])


@st.composite
def csv_files(draw: Any) -> tuple[bytes, int]:
    """(file bytes, data records written)."""
    kind = draw(HEADERS)
    header = list(NAMES)
    if kind == "duplicate declared":
        header = header + ["cat"]
    elif kind == "duplicate extra":
        header = header + ["zz", "zz"]
    elif kind == "missing":
        header = header[1:]
    elif kind == "shuffled":
        header = header[::-1]
    elif kind == "padded":
        header = [f" {h} " for h in header]
    rows = draw(ROWS)
    buf = io.StringIO()
    # "\r\n" so that csv quotes fields holding a bare \r or \n (with "\n" a bare \r would be
    # written unquoted, which every CSV reader rightly reads as a line end)
    w = csv.writer(buf, lineterminator="\r\n")
    if not draw(st.booleans()) or rows:  # sometimes a header-only or fully empty file
        w.writerow(header)
    written = 0
    for r in rows:
        fields = [_as_text(r.get(h.strip(), "")) for h in header]
        if any(len(f) > 100_000 for f in fields):  # a too-long field ends its line: keep it one line
            fields = [f.replace("\r", " ").replace("\n", " ") for f in fields]
        ragged = draw(st.integers(-3, 3)) if draw(st.integers(0, 9)) == 0 else 0
        if ragged < 0:
            fields = fields[: max(1, len(fields) + ragged)]
        elif ragged > 0:
            fields = fields + ["extra"] * ragged
        w.writerow(fields)
        written += 1
    text = buf.getvalue()
    return text.encode("utf-8", "surrogateescape"), written if text else 0


def _fuzz_csv(case: tuple[bytes, int], block_rows: int) -> None:
    data, written = case
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "in.csv")
        with open(path, "wb") as fh:
            fh.write(data)
        used, rejected = _run(path, block_rows)
        # one record per physical line (max_record_lines=1): a quoted field with a line break is
        # rejected line by line; the first non-blank line is the header
        lines = max(len([x for x in data.splitlines() if x]) - 1, 0)
        _check_counts(lines, used, rejected, file_level_ok=False)
        # records may span lines: every written row is used or rejected at least once (a record
        # whose first line could also close a quoted field is rejected line by line), and no
        # line is in two records
        used, rejected = _run(path, block_rows, max_record_lines=MAX_RECORD_LINES_LIMIT)
    per_row = [r for r in rejected if r.row is not None]
    assert written <= used + len(per_row) <= lines and len(per_row) == len(rejected)


# -- JSONL -----------------------------------------------------------------------------------------
JUNK = st.one_of(
    st.sampled_from(["[1, 2]", "42", '"text"', "{", '{"cat": }', "{'cat': 'a'}", "null", "NaN",
                     '{"cat": "a"} trailing', '{"cat": "\\ud800"}', "[" * 5000 + "]" * 5000,
                     "\x00", "\xff"]),
    st.text(max_size=40).filter(lambda s: s.strip() and "\n" not in s and "\r" not in s),
)


@st.composite
def jsonl_files(draw: Any) -> tuple[bytes, int]:
    """(file bytes, non-blank lines written)."""
    lines: list[str] = []
    for r in draw(ROWS):
        choice = draw(st.integers(0, 9))
        if choice == 0:
            lines.append(draw(JUNK))
            continue
        obj = {k: v for k, v in r.items() if not (choice == 1 and k == "cat")}  # a missing key
        if choice == 2:
            obj["extra"] = {"nested": [1, None]}
        if choice == 3:
            obj["num"] = [1, 2]  # a list where a scalar belongs
        lines.append(json.dumps(obj, ensure_ascii=draw(st.booleans())))
    blank = draw(st.sampled_from(["", "\n", "  \n"]))
    text = blank + "\n".join(lines) + ("\n" if lines and draw(st.booleans()) else "")
    return text.encode("utf-8", "surrogateescape"), len(lines)


def _fuzz_jsonl(case: tuple[bytes, int], block_rows: int) -> None:
    data, written = case
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "in.jsonl")
        with open(path, "wb") as fh:
            fh.write(data)
        used, rejected = _run(path, block_rows)
    _check_counts(written, used, rejected, file_level_ok=False)


# -- Avro ------------------------------------------------------------------------------------------
_ANY = ["null", "string", "long", "double", "boolean", "bytes"]


def _avro_value(v: Any) -> Any:
    if isinstance(v, int) and not isinstance(v, bool) and not -(2**63) <= v < 2**63:
        return str(v)  # Avro long is 64-bit
    if isinstance(v, str):
        return v.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return v


@st.composite
def avro_files(draw: Any) -> tuple[bytes, int, bool]:
    """(file bytes, records written, truncated?)."""
    names = list(NAMES) if draw(st.integers(0, 5)) else NAMES[1:]  # sometimes a column is missing
    schema = {"type": "record", "name": "r",
              "fields": [{"name": n, "type": _ANY} for n in names]}
    rows = [{n: _avro_value(r[n]) for n in names} for r in draw(ROWS)]
    buf = io.BytesIO()
    if draw(st.integers(0, 9)) == 0:
        return b"", 0, True  # an empty file is not an Avro file
    fastavro.writer(buf, fastavro.parse_schema(schema), rows,
                    sync_interval=draw(st.sampled_from([16, 16000])))
    data = buf.getvalue()
    if rows and draw(st.integers(0, 7)) == 0:
        cut = draw(st.integers(1, len(data) - 1))
        return data[:cut], len(rows), True
    return data, len(rows), False


def _fuzz_avro(case: tuple[bytes, int, bool], block_rows: int) -> None:
    data, written, broken = case
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "in.avro")
        with open(path, "wb") as fh:
            fh.write(data)
        used, rejected = _run(path, block_rows)
    if broken:  # a truncated file: what was readable is accounted for, the rest is one dead letter
        per_row = [r for r in rejected if r.row is not None]
        assert used + len(per_row) <= written + 1
        assert any(("corrupt" in r.reason or "unreadable" in r.reason or "cannot read" in r.reason)
                   for r in rejected) or used + len(per_row) == written
    else:
        _check_counts(written, used, rejected, file_level_ok=False)


# -- the tests: a fast profile in the default suite, >= 10,000 cases in the slow one -------------
_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                      HealthCheck.large_base_example])
BLOCK = st.sampled_from([1, 3, 20_000])


@settings(max_examples=FUZZ_FAST, derandomize=True, **_SETTINGS)
@given(csv_files(), BLOCK)
def test_fuzz_csv(case, block_rows):
    _fuzz_csv(case, block_rows)


@settings(max_examples=FUZZ_FAST, derandomize=True, **_SETTINGS)
@given(jsonl_files(), BLOCK)
def test_fuzz_jsonl(case, block_rows):
    _fuzz_jsonl(case, block_rows)


@settings(max_examples=FUZZ_FAST, derandomize=True, **_SETTINGS)
@given(avro_files(), BLOCK)
def test_fuzz_avro(case, block_rows):
    _fuzz_avro(case, block_rows)


@pytest.mark.slow
@settings(max_examples=FUZZ_SLOW, **_SETTINGS)
@given(csv_files(), BLOCK)
def test_fuzz_csv_many(case, block_rows):
    _fuzz_csv(case, block_rows)


@pytest.mark.slow
@settings(max_examples=FUZZ_SLOW, **_SETTINGS)
@given(jsonl_files(), BLOCK)
def test_fuzz_jsonl_many(case, block_rows):
    _fuzz_jsonl(case, block_rows)


@pytest.mark.slow
@settings(max_examples=FUZZ_SLOW, **_SETTINGS)
@given(avro_files(), BLOCK)
def test_fuzz_avro_many(case, block_rows):
    _fuzz_avro(case, block_rows)


# -- regressions found by the fuzzer ---------------------------------------------------------------
def test_dead_letter_with_lone_surrogates_is_valid_utf8(tmp_path):
    """Found by fuzzing: a JSONL row with undecodable bytes (or a JSON "\\ud800" escape) was
    rejected, but its dead-letter line could not be written as UTF-8 (UnicodeEncodeError)."""
    p = tmp_path / "in.jsonl"
    p.write_bytes(b'{"cat": "\x90x", "num": 1}\n{"cat": "\\ud800", "num": 2}\n')
    used, rejected = _run(str(p), 10)
    assert used == 0 and [r.row for r in rejected] == [1, 2]
    lines = [json.loads(r.to_json().encode("utf-8")) for r in rejected]
    assert "\udc90x" in lines[0]["raw"] or "\\udc90" in lines[0]["raw"]


def test_numeric_column_with_undecodable_bytes_is_rejected_not_crashing(tmp_path):
    """Found by fuzzing: a float/integer value holding undecodable bytes crashed the encoder
    (pyarrow UnicodeEncodeError in domains._parse_numbers) instead of rejecting the row."""
    p = tmp_path / "in.jsonl"
    good = {"cat": "a", "num": 5, "flt": 0.5, "when": "2020-03-01", "word": "ab", "other": "x", "pid": "u"}
    # a JSON escape: undecodable bytes in the file itself are rejected by the reader (whole line)
    p.write_bytes(json.dumps(good).encode() + b"\n" + json.dumps({**good, "flt": "0.5"}).encode()[:-1]
                  .replace(b'"0.5"', b'"0.5\\udcff"') + b"}\n")
    used, rejected = _run(str(p), 10)
    assert used == 1
    assert len(rejected) == 1 and "is not a valid float" in rejected[0].reason
