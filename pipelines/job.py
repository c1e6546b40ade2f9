"""Job-level steps of the public API: full synthesis on a private collection, and the manifest.

* :class:`Synthesize` (and its named forms :class:`IndependentSynthesis`, :class:`PrivBayes`,
  :class:`SBHG`, :class:`PlausibleDeniability`) runs a registered synthesis method
  (:mod:`beamsynth.pipelines.methods.registry`) on a :class:`~beamsynth.transforms.private.PrivateCollection`
  and returns synthetic records as schema'd ``beam.Row``s. Its ε (and δ) is spent on the job's
  accountant when it is applied, under step names ``<label>/<part>``; with ``rows=None`` a DP
  record count takes ``count_fraction`` of its ε.
* :class:`WriteManifest` writes the job's one manifest through Beam's ``FileSystems`` (local
  paths, ``gs://``, ...) and returns it as a ``PCollection[dict]``: the public part lists every
  spend of the job; the private ``operational`` part has the exact counts of every input (read,
  rejected, dropped by the contribution bound, used).
"""

from __future__ import annotations

import inspect
import json
import os
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindow, GlobalWindows
from apache_beam.typehints.row_type import RowTypeConstraint

from beamsynth.pipelines.io.manifest import build_manifest
from beamsynth.pipelines.methods.options import check_options
from beamsynth.pipelines.methods.registry import get_method, method_option_names
from beamsynth.pipelines.methods.synthesize import (
    SynthesisConfig,
    SynthesisPlan,
    synthesize_batches,
)
from beamsynth.pipelines.methods.wording import Vocabulary
from beamsynth.schemas.schema import EncodedBatch
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant, PureDP, as_budget, check_rows
from beamsynth.transforms.conventions import typed_boundary
from beamsynth.transforms.outputs import record_type, table_order, table_rows
from beamsynth.transforms.private import (
    PrivacyJob,
    PrivateCollection,
    PrivateTransform,
    _keywords_checked,
    check_epsilon,
    release_rows,
    window_row_type,
)
from beamsynth.transforms.synthesis import DEFAULT_SHARD_ROWS
from beamsynth.transforms.windows import iso_seconds

__all__ = ["IndependentSynthesis", "PlausibleDeniability", "PrivBayes", "SBHG", "Synthesize",
           "WriteManifest", "method_option_names"]


def _noise_text(details: Mapping[str, Any]) -> str:
    """A spend's noise for display data, from its planned details (public, known when built):
    its scale, a scale per table, or, where the scale is chosen later (per privately chosen
    table) or the mechanism has none (permute-and-flip, exponential mechanism), its sensitivity
    and ε per use; plausible's test, its invocations. Before H81 only a plain ``scale`` showed,
    so 1-way marginals, PrivBayes tables and every selection showed an ε alone."""
    if "scale" in details:
        return f" scale {_scale_text(details['scale'])}"
    if "scale_per_table" in details:
        return f" scale {_scale_text(details['scale_per_table'])} per table"
    if "sensitivity_per_table" in details:
        return (f" sensitivity {_scale_text(details['sensitivity_per_table'])} per table, "
                "scales set with the privately chosen tables")
    if "sensitivity" in details:
        per = next((f", ε {_scale_text(details[k])} per {k.removeprefix('epsilon_per_')}"
                    for k in ("epsilon_per_step", "epsilon_per_pick", "epsilon_per_draw")
                    if k in details), "")
        return f" sensitivity {_scale_text(details['sensitivity'])}{per}"
    if "C" in details:
        return f" {_scale_text(details['C'])} test invocations"
    return ""


def _scale_text(scale: Any) -> str:
    """A spend's noise scale for display data: one number, or a few numbers (e.g. one per
    refinement round or table), never a data value."""
    if isinstance(scale, (list, tuple)):
        parts = [_scale_text(v) for v in scale]
        return "[" + ", ".join(parts[:4]) + (", ..." if len(parts) > 4 else "") + "]"
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        return f"{scale:g}"
    return str(scale)


