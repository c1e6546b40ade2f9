"""A realistic ETL job: JSON events in, four DP releases out, one budget, one manifest.

Usage::

    python examples/etl_job.py INPUT.jsonl --schema SCHEMA --epsilon E --output DIR \\
        [--rows N] [--seed S] [--histogram-column COL] [--marginals a,b c,d] \\
        [--fractions synthetic=0.6,histogram=0.15,marginals=0.2,count=0.05] \\
        [--privacy-id COL --max-contributions K] [Beam options: --runner direct-multi, ...]

``SCHEMA`` is a bundled schema name (``adult``, ``acs_national``, ...) or a path to a YAML/JSON
schema; nothing about the columns is hard-coded here. The steps, all in ONE Beam pipeline:

1. **Budget first.** ``bs.PrivacyJob(epsilon=E)`` is the job's one accountant. ``E`` is split by
   declared fractions (printed); every mechanism spends its share when it is applied, while the
   pipeline is built. A split that overspends raises ``bs.BudgetExceededError`` before any data
   is read, and nothing is written.
2. **Read.** ``beam.io.ReadFromText`` reads the JSON-lines events (one event per line) as bytes.
3. **Parse.** UTF-8 decoding and ``json.loads`` per line; a line that is not UTF-8 or not a JSON
   object goes to the dead letters (reason ``not UTF-8 ...``, ``invalid JSON ...``), it never
   crashes the run.
4. **Clean** with ordinary Beam steps: keep only the fields the schema declares (by name or by
   Parquet field name, e.g. ``education_num``) and the privacy id, then route events with no declared value at all to the dead letters (reason ``no declared
   values``) — a filter that loses no row silently. Each record is judged alone, so adding or
   removing one event changes the used events by at most that event.
5. **Make private.** ``job.private(schema)`` encodes the events against the declared domains
   (out-of-domain or malformed values → dead letters), and with ``--privacy-id`` keeps at most
   ``--max-contributions`` events per person before anything is measured.
6. **Release**, each under its share of ``E`` (neighbours: add/remove one privacy unit):
   a synthetic table (``bs.PrivBayes``), a CatHist histogram of one column (``bs.Histogram``;
   default: the declared categorical column with the largest domain — a public property), 2-way
   marginals (``bs.Marginals``; default: up to three disjoint pairs of declared columns with small
   domains, chosen from the schema only; one-way tables when no pair is small enough) and a DP
   record count (``bs.Count``). The privacy unit is ``--privacy-id`` or the schema's
   ``privacy_id``, else one event.
7. **Write** with Beam's own sinks: one Parquet file per release (``beam.io.WriteToParquet`` with
   ``bs.arrow_schema(...)``, ``num_shards=1`` and ``shard_name_template=""`` so the file names do
   not depend on the data), the dead letters as JSON lines (``rejected.jsonl``: **private**, keep
   them with the data owner) and ONE manifest ``DIR/manifest.json`` (``bs.WriteManifest``) with
   every spend (public part) and the exact read/rejected/used counts (private part), including
   this script's own parse and filter rejections.

Output files (names fixed in advance): ``synthetic.parquet``, ``histogram_<COL>.parquet``,
``marginal_<a>__<b>.parquet`` per pair, ``count.parquet``, ``rejected.jsonl``,
``manifest.json``. DIR must not hold other files (an earlier run's releases would sit next to
this run's): the job refuses it before building. At the end it prints the manifest's exact
counts, ``events read R = used U + rejected X + dropped by the contribution bound D`` (private). Beam's ``ReadFromText`` gives elements no line number, so by default dead
letters carry the raw line and ``position: null``; ``--line-numbers`` reads each file whole
(``fileio.MatchFiles`` + ``ReadMatches``, not split across workers) and numbers every dead letter
by its line (per file).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystems import FileSystems

import beamsynth as bs

SOURCE = "events"
DEFAULT_FRACTIONS = {"synthetic": 0.6, "histogram": 0.15, "marginals": 0.2, "count": 0.05}
MAX_PAIR_CELLS = 400          # default marginals: pairs whose declared table has ≤ this many cells
MAX_PAIRS = 3
BAD = "bad"
POSITION_FIELD = "_etl_line"  # line number attached with --line-numbers (read by job.private)
DEFAULT_TOLERANCE = 0.9       # CatHist ρ when the histogram column declares no open.tolerance


def parse_fractions(text: str) -> dict[str, float]:
    """``"synthetic=0.6,histogram=0.15,..."`` → fractions of E (every mechanism named, each > 0).
    Raises ``argparse.ArgumentTypeError``, whose message argparse prints as is."""
    out: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in DEFAULT_FRACTIONS:
            raise argparse.ArgumentTypeError(f"--fractions item {part!r} must be NAME=FRACTION with NAME one of "
                             f"{sorted(DEFAULT_FRACTIONS)}")
        try:
            out[name] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--fractions item {part!r}: {value!r} is not a number") from None
        if not out[name] > 0:
            raise argparse.ArgumentTypeError(f"--fractions item {part!r}: the fraction must be > 0")
    missing = sorted(set(DEFAULT_FRACTIONS) - set(out))
    if missing:
        raise argparse.ArgumentTypeError(f"--fractions {text!r} misses {missing}; give all of "
                         f"{sorted(DEFAULT_FRACTIONS)}")
    return out


def histogram_column(schema: bs.Schema) -> str:
    """The declared categorical column with the largest declared domain (public), else the first
    column with the largest domain."""
    cats = [c for c in schema.columns if c.type == "categorical"] or list(schema.columns)
    return max(cats, key=lambda c: c.cells).name


def default_pairs(schema: bs.Schema, *, exclude: Iterable[str] = ()) -> list[tuple[str, ...]]:
    """Up to ``MAX_PAIRS`` disjoint pairs of declared columns, in declaration order, each with a
    declared table of at most ``MAX_PAIR_CELLS`` cells (from the schema only, never the data)."""
    skip = set(exclude)
    small = [c for c in schema.columns if c.name not in skip and c.cells <= MAX_PAIR_CELLS]
    pairs: list[tuple[str, str]] = []
    used: set[str] = set()
    for i, a in enumerate(small):
        if a.name in used:
            continue
        for b in small[i + 1:]:
            if b.name not in used and a.cells * b.cells <= MAX_PAIR_CELLS:
                pairs.append((a.name, b.name))
                used.update((a.name, b.name))
                break
        if len(pairs) == MAX_PAIRS:
            break
    return pairs


def default_marginals(schema: bs.Schema, histogram: str) -> list[tuple[str, ...]]:
    """Pairs (:func:`default_pairs`, avoiding the histogram column if it can); when no pair is
    small enough (one column, or only huge domains), the one-way tables of up to ``MAX_PAIRS``
    columns with the smallest declared domains."""
    pairs = default_pairs(schema, exclude=[histogram]) or default_pairs(schema)
    if pairs:
        return pairs
    smallest = sorted(schema.columns, key=lambda c: c.cells)[:MAX_PAIRS]
    return [(c.name,) for c in smallest if c.cells <= 50 * MAX_PAIR_CELLS]


def field_names(schema: bs.Schema) -> frozenset[str]:
    """Names an event may use for a declared column: the declared name and its Parquet/Avro field
    name (``education-num`` or ``education_num``), as ``job.private`` accepts both."""
    return frozenset(schema.names) | frozenset(f.name for f in bs.arrow_schema(schema))


def file_part(name: str) -> str:
    """A column name as a file-name part."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def numbered_lines(readable_file: Any) -> Iterable[tuple[int, bytes]]:
    """A matched file (``fileio.ReadMatches``) → ``(line number from 1, line bytes)``."""
    with readable_file.open() as fh:
        for number, raw in enumerate(iter(fh.readline, b""), 1):
            yield number, raw.rstrip(b"\r\n")


