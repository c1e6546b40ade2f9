"""Split planning: which files are read in byte-range parts and where the cuts are
(:func:`plan_parts`; file names and sizes are metadata, known before any record is read).
"""

from __future__ import annotations

from collections.abc import Sequence

from apache_beam.io.filesystems import FileSystems

from beamsynth.pipelines.io.records import FilePart, detect_format

__all__ = [
    "plan_parts",
]


def _splittable(path: str, max_record_lines: int = 1) -> bool:
    fmt = detect_format(path)
    return ((fmt in ("jsonl", "avro", "parquet") or (fmt == "csv" and max_record_lines == 1))
            and not path.lower().endswith(".gz"))


def plan_parts(paths_sizes: Sequence[tuple[str, int | None]], split_bytes: int, *,
               max_record_lines: int = 1) -> list[FilePart]:
    """File parts for parallel reading: uncompressed CSV/JSONL/Avro/Parquet files larger than
    ``split_bytes`` are cut into ``ceil(size / split_bytes)`` equal byte ranges (the readers then
    align records to line starts, Avro blocks to sync markers, Parquet row groups to their first
    page); other files (and ``split_bytes=0``) are one part each, and so is a
    CSV file when records may span lines (``max_record_lines > 1``). Sizes are file metadata,
    known before any record is read; the plan is the same on every runner."""
    parts = []
    for path, size in paths_sizes:
        if not split_bytes or size is None or size <= split_bytes or not _splittable(path, max_record_lines):
            parts.append(FilePart(path, 0, 0, None))
            continue
        n = -(-size // split_bytes)
        cuts = [size * i // n for i in range(n)]
        parts.extend(FilePart(path, i, cuts[i], cuts[i + 1] if i + 1 < n else None) for i in range(n))
    return parts


def _expand_paths(pattern: str) -> list[tuple[str, int | None]]:
    matches = FileSystems.match([pattern])[0].metadata_list
    found = sorted((m.path, m.size_in_bytes) for m in matches)
    if not found:
        raise FileNotFoundError(f"no input file matches {pattern!r}")
    return found
