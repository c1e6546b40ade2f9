"""Whole-file checks before a pipeline is built, and the operator's console after it ran.

**Pre-flight** (:func:`check_inputs`) runs when a command is planned, before any budget is spent,
any output is written or any record is measured. It reads only public structure of each input
file — the CSV header line, the Avro writer schema, the Parquet schema, whether the gzip stream is
intact and whether a file holds any record at all — and raises :class:`PreflightError` (a
``ValueError``: the CLI exits with status 2) naming the file and the problem:

* no file matches the input pattern; a file that cannot be opened;
* a CSV file without a header line (0 bytes), a header that is not UTF-8 (e.g. UTF-16, Latin-1),
  binary content (NUL bytes) in a ``.csv``;
* a declared column, the ``--privacy-id`` or a ``--column`` named on the command line missing from
  the header, with a guess at the delimiter (``;``, tab, ``|``) and near-miss names;
* undeclared columns under ``extra_columns: reject``, declared columns repeated in the header;
* a truncated or corrupt ``.gz`` stream (checked by decompressing it to the end without parsing:
  the gzip trailer is the only place truncation shows);
* an unreadable Avro header or Parquet footer;
* an input with no data record at all (every file empty or header-only), unless the operator
  passes ``--allow-empty`` (see ``docs/methods.md``, "Empty inputs", for why this is the one
  data-dependent refusal and what it costs the guarantee).

Record contents are never inspected: per-record problems stay dead letters. JSONL files have no
header, so for them only the gzip stream and emptiness are checked.

**Noise scales** (:func:`check_noise_scales`): every spend recorded on the accountant carries its
noise scale; a scale the exact samplers cannot draw (``exp(-1/scale)`` rounds to 1, e.g.
``ε = 1e-20``) is refused when the pipeline is built, naming the step, ε and the scale.

The operator's console after a run (counts, the rejected-rows warning, method advice) and the
input-check options of the commands are :mod:`beamsynth.pipelines.cli.console`.
"""

from __future__ import annotations

import codecs
import csv
import difflib
import gzip
import math
import os
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from apache_beam.io.filesystems import FileSystems

from beamsynth.pipelines.io.records import detect_format
from beamsynth.schemas.schema import Schema, avro_field_name

__all__ = [
    "FileFacts",
    "PreflightError",
    "PreflightReport",
    "Required",
    "check_inputs",
    "check_noise_scales",
    "check_outputs",
    "check_table_inputs",
    "header_columns",
    "schema_requirements",
]


_HEAD_BYTES = 1 << 20  # the header line must end within the first MiB
_GZIP_CHUNK = 1 << 20
_DELIMITERS = {";": "';'", "\t": "tab", "|": "'|'", ":": "':'"}


class PreflightError(ValueError):
    """A whole-file problem found before the pipeline was built (the CLI exits with status 2)."""


@dataclass(frozen=True)
class Required:
    """A column an input must have, and who asked for it (for the error message)."""

    name: str
    why: str


@dataclass
class FileFacts:
    """Public structure of one input file."""

    path: str
    format: str
    columns: list[str] | None = None  # None: the format has no header (JSONL)
    has_records: bool | None = None  # None: unknown


@dataclass
class PreflightReport:
    """What pre-flight found: the files and warnings for the operator's console."""

    files: list[FileFacts] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """Whether no input file holds any record (every file empty or header-only)."""
        return bool(self.files) and all(f.has_records is False for f in self.files)


def schema_requirements(schema: Schema, *, privacy_id: str | None = None,
                        privacy_id_flag: str = "--privacy-id") -> list[Required]:
    """The columns a schema (and a privacy id given on the command line) needs in every input."""
    req = [Required(n, f"declared in schema {schema.name!r}") for n in schema.names]
    pid = privacy_id or schema.privacy_id
    if pid is not None and pid not in schema.names:
        why = f"named by {privacy_id_flag}" if privacy_id else f"privacy_id of schema {schema.name!r}"
        req.append(Required(pid, why))
    return req


# -- input files ----------------------------------------------------------------------------------------
def _expand(pattern: str | Sequence[str]) -> list[str]:
    patterns = [pattern] if isinstance(pattern, str) else list(pattern)
    paths: list[str] = []
    for pat in patterns:
        try:
            found = sorted(m.path for m in FileSystems.match([pat])[0].metadata_list)
        except Exception as exc:  # Beam wraps OS errors in BeamIOError
            raise PreflightError(f"{pat}: cannot list input files: {exc}") from None
        if not found:
            raise PreflightError(f"{pat}: no input file matches")
        paths.extend(found)
    return paths


