"""Files in and out: reading private records into columnar blocks (with a dead-letter output),
writing tables, manifests, and the whole-file checks before a run.

Formats by extension: ``.csv`` (and ``.csv.gz``), ``.jsonl``/``.ndjson``, ``.avro``, ``.parquet``.

Reading is split in two steps so that other transforms can reuse the raw form:

* :func:`iter_raw_blocks` / :class:`ReadRawBlocks`: a file → :class:`RawBlock` elements (up to
  ``block_rows`` rows of raw column values as pandas object Series) plus :class:`Rejected` rows
  that could not even be split into fields (ragged or malformed CSV lines, invalid JSON, bytes
  that are not UTF-8, corrupt Avro blocks and Parquet row groups, unreadable files).
* :class:`EncodeBlocks`: RawBlock → :class:`~beamsynth.schemas.schema.EncodedBatch` (cell codes
  for the declared schema) and, on the ``rejected`` output, every row with a value outside the
  declared domain, an unparseable value, a null where none is allowed or (JSONL) keys the
  schema does not allow, each with its reason.

Stability (privacy rule 6; docs/schema-format.md, "Reading rules"): every record is read and
judged alone, so adding or removing one record changes the used records by at most that
record. A CSV record is one physical line by default (``max_record_lines=1``: an unbalanced
quote rejects its own line, never the lines after it); the header (the first non-blank line) is
public structure and only it is a header. A JSONL record's keys are checked against the schema,
never against other records. A corrupt Avro block or Parquet row group is one dead letter and
reading goes on (after the next sync marker / with the next row group).

Nothing is dropped silently: rows read = rows encoded + rows rejected, and every rejected row
names its file, its row number (1-based, header excluded), its line where known (or its Avro
byte range / Parquet row group as ``block``), and the reason.

Parallel reading: :class:`ReadRecords` cuts uncompressed CSV/JSONL/Avro/Parquet files larger
than ``split_bytes`` into byte ranges (:func:`plan_parts`) read and encoded by different
workers; CSV/JSONL records are aligned to line starts, Avro parts own the blocks that begin in
their range (after a sync marker) and Parquet parts the row groups whose first page does. A
part's dead letters are renumbered file-wide (:class:`NumberRejected`; Parquet rows are
file-wide already, from the footer), and the result equals a sequential read byte for byte
(records never span lines there; a CSV file read with ``max_record_lines > 1`` is not split).
Avro and Parquet files are read block by block / row group by row group from a seekable
stream, so memory does not grow with the file size.

Modules (reading goes records → lines → one reader per format → read; encode and dead_letters
are used by read; nothing here imports another ``beamsynth.pipelines`` subpackage):

* :mod:`~beamsynth.pipelines.io.records`: the elements (``RawBlock``, ``Rejected``, ``FilePart``,
  ``PartCount``), ``detect_format``, ``rejected_path``, ``max_record_lines`` checks;
* :mod:`~beamsynth.pipelines.io.lines`: the line reader under CSV and JSONL;
* :mod:`~beamsynth.pipelines.io.read_csv`, :mod:`~beamsynth.pipelines.io.read_jsonl`,
  :mod:`~beamsynth.pipelines.io.read_avro`, :mod:`~beamsynth.pipelines.io.read_parquet`: one
  reader per format;
* :mod:`~beamsynth.pipelines.io.planning`: which files are read in byte-range parts;
* :mod:`~beamsynth.pipelines.io.read`: ``iter_raw_blocks``, ``ReadRawBlocks``, ``ReadRecords``;
* :mod:`~beamsynth.pipelines.io.encode`: ``encode_block``, ``EncodeBlocks``;
* :mod:`~beamsynth.pipelines.io.dead_letters`: tagged dead-letter outputs, file-wide renumbering,
  ``write_rejected``;
* :mod:`~beamsynth.pipelines.io.write`: ``WriteTables``; :mod:`~beamsynth.pipelines.io.formats`:
  Beam-free table encoders; :mod:`~beamsynth.pipelines.io.single_file`: streaming single-file
  output and the dead-letter merge; :mod:`~beamsynth.pipelines.io.filesystem`: Beam
  ``FileSystems`` helpers (atomic writes);
* :mod:`~beamsynth.pipelines.io.manifest`: ``build_manifest``, ``manifest_path``;
* :mod:`~beamsynth.pipelines.io.metrics`: ``run_counters``, a finished run's beamsynth counters;
* :mod:`~beamsynth.pipelines.io.preflight`: whole-file checks before a run and the operator's
  console counts after it.
"""