def parse_line(item: tuple[int | None, bytes], *, columns: frozenset[str],
               privacy_id: str | None = None) -> Iterable[Any]:
    """``(line number or None, JSON line bytes)`` → the event restricted to the declared
    ``columns`` and ``privacy_id`` (plus ``POSITION_FIELD`` when numbered; main output), or a dead
    letter (tagged ``bad``) for bytes that are not UTF-8, invalid JSON, a non-object, or an event
    with no value in any declared column."""
    position, raw = item
    try:
        line = raw.decode("utf-8-sig")    # a UTF-8 BOM on the first line is not part of the event
    except UnicodeDecodeError as err:
        yield beam.pvalue.TaggedOutput(
            BAD, dead_letter(raw.decode("utf-8", "backslashreplace"), f"not UTF-8: {err}", position))
        return
    try:
        event = json.loads(line)
    except ValueError as err:
        yield beam.pvalue.TaggedOutput(BAD, dead_letter(line, f"invalid JSON: {err}", position))
        return
    if not isinstance(event, dict):
        yield beam.pvalue.TaggedOutput(
            BAD, dead_letter(line, f"not a JSON object ({type(event).__name__})", position))
        return
    cleaned = {k: v for k, v in event.items() if k in columns or k == privacy_id}
    # undeclared fields dropped
    if all(_blank(v) for k, v in cleaned.items() if k != privacy_id):
        yield beam.pvalue.TaggedOutput(BAD, dead_letter(line, "no declared values", position))
        return
    if position is not None:
        cleaned[POSITION_FIELD] = position
    yield cleaned


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value == "")


