"""The elements reading produces and the names every reader shares: :class:`RawBlock` (raw
column values of up to ``block_rows`` rows), :class:`Rejected` (one dead-letter row with its
source position and reason), :class:`FilePart` / :class:`PartCount` (a byte range of a file read
by one reader, and what it counted), :func:`detect_format`, :func:`rejected_path` and the
``max_record_lines`` check.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from beamsynth.transforms.coders import register_columnar

__all__ = [
    "DEFAULT_SPLIT_BYTES",
    "MAX_RECORD_LINES_LIMIT",
    "check_max_record_lines",
    "empty_input_note",
    "rejected_gate_note",
    "record_lines_note",
    "FilePart",
    "PartCount",
    "RawBlock",
    "Rejected",
    "detect_format",
    "rejected_path",
]


DEFAULT_BLOCK_ROWS = 20_000
DEFAULT_SPLIT_BYTES = 16 << 20  # uncompressed files larger than this are read in parts
_RAW_LIMIT = 500  # characters of a rejected row kept in the dead-letter output
METRICS_NAMESPACE = "beamsynth"


def detect_format(path: str) -> str:
    """Format name from a file extension (``.csv``, ``.csv.gz``, ``.jsonl``, ``.avro``, ``.parquet``)."""
    p = path.lower()
    if p.endswith(".gz"):
        p = p[:-3]
    for ext, fmt in ((".csv", "csv"), (".jsonl", "jsonl"), (".ndjson", "jsonl"), (".json", "jsonl"),
                     (".avro", "avro"), (".parquet", "parquet")):
        if p.endswith(ext):
            return fmt
    raise ValueError(
        f"cannot tell the format of {path!r} from its extension; use one of "
        ".csv, .csv.gz, .jsonl, .avro, .parquet"
    )


def rejected_path(output: str) -> str:
    """Where the dead-letter rows of a run writing ``output`` go."""
    return f"{output}.rejected.jsonl"


@dataclass
class Rejected:
    """One dead-letter row: where it came from and why it was not used."""

    source: str
    row: int | None
    reason: str
    raw: str = ""
    line: int | None = None
    part: int = 0  # the file part whose reader found it (row/line counted from the part's start)
    block: str | None = None  # Avro byte range / Parquet row group of a rejected block
    after: int | None = None  # a corrupt Avro block: rows read before it (sort position only)

    def to_json(self) -> str:
        """One JSON line (valid UTF-8: lone surrogates from undecodable bytes or JSON ``\\ud800``
        escapes become ``\\udXXX`` escapes instead of failing the dead-letter write); the key
        ``block`` only for a rejected Avro block or Parquet row group."""
        obj = {"source": self.source, "row": self.row, "line": self.line, "reason": self.reason,
               "raw": self.raw[:_RAW_LIMIT]}
        if self.block is not None:
            obj["block"] = self.block
        text = json.dumps(obj, ensure_ascii=False)
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass
class RawBlock:
    """Up to ``block_rows`` raw rows of one file, column-wise (pandas object Series).

    ``rows`` holds the 1-based row number of each row in its file (header excluded) and ``lines``
    the line number where known (CSV/JSONL); in a block of file part ``part > 0`` (see
    :class:`FilePart`) both count from the start of the part.

    JSONL blocks have no header: ``key_sets`` lists the distinct key sets of their records and
    ``row_keys`` the index of each row's key set, so that each record is judged against the
    schema alone (a key it lacks is a null or a missing value, a key it adds concerns only it).
    Other formats (``key_sets=None``) have one header for the whole file: public structure.
    """

    source: str
    columns: dict[str, pd.Series]
    rows: np.ndarray
    lines: np.ndarray | None = None
    header_error: str | None = None
    raw_rows: list[str] = field(default_factory=list)
    part: int = 0
    key_sets: list[tuple[str, ...]] | None = None
    row_keys: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.rows.size)


register_columnar(RawBlock)  # size estimates without pickling (transforms/coders.py)


MAX_RECORD_LINES_LIMIT = 1_000  # largest allowed max_record_lines


@dataclass(frozen=True)
class FilePart:
    """Bytes ``[start, stop)`` of an input file read by one reader (``stop=None``: to the end).

    Part ``i > 0`` owns the records that begin after the first newline at or after ``start - 1``
    (and after the header); part ``i`` ends where part ``i + 1`` begins. Row and line numbers
    inside a part are counted from the part's start and made file-wide by
    :class:`NumberRejected` from every part's :class:`PartCount`.
    """

    path: str
    index: int
    start: int
    stop: int | None


@dataclass(frozen=True)
class PartCount:
    """Records (header excluded) and physical lines (header included in part 0) of a part."""

    path: str
    index: int
    records: int
    lines: int


class _PartState:
    """Counts a part reader reports when done (records, lines)."""

    def __init__(self) -> None:
        self.records = 0
        self.lines = 0


def check_max_record_lines(value: Any) -> int:
    """``max_record_lines`` validated: an int in ``[1, MAX_RECORD_LINES_LIMIT]``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_RECORD_LINES_LIMIT:
        raise ValueError(f"max_record_lines ({value!r}) must be an int in [1, {MAX_RECORD_LINES_LIMIT}] "
                         "(physical lines one CSV record may span; 1: no line breaks inside fields)")
    return value


EMPTY_INPUT_REFUSED = ("an input holding no record is refused (exit 2, nothing released), so the "
                       "guarantee holds between neighbouring inputs that both hold a record; the "
                       "commands' --allow-empty releases from an empty input too and keeps it for every "
                       "pair (docs/methods.md, 'Empty inputs')")


def empty_input_note(refused: bool) -> dict[str, Any]:
    """What the caller's refusal of an empty input means for the guarantee, for the manifest's
    ``privacy_unit`` (the one pair it changes: no record vs one record); nothing when the caller
    did not refuse it (``--allow-empty``, or a run that made no such check)."""
    return {"empty_input": EMPTY_INPUT_REFUSED} if refused else {}


REJECTED_GATE = ("this run was checked with --fail-on-rejected {f:g}: an input of which more than "
                 "that share of the records is rejected is refused (exit 2, nothing released), so "
                 "whether this release exists depends on the exact rejected share; the guarantee "
                 "holds between neighbouring inputs on the same side of that share (docs/methods.md, "
                 "'Rejected rows')")


def rejected_gate_note(fail_on_rejected: float | None) -> dict[str, Any]:
    """What a ``--fail-on-rejected`` refusal means for the guarantee, for the manifest's
    ``privacy_unit`` (one more or one less rejected record can move the share across the
    threshold); nothing without it."""
    return {} if fail_on_rejected is None else {
        "fail_on_rejected": REJECTED_GATE.format(f=fail_on_rejected)}


def record_lines_note(max_record_lines: int) -> dict[str, Any]:
    """What ``max_record_lines`` means for the guarantee, for the manifest's ``privacy_unit``:
    nothing for 1 (exactly stable); for ``L > 1`` the bound and the group of ``L`` records one
    added or removed record may change (docs/schema-format.md: a line inserted inside an
    ``L``-line quoted record splits it: that record lost, the line and ``L - 2`` inner lines
    read as records)."""
    lines = check_max_record_lines(max_record_lines)
    if lines == 1:
        return {}
    return {"csv_max_record_lines": lines, "csv_records_one_record_may_change": lines}