def _open(path: str) -> Any:
    try:
        return FileSystems.open(path, compression_type="uncompressed")
    except Exception as exc:
        raise PreflightError(f"{path}: cannot open the file: {exc}") from None


def _check_gzip(path: str) -> None:
    """Decompress the whole stream (every member) without keeping it; raise if cut short."""
    with _open(path) as raw:
        d, fed = zlib.decompressobj(wbits=31), False
        try:
            while chunk := raw.read(_GZIP_CHUNK):
                while chunk:
                    d.decompress(chunk)
                    fed = True
                    chunk = d.unused_data
                    if d.eof:  # a member ended: what follows is the next member
                        d, fed = zlib.decompressobj(wbits=31), False
                        chunk = chunk.lstrip(b"\0")  # zero padding after the last member is allowed
                    else:
                        chunk = b""
        except zlib.error as exc:
            raise PreflightError(f"{path}: the gzip stream is corrupt ({exc}); re-copy or "
                                 "re-compress the file") from None
    if fed:
        raise PreflightError(f"{path}: the gzip stream is truncated (it ends before its "
                             "end-of-stream marker): the file was cut short; re-copy it")


def _head(path: str) -> tuple[bytes, bool]:
    """(up to the first MiB of the decompressed content, whether that is the whole file)."""
    with _open(path) as raw:
        fh = gzip.GzipFile(fileobj=raw) if path.lower().endswith(".gz") else raw
        try:
            data = fh.read(_HEAD_BYTES)
            whole = not fh.read(1)
        except (OSError, EOFError) as exc:
            raise PreflightError(f"{path}: cannot read the file: {exc}") from None
    return data, whole


def _csv_facts(path: str) -> FileFacts:
    data, whole = _head(path)
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise PreflightError(f"{path}: the file is UTF-16 encoded; beamsynth reads UTF-8 — convert "
                             "it (e.g. iconv -f utf-16 -t utf-8)")
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if not data.strip():
        raise PreflightError(f"{path}: the file is empty (no header line); a CSV input needs a "
                             "header naming its columns")
    start, end = _header_line(data)
    if end is None:
        if not whole:
            raise PreflightError(f"{path}: no line break in the first {_HEAD_BYTES >> 20} MiB: is "
                                 "it a CSV file?")
        end = len(data)
    head = data[start:end]
    if b"\x00" in head:  # the header line only: a NUL byte in a record rejects that record alone
        raise PreflightError(f"{path}: the file holds NUL bytes: is it a binary file (Parquet, "
                             "Avro, a spreadsheet) with a .csv name?")
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PreflightError(
            f"{path}: the header line is not valid UTF-8 (byte 0x{head[exc.start]:02x} at offset "
            f"{start + exc.start}); beamsynth reads UTF-8 — convert the file (e.g. iconv -f latin1 "
            "-t utf-8)"
        ) from None
    fields = next(csv.reader([text]), [])
    rest = data[end:]
    # a record is any line the reader does not skip: only empty lines (line breaks alone) are
    # blank; a line of spaces or tabs is a record (a dead letter), as docs/schema-format.md says
    has_records = True if rest.translate(None, b"\r\n") else (False if whole else None)
    return FileFacts(path, "csv", [f.strip() for f in fields], has_records)


_LINE_BREAK = re.compile(rb"\r\n|\r|\n")


def _header_line(data: bytes) -> tuple[int, int | None]:
    """(start, end) of the header: the first line that is not blank, as the reader takes it
    (one physical line; blank lines before it are skipped). ``end`` is None without a line break."""
    pos = 0
    for m in _LINE_BREAK.finditer(data):
        if m.start() > pos:
            return pos, m.start()
        pos = m.end()
    return pos, None


def _jsonl_facts(path: str) -> FileFacts:
    data, whole = _head(path)
    # blank as the reader judges it (read_jsonl: ``str.strip``, i.e. Unicode white space such as
    # U+00A0 or U+2028 too); a multi-byte character cut by the head's end is held back, not judged
    text = codecs.getincrementaldecoder("utf-8")("surrogateescape").decode(data, final=whole)
    return FileFacts(path, "jsonl", None, True if text.strip() else (False if whole else None))


def _avro_header(path: str, fh: Any) -> tuple[Any, list[str]]:
    """(fastavro reader, field names) of an open Avro file: its writer schema only."""
    import fastavro

    try:
        reader = fastavro.reader(fh)
        return reader, [f["name"] for f in reader.writer_schema.get("fields", [])]
    except Exception as exc:  # fastavro raises several types for a bad header
        raise PreflightError(f"{path}: not a readable Avro file ({exc})") from None