def dead_letter(element: str, reason: str, position: int | None = None) -> dict[str, Any]:
    """This script's dead letters, in the same shape as ``job.private``'s."""
    return {"source": SOURCE, "position": position, "reason": reason, "element": element}


def build_parser() -> argparse.ArgumentParser:
    """The script's own options (anything else goes to Beam)."""
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Any other --option goes to Beam, e.g. --runner direct-multi (2 processes; "
               "--direct_num_workers=N), --runner dask; docs/runners.md. A mistyped option is "
               "refused. Workers log at WARNING unless --default_sdk_harness_log_level is given.")
    ap.add_argument("input", help="JSON-lines events (a path or glob Beam's ReadFromText takes)")
    ap.add_argument("--schema", required=True, help="bundled schema name or YAML/JSON path")
    ap.add_argument("--epsilon", type=float, required=True, help="total ε of the whole job")
    ap.add_argument("--output", required=True, help="output folder")
    ap.add_argument("--rows", type=int, default=None,
                    help="synthetic rows (default: a DP count inside PrivBayes decides)")
    ap.add_argument("--seed", type=int, default=None,
                    help="fixed noise seed: tests/demos only, the manifest says so")
    ap.add_argument("--histogram-column", default=None, help="column released with CatHist")
    ap.add_argument("--tolerance", type=float, default=None,
                    help="CatHist ρ (default: the column's declared open.tolerance, else 0.9)")
    ap.add_argument("--marginals", nargs="+", default=None, metavar="A,B",
                    help="marginals (2-way, or 1-way A), e.g. --marginals age,sex race,income")
    ap.add_argument("--fractions", default=None, type=parse_fractions,
                    help="split of ε, e.g. synthetic=0.6,histogram=0.15,marginals=0.2,count=0.05")
    ap.add_argument("--line-numbers", action="store_true",
                    help="read with fileio.MatchFiles/ReadMatches (one worker per file) so every "
                         "dead letter carries its line number")
    ap.add_argument("--degree", type=int, default=1, help="PrivBayes network degree")
    ap.add_argument("--privacy-id", default=None,
                    help="field naming a person (default: the schema's privacy_id, if any)")
    ap.add_argument("--max-contributions", type=int, default=1,
                    help="events kept per person (with --privacy-id)")
    return ap


