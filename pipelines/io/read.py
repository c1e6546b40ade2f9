"""Reading files: :func:`iter_raw_blocks` (one file or file part, any format, Beam-free),
:class:`ReadRawBlocks` (files → raw blocks + dead letters) and :class:`ReadRecords` (files →
encoded batches + dead letters).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics

from beamsynth.pipelines.io.dead_letters import (
    NumberRejected,
    _apply_with_dead_letters,
    _check_flag,
)
from beamsynth.pipelines.io.encode import EncodeBlocks
from beamsynth.pipelines.io.planning import _expand_paths, _splittable, plan_parts
from beamsynth.pipelines.io.read_avro import _iter_avro
from beamsynth.pipelines.io.read_csv import _iter_csv
from beamsynth.pipelines.io.read_jsonl import _iter_jsonl
from beamsynth.pipelines.io.read_parquet import _iter_parquet
from beamsynth.pipelines.io.records import (
    DEFAULT_BLOCK_ROWS,
    DEFAULT_SPLIT_BYTES,
    METRICS_NAMESPACE,
    FilePart,
    PartCount,
    RawBlock,
    Rejected,
    _PartState,
    check_max_record_lines,
    detect_format,
)
from beamsynth.schemas.schema import EncodedBatch, Schema
from beamsynth.transforms.conventions import display_items, element_types

__all__ = [
    "ReadRawBlocks",
    "ReadRecords",
    "iter_raw_blocks",
]


def iter_raw_blocks(path: str, *, block_rows: int = DEFAULT_BLOCK_ROWS, part: FilePart | None = None,
                    counts: _PartState | None = None,
                    max_record_lines: int = 1) -> Iterator[RawBlock | Rejected]:
    """Raw blocks and unsplittable rows of one file, or of one :class:`FilePart` of a CSV/JSONL
    file (Beam-free). ``counts`` (if given) receives the part's records and lines when done.

    ``max_record_lines``: physical lines one CSV record may span (a quoted field holding line
    breaks); 1 (default) reads every line as one record, which makes the used records exactly
    stable (docs/schema-format.md, "Reading rules"). Files read in parts need 1.
    """
    fmt = detect_format(path)
    max_lines = check_max_record_lines(max_record_lines)
    if part is not None and (part.index > 0 or part.stop is not None) and not _splittable(path, max_lines):
        raise ValueError(f"{path!r} cannot be read in parts ({fmt}{', gzip' if path.lower().endswith('.gz') else ''}"
                         f"{', max_record_lines > 1' if max_lines > 1 else ''})")
    try:
        if fmt == "csv":
            yield from _iter_csv(path, block_rows, part, counts, max_lines)
        elif fmt == "jsonl":
            yield from _iter_jsonl(path, block_rows, part, counts)
        elif part is None:  # whole file (the audit's broken readers replace these two)
            yield from (_iter_avro if fmt == "avro" else _iter_parquet)(path, block_rows)
        elif fmt == "avro":
            yield from _iter_avro(path, block_rows, part, counts)
        else:
            yield from _iter_parquet(path, block_rows, part)
    except (OSError, UnicodeError, EOFError) as exc:
        yield Rejected(path, None, f"cannot read {fmt} file: {exc}", part=0 if part is None else part.index)


class _ReadFileFn(beam.DoFn):
    """``FilePart`` → ``RawBlock`` (main), ``Rejected`` (tag ``rejected``), one ``PartCount``
    (tag ``parts``; only for files read in several parts)."""

    def __init__(self, block_rows: int, max_record_lines: int = 1, tagged: bool = True) -> None:
        self._block_rows = block_rows
        self._max_lines = max_record_lines
        self._tagged = tagged
        self._read = Metrics.counter(METRICS_NAMESPACE, "rows_read")
        self._rejected = Metrics.counter(METRICS_NAMESPACE, "rows_rejected_unparseable")

    def process(self, part: FilePart | str):
        if isinstance(part, str):
            part = FilePart(part, 0, 0, None)
        whole = part.index == 0 and part.stop is None
        counts = _PartState()
        for item in iter_raw_blocks(part.path, block_rows=self._block_rows,
                                    part=None if whole else part, counts=counts,
                                    max_record_lines=self._max_lines):
            if isinstance(item, Rejected):
                self._read.inc()
                self._rejected.inc()
                yield beam.pvalue.TaggedOutput("rejected", item) if self._tagged else item
            else:
                self._read.inc(len(item))
                yield item
        if not whole:
            out = PartCount(part.path, part.index, counts.records, counts.lines)
            yield beam.pvalue.TaggedOutput("parts", out) if self._tagged else out


@element_types(outputs={"blocks": RawBlock, "rejected": Rejected, "parts": PartCount})
class ReadRawBlocks(beam.PTransform):
    """Files (a path or glob) → ``RawBlock`` (main) and ``Rejected`` (tag ``rejected``).

    The file list (and file sizes) are resolved when the pipeline is built (file names and sizes
    are not private data). With ``split_bytes=0`` (default) each file is one reader and its blocks
    are redistributed over the workers. With ``split_bytes > 0`` every uncompressed CSV/JSONL
    file larger than that is read in byte-range parts in parallel (:func:`plan_parts`), blocks
    are not redistributed (the parts are), and the output has a third key ``parts``
    (:class:`PartCount` per part) for :class:`NumberRejected`; until numbered, blocks and dead
    letters of a part ``> 0`` count rows and lines from the part's start.

    ``max_record_lines`` (default 1): physical lines one CSV record may span. With 1 a quoted
    field never continues on the next line (an unbalanced quote rejects its own line only), so
    split reads equal one reader byte for byte; CSV files with ``max_record_lines > 1`` are read
    by one reader each. See docs/schema-format.md, "Reading rules".
    """

    def __init__(self, pattern: str | Sequence[str], *, block_rows: int = DEFAULT_BLOCK_ROWS,
                 single_output: bool = False, split_bytes: int = 0, max_record_lines: int = 1,
                 label: str | None = None) -> None:
        super().__init__(label)
        self._single_output = _check_flag("single_output", single_output)
        patterns = [pattern] if isinstance(pattern, str) else list(pattern)
        found = [f for pat in patterns for f in _expand_paths(pat)]
        self._paths = [p for p, _ in found]
        for p in self._paths:
            detect_format(p)
        if not isinstance(block_rows, int) or block_rows < 1:
            raise ValueError(f"block_rows ({block_rows!r}) must be an int >= 1")
        if isinstance(split_bytes, bool) or not isinstance(split_bytes, int) or split_bytes < 0:
            raise ValueError(f"split_bytes ({split_bytes!r}) must be an int >= 0 (0: one reader per file)")
        self._block_rows = block_rows
        self._split = split_bytes
        self._max_lines = check_max_record_lines(max_record_lines)
        self._parts = plan_parts(found, split_bytes, max_record_lines=self._max_lines)

    @property
    def paths(self) -> list[str]:
        """The input files."""
        return list(self._paths)

    @property
    def parts(self) -> list[FilePart]:
        """The file parts read in parallel."""
        return list(self._parts)

    def display_data(self) -> dict[str, Any]:
        """Files and parts read (names and sizes are not private; no data values)."""
        return display_items(step="read files into raw blocks (dead letters tagged 'rejected')",
                             files=len(self._paths), parts=len(self._parts),
                             block_rows=self._block_rows, split_bytes=self._split)

    def expand(self, pbegin):
        if not self._split:
            paths = pbegin | "Files" >> beam.Create(self._paths)
            # str path
            blocks, rejected = _apply_with_dead_letters(
                paths, _ReadFileFn, (self._block_rows, self._max_lines), main="blocks",
                single_output=self._single_output, label="ReadFiles", main_type=RawBlock)
            # blocks: RawBlock, rejected: Rejected
            blocks = blocks | "Redistribute" >> beam.Reshuffle()
            return {"blocks": blocks, "rejected": rejected}
        parts = pbegin | "Parts" >> beam.Create(self._parts)
        # FilePart, spread over the workers by Create's reshuffle
        blocks, rejected, counts = _apply_with_dead_letters(
            parts, _ReadFileFn, (self._block_rows, self._max_lines), main="blocks",
            single_output=self._single_output, label="ReadParts", parts=True, main_type=RawBlock)
        # blocks: RawBlock, rejected: Rejected, counts: PartCount (row/line numbers part-local)
        return {"blocks": blocks, "rejected": rejected, "parts": counts}


@element_types(outputs={"batches": EncodedBatch, "rejected": Rejected, "parts": PartCount})
class ReadRecords(beam.PTransform):
    """Files → encoded batches and one merged dead-letter output.

    Returns ``{"batches": PCollection[EncodedBatch], "rejected": PCollection[Rejected]}``.
    ``single_output=True`` avoids multi-output ParDos (needed on Beam's DaskRunner).

    Uncompressed CSV/JSONL files larger than ``split_bytes`` (default 16 MiB; 0: one reader per
    file) are read in byte-range parts in parallel and each part is encoded where it was read, so
    only encoded cell codes leave the reading worker; dead letters get file-wide row and line
    numbers (:class:`NumberRejected`). Blocks depend only on the files and ``split_bytes``, so
    seeded output is the same on every runner and worker count.

    ``number_rejected=False`` skips that renumbering (whose ``GroupByKey``, like the ``Flatten`` of
    the read and encode dead letters, holds dead letters in memory until every part is read):
    ``rejected`` is then a list of two ``PCollection[Rejected]`` (read, encode) whose rows of file
    parts ``> 0`` count from their part's start, and ``parts`` the ``PartCount`` output (``None``
    when nothing is split), for ``write_rejected(rejected, out, part_counts=parts)``, which
    renumbers while it merges.

    Every record is judged alone (docs/schema-format.md, "Reading rules"): adding or removing
    one record changes the used records by at most that record. ``max_record_lines`` is
    :class:`ReadRawBlocks`'.
    """

    def __init__(self, pattern: str | Sequence[str], schema: Schema, *,
                 block_rows: int = DEFAULT_BLOCK_ROWS, single_output: bool = False,
                 split_bytes: int = DEFAULT_SPLIT_BYTES, number_rejected: bool = True,
                 max_record_lines: int = 1, label: str | None = None) -> None:
        super().__init__(label)
        self._read = ReadRawBlocks(pattern, block_rows=block_rows, single_output=single_output,
                                   split_bytes=split_bytes, max_record_lines=max_record_lines)
        self._schema = schema
        self._single_output = single_output
        self._split = split_bytes
        self._number = _check_flag("number_rejected", number_rejected)

    @property
    def paths(self) -> list[str]:
        """The input files."""
        return self._read.paths

    def display_data(self) -> dict[str, Any]:
        """Files, schema and split size (no data values)."""
        return display_items(step="read and encode records (dead letters tagged 'rejected')",
                             files=len(self._read.paths), schema=self._schema.name,
                             columns=len(self._schema.columns), split_bytes=self._split)

    def expand(self, pbegin):
        raw = pbegin | "ReadRaw" >> self._read
        # blocks: RawBlock, rejected: Rejected (+ parts: PartCount when split)
        enc = raw["blocks"] | "EncodeRows" >> EncodeBlocks(self._schema, single_output=self._single_output)
        # batches: EncodedBatch, rejected: Rejected
        if not self._number:  # the caller renumbers, e.g. write_rejected(..., part_counts=parts)
            return {"batches": enc["batches"], "rejected": [raw["rejected"], enc["rejected"]],
                    "parts": raw.get("parts")}
        rejected = (raw["rejected"], enc["rejected"]) | "MergeRejected" >> beam.Flatten()
        if self._split:
            rejected = (rejected, raw["parts"]) | "NumberRejected" >> NumberRejected()
        # Rejected with file-wide row/line numbers
        return {"batches": enc["batches"], "rejected": rejected}
