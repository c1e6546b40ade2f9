"""Declarative releases: one YAML file → validated plan → ledger reservation → one release folder.

A release config (see ``docs/releases.md`` and :data:`RELEASE_CONFIG_SCHEMA`) names the inputs,
schemas, privacy unit, per-table mechanism and parameters, the release's total budget, output
formats, the release folder and the privacy ledger with a budget policy per data source.

:func:`load_release_config` validates the whole file **before any data is read** — unknown keys,
schemas and their domains, methods, per-column options, overspend — and reports problems with the
YAML path (``tables[1].columns.age.epsilon``). :func:`plan_release` then builds every table's
:class:`~beamsynth.pipelines.methods.synthesize.SynthesisPlan` (all spends are made here, by the methods
themselves), and :func:`run_release` reserves the spends in the
:class:`~beamsynth.pipelines.releases.ledger.PrivacyLedger`, runs the pipelines into a hidden temp folder,
publishes it with one atomic rename and commits the reservation.

Release folder layout::

    FOLDER/release.json               public: what was released, every spend, ledger entry
    FOLDER/public/TABLE.FORMAT        the synthetic tables (DP)
    FOLDER/public/TABLE.model.json    the fitted model's description (post-processing of DP outputs)
    FOLDER/public/report.html         public report: built from the DP outputs only
    FOLDER/private/TABLE.manifest.json  full manifest incl. exact, non-DP operational counts
    FOLDER/private/TABLE.rejected.jsonl dead-letter rows (raw private data)
    FOLDER/private/report.html        quality report with private statistics (data owner only)

Publish ``public/`` and ``release.json``; keep ``private/`` with the data owner.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import glob
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beamsynth.pipelines.io import filesystem as fs
from beamsynth.pipelines.io.encode import reader_privacy_ids
from beamsynth.pipelines.io.manifest import SEEDED_NOTE, build_manifest, write_json_atomic
from beamsynth.pipelines.io.preflight import check_table_inputs
from beamsynth.pipelines.io.records import METRICS_NAMESPACE, empty_input_note, rejected_path
from beamsynth.pipelines.io.write import WriteTables
from beamsynth.pipelines.methods.progress import Progress
from beamsynth.pipelines.methods.registry import method_option_names
from beamsynth.pipelines.methods.synthesize import (
    SynthesisConfig,
    SynthesisPlan,
    build_synthesis,
    counter_value,
    plan_synthesis,
)
from beamsynth.pipelines.methods.wording import Vocabulary
from beamsynth.pipelines.releases.config import ReleaseConfig, ReleaseConfigError, TableSpec
from beamsynth.pipelines.releases.ledger import (
    RELEASE_MARKER,
    LedgerError,
    LedgerSpend,
    PrivacyLedger,
    temp_folder,
)
from beamsynth.runners.presets import is_beam_dask
from beamsynth.schemas.tables import arrow_schema_for
from beamsynth.transforms.budget import BudgetExceededError
from beamsynth.transforms.noise import child_seed

__all__ = [
    "ReleasePlan",
    "plan_release",
    "public_night",
    "run_release",
]


@dataclass
class ReleasePlan:
    """A release whose every spend is made (nothing read yet)."""

    config: ReleaseConfig
    plans: dict[str, SynthesisPlan]
    spends: list[LedgerSpend] = field(default_factory=list)


# -- planning --------------------------------------------------------------------------------------
def table_seed(cfg: ReleaseConfig, t: TableSpec) -> int | None:
    """A demo release's seed for one table (``None`` unless ``seed`` is set, demo only): derived
    from the release's seed and the table's name, so two tables never share a noise stream (one
    seed for all made the difference of two tables' DP counts exact; H77). Each table's manifest
    states its own seed: ``beamsynth synthesize --seed`` with it gives that table's rows."""
    return None if cfg.seed is None else child_seed(cfg.seed, "release table", t.name)


def _synthesis_config(cfg: ReleaseConfig, t: TableSpec, output: str) -> SynthesisConfig:
    return SynthesisConfig(
        input=list(t.inputs) if len(t.inputs) > 1 else t.inputs[0], schema=t.schema, output=output,
        epsilon=t.epsilon, delta=t.delta, method=t.method, rows=t.rows, privacy_id=t.privacy_id,
        max_contributions=t.max_contributions, seed=table_seed(cfg, t), count_fraction=t.count_fraction,
        options=dict(t.options), empty_input_refused=True)  # check_table_inputs refuses empty inputs


def plan_release(cfg: ReleaseConfig, *, output_root: str | None = None) -> ReleasePlan:
    """Build every table's synthesis plan (all budget spends happen here; no data is read)."""
    root = output_root or cfg.folder
    plans: dict[str, SynthesisPlan] = {}
    spends: list[LedgerSpend] = []
    for t in cfg.tables:
        out = os.path.join(root, "public", f"{t.name}.{t.formats[0]}")
        if t.kind == "histogram":
            spends.append(_plan_histogram(cfg, t))
            continue
        try:
            # messages in the release file's words: a table's keys (rows, delta, method) and its
            # options: {...} are a Beam YAML step's, never the CLI's flags (H76)
            plan = plan_synthesis(_synthesis_config(cfg, t, out), vocabulary=Vocabulary("yaml"))
        except BudgetExceededError as exc:
            raise ReleaseConfigError(f"{t.where}.epsilon", str(exc)) from None
        except (ValueError, TypeError) as exc:
            # refused unless allowed to run NOT DP (plausible's Privacy Test 1 says "pass
            # options: {allow_non_dp: true}"): a release never may, so say that instead
            plan = _plan_if_non_dp_allowed(cfg, t, out)
            if plan is None:
                raise ReleaseConfigError(t.where, str(exc)) from None
        if getattr(plan.method, "non_dp_warning", None):  # e.g. plausible's Privacy Test 1
            raise ReleaseConfigError(
                f"{t.where}.options", f"{plan.method.non_dp_warning} A release publishes DP outputs only: "
                "its ledger can charge no finite ε for it; use `beamsynth synthesize --allow-non-dp`")
        plans[t.name] = plan
        for s in plan.accountant.spends:
            spends.append(LedgerSpend(source=t.source, privacy_unit=t.privacy_unit,
                                      step=f"{t.name}.{s.step}", epsilon=s.budget.epsilon,
                                      delta=s.budget.delta, mechanism=s.mechanism,
                                      privacy_id=t.privacy_id,
                                      max_contributions=t.max_contributions))
    return ReleasePlan(cfg, plans, spends)


def _plan_if_non_dp_allowed(cfg: ReleaseConfig, t: TableSpec, out: str) -> SynthesisPlan | None:
    """The table's plan with ``allow_non_dp`` where its method has that option and the table does
    not set it, if that plan releases records that are NOT DP (then the caller refuses it in the
    release's words); else ``None``. Build time, no data."""
    if t.options.get("allow_non_dp") or "allow_non_dp" not in method_option_names(t.method):
        return None
    sc = _synthesis_config(cfg, t, out)
    try:
        plan = plan_synthesis(dataclasses.replace(sc, options={**sc.options, "allow_non_dp": True}),
                              vocabulary=Vocabulary("yaml"))
    except (ValueError, TypeError, BudgetExceededError):
        return None
    return plan if getattr(plan.method, "non_dp_warning", None) else None


def _histogram_config(cfg: ReleaseConfig, t: TableSpec, output: str) -> Any:
    from beamsynth.pipelines.methods.histogram import HistogramConfig

    return HistogramConfig(
        input=list(t.inputs) if len(t.inputs) > 1 else t.inputs[0],  # type: ignore[arg-type]
        column=t.schema.column(t.column), output=output, epsilon=t.epsilon,
        tolerance=float(t.tolerance), seed=table_seed(cfg, t), privacy_id=t.privacy_id,
        max_contributions=t.max_contributions, empty_input_refused=True)


def _plan_histogram(cfg: ReleaseConfig, t: TableSpec) -> LedgerSpend:
    """Validate a CatHist table as its mechanism would (no data read) and return its spend."""
    from beamsynth.transforms.budget import PureDP
    from beamsynth.transforms.cathist import ColumnCells, DPCategoricalHistogram

    try:
        DPCategoricalHistogram(domain=ColumnCells(t.schema.column(t.column)),
                               budget=PureDP(epsilon=t.epsilon), tolerance=float(t.tolerance),
                               max_contributions=t.max_contributions, seed=table_seed(cfg, t))
    except (ValueError, TypeError) as exc:
        raise ReleaseConfigError(t.where, str(exc)) from None
    return LedgerSpend(source=t.source, privacy_unit=t.privacy_unit,
                       step=f"{t.name}.cathist.{t.column}", epsilon=t.epsilon, delta=0.0,
                       mechanism="CatHist: discrete Laplace on every declared bin, keep ≥ τ",
                       privacy_id=t.privacy_id, max_contributions=t.max_contributions)


def _run_histogram_table(cfg: ReleaseConfig, t: TableSpec, tmp: str, options: PipelineOptions,
                         progress: Progress) -> dict[str, Any]:
    from beamsynth.pipelines.io.manifest import manifest_path
    from beamsynth.pipelines.methods.histogram import run_histogram

    out = fs.join(tmp, "public", f"{t.name}.{t.formats[0]}")
    manifest = run_histogram(_histogram_config(cfg, t, out), options)
    fs.delete_quietly([manifest_path(out)])  # rewritten below, in private/
    _move_rejected(rejected_path(out), fs.join(tmp, "private", f"{t.name}.rejected.jsonl"))
    _remove_sink_temp(tmp)
    manifest["release"]["outputs"] = {t.formats[0]: f"public/{t.name}.{t.formats[0]}",
                                      "rejected": f"private/{t.name}.rejected.jsonl"}
    manifest["release"]["details"].update(table=t.name, source=t.source, kind="histogram",
                                          columns=[t.column])
    manifest["operational"]["inputs"] = list(t.inputs)
    write_json_atomic(fs.join(tmp, "private", f"{t.name}.manifest.json"), manifest)
    op = manifest["operational"]
    progress(f"table {t.name}: read {op.get('rows_read')} rows, released "
             f"{manifest['release'].get('rows_out')} categories of {t.column}")
    return manifest


def run_key(cfg: ReleaseConfig) -> str:
    """The identity of one night's release in the (private) ledger: name and resolved folder."""
    return f"{cfg.name}@{cfg.folder}"


def public_night(cfg: ReleaseConfig) -> str:
    """The night's identity as published in ``release.json``: the name and the folder's own name
    (no path: public files say nothing about the operator's machine)."""
    return f"{cfg.name}@{os.path.basename(cfg.folder.rstrip('/'))}"


# -- running ---------------------------------------------------------------------------------------
def _run_table(plan: SynthesisPlan, t: TableSpec, tmp: str, options: PipelineOptions,
               progress: Progress) -> dict[str, Any]:
    start = time.time()
    p = beam.Pipeline(options=options)
    built = build_synthesis(p, plan, progress_label=None if progress.quiet else t.name)
    if is_beam_dask(options):  # Beam's own DaskRunner runs only the last sink (docs/runners.md)
        return _finish_table(plan, t, tmp, p.run(), start, progress)
    for fmt in t.formats[1:]:
        built["tables"] | f"Write_{fmt}" >> WriteTables(
            fs.join(tmp, "public", f"{t.name}.{fmt}"), column_names=plan.schema.names,
            avro_schema=plan.schema.avro_schema(), arrow_schema=arrow_schema_for(plan.schema))
    model_path = fs.join(tmp, "public", f"{t.name}.model.json")
    if built.get("models") is not None:  # methods releasing records directly have no model
        (built["models"]
         | "Describe" >> beam.Map(lambda m: json.dumps(m.describe(), default=str))
         | "WriteModel" >> beam.io.WriteToText(model_path, num_shards=1, shard_name_template=""))
    return _finish_table(plan, t, tmp, p.run(), start, progress)


def _finish_table(plan: SynthesisPlan, t: TableSpec, tmp: str, result: Any, start: float,
                  progress: Progress) -> dict[str, Any]:
    cfg = plan.config
    result.wait_until_finish()
    plan.method.collect_metrics(result)  # run-time choices from DP counts, as synthesize's (H74)
    rej_parse = counter_value(result, "rows_rejected_unparseable")
    rej_dom = counter_value(result, "rows_rejected_domain")
    used = counter_value(result, "rows_encoded")
    dropped = counter_value(result, "rows_dropped_by_bound") if plan.schema.privacy_id else 0
    counts = {"rows_read": counter_value(result, "rows_read"), "rows_dropped_by_bound": dropped,
              "rows_used": None if used is None or dropped is None else used - dropped,  # after bounding
              "rows_rejected": None if rej_parse is None or rej_dom is None else rej_parse + rej_dom,
              "rows_out": counter_value(result, "rows_synthesized"),
              "seconds": round(time.time() - start, 3)}
    _remove_sink_temp(tmp)  # some runners leave sink temp folders
    _move_rejected(rejected_path(cfg.output), fs.join(tmp, "private", f"{t.name}.rejected.jsonl"))
    outputs = {fmt: f"public/{t.name}.{fmt}" for fmt in t.formats}
    if fs.exists(fs.join(tmp, "public", f"{t.name}.model.json")):
        outputs["model"] = f"public/{t.name}.model.json"
    manifest = build_manifest(
        command="release", method=plan.method.name, inputs=list(t.inputs),
        outputs={**outputs, "rejected": f"private/{t.name}.rejected.jsonl"},
        schema_name=plan.schema.name, schema_fingerprint=plan.schema.fingerprint(),
        accountant=plan.accountant.to_dict(), seed=plan.config.seed,
        privacy_unit={"privacy_id": plan.schema.privacy_id,
                      "max_contributions": cfg.max_contributions,
                      "neighbouring": "add/remove one privacy unit",
                      **empty_input_note(plan.config.empty_input_refused)},
        counts=counts, privacy_ids=reader_privacy_ids(plan.schema.privacy_id),  # as ReadRecords read
        details={"method": plan.method.details(), "rows_requested": cfg.rows, "table": t.name,
                 "source": t.source, "columns": plan.schema.names},
    )
    write_json_atomic(fs.join(tmp, "private", f"{t.name}.manifest.json"), manifest)
    progress(f"table {t.name}: read {counts['rows_read']} rows, rejected {counts['rows_rejected']}"
             f", wrote {counts['rows_out']} synthetic rows ({counts['seconds']:.1f}s)")
    return manifest


def _move_rejected(source: str, destination: str) -> None:
    """Move a table's dead letters into ``private/`` (an empty file if a runner wrote none)."""
    if not fs.exists(source):
        fs.write_bytes_atomic(destination, b"")
        return
    if fs.is_local(destination):
        os.makedirs(os.path.dirname(destination), exist_ok=True)
    FileSystems.rename([source], [destination])


def _remove_sink_temp(tmp: str) -> None:
    """Delete the ``beam-temp-*`` folders Beam's file sinks may leave in ``public/``."""
    public = fs.join(tmp, "public")
    pattern = fs.join(public, "beam-temp-*")
    fs.delete_quietly(glob.glob(pattern) if fs.is_local(public) else _matches(pattern + "/**"))


def _matches(pattern: str) -> list[str]:
    try:
        return [m.path for m in FileSystems.match([pattern])[0].metadata_list]
    except BeamIOError:
        return []


def _release_temp_folder(folder: str, release_id: str) -> str:
    """Where a release is assembled before it is published as ``folder`` (any Beam path)."""
    if fs.is_local(folder):
        return temp_folder(folder, release_id)
    parent, base = fs.split(folder.rstrip("/"))
    return fs.join(parent, f".{base}.tmp-{release_id}")


def _fsync_dir(folder: str) -> None:
    """Make a rename inside ``folder`` durable (best effort where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(folder: str) -> None:
    for root, _dirs, files in os.walk(folder):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def run_release(
    cfg: ReleaseConfig,
    pipeline_options: PipelineOptions | None = None,
    *,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Plan, reserve in the ledger, run, publish atomically, commit; returns ``release.json``.

    Raises (before reading any data) :class:`ReleaseConfigError` for a bad plan and
    :class:`~beamsynth.pipelines.releases.ledger.LedgerError` when the ledger refuses the release;
    :class:`~beamsynth.pipelines.releases.ledger.LedgerError` too, publishing nothing, when its
    reservation was aborted while it ran (``ledger reconcile --force``).
    """
    progress = progress or Progress(quiet=True)
    options = pipeline_options or PipelineOptions([])
    plan = plan_release(cfg)
    if is_beam_dask(options):
        for t in cfg.tables:
            if len(t.formats) > 1:
                raise ReleaseConfigError(f"{t.where}.formats", f"({list(t.formats)}) on the "
                                         "DaskRunner a release writes one format per table")
    eps = sum(s.epsilon for s in plan.spends)
    progress(f"release {cfg.name}: validated {len(cfg.tables)} table(s), plan spends ε={eps:g}")
    if os.path.exists(cfg.ledger_path):  # exactly once, one unit per source, budget: checked
        PrivacyLedger(cfg.ledger_path).check(  # before any input file is opened
            run_key=run_key(cfg), spends=plan.spends, policies=cfg.policies)
    ledger = PrivacyLedger(cfg.ledger_path)
    release_id = ledger.reserve(run_key=run_key(cfg), name=cfg.name, folder=cfg.folder,
                                spends=plan.spends, policies=cfg.policies)
    if fs.folder_exists(cfg.folder):  # published outside this ledger, or not a release at all
        ledger.abort(release_id, "release folder already exists")
        raise ReleaseConfigError("folder", f"{cfg.folder!r} already exists and this ledger has no "
                                           "committed release for it; move it away or choose "
                                           "another folder")
    try:  # whole-file problems (header, gzip, empty input): nothing spent, exit 2
        check_table_inputs(cfg.tables)
    except ValueError as exc:
        ledger.abort(release_id, f"input check failed: {exc}"[:500])
        raise
    progress(f"reserved ε={eps:g} in ledger {cfg.ledger_path} (release {release_id}, pending)")
    sources = {t.source for t in cfg.tables}
    budgets = [s for s in ledger.summary() if s["source"] in sources]  # incl. this reservation
    parent, base = fs.split(cfg.folder.rstrip("/"))
    if fs.is_local(parent):
        os.makedirs(parent, exist_ok=True)
    stale = fs.join(parent, f".{base}.tmp-*")
    # left by a killed run of this night (object stores: the files under them)
    fs.delete_quietly(glob.glob(stale) if fs.is_local(stale) else _matches(stale + "/**"))
    tmp = _release_temp_folder(cfg.folder, release_id)
    try:
        if fs.is_local(tmp):
            os.makedirs(os.path.join(tmp, "public"))
        manifests = {}
        for t in cfg.tables:
            if t.kind == "histogram":
                progress(f"table {t.name}: reading {', '.join(t.inputs)}, CatHist of {t.column}")
                manifests[t.name] = _run_histogram_table(cfg, t, tmp, options, progress)
                continue
            progress(f"table {t.name}: reading {', '.join(t.inputs)} and synthesizing ({t.method})")
            p = plan.plans[t.name]
            p = dataclasses.replace(p, config=dataclasses.replace(
                p.config, output=fs.join(tmp, "public", f"{t.name}.{t.formats[0]}")))
            manifests[t.name] = _run_table(p, t, tmp, options, progress)
        release = _release_document(cfg, release_id, manifests, budgets)
        if cfg.public_report or cfg.private_report:
            progress("writing reports")
            from beamsynth.pipelines.releases.report import write_release_reports

            write_release_reports(cfg, tmp, release, manifests, progress)
        write_json_atomic(fs.join(tmp, RELEASE_MARKER), release)
        if fs.is_local(tmp):
            _fsync_tree(tmp)
    except BaseException as exc:
        fs.delete_quietly([tmp])
        with contextlib.suppress(LedgerError):  # already aborted by `ledger reconcile --force`
            ledger.abort(release_id, f"failed before publishing: {type(exc).__name__}: {exc}"[:500])
        raise
    if fs.folder_exists(cfg.folder):  # created by something else while we ran: do not replace it
        fs.delete_quietly([tmp])
        with contextlib.suppress(LedgerError):
            ledger.abort(release_id, "release folder appeared while the release ran")
        raise ReleaseConfigError("folder", f"{cfg.folder!r} appeared while the release ran")
    try:  # still reserved? (`ledger reconcile --force` may have aborted it while we ran)
        ledger.begin_publish(release_id)
    except LedgerError:
        fs.delete_quietly([tmp])  # computed under a refunded spend: never published
        raise
    # publish: one atomic rename on a local disk; elsewhere file by file, release.json last
    fs.move_folder(tmp, cfg.folder, marker=RELEASE_MARKER)
    if fs.is_local(parent):
        _fsync_dir(parent)
    ledger.commit(release_id)
    progress(f"published {cfg.folder} and committed release {release_id}")
    return release


def _public_budget(s: Mapping[str, Any]) -> dict[str, Any]:
    """A source's ledger state after this release, for ``release.json`` (public budget facts)."""
    unit = s["units"][0] if len(s["units"]) == 1 else None
    return {
        "policy": s["policy"], "guarantee": s["guarantee"], "renews": s["renews"],
        "window_days": s["window_days"], "data_retention_days": s["data_retention_days"],
        "privacy_unit": None if unit is None else {
            "unit": unit["unit"], "privacy_id": unit["privacy_id"],
            "max_contributions": unit["max_contributions"]},
        "counted_by_policy": {"epsilon": s["epsilon_spent"], "delta": s["delta_spent"]},
        "left": {"epsilon": s["epsilon_left"], "delta": s["delta_left"]},
        "lifetime_total": s["lifetime"],
        "note": "totals include this release; the lifetime total covers every release on the "
                "source (sequential composition), whatever the policy renews",
    }


def _release_document(cfg: ReleaseConfig, release_id: str, manifests: Mapping[str, dict[str, Any]],
                      budgets: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``release.json``: the public parts of the manifests plus the ledger entry (no paths of
    the operator's machine: the ledger file's name and the release folder's name only)."""
    doc: dict[str, Any] = {
        "beamsynth_release": 1,
        "release_id": release_id,
        "name": cfg.name,
        "description": cfg.description,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "budget": {"epsilon": cfg.epsilon, "delta": cfg.delta},
        "spent": {"epsilon": sum(m["release"]["budget"]["spent"]["epsilon"] for m in manifests.values()),
                  "delta": sum(m["release"]["budget"]["spent"]["delta"] for m in manifests.values())},
        "ledger": {"path": os.path.basename(cfg.ledger_path), "night": public_night(cfg),
                   "policies": {s: p.describe() for s, p in cfg.policies.items()},
                   "sources": {s["source"]: _public_budget(s) for s in budgets or []}},
        "tables": {name: {"source": next(t.source for t in cfg.tables if t.name == name),
                          **m["release"]} for name, m in manifests.items()},
        "metrics_namespace": METRICS_NAMESPACE,
    }
    if cfg.demo:
        doc["demo"] = ("DEMO RELEASE: " + SEEDED_NOTE
                       + (f" (seed {cfg.seed})" if cfg.seed is not None else "")
                       + "; the noise can be regenerated, so nothing here is private")
    return doc