def plan(args: argparse.Namespace) -> dict[str, Any]:
    """Public choices of the job: schema, columns, split of ε (nothing reads the data)."""
    schema = bs.load_schema(args.schema)
    hist = args.histogram_column or histogram_column(schema)
    if hist not in schema.names:
        raise ValueError(f"--histogram-column {hist!r} is not declared; columns: {schema.names}")
    if args.marginals:
        pairs = []
        for item in args.marginals:
            pair = tuple(x.strip() for x in item.split(","))
            if len(pair) not in (1, 2) or any(x not in schema.names for x in pair):
                raise ValueError(f"--marginals item {item!r} must be one or two declared columns "
                                 f"A,B; columns: {schema.names}")
            pairs.append(pair)
    else:
        pairs = default_marginals(schema, hist)
    if not pairs:
        raise ValueError(f"schema {schema.name!r} has no column with a declared table of "
                         f"≤ {50 * MAX_PAIR_CELLS} cells; name marginals with --marginals")
    tolerance = args.tolerance
    if tolerance is None and schema.column(hist).tolerance is None:
        tolerance = DEFAULT_TOLERANCE
    fractions = args.fractions or dict(DEFAULT_FRACTIONS)
    shares = {k: args.epsilon * f for k, f in fractions.items()}
    return {"schema": schema, "histogram": hist, "tolerance": tolerance, "pairs": pairs, "fractions": fractions,
            "shares": shares}


def output_files(chosen: dict[str, Any]) -> list[str]:
    """The names this run writes into DIR, fixed by the plan before any data is read."""
    return (["synthetic.parquet", f"histogram_{file_part(chosen['histogram'])}.parquet"]
            + ["marginal_" + "__".join(file_part(c) for c in pair) + ".parquet"
               for pair in chosen["pairs"]] + ["count.parquet", "rejected.jsonl", "manifest.json"])


def stale_files(folder: str, chosen: dict[str, Any]) -> list[str]:
    """Files already in ``folder`` that this run would not overwrite (an earlier run's)."""
    if not os.path.isdir(folder):
        return []
    return sorted(n for n in set(os.listdir(folder)) - set(output_files(chosen))
                  if not n.startswith("beam-temp-"))  # a crashed run's temp folder is no release


def build(p: beam.Pipeline, args: argparse.Namespace, chosen: dict[str, Any]) -> bs.PrivacyJob:
    """Wire the whole job into ``p``; every spend happens here, before any data is read."""
    schema, shares, out = chosen["schema"], chosen["shares"], args.output
    privacy_id = args.privacy_id or schema.privacy_id
    unit = (bs.PrivacyUnit(id_column=privacy_id, max_contributions=args.max_contributions)
            if privacy_id else None)
    job = bs.PrivacyJob(epsilon=args.epsilon, privacy_unit=unit, seed=args.seed,
                        name=f"etl_job {schema.name}")

    if args.line_numbers:
        lines = (p | "MatchEvents" >> fileio.MatchFiles(args.input)
                 | "OpenEvents" >> fileio.ReadMatches()
                 | "NumberLines" >> beam.FlatMap(numbered_lines))
    else:
        lines = (p | "ReadEvents" >> beam.io.ReadFromText(
                    args.input, coder=beam.coders.BytesCoder())
                 | "NoPosition" >> beam.Map(lambda raw: (None, raw)))
    # (line number or None, bytes of one line): decoded per line, so a bad byte is a dead
    # letter, not a crashed run
    parsed = lines | "ParseAndClean" >> beam.FlatMap(
        parse_line, columns=field_names(schema), privacy_id=privacy_id).with_outputs(
        BAD, main="events")
    # events: dict of declared fields; bad: dead-letter dict
    # A parse/filter rejection is a record read and rejected before job.private sees it: add it
    # to the job's exact counts, so the manifest's read = used + rejected + dropped by the bound.
    job.count_rejected(parsed[BAD], source=SOURCE)
    private = parsed["events"] | "MakePrivate" >> job.private(
        schema, source=SOURCE, position_field=POSITION_FIELD if args.line_numbers else None)

    # --- releases: each spends its share now (build time) ---
    synthetic = private | "Synthesize" >> bs.PrivBayes(
        epsilon=shares["synthetic"], rows=args.rows, options={"degree": args.degree})
    hist = private | "Histogram" >> bs.Histogram(
        column=chosen["histogram"], epsilon=shares["histogram"], tolerance=chosen["tolerance"])
    tables = private | "Marginals" >> bs.Marginals(marginals=chosen["pairs"],
                                                   epsilon=shares["marginals"])
    count = private | "Count" >> bs.Count(epsilon=shares["count"])

    def write(rows: beam.PCollection, name: str, arrow) -> None:
        _ = (rows | f"{name}AsDicts" >> beam.Map(lambda r: r._asdict())
             | f"Write{name}" >> beam.io.WriteToParquet(
                 os.path.join(out, f"{name}.parquet"), arrow, num_shards=1,
                 shard_name_template=""))

    write(synthetic, "synthetic", bs.arrow_schema(schema))
    write(hist, f"histogram_{file_part(chosen['histogram'])}", bs.arrow_schema(hist))
    for pair in chosen["pairs"]:
        rows = tables[",".join(pair)]
        write(rows, "marginal_" + "__".join(file_part(c) for c in pair), bs.arrow_schema(rows))
    write(count, "count", bs.arrow_schema(count))

    # dead letters (private): this script's parse/filter rejections + job.private's
    encoded_bad = private.dead_letters | "DeadLettersAsDicts" >> beam.Map(lambda r: r._asdict())
    _ = ((parsed[BAD], encoded_bad) | "AllDeadLetters" >> beam.Flatten()
         | "DeadLettersJson" >> beam.Map(json.dumps, sort_keys=True, default=str)
         | "WriteDeadLetters" >> beam.io.WriteToText(
             os.path.join(out, "rejected.jsonl"), num_shards=1, shard_name_template=""))
    _ = p | "Manifest" >> bs.WriteManifest(job=job, path=os.path.join(out, "manifest.json"))
    return job