def _avro_facts(path: str) -> FileFacts:
    with _open(path) as fh:
        reader, names = _avro_header(path, fh)
        try:
            has = next(iter(reader), None) is not None
        except Exception:  # a corrupt first block is a per-block problem: the reader dead-letters it
            has = None
    return FileFacts(path, "avro", names, has)


def _parquet_facts(path: str) -> FileFacts:
    import pyarrow.parquet as pq

    with _open(path) as fh:
        try:
            meta = pq.ParquetFile(fh).metadata
            names = list(meta.schema.to_arrow_schema().names)
        except Exception as exc:
            raise PreflightError(f"{path}: not a readable Parquet file ({exc})") from None
    return FileFacts(path, "parquet", names, meta.num_rows > 0)


_FACTS = {"csv": _csv_facts, "jsonl": _jsonl_facts, "avro": _avro_facts, "parquet": _parquet_facts}


def header_columns(path: str) -> list[str] | None:
    """The column names of one input file (any Beam file system: local, ``gs://``, ...) as the
    pre-flight reads them: a CSV's header line, an Avro writer schema, a Parquet schema (no
    record is parsed); ``None`` for JSONL, which has no header. Raises :class:`PreflightError`
    on a whole-file problem (unopenable, empty, not UTF-8, unreadable header)."""
    fmt = detect_format(path)
    if fmt == "avro":
        with _open(path) as fh:
            return _avro_header(path, fh)[1]
    return _FACTS[fmt](path).columns


def _delimiter_hint(path: str, header: list[str], wanted: Sequence[str]) -> str:
    """'— is the delimiter ';'?' when splitting the header on another delimiter finds more names."""
    line = ",".join(header)
    best, best_hits = None, sum(1 for n in wanted if n in header)
    for d, shown in _DELIMITERS.items():
        if d not in line:
            continue
        fields = [f.strip() for f in next(csv.reader([line], delimiter=d), [])]
        hits = sum(1 for n in wanted if n in fields)
        if hits > best_hits:
            best, best_hits = shown, hits
    if best is None:
        return ""
    return f" — is the delimiter {best}? (beamsynth reads ','-separated CSV; convert the file)"


def _near_misses(missing: Sequence[str], header: Sequence[str]) -> str:
    hints = []
    lower = {h.lower(): h for h in header}
    for name in missing:
        close = [lower[name.lower()]] if name.lower() in lower else difflib.get_close_matches(
            name, header, n=1, cutoff=0.8)
        if close:
            hints.append(f"{close[0]!r} for {name!r}")
    return f"; did you mean {', '.join(hints)}?" if hints else ""


def _few(items: Sequence[str], limit: int = 6) -> str:
    """``a, b, c`` or ``a, b, … (N in all)``."""
    if len(items) <= limit:
        return ", ".join(items)
    return ", ".join(items[:limit]) + f", … ({len(items)} in all)"


def _check_columns(facts: FileFacts, required: Sequence[Required], reject_extra: Sequence[str] | None
                   ) -> None:
    if facts.columns is None:
        return
    header = facts.columns
    have = set(header)
    missing = [r for r in required if r.name not in have and avro_field_name(r.name) not in have]
    if missing:
        by_why: dict[str, list[str]] = {}
        for r in missing:
            by_why.setdefault(r.why, []).append(repr(r.name))
        parts = [f"{_few(names)} ({why})" for why, names in by_why.items()]
        noun = "column" if len(missing) == 1 else "columns"
        raise PreflightError(
            f"{facts.path}: header has no {noun} {' and '.join(parts)}; header columns "
            f"({len(header)}): {_few([repr(h) for h in header], 20)}"
            + (_delimiter_hint(facts.path, header, [r.name for r in required])
               or _near_misses([r.name for r in missing], header)))
    wanted = {r.name for r in required} | {avro_field_name(r.name) for r in required}
    dups = sorted({h for h in header if h in wanted and header.count(h) > 1})
    if dups:
        raise PreflightError(f"{facts.path}: header repeats column(s) {dups}")
    if reject_extra is not None:
        allowed = set(reject_extra) | {avro_field_name(n) for n in reject_extra}
        extra = [h for h in header if h not in allowed]
        if extra:
            raise PreflightError(f"{facts.path}: header has undeclared column(s) {extra} and the "
                                 "schema says extra_columns: reject")


