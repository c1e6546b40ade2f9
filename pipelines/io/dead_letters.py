"""Dead letters: DoFns with a tagged ``rejected`` output (or one output split by type, for the
DaskRunner), file-wide renumbering of the dead letters of files read in parts
(:class:`NumberRejected`, :func:`shift_rejected`) and the streaming dead-letter file
(:func:`write_rejected`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

import apache_beam as beam

from beamsynth.pipelines.io.records import PartCount, Rejected, rejected_path
from beamsynth.transforms.conventions import display_items, element_types

__all__ = [
    "NumberRejected",
    "number_rejected",
    "shift_rejected",
]


def _is_rejected(item: Any) -> bool:
    return isinstance(item, Rejected)


def _is_part_count(item: Any) -> bool:
    return isinstance(item, PartCount)


def _is_main(item: Any) -> bool:
    return not isinstance(item, (Rejected, PartCount))


def _apply_with_dead_letters(pcoll: beam.PCollection, fn_cls: type, args: tuple, *, main: str,
                             single_output: bool, label: str, parts: bool = False,
                             main_type: type | None = None) -> tuple[Any, ...]:
    """``(main, rejected)`` outputs of a DoFn whose dead letters are :class:`Rejected` rows
    (``(main, rejected, parts)`` with ``parts``: its :class:`PartCount` output too).

    By default a tagged multi-output ParDo. With ``single_output`` the DoFn emits every kind on
    one output and ``Filter`` steps split them by type: Beam's DaskRunner (2.77) sends every
    output of a multi-output ParDo to every consumer (see docs/runners.md). ``main_type``: the
    main output's element type (its registered coder, e.g. transforms/coders.py's).
    """
    tags = ("rejected", "parts") if parts else ("rejected",)
    if not single_output:
        fn = beam.ParDo(fn_cls(*args))
        if main_type is not None:
            fn = fn.with_output_types(main_type)
        out = pcoll | label >> fn.with_outputs(*tags, main=main)
        return (out[main], *(out[t] for t in tags))
    mixed = pcoll | label >> beam.ParDo(fn_cls(*args, tagged=False))
    # RawBlock/EncodedBatch | Rejected | PartCount
    outs = (mixed | f"{label}Main" >> beam.Filter(_is_main),
            mixed | f"{label}Rejected" >> beam.Filter(_is_rejected))
    if parts:
        outs += (mixed | f"{label}Parts" >> beam.Filter(_is_part_count),)
    return outs


def _check_flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} ({value!r}) must be a bool")
    return value


def _key_by_path(item: Rejected | PartCount) -> tuple[str, Rejected | PartCount]:
    return (item.source if isinstance(item, Rejected) else item.path), item


def number_rejected(keyed: tuple[str, Iterable[Rejected | PartCount]]) -> list[Rejected]:
    """File-wide row and line numbers for the dead letters of one file read in parts.

    Part ``i``'s numbers are offset by the records and lines of parts ``0..i-1`` (part 0's lines
    include the header), so every dead letter names the row and line a sequential read names.
    """
    path, items = keyed
    counts: dict[int, PartCount] = {}
    rejected: list[Rejected] = []
    for item in items:
        if isinstance(item, PartCount):
            counts[item.index] = item
        else:
            rejected.append(item)
    if any(r.part for r in rejected) and sorted(counts) != list(range(len(counts))):
        raise ValueError(f"part counts of {path!r} are incomplete: got parts {sorted(counts)}")
    row_off, line_off = [0], [0]
    for i in range(len(counts)):
        row_off.append(row_off[-1] + counts[i].records)
        line_off.append(line_off[-1] + counts[i].lines)
    out = []
    for r in rejected:
        if r.part:
            r = shift_rejected(r, row_off[r.part], line_off[r.part])
        out.append(r)
    return out


_AFTER_ROW = re.compile(r"\(after row (\d+);")


def shift_rejected(r: Rejected, row_off: int, line_off: int) -> Rejected:
    """``r`` numbered file-wide (part 0): row, line and a corrupt Avro block's ``after row N``
    moved by the rows and lines of the parts before its own (its ``block`` kept)."""
    reason = r.reason
    if r.block is not None and row_off:
        reason = _AFTER_ROW.sub(lambda m: f"(after row {int(m.group(1)) + row_off};", reason, count=1)
    return Rejected(r.source, None if r.row is None else r.row + row_off, reason, r.raw,
                    None if r.line is None else r.line + line_off, block=r.block,
                    after=None if r.after is None else r.after + row_off)


def _first_part(r: Rejected) -> bool:
    return r.part == 0


def _later_part(r: Rejected) -> bool:
    return r.part != 0


@element_types(inputs={0: Rejected, 1: PartCount}, output=Rejected)
class NumberRejected(beam.PTransform):
    """``(rejected, part counts)`` → dead letters with file-wide row and line numbers.

    Only needed when files are read in parts (:class:`ReadRawBlocks` with ``split_bytes``).
    Dead letters of part 0 (and of unsplit files) are already numbered and pass straight through;
    those of later parts are grouped by file with the part counts (a ``GroupByKey``, safe on every
    runner), so they are held until every part of their file has been read.
    """

    def display_data(self) -> dict[str, Any]:
        """What the step does (no parameters, no data values)."""
        return display_items(step="number dead letters file-wide from the part counts")

    def expand(self, pcolls):
        rejected, parts = pcolls
        first = rejected | "FirstParts" >> beam.Filter(_first_part)
        # Rejected, file-wide numbers already
        later = (
            (rejected | "LaterParts" >> beam.Filter(_later_part), parts)
            | "Flatten" >> beam.Flatten()
            # Rejected | PartCount
            | "ByFile" >> beam.Map(_key_by_path)
            | "Group" >> beam.GroupByKey()
            # (path, Iterable[Rejected | PartCount])
            | "Number" >> beam.FlatMap(number_rejected)
            # Rejected, file-wide row/line
        )
        return (first, later) | "Join" >> beam.Flatten()


def _rejected_sort_key(r: Rejected) -> bytes:
    """Bytes ordering dead letters by (source file, file part, row, line): the source as ASCII
    JSON (no JSON string is a prefix of another), numbers zero-padded, ``-`` for unknown. A
    corrupt Avro block (no row) sorts by the rows read before it, so a file read in parts
    orders its dead letters as a sequential read does."""
    def num(v: int | None) -> bytes:
        return b"-" if v is None else b"%020d" % v
    row = r.row if r.row is not None or r.after is None else r.after
    return b" ".join((json.dumps(r.source).encode("ascii"), b"%010d" % r.part, num(row), num(r.line)))


def _keyed_json(r: Rejected) -> tuple[bytes, str]:
    return _rejected_sort_key(r), r.to_json()


def _renumber_lines(counts: list[PartCount]) -> Any:
    """``rewrite(key, line)`` for the dead-letter merge: lines of file parts ``> 0`` get file-wide
    row and line numbers (part ``i`` offset by the records and lines of parts ``0..i-1``, as
    :func:`number_rejected`), others pass unchanged."""
    by_path: dict[str, dict[int, PartCount]] = {}
    for c in counts:
        by_path.setdefault(c.path, {})[c.index] = c
    offsets: dict[tuple[str, int], tuple[int, int]] = {}
    for path, parts in by_path.items():
        rows = lines = 0
        for i in range(len(parts)):
            if i not in parts:
                break  # incomplete: later parts get no offset (their dead letters raise)
            offsets[(path, i)] = (rows, lines)
            rows, lines = rows + parts[i].records, lines + parts[i].lines

    def rewrite(key: bytes, line: bytes) -> bytes:
        source, part = key.rsplit(b" ", 3)[:2]
        if part == b"0" * 10:
            return line
        r = json.loads(line)
        where = (json.loads(source), int(part))
        if where not in offsets:
            raise ValueError(f"part counts of {where[0]!r} are incomplete: no offset for part {where[1]}")
        row_off, line_off = offsets[where]
        fixed = shift_rejected(Rejected(r["source"], r["row"], r["reason"], r["raw"], r["line"],
                                        block=r.get("block")), row_off, line_off)
        return (fixed.to_json() + "\n").encode("utf-8")
    return rewrite


def write_rejected(rejected: beam.PCollection | Sequence[beam.PCollection], output: str, *,
                   part_counts: beam.PCollection | None = None) -> Any:
    """Write dead-letter rows as JSON lines to ``rejected_path(output)`` (one file), streaming.

    ``rejected``: ``PCollection[Rejected]``, or several (written separately and merged: better
    than a ``Flatten`` of dead-letter outputs of different stages, which the DirectRunner holds
    in memory). ``part_counts``: the ``PartCount`` output of a read in file parts
    (:class:`ReadRawBlocks` with ``split_bytes``): dead letters may then still count rows and
    lines from their part's start, and are renumbered file-wide while merging (the work of
    :class:`NumberRejected`, without grouping the rows).

    Lines are ordered by (source file, row, line), then by content, on every runner. Rows never
    cross a shuffle here: each worker writes sorted runs where the rows are rejected and one
    worker merges them (:class:`~beamsynth.pipelines.io.single_file.WriteSortedLines`), so the write
    holds one run (8 MiB) per worker, whatever the number of rejected rows (Beam's
    ``WriteToText(num_shards=1)`` grouped every row under one key, which the DirectRunner holds
    in memory). What feeds it may still hold rows: ``ReadRecords``' merged ``rejected`` output is
    a ``Flatten`` of the read and encode stages, and ``NumberRejected`` groups a split file's
    dead letters. No rejected row: an empty file.
    """
    from beamsynth.pipelines.io.single_file import WriteSortedLines

    inputs = [rejected] if isinstance(rejected, beam.PCollection) else list(rejected)
    keyed = tuple(pc | f"RejectedToJson{'' if i == 0 else i}" >> beam.Map(_keyed_json)
                  for i, pc in enumerate(inputs))
    # (sort key bytes, JSON line) per input
    if part_counts is None:
        return keyed | "WriteRejected" >> WriteSortedLines(rejected_path(output))
    return {"lines": keyed, "context": part_counts} | "WriteRejected" >> WriteSortedLines(
        rejected_path(output), rewriter=_renumber_lines)