def count_summary(manifest_path: str) -> str:
    """The manifest's exact counts as one line: read = used + rejected + dropped by the bound."""
    with FileSystems.open(manifest_path) as fh:
        op = json.loads(fh.read().decode("utf-8"))["operational"]
    return (f"events read {op['rows_read']} = used {op['rows_used']} + rejected "
            f"{op['rows_rejected']} (rejected.jsonl) + dropped by the contribution bound "
            f"{op['rows_dropped_by_bound']}: exact counts, private (manifest 'operational')")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the job; returns 0. Raises ``bs.BudgetExceededError`` before reading on overspending."""
    parser = build_parser()
    args, beam_args = parser.parse_known_args(argv)
    try:  # a mistyped flag (--rowz 10) is refused, never silently handed to Beam
        bs.check_pipeline_args(beam_args, own_flags=[o for a in parser._actions
                                                     for o in a.option_strings if o.startswith("--")])
    except bs.UnknownOptionError as exc:
        parser.error(str(exc))   # exit 2
    try:
        chosen = plan(args)
    except ValueError as exc:  # a bad option value or schema: one line and exit 2, no traceback
        parser.error(str(exc))
    stale = stale_files(args.output, chosen)
    if stale:  # an earlier run's files next to this run's would be read as this run's releases
        parser.error(f"--output {args.output} holds files this run does not write: "
                     f"{', '.join(stale)}; use an empty or new folder")
    total = sum(chosen["fractions"].values())
    print(f"schema {chosen['schema'].name}: ε = {args.epsilon} split "
          + ", ".join(f"{k} {f:g} (ε={chosen['shares'][k]:.4g})"
                      for k, f in chosen["fractions"].items()) + f"; fractions sum {total:g}")
    print(f"histogram column {chosen['histogram']!r}; marginals {chosen['pairs']}")
    if not any(a.startswith("--default_sdk_harness_log_level") for a in beam_args):
        beam_args = [*beam_args, "--default_sdk_harness_log_level=WARNING"]  # quiet workers
    p = beam.Pipeline(options=bs.pipeline_options(beam_args))
    try:
        job = build(p, args, chosen)  # raises here, before the pipeline runs, if E is overspent
    except bs.BudgetExceededError:
        raise
    except (ValueError, OSError) as exc:  # ε, --rows, --degree, input files: exit 2, no traceback
        parser.error(str(exc))
    os.makedirs(args.output, exist_ok=True)
    p.run().wait_until_finish()
    print(f"spent ε = {job.accountant.spent_epsilon:.6g} of {args.epsilon}; "
          f"outputs and manifest in {args.output}")
    print(count_summary(os.path.join(args.output, "manifest.json")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
