"""End Beam's splittable CSV header read at the end of the file (Beam's own endless loop).

``apache_beam.dataframe.io._TextFileSplitter.read_header`` (Beam 2.77; ``ReadFromCsv`` reads
with ``splittable=True`` unless told otherwise) reads lines until it has passed the header line
that ``header: N`` declares (Beam YAML's ``names:`` + ``header: 0``). A file that ends before that
line (0 bytes, or blank lines only) never ends the loop: at the end of the file every read returns
an empty line, which counts as blank, is skipped, and the next read is empty again. The run never
finishes (docs/beam-api.md, "Seventeenth session: IO robustness and open items (H89)").

:func:`install` wraps the method once per process (importing this module calls it, and
``import beamsynth`` imports it first, so a worker that loads any beamsynth step has it too): at
the end of the file it returns the lines read so far as the header and nothing after it, which
pandas reads as no rows, as it reads a header-only file.
Everywhere else the method runs unchanged. Whether a file is empty is never looked at before the
run: the release happens either way (rule 7), with its DP counts of no rows.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

__all__ = ["install", "wrap_dataframe_io"]


class _PastEnd(Exception):
    """Raised inside the wrapped read when a header line is asked for past the end of the file."""


def _ending_at_eof(read_header: Any) -> Any:
    @functools.wraps(read_header)
    def read_header_to_eof(self: Any, handle: Any) -> tuple:
        lines: list = []
        to_boundary = self.read_to_record_boundary

        def next_line(buffered: Any, stream: Any) -> tuple:
            line, rest = to_boundary(buffered, stream)
            if not line:  # a line always holds a byte; none left is the end of the file
                raise _PastEnd
            lines.append(line)
            return line, rest

        reader = copy.copy(self)  # the splitter travels with the DoFn: never changed in place
        reader.read_to_record_boundary = next_line
        try:
            return read_header(reader, handle)
        except _PastEnd:
            return self.empty_buffer().join(lines), self.empty_buffer()

    return read_header_to_eof


def wrap_dataframe_io(owner: str, method: str, wrap: Any, *, needs: str = "") -> bool:
    """Replace ``apache_beam.dataframe.io.<owner>.<method>`` by ``wrap(method)`` once per process
    (a wrapped method carries ``beamsynth_wrapped``); False when this Beam has no such method (or
    ``owner`` lacks the attribute ``needs``): Beam's own behaviour then stays."""
    try:
        from apache_beam.dataframe import io as dataframe_io
    except ImportError:  # pragma: no cover - a Beam without its DataFrame API
        return False
    cls = getattr(dataframe_io, owner, None)
    original = getattr(cls, method, None)
    if original is None or (needs and not hasattr(cls, needs)):
        return False
    if not getattr(original, "beamsynth_wrapped", False):
        wrapped = wrap(original)
        wrapped.beamsynth_wrapped = True
        setattr(cls, method, wrapped)
    return True


def install() -> bool:
    """Wrap Beam's splittable CSV header read once; False when this Beam has no such reader."""
    return wrap_dataframe_io("_TextFileSplitter", "read_header", _ending_at_eof,
                             needs="read_to_record_boundary")


install()
