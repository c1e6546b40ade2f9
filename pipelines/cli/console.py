"""The operator's console: input-check options of the commands and what they print (stderr only).

**After the run** (:func:`rejection_report`, :func:`count_line`): the operator's console (stderr,
never a released file) gets honest counts — rows read, rejected, dropped by the contribution
bound, used — and a warning with the top reasons and example positions when more than a set share
of the rows was rejected.

**Options** (:func:`add_check_arguments`, :func:`cli_checks`, :func:`cli_report`):
``--allow-empty``, ``--warn-rejected``, ``--fail-on-rejected`` (the counting pre-pass,
:func:`count_rejections`), and :func:`method_advice` (docs/methods.md, "Choosing a method").
Whole-file checks before a run are :mod:`beamsynth.pipelines.io.preflight`.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from apache_beam.io.filesystems import FileSystems

from beamsynth.pipelines.io.manifest import manifest_path
from beamsynth.pipelines.io.preflight import (
    PreflightError,
    PreflightReport,
    Required,
    check_inputs,
    check_outputs,
)
from beamsynth.pipelines.io.records import rejected_path
from beamsynth.schemas.schema import Schema, avro_field_name

__all__ = [
    "CORRELATED_METHODS",
    "CORRELATED_MIN_N_EPSILON",
    "DEFAULT_WARN_REJECTED",
    "add_check_arguments",
    "allowed_columns",
    "check_rejected_fraction",
    "cli_checks",
    "cli_report",
    "count_line",
    "count_rejections",
    "method_advice",
    "rejection_report",
    "summarize_rejected",
]


DEFAULT_WARN_REJECTED = 0.05
"""Share of rejected rows above which the console prints a warning (``--warn-rejected``)."""


# A reason's value: a whole quoted repr, else everything up to the reason's last " is " (a repr
# cut short by the encoders, 60 or 80 characters without its closing quote or brace, holds
# spaces: matching it only up to the first one put the rest of the value on the console; H100),
# else one word.
_VALUE = re.compile(r"value (?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|.*(?= is )|\S+)")
_POSITION = re.compile(r"(line|column|char|bytes|row) \d+(-\d+)?")
_DETAIL = re.compile(r"(alphabet: |length )\S.*?(?=$| exceeds)")


# -- after the run: counts and rejections ---------------------------------------------------------------
def count_line(op: Mapping[str, Any]) -> str:
    """``rows read R, rejected X, dropped by the bound D, used U`` from manifest counts."""
    read, rej = op.get("rows_read"), op.get("rows_rejected")
    dropped = op.get("rows_dropped_by_bound")
    text = f"rows read {read}, rejected {rej}"
    if dropped is not None:
        text += f", dropped by the contribution bound {dropped}"
    return text + f", used {op.get('rows_used')}"


_HINTS = (
    ("outside the declared alphabet", "declare the characters, --map them, or fold case (the default)"),
    ("outside the declared box", "are the coordinate columns swapped, or the box in another order?"),
    ("outside the declared", "compare the declared domain (bounds, case, spelling, rounding of "
                             "maxima) with the data dictionary"),
    ("is not a valid", "is the column's declared type right (integer vs float, date format)?"),
    ("fields but the header has", "check the delimiter and quoting"),
    ("invalid JSON", "is the file JSON Lines (one object per line)?"),
    ("exceeds the declared max_length", "raise --max-length or --on-too-long truncate"),
)


def _hint(reason: str) -> str:
    return next((f" — {h}" for key, h in _HINTS if key in reason), "")


def _normalize(reason: str) -> str:
    """A reason without its value or position, so rows with the same problem group together."""
    return _DETAIL.sub(r"\1…", _POSITION.sub(r"\1 …", _VALUE.sub("value …", reason)))


def summarize_rejected(path: str, *, limit: int = 200_000, examples: int = 3
                       ) -> tuple[Counter, dict[str, list[str]], int]:
    """(count per normalized reason, example positions per reason, lines read) of a dead-letter
    file (at most ``limit`` lines are read)."""
    counts: Counter = Counter()
    where: dict[str, list[str]] = {}
    n = 0
    try:
        fh = FileSystems.open(path, compression_type="uncompressed")
    except Exception:
        return counts, where, 0
    with fh:
        for raw in io.TextIOWrapper(fh, encoding="utf-8", errors="replace"):
            if n >= limit:
                break
            n += 1
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            reason = _normalize(str(rec.get("reason", "?")))
            counts[reason] += 1
            ex = where.setdefault(reason, [])
            if len(ex) < examples:
                pos = rec.get("line") if rec.get("line") is not None else rec.get("row")
                label = "line" if rec.get("line") is not None else "row"
                ex.append(f"{rec.get('source')}:{label} {pos}" if pos is not None else str(rec.get("source")))
    return counts, where, n


def rejection_report(op: Mapping[str, Any], rejected_file: str, *, warn: float = DEFAULT_WARN_REJECTED,
                     top: int = 3, limit: str = "--warn-rejected") -> str | None:
    """The console warning when more than ``warn`` of the rows read were rejected, else None
    (``limit`` names the threshold: the option that sets it)."""
    read, rej = op.get("rows_read"), op.get("rows_rejected")
    if not read or rej is None or rej / read <= warn:
        return None
    counts, where, n = summarize_rejected(rejected_file)
    lines = [f"warning: {rej} of {read} rows ({rej / read:.1%}) were rejected "
             f"(more than {limit} {warn:g}); the release is built from the rest. "
             f"Top reasons{'' if n >= rej else f' (first {n} dead letters)'}:"]
    for reason, c in counts.most_common(top):
        lines.append(f"  {c} × {reason}  (e.g. {'; '.join(where[reason])}){_hint(reason)}")
    lines.append(f"  all dead letters: {rejected_file}")
    return "\n".join(lines)


def check_rejected_fraction(read: int | None, rejected: int | None, limit: float, *, source: str) -> None:
    """Raise :class:`PreflightError` when more than ``limit`` of the rows read are rejected
    (``--fail-on-rejected``; an operator-side health check, see docs/methods.md)."""
    if read is None or rejected is None:
        raise PreflightError(f"{source}: --fail-on-rejected needs row counts, which this runner "
                             "does not report")
    if read and rejected / read > limit:
        raise PreflightError(f"{source}: {rejected} of {read} rows ({rejected / read:.1%}) would be "
                             f"rejected, more than --fail-on-rejected {limit:g}; nothing was "
                             "released and no budget spent")


def count_rejections(build: Callable[[Any], Any], options: Any) -> tuple[int | None, int | None]:
    """(rows read, rows rejected) of a read-and-encode-only pipeline wired by ``build(p)``: the
    ``--fail-on-rejected`` pre-pass. Nothing is measured or written; no budget is spent."""
    import apache_beam as beam

    from beamsynth.pipelines.io.metrics import run_counters

    p = beam.Pipeline(options=options)
    build(p)
    result = p.run()
    result.wait_until_finish()
    totals = run_counters(result)  # every beamsynth counter of the pass, by name
    if totals is None:  # a runner without metrics
        return None, None
    return totals.get("rows_read", 0), (totals.get("rows_rejected_unparseable", 0)
                                        + totals.get("rows_rejected_domain", 0))


# -- command-line options and advice ----------------------------------------------------------------------
def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"FRACTION ({text!r}) must be a number in [0, 1]") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"FRACTION ({text!r}) must be in [0, 1]")
    return value


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    """``--allow-empty``, ``--warn-rejected``, ``--fail-on-rejected`` (shared by the commands)."""
    g = parser.add_argument_group("input checks (docs/methods.md)")
    g.add_argument("--allow-empty", action="store_true",
                   help="release even when the input has no data record (default: an empty or "
                        "header-only input is an error, exit status 2)")
    g.add_argument("--warn-rejected", type=_fraction, default=DEFAULT_WARN_REJECTED, metavar="FRACTION",
                   help="warn on the console (never in released files) with the top reasons when "
                        f"more than FRACTION of the rows are rejected (default {DEFAULT_WARN_REJECTED:g})")
    g.add_argument("--fail-on-rejected", type=_fraction, default=None, metavar="FRACTION",
                   help="operator health check: first count the rows the schema rejects (one extra "
                        "read, nothing released) and exit with status 2 if more than FRACTION are; "
                        "makes whether a release happens depend on the data (docs/methods.md)")


def allowed_columns(schema: Schema) -> list[str] | None:
    """The only columns an input may have (schema ``extra_columns: reject``), else None."""
    if schema.extra_columns != "reject":
        return None
    return list(schema.names) + ([schema.privacy_id] if schema.privacy_id else [])


def ignored_columns_note(report: PreflightReport, schema: Schema,
                         required: Sequence[Required]) -> str | None:
    """Which input header columns ``extra_columns: ignore`` leaves out of the output (e.g. a
    column the dictionary declared no domain for, so the drafted schema skipped it), else None.
    Header names only (the file's structure, console only), never a value."""
    if schema.extra_columns != "ignore":
        return None
    wanted = {r.name for r in required} | {avro_field_name(r.name) for r in required}
    extra = list(dict.fromkeys(h for f in report.files for h in (f.columns or ()) if h not in wanted))
    if not extra:
        return None
    names = ", ".join(repr(h) for h in extra)
    noun = "column" if len(extra) == 1 else "columns"
    verb = "is" if len(extra) == 1 else "are"
    return (f"input {noun} {names} {verb} not in schema {schema.name!r} and {verb} not synthesized "
            "(extra_columns: ignore); declare a domain for it to keep it (docs/schema-guide.md)")


CORRELATED_METHODS = ("privbayes", "sbhg", "plausible")
CORRELATED_MIN_N_EPSILON = 400
"""Per synthesized column: below ``n·ε / columns`` of this the correlated methods lost to (or
tied with) independent marginals on Adult subsamples (docs/methods.md, 'Choosing a method')."""


def method_advice(*, method: str, epsilon: float, rows: int | None, columns: int,
                  sizing: str | None = None) -> str | None:
    """Which method fits n (``--rows`` or the released DP row count: public), ε and the number of
    synthesized columns, when the chosen correlated method is outside its regime; else None.

    Each of the ``columns`` tables a method measures gets about ε/columns, so its signal-to-noise
    grows with ``n·ε / columns``; the threshold is :data:`CORRELATED_MIN_N_EPSILON`. PrivBayes with
    ``--pb-sizing auto`` (``sizing`` None or "auto", the default) is not advised against: it sizes
    its own model from n̂·ε (1-way tables plus a forest of affordable pairs below its threshold;
    docs/privbayes.md), and on COMPAS (5,050 rows, 15 columns, ε = 0.5–2) it beat independent
    marginals on TVD2/TVD3 by up to 44% / 49% where this note used to tell users to switch.
    """
    if method not in CORRELATED_METHODS or rows is None or not epsilon > 0 or columns < 1:
        return None
    if method == "privbayes" and (sizing or "auto") == "auto":
        return None
    need = CORRELATED_MIN_N_EPSILON * columns
    if rows * epsilon >= need:
        return None
    return (f"--method {method} with about {rows} rows at ε={epsilon:g} over {columns} columns "
            f"(n·ε ≈ {rows * epsilon:.0f} < {need} = {CORRELATED_MIN_N_EPSILON} per column): correlated "
            "methods need more data or budget; --method independent usually gives better marginals "
            "here (docs/methods.md, 'Choosing a method')")


def cli_checks(command: str, args: argparse.Namespace, options: Any, *, required: Sequence[Required],
               reject_extra: Sequence[str] | None = None,
               read: Callable[[Any], Any] | None = None,
               outputs: Sequence[str] = ()) -> PreflightReport:
    """A command's pre-flight: ``args.output``, its manifest and dead letters (and ``outputs``)
    must not be folders (:func:`check_outputs`), :func:`check_inputs` on ``args.input``
    (warnings to stderr), then, with ``--fail-on-rejected``, the counting pre-pass over the
    pipeline ``read(p)`` wires."""
    check_outputs([args.output, manifest_path(args.output), rejected_path(args.output),
                   *outputs])
    report = check_inputs(args.input, required=required, reject_extra=reject_extra,
                          allow_empty=args.allow_empty)
    for w in report.warnings:
        print(f"beamsynth {command}: warning: {w}", file=sys.stderr)
    if args.fail_on_rejected is not None and read is not None:
        check_rejected_fraction(*count_rejections(read, options), args.fail_on_rejected, source=args.input)
    return report


def cli_report(command: str, args: argparse.Namespace, op: Mapping[str, Any], rejected_file: str) -> None:
    """The ``--warn-rejected`` warning on stderr after a run (private console only)."""
    warning = rejection_report(op, rejected_file, warn=args.warn_rejected)
    if warning:
        print(f"beamsynth {command}: {warning}", file=sys.stderr)