class _StepAccountant:
    """The job's accountant seen by one method: spends are named ``<step>/<part>``."""

    def __init__(self, job: PrivacyJob | PrivacyAccountant, step: str) -> None:
        self._job, self._step = job, step

    def spend(self, step: str, budget: ApproxDP, *, mechanism: str,
              details: Mapping[str, Any] | None = None) -> ApproxDP:
        return self._job.spend(f"{self._step}/{step}", budget, mechanism=mechanism, details=details)

    def __getattr__(self, name: str) -> Any:
        return getattr(getattr(self._job, "accountant", self._job), name)


class Synthesize(PrivateTransform):
    """DP synthetic records from a private collection with a registered method.

    Args:
      epsilon: ε of this step (model, and the DP row count when ``rows`` is None).
      delta: δ of this step (default 0; ``sbhg`` and ``plausible`` need δ > 0).
      method: ``independent`` (default), ``privbayes``, ``sbhg`` or ``plausible``. Only
        ``bs.Synthesize`` takes it: ``bs.PrivBayes`` etc. name their method and refuse another.
      rows: synthetic records to draw; ``None``: a DP count spending ``count_fraction`` of ε.
      count_fraction: share of ε for the DP count (default 0.05); only with ``rows=None``, as a
        public ``rows`` needs no count.
      options: method options (the CLI's, e.g. ``{"degree": 2}`` for privbayes); unknown names
        are refused.
      typed: return ``{"tables": PCollection[pyarrow.Table], "models": PCollection[SynthesisModel]
        or None}`` instead of rows.

    The guarantee is the method's (its docstring and docs/), for add/remove of one privacy unit
    with the job's contribution bound; synthesis after measurement is post-processing. Output:
    ``PCollection[beam.Row]``, one field per declared column (schema types and nullability).
    """

    method_name = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A named form (``method_name`` set) shows its signature without ``method``."""
        super().__init_subclass__(**kwargs)
        if cls.method_name:
            sig = inspect.signature(Synthesize.__init__)
            cls.__signature__ = sig.replace(parameters=[
                q for name, q in sig.parameters.items() if name not in ("self", "method")])

    def __init__(self, *, epsilon: float, delta: float = 0.0, method: str | None = None,
                 rows: int | None = None, count_fraction: float | None = None,
                 options: Mapping[str, Any] | None = None, shard_rows: int = DEFAULT_SHARD_ROWS,
                 typed: bool = False, label: str | None = None) -> None:
        super().__init__(label)
        if self.method_name and method not in (None, self.method_name):
            get_method(method)  # unknown method: ValueError listing the available ones
            named = {c.method_name: c.__name__ for c in Synthesize.__subclasses__()}
            use = (f"bs.{named[method]}(...) or " if method in named else "")
            raise TypeError(f"bs.{type(self).__name__} always runs method "
                            f"{self.method_name!r} and takes no method ({method!r}); use "
                            f"{use}bs.Synthesize(method={method!r}, ...)")
        method = self.method_name or method or "independent"
        get_method(method)  # unknown method: ValueError listing the available ones
        self._budget = as_budget(check_epsilon(epsilon), delta)
        check_rows(rows)
        if count_fraction is not None and rows is not None:
            raise ValueError(f"count_fraction ({count_fraction!r}) is the DP record count's share "
                             f"of ε, used only with rows=None; with rows={rows!r} nothing is "
                             "counted: drop count_fraction, or pass rows=None")
        count_fraction = 0.05 if count_fraction is None else count_fraction
        if isinstance(count_fraction, bool) or not isinstance(count_fraction, (int, float)) or not (
                0 < count_fraction < 1):
            raise ValueError(f"count_fraction ({count_fraction!r}) must be in (0, 1)")
        # unknown names, kinds and ranges, refused now in the API's words (methods/options.py)
        options = check_options(get_method(method), options, Vocabulary("api"))
        if not isinstance(typed, bool):
            raise TypeError(f"typed ({typed!r}) must be True or False")
        self._method, self._rows, self._fraction = method, rows, float(count_fraction)
        self._options, self._shard_rows, self._typed = options, shard_rows, typed
        self.mechanism = f"synthesis ({method})"
        self.with_input_types(EncodedBatch)

    def default_label(self) -> str:
        return f"Synthesize[{self.method_name or self._method}]"

    def display_data(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism, "epsilon": self._budget.epsilon,
                "delta": self._budget.delta, "rows": str(self._rows),
                "spends": getattr(self, "_spends", "unbound")}

    def bind(self, private: PrivateCollection) -> None:
        job, step, k = private.job, self.label, private.max_contributions
        job.check_fits(step, self._budget)  # names this step when the whole share does not fit
        # spends are staged and made on the job once the method is built, so an option it refuses
        # (a bad target, degree, ...) leaves the job's accountant as it was (H42)
        staged = PrivacyAccountant(total=self._budget)
        acct = _StepAccountant(staged, step)
        count_budget, method_budget = None, self._budget
        if self._rows is None:
            count_budget = PureDP(epsilon=self._budget.epsilon * self._fraction)
            acct.spend("row_count", count_budget, mechanism="discrete Laplace on the record count",
                       details={"sensitivity": k, "scale": k / count_budget.epsilon})
            method_budget = as_budget(self._budget.epsilon - count_budget.epsilon, self._budget.delta)
        seed = job.step_seed(step)
        schema = private.schema
        method = get_method(self._method)(
            schema=schema, accountant=acct, budget=method_budget, max_contributions=k, seed=seed,
            options={**self._options, "rows": self._rows}, vocabulary=Vocabulary("api"))
        cfg = SynthesisConfig(input=private.source, schema=schema, output="", epsilon=self._budget.epsilon,
                              delta=self._budget.delta, method=self._method, rows=self._rows,
                              privacy_id=schema.privacy_id, max_contributions=k, seed=seed,
                              count_fraction=self._fraction, options=self._options,
                              shard_rows=self._shard_rows)
        self._plan = SynthesisPlan(cfg, schema, acct, method, count_budget)  # type: ignore[arg-type]
        for s in staged.spends:
            job.spend(s.step, s.budget, mechanism=s.mechanism, details=s.details)
        self._spends = "; ".join(  # display_data: each part's ε and noise (public, no data)
            s.step.removeprefix(f"{step}/") + f" {s.budget}" + _noise_text(s.details or {})
            for s in staged.spends)
        if not self._typed:
            row_type = record_type(schema)
            self.with_output_types(row_type if private.windows is None else window_row_type(row_type))
        self.record({"method": self._method, "rows": self._rows, "epsilon": self._budget.epsilon,
                     "delta": self._budget.delta, "details": method.details()})
        hook = getattr(method, "run_time_details", None)  # a picklable function of the plan only
        if hook is not None:  # the manifest's run-time figures of this step (WriteManifest)
            _RUN_TIME_HOOKS.setdefault(job, {})[step] = hook

    def expand(self, batches):
        p = self.private
        if p.layout.keys:
            batches = batches | "SchemaColumns" >> beam.Map(p.layout.schema_codes)
            # EncodedBatch of the schema's columns only
        tables, models, _rows = synthesize_batches(batches, self._plan)
        # pyarrow.Table shards of synthetic records
        p.job.count_outputs.append(  # the released rows (the CLI's rows_out; H76), per window (H79)
            tables
            | "CountOut" >> beam.Map(lambda t: ("rows_out", t.num_rows))
            | "KeyCountOut" >> beam.ParDo(_KeyRunCountFn(self.label, _OUTPUT))
            | "GlobalCountOut" >> beam.WindowInto(GlobalWindows()))
        # ((OUTPUT, step), (window_start or None, "rows_out"), rows of one shard): WriteManifest's
        # release.rows_out and rows_out_per_window
        run_counts = getattr(self._plan.method, "run_counts", None)
        if run_counts is not None:  # run-time figures for the manifest (e.g. plausible's released)
            p.job.count_outputs.append(
                run_counts
                | "KeyRunCounts" >> beam.ParDo(_KeyRunCountFn(self.label))
                | "GlobalRunCounts" >> beam.WindowInto(GlobalWindows()))
            # ((MECHANISM, step), (window_start or None, field), n): WriteManifest's exact counts
        if self._typed:
            return {"tables": tables, "models": models}
        # A method releasing its records itself (plausible: at most its declared candidates) is
        # gathered, in label order on every runner (H81); sampling shards become rows in parallel,
        # each shard's rows in sample order: one gather of 1M rows made direct-multi's launcher
        # 4.7x and its worker 3x larger (H82, docs/beam-api.md)
        gather = self._plan.method.releases_records()
        return tables | "ToRows" >> release_rows(p, table_rows, p.schema,
                                                 row_type=record_type(p.schema),
                                                 order=table_order if gather else None)
        # beam.Row per synthetic record ([window_start,] declared columns)


class IndependentSynthesis(Synthesize):
    """:class:`Synthesize` with ``method="independent"``: noisy 1-way marginals of every column
    (discrete Laplace, ε split equally; CatHist for open columns), fitted by Norm-Sub and sampled
    balanced (each cell ⌊N·p⌋ or ⌈N·p⌉ of the N rows, columns shuffled independently; both
    post-processing); ``options={"independent_sampling": "iid"}`` draws i.i.d. rows instead.
    Guarantee: ε-DP (pure, δ unused) for adding or removing one privacy unit (its
    ``max_contributions`` records): ε on the tables, plus the DP row count's share when ``rows``
    is None (basic composition)."""

    method_name = "independent"


class PrivBayes(Synthesize):
    """:class:`Synthesize` with ``method="privbayes"``: a private Bayesian network from noisy
    marginals (seed 004; docs/privbayes.md), pure ε-DP; with ``delta > 0`` and
    ``options={"pb_noise": "gaussian"}`` discrete Gaussian tables under zCDP, converted to (ε, δ).
    Guarantee: for adding or removing one privacy unit (its ``max_contributions`` records), ε-DP,
    or (ε, δ)-DP in the zCDP mode; the manifest's ``noise_mode`` says which ran."""

    method_name = "privbayes"


