"""JSON-lines reader: every line is one record, its key set judged alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd

from beamsynth.pipelines.io.lines import _SURROGATE, _clean, _LineSource, _open_binary, _part_bounds
from beamsynth.pipelines.io.records import FilePart, RawBlock, Rejected, _PartState

__all__: list[str] = []


# -- JSONL: every line is one record, judged alone --------------------------------------------------
def _iter_jsonl(path: str, block_rows: int, part: FilePart | None = None,
                state: _PartState | None = None) -> Iterator[RawBlock | Rejected]:
    """Records of a JSON-lines file. Each record keeps its own key set (``RawBlock.key_sets``):
    which keys it lacks or adds is judged against the schema for that record alone
    (:func:`encode_block`), never against the other records of its block or file."""
    rows: list[dict[str, Any]] = []
    nums: list[int] = []
    lines: list[int] = []
    row_no = 0
    idx = 0 if part is None else part.index

    def flush() -> RawBlock:
        sets: dict[tuple[str, ...], int] = {}
        which = np.fromiter((sets.setdefault(tuple(r), len(sets)) for r in rows), np.int32, len(rows))
        keys = list(dict.fromkeys(k for ks in sets for k in ks))
        cols = {k: pd.Series([r.get(k) for r in rows], dtype=object) for k in keys}
        return RawBlock(path, cols, np.asarray(nums, np.int64), np.asarray(lines, np.int64), part=idx,
                        key_sets=list(sets), row_keys=which)

    fh_range: tuple[int, int | None] = (0, None)
    if part is not None and not (idx == 0 and part.stop is None):
        fh_range = _part_bounds(path, part, 0)
        if fh_range[1] is not None and fh_range[0] >= fh_range[1]:
            return
    with _open_binary(path) as fh:
        src = _LineSource(fh, *fh_range)
        line_no = 0
        try:
            for line in src:
                line_no += 1
                if not line.strip():
                    continue
                row_no += 1
                if _SURROGATE.search(line) is not None:
                    yield Rejected(path, row_no, "invalid UTF-8: the line holds undecodable bytes",
                                   raw=_clean(line), line=line_no, part=idx)
                    continue
                try:
                    obj = json.loads(line)
                except (json.JSONDecodeError, UnicodeError, RecursionError) as exc:
                    yield Rejected(path, row_no, f"invalid JSON: {exc}", raw=_clean(line), line=line_no,
                                   part=idx)
                    continue
                if not isinstance(obj, dict):
                    yield Rejected(path, row_no,
                                   f"a JSON line must hold an object, got {type(obj).__name__}",
                                   raw=_clean(line), line=line_no, part=idx)
                    continue
                rows.append(obj)
                nums.append(row_no)
                lines.append(line_no)
                if len(rows) >= block_rows:
                    yield flush()
                    rows, nums, lines = [], [], []
        finally:
            if state is not None:
                state.records, state.lines = row_no, line_no
    if rows:
        yield flush()