def check_inputs(pattern: str | Sequence[str], *, required: Sequence[Required] = (),
                 reject_extra: Sequence[str] | None = None, allow_empty: bool = False,
                 empty_advice: str = "pass --allow-empty to release from it anyway") -> PreflightReport:
    """Check every input file's public structure; raise :class:`PreflightError` on a whole-file
    problem (module docstring). ``reject_extra``: the only columns allowed (schema
    ``extra_columns: reject``). ``allow_empty``: release from an input with no record at all;
    ``empty_advice``: what the refusal of an empty input tells the caller to do."""
    report = PreflightReport()
    for path in _expand(pattern):
        fmt = detect_format(path)
        if path.lower().endswith(".gz"):
            _check_gzip(path)
        facts = _FACTS[fmt](path)
        _check_columns(facts, required, reject_extra)
        report.files.append(facts)
    if report.empty and not allow_empty:
        names = ", ".join(f.path for f in report.files)
        raise PreflightError(
            f"{names}: no data records (the input is empty or header-only). An empty input is "
            f"treated as an operator error; {empty_advice} (docs/methods.md, 'Empty inputs')")
    if not report.empty and len(report.files) > 1:
        report.warnings += [f"{f.path}: no data records" for f in report.files if f.has_records is False]
    return report


def check_outputs(paths: Sequence[str], *, flag: str = "--output") -> None:
    """Refuse, before anything is read or spent, a local output path that exists and is not a
    regular file (a folder): the run would read, measure and sample everything and then fail
    when the finished file is renamed onto it. Object-store paths have no folders: not checked."""
    for path in paths:
        if "://" not in path and os.path.exists(path) and not os.path.isfile(path):
            kind = "a folder" if os.path.isdir(path) else "not a regular file"
            raise PreflightError(f"{path}: exists and is {kind}; {flag} names the file to write "
                                 "(its manifest and dead letters go beside it), e.g. "
                                 f"{os.path.join(path, 'out.csv')}")


def check_table_inputs(tables: Iterable[Any]) -> None:
    """Pre-flight of every table of a release config (``TableSpec``: ``inputs``, ``schema``,
    ``privacy_id``, ``kind``, ``column``, ``where``), before the ledger is touched."""
    for t in tables:
        if t.kind == "histogram":
            required = [Required(t.column, f"{t.where}.column")] + (
                [Required(t.privacy_id, f"{t.where}.privacy_id")] if t.privacy_id else [])
        else:
            required = schema_requirements(t.schema, privacy_id=t.privacy_id,
                                           privacy_id_flag=f"{t.where}.privacy_id")
        check_inputs(list(t.inputs), required=required, empty_advice=(  # a release has no --allow-empty
            "a release always refuses it: nothing was spent (its ledger reservation is aborted), so "
            "rerun this night once the input holds records, or skip the night"))


# -- noise scales ---------------------------------------------------------------------------------------
def _scales(details: Any, prefix: str = "") -> Iterable[tuple[str, float]]:
    if isinstance(details, Mapping):
        for k, v in details.items():
            key = f"{prefix}{k}"
            if "scale" in str(k) and isinstance(v, (int, float)) and not isinstance(v, bool):
                yield key, float(v)
            elif isinstance(v, (Mapping, list, tuple)):
                yield from _scales(v, key + ".")
    elif isinstance(details, (list, tuple)):
        for i, v in enumerate(details):
            yield from _scales(v, f"{prefix}{i}.")


def _drawable(scale: float) -> bool:
    """Whether the exact samplers can draw noise of this scale (``exp(-1/scale) < 1``)."""
    return math.isfinite(scale) and scale > 0 and math.exp(-1.0 / scale) < 1.0


def check_noise_scales(spends: Iterable[Any]) -> None:
    """Refuse, when the pipeline is built, a spend whose noise scale the samplers cannot draw.

    ``spends``: the accountant's spends (objects with ``step``, ``budget`` and ``details``, or
    their ``to_dict()`` form). Every numeric detail whose key names a scale is checked.
    """
    for s in spends:
        d = s if isinstance(s, Mapping) else {"step": s.step, "epsilon": s.budget.epsilon,
                                               "details": s.details}
        for key, scale in _scales(d.get("details") or {}):
            if not _drawable(scale):
                raise PreflightError(
                    f"step {d['step']!r}: ε={d['epsilon']:g} gives noise {key}={scale:g}, which "
                    "the exact samplers cannot draw (exp(-1/scale) rounds to 1); raise --epsilon")