class SBHG(Synthesize):
    """:class:`Synthesize` with ``method="sbhg"``: hashed full conditionals released by
    stability-based histograms, Gibbs-sampled (seed 002; docs/sbhg.md); needs ``delta > 0``.
    Guarantee: (ε, δ)-DP for adding or removing one privacy unit (its ``max_contributions``
    records); sampling is post-processing."""

    method_name = "sbhg"


class PlausibleDeniability(Synthesize):
    """:class:`Synthesize` with ``method="plausible"``: seed-based candidates released through the
    randomized plausible-deniability test (seed 001; docs/plausible.md); needs a public ``rows``
    and ``delta > 0``. Guarantee: (ε, δ)-DP for adding or removing one privacy unit: the model's
    ε plus Theorem 1 per candidate composed over the public bound on the Poisson(``rows``)
    candidates (refused when built if that does not fit ε, δ; the manifest's
    ``release_guarantee`` states each part)."""

    method_name = "plausible"


# -- the manifest --------------------------------------------------------------------------------
_MECHANISM = "mechanism"
"""First part of the count key of a mechanism's run-time figures (a tuple: never a source name)."""

_OUTPUT = "output"
"""First part of the count key of a ``Synthesize`` step's released rows (``rows_out``)."""

_RUN_TIME_HOOKS: weakref.WeakKeyDictionary[PrivacyJob, dict[str, Any]] = weakref.WeakKeyDictionary()
"""Per job, per ``Synthesize`` step: its method's ``run_time_details(details, totals, per_window,
every_window=)`` (plausible's released rows, privbayes' run-time choices), taken when bound."""


class _KeyRunCountFn(beam.DoFn):
    """``(field, n)`` of one step, in its window → ``((kind, step), (window_start, field), n)``
    (``window_start`` ISO 8601 for a declared window, ``None`` on the global window; ``kind``
    :data:`_MECHANISM` for a method's run-time figures, :data:`_OUTPUT` for released rows)."""

    def __init__(self, step: str, kind: str = _MECHANISM) -> None:
        self._step, self._kind = step, kind

    def process(self, item: tuple[str, int], window=beam.DoFn.WindowParam):
        start = None if isinstance(window, GlobalWindow) else iso_seconds(window.start)
        field, n = item
        yield (self._kind, self._step), (start, field), int(n)


class _MergeCountsFn(beam.CombineFn):
    """``(source, field, rows)`` → ``{source: {field: total}}`` (exact, private)."""

    def create_accumulator(self) -> dict[str, dict[str, int]]:
        return {}

    def add_input(self, acc: dict[str, dict[str, int]], item: tuple[str, str, int]
                  ) -> dict[str, dict[str, int]]:
        source, field, n = item
        acc.setdefault(source, {})
        acc[source][field] = acc[source].get(field, 0) + int(n)
        return acc

    def merge_accumulators(self, accs: Iterable[dict[str, dict[str, int]]]
                           ) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for acc in accs:
            for source, fields in acc.items():
                for field, n in fields.items():
                    self.add_input(out, (source, field, n))
        return out

    def extract_output(self, acc: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
        return acc


def _operational(counts: Mapping[str, Mapping[str, int]], sources: list[str],
                 rounded: Iterable[str] = ()) -> dict[str, Any]:
    """Exact counts per source and in all; ``rounded``: sources whose ids of 2**53 or more are
    read as their nearest float (``privacy_ids: rounded`` with an id column), whose encoded
    records with such an id are ``privacy_ids_rounded`` (in all; H71)."""
    per = {}
    for s in sources:
        c = counts.get(s, {})
        read, rejected = c.get("read", 0), c.get("rejected", 0)
        encoded, used = c.get("encoded", 0), c.get("used", 0)
        per[s] = {"read": read, "rejected": rejected, "dropped_by_bound": encoded - used,
                  "used": used}
    out = {"rows_read": sum(v["read"] for v in per.values()),
           "rows_rejected": sum(v["rejected"] for v in per.values()),
           "rows_dropped_by_bound": sum(v["dropped_by_bound"] for v in per.values()),
           "rows_used": sum(v["used"] for v in per.values()), "sources": per}
    if rounded:
        out["privacy_ids_rounded"] = sum(counts.get(s, {}).get("privacy_ids_rounded", 0)
                                         for s in sources if s in rounded)
    return out


def windows_section(windows: Any, accountant: Mapping[str, Any]) -> dict[str, Any] | None:
    """The manifest's declared-windows part: the declaration, the guarantee and every window's
    spends (the job's spends, each made once per declared window). ``None``: global window."""
    if windows is None:
        return None
    spends = [{"step": s["step"], "epsilon": s["epsilon"], "delta": s["delta"]}
              for s in accountant.get("spends", [])]
    starts = windows.window_starts()
    per_window = None if starts is None else [
        {"start": iso_seconds(t), "end": iso_seconds(t + windows.seconds), "spends": spends}
        for t in starts]
    return {"declared": windows.describe(), "windows": None if starts is None else len(starts),
            "budget": "per window: every spend below is made once in each declared window",
            "guarantee": ("each window's releases are (ε, δ)-DP for adding/removing one privacy "
                          "unit's records in that window; a unit with records in w windows is "
                          "protected at (w·ε, w·δ) (sequential composition); windows hold "
                          "disjoint records, so units confined to one window get (ε, δ)"),
            "per_window": per_window if per_window is not None else
            "every window from the declared start on, each with the job's spends"}


def _run_time_mechanisms(counts: Mapping[Any, Mapping[Any, int]], public: Mapping[str, Any]
                         ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every mechanism's public details with its run-time figures (a method's
    ``run_time_details`` over the counts its step registered: public part, private part), and
    the private parts by step. Windowed jobs list every declared window, empty ones as zeros;
    an open-ended range lists the windows that have counts (``every_window=False``)."""
    windows = public.get("windows")
    starts = None if windows is None else windows.start_labels()
    mechanisms, private = [], {}
    hooks = public.get("run_time", {})
    for entry in public["mechanisms"]:
        method = entry.get("method")  # a Synthesize step records mechanism "synthesis (<method>)"
        hook = (hooks.get(entry["step"]) if entry.get("mechanism") == f"synthesis ({method})"
                else None)
        if hook is None:
            mechanisms.append(entry)
            continue
        mine = counts.get((_MECHANISM, entry["step"]), {})  # {(window_start, field): n}
        totals: dict[str, int] = {}
        per_window: dict[str, dict[str, int]] | None = None
        if windows is not None:
            per_window = {s: {} for s in (starts or sorted({w for w, _ in mine}))}
        for (start, field), n in mine.items():
            totals[field] = totals.get(field, 0) + n
            if per_window is not None:
                per_window.setdefault(start, {})[field] = n
        details, mine_private = hook(entry["details"], totals, per_window,
                                     every_window=starts is not None)
        if mine_private:  # exact figures only (privbayes' choices are all public: none)
            private[entry["step"]] = mine_private
        mechanisms.append({**entry, "details": details})
    return mechanisms, private


def assemble_manifest(counts: Mapping[str, Mapping[str, int]], *, public: Mapping[str, Any],
                      path: str) -> dict[str, Any]:
    """The job manifest from the public facts (taken at build time) and the exact counts."""
    sources = [s["source"] for s in public["sources"]]
    mechanisms, private = _run_time_mechanisms(counts, public)
    mechanisms, rows_out, per_window = _rows_out(counts, mechanisms, public.get("windows"))
    modes = {s["source"]: s.get("privacy_ids") for s in public["sources"]}
    operational = _operational(counts, sources, [s for s, m in modes.items() if m == "rounded"])
    if private:
        operational["mechanisms"] = private
    first = public["sources"][0] if public["sources"] else {"schema": None, "schema_sha256": None}
    return build_manifest(
        command="api", method="; ".join(m["step"] for m in public["mechanisms"]),
        inputs=sources, outputs={"manifest": path}, schema_name=first["schema"],
        schema_fingerprint=first["schema_sha256"], accountant=public["accountant"],
        seed=public["seed"], privacy_unit=public["privacy_unit"],
        counts={**operational, "rows_out": rows_out, "rows_out_per_window": per_window},
        privacy_ids=_id_modes(modes),
        details={"job": public["job"], "mechanisms": mechanisms,
                 "sources": public["sources"],
                 "windows": windows_section(public.get("windows"), public["accountant"])})


def _rows_out(counts: Mapping[Any, Mapping[Any, int]], mechanisms: list[dict[str, Any]],
              windows: Any = None
              ) -> tuple[list[dict[str, Any]], int | None, dict[str, int] | None]:
    """Each ``Synthesize`` step's released rows (``rows_out`` in its entry) and their sum, the
    manifest's ``release.rows_out`` as the CLI's: the rows the step output (its DP count, or the
    declared ``rows``, or plausible's released candidates), never an input count. ``None``: the
    job synthesizes nothing (its counts and tables have no row total). Under declared windows,
    also per window (``rows_out_per_window``: every declared window's start, in order, 0 where
    nothing was released; the step's and the sum over steps): the rows of each window's
    released tables, as ``synthesize --stream`` states them in each window's manifest (H79)."""
    starts = None if windows is None else windows.start_labels()
    total, out, every = None, [], None
    for entry in mechanisms:
        if entry.get("mechanism") == f"synthesis ({entry.get('method')})":
            mine = counts.get((_OUTPUT, entry["step"]), {})  # {(window_start, "rows_out"): n}
            n = sum(int(v) for v in mine.values())
            entry, total = {**entry, "rows_out": n}, (total or 0) + n
            if starts is not None:
                per = {s: int(mine.get((s, "rows_out"), 0)) for s in starts}
                entry["rows_out_per_window"] = per
                every = {s: (every or {}).get(s, 0) + per[s] for s in starts}
        out.append(entry)
    return out, total, every


def _id_modes(modes: Mapping[str, str | None]) -> str | None:
    """The sources' one ``privacy_ids`` mode, or where to find them when they differ."""
    found = sorted({m for m in modes.values() if m is not None})
    return None if not found else found[0] if len(found) == 1 else \
        "per source: " + ", ".join(f"{s} {m}" for s, m in modes.items() if m is not None)


MANIFEST_ROW_TYPE = RowTypeConstraint.from_fields(
    [("path", str), ("created", str), ("release", str), ("operational", str)])
_MANIFEST_OUTPUTS = {"dict": dict, "json": str, "row": MANIFEST_ROW_TYPE}


def manifest_text(manifest: Mapping[str, Any], path: str = "") -> str:
    """The manifest file's JSON text (without the final newline, which ``WriteToText`` adds)."""
    return json.dumps(manifest, indent=2, ensure_ascii=False, default=str)


def manifest_row(manifest: Mapping[str, Any], path: str) -> beam.Row:
    """``Row(path, created, release, operational)``: the public ``release`` and the private
    ``operational`` part as JSON text (one flat row for table sinks)."""
    def text(part: Any) -> str:
        return json.dumps(part, ensure_ascii=False, default=str)
    return beam.Row(path=path, created=str(manifest.get("created")),
                    release=text(manifest.get("release")),
                    operational=text(manifest.get("operational")))


def write_manifest_file(manifest: Mapping[str, Any], path: str) -> dict[str, Any]:
    """Write JSON through ``FileSystems`` (a temporary file renamed over ``path``)."""
    data = (manifest_text(manifest) + "\n").encode("utf-8")
    _check_manifest_path(path)
    tmp = f"{path}.tmp"
    with FileSystems.create(tmp) as fh:
        fh.write(data)
    try:  # local rename replaces the file atomically; object stores copy over it
        FileSystems.rename([tmp], [path])
    except Exception:  # noqa: BLE001 - a file system that refuses to overwrite
        FileSystems.delete([path])
        FileSystems.rename([tmp], [path])
    return dict(manifest)


def _check_manifest_path(path: str) -> None:
    """A local manifest path must be a regular file or not exist (never a device or folder)."""
    if "://" not in path and os.path.exists(path) and not os.path.isfile(path):
        raise ValueError(f"manifest path ({path!r}) exists and is not a regular file")


class WriteManifest(beam.PTransform):
    """``p | bs.WriteManifest(job=job, path=...)``: the job's one manifest, written and returned.

    Apply it after every mechanism of the job: it takes the job's spends when the pipeline is
    built, and any later spend raises. Output: ``PCollection[dict]`` with the manifest (one
    element), written to ``path`` through ``FileSystems`` when the pipeline runs. The
    ``operational`` part (exact counts) is private: keep it with the data owner.

    ``output="json"``: the element is instead the file's JSON text (``str``, for
    ``beam.io.WriteToText``); ``output="row"``: a schema'd ``beam.Row(path, created, release,
    operational)``, the two parts as JSON text (``MANIFEST_ROW_TYPE``, for ``WriteToJson``,
    ``WriteToCsv``, ``WriteToParquet``, BigQuery).
    """

    @_keywords_checked  # bs.WriteManifest(job, "m.json") names its keywords
    def __init__(self, *, job: PrivacyJob, path: str, output: str = "dict",
                 label: str | None = None) -> None:
        super().__init__(label)
        if not isinstance(job, PrivacyJob):
            raise TypeError(f"job must be a PrivacyJob, got {type(job).__name__} ({job!r})")
        if not isinstance(path, str) or not path:
            raise ValueError(f"path ({path!r}) must be a non-empty path or URL")
        if output not in _MANIFEST_OUTPUTS:
            raise ValueError(
                f"output ({output!r}) must be one of {list(_MANIFEST_OUTPUTS)}: 'dict' (the "
                "manifest as a dict), 'json' (its JSON text, for beam.io.WriteToText) or 'row' "
                "(a schema'd beam.Row, for WriteToJson/WriteToCsv/WriteToParquet)")
        _check_manifest_path(path)
        self._job, self._path, self._output = job, path, output
        self.with_output_types(_MANIFEST_OUTPUTS[output])

    def default_label(self) -> str:
        return "WriteManifest"

    def display_data(self) -> dict[str, Any]:
        acct = self._job.accountant
        return {"path": self._path, "epsilon_total": acct.total.epsilon,
                "delta_total": acct.total.delta, "spends": len(acct.spends),
                "output": self._output}

    @typed_boundary  # typed at the public step, not at each inner one
    def expand(self, pbegin):
        job = self._job
        job.freeze(self.label)
        public = {"job": job.name, "accountant": job.accountant.to_dict(), "seed": job.seed,
                  "privacy_unit": job.unit.to_dict(), "mechanisms": list(job.mechanisms),
                  "sources": list(job.sources), "windows": job.windows,
                  "run_time": dict(_RUN_TIME_HOOKS.get(job, {}))}
        if job.disjoint:  # declared by the user, not checked: parallel composition with other jobs
            public["disjoint_from_other_jobs"] = True
        p = pbegin.pipeline
        if job.windows is not None and job.windows.declared_end is None:
            raise ValueError(
                f"{self.label}: job {job.name!r} declares open-ended windows ({job.windows!r}, "
                "end=None): every release step is driven by heartbeats that never stop "
                "(PeriodicImpulse), so the pipeline never finishes and a manifest would never be "
                "written, even on a bounded input; declare the range's end "
                "(bs.DeclaredWindows(start=..., end=..., size=...)) or drop bs.WriteManifest (the "
                "spends are known now: job.accountant.to_dict(); docs/beam-api.md, windows)")
        if any(not c.is_bounded for c in job.count_outputs):
            raise ValueError(
                f"{self.label}: job {job.name!r} reads an unbounded source; its manifest's exact "
                "counts are never final (a record late for its window is a dead letter until "
                "a year after the window's release) and records outside the declared windows "
                "belong to none, so bs.WriteManifest needs a bounded pipeline; the spends are "
                "known now: job.accountant.to_dict() (docs/beam-api.md, windows)")
        named = [s["source"] for s in job.sources]
        stray = [s for s in job.rejected_sources if s not in named]
        if stray:  # its counts would match no input of the manifest and be lost
            raise ValueError(
                f"{self.label}: job.count_rejected(source={stray[0]!r}) names no source of "
                f"job.private (sources: {named}); give both the same name, "
                "job.private(schema, source=...), so the manifest counts those records as read "
                "and rejected (read = used + rejected + dropped by the bound)")
        if job.count_outputs:
            items = tuple(job.count_outputs) | "JoinCounts" >> beam.Flatten()
        else:
            items = p | "NoInputs" >> beam.Create([])
        # (source, field, rows)
        counts = items | "SumCounts" >> beam.CombineGlobally(_MergeCountsFn())
        # {source: {field: rows}} (one: global window)
        manifests = (counts
                     | "Assemble" >> beam.Map(assemble_manifest, public=public, path=self._path)
                     | "Write" >> beam.Map(write_manifest_file, self._path).with_output_types(dict))
        # dict: the manifest
        if self._output == "dict":
            return manifests
        as_output = manifest_text if self._output == "json" else manifest_row
        return manifests | "As" + self._output.title() >> beam.Map(
            as_output, path=self._path).with_output_types(_MANIFEST_OUTPUTS[self._output])
        # str: the file's JSON text, or Row(path, created, release, operational)
