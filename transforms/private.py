"""The public API's core: one privacy job (one budget) over private collections of a user's data.

::

    job = PrivacyJob(epsilon=1.0, privacy_unit=PrivacyUnit(id_column="user_id", max_contributions=3))
    private = records | job.private(schema)          # dicts, beam.Rows, Arrow tables → private
    private.dead_letters | beam.io.WriteToText(...)  # rejected elements, with reasons
    counts = private | Count(epsilon=0.05)           # schema'd beam.Row outputs
    ages = private | Marginals(marginals=[("age", "sex")], epsilon=0.3)

**One budget per job.** The job holds one :class:`~beamsynth.transforms.budget.PrivacyAccountant`.
Every mechanism spends its ε on it when it is applied to a private collection, i.e. while the
pipeline is built and before any data is read; a spend that does not fit raises
:class:`~beamsynth.transforms.budget.BudgetExceededError` naming the step and the amounts. Spends
compose by basic sequential composition for add/remove of one privacy unit.

**Privacy unit, bounded once.** :class:`PrivacyUnit` is declared on the job. With an id column,
:class:`MakePrivate` keeps at most ``max_contributions`` records per id (uniformly at random,
:class:`~beamsynth.transforms.units.BoundContributions`) right after encoding, before any
measurement; every mechanism's sensitivity is that bound.

**Windows.** The API releases over the global window, or once per **declared** window:
``job.private(schema, windows=DeclaredWindows(start=, end=, size=))`` windows timestamped input
(or accepts input already windowed with the same ``DeclaredWindows``). Every mechanism then
releases exactly once per declared window, records or not; output rows carry the window's start
(``window_start``, ISO 8601 UTC, first field) and stay in their Beam windows. The job's ε is
spent once and holds **per window** (each window's releases are ε-DP for adding/removing one
unit's records in that window; a unit present in ``w`` windows gets ``w·ε``, docs/streaming.md).
Elements stamped outside ``[start, end)`` become dead letters, and so, on an unbounded input,
do elements arriving after their window's release fired (``windows.SplitLate``, reason
``arrived after window [start, end) was released``). Any other windowing (undeclared
``FixedWindows``, sliding, sessions) and triggers that can fire twice are refused when the
pipeline is built.

A mechanism applied to anything but a private collection fails when the pipeline is built with a
message saying how to make one.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import StandardOptions
from apache_beam.transforms.window import GlobalWindows
from apache_beam.typehints import typehints
from apache_beam.typehints.decorators import TypeCheckError
from apache_beam.typehints.native_type_compatibility import convert_to_beam_type
from apache_beam.typehints.row_type import RowTypeConstraint
from apache_beam.utils.timestamp import Timestamp

from beamsynth.schemas.keys import KeyCodec
from beamsynth.schemas.schema import (
    EncodedBatch,
    Schema,
    ambiguous_values,
    avro_field_name,
    load_schema,
    reader_caveats,
)
from beamsynth.transforms.budget import (
    ApproxDP,
    BudgetExceededError,
    PrivacyAccountant,
    PureDP,
    as_budget,
)
from beamsynth.transforms.conventions import NotAPCollectionError, display_items, typed_boundary
from beamsynth.transforms.conventions import keywords_checked as _keywords_checked
from beamsynth.transforms.frame_fields import (
    dataframe_read_behind,
    declared_row_type,
    with_declared_fields,
)
from beamsynth.transforms.inputs import (
    DEAD_LETTER_TYPE,
    DEFAULT_BATCH_ROWS,
    INPUT_TYPES,
    EncodeElements,
    KeyLayout,
    reject_elements,
    wanted_fields,
)
from beamsynth.transforms.noise import child_seed
from beamsynth.transforms.units import BoundContributions
from beamsynth.transforms.windows import (
    DeclaredWindows,
    SplitLate,
    check_release_windowing,
    declared_instead,
    iso_seconds,
    window_text,
)

__all__ = [
    "MakePrivate",
    "PrivacyJob",
    "PrivacyUnit",
    "PrivateCollection",
    "PrivateTransform",
    "WINDOW_FIELD",
    "WindowRowsFn",
    "check_epsilon",
    "release_rows",
    "stamp_now",
    "window_row_type",
]

WINDOW_FIELD = "window_start"  # first field of every output row under declared windows
_SEEDED = "seeded: not for release"  # the manifest's randomness note of a seeded job
_LOG = logging.getLogger(__name__)
# The PrivacyJobs of each pipeline: a second job would hand out a second full budget over the same
# records (two jobs of ε each release 2ε), so MakePrivate refuses it when the pipeline is built,
# unless every job of the pipeline declares disjoint=True. Weak references to the jobs: a job
# holds PCollections of its pipeline (count_outputs), so a strong one kept every pipeline built
# with job.private (graph, jobs, Create's records) alive for the life of the process (H79).
_PIPELINE_JOBS: weakref.WeakKeyDictionary[beam.Pipeline, list[weakref.ref[PrivacyJob]]] = (
    weakref.WeakKeyDictionary())


def _jobs_of(pipeline: beam.Pipeline) -> list[PrivacyJob]:
    """The PrivacyJobs of ``pipeline`` (alive while its graph is: MakePrivate holds each)."""
    return [j for j in (r() for r in _PIPELINE_JOBS.get(pipeline, [])) if j is not None]
# Steps that spend from their own accountant on a pipeline's records (Beam YAML's
# BeamsynthSynthesize ledger; pipelines/yaml_transforms.py): a PrivacyJob beside them would hand
# out a second full budget too, unless the ledger made it (the YAML statistics steps' job).
_PIPELINE_HOLDERS: weakref.WeakKeyDictionary[beam.Pipeline, str] = weakref.WeakKeyDictionary()
_LEDGER_JOBS: weakref.WeakSet[PrivacyJob] = weakref.WeakSet()


_NOT_A_PCOLLECTION = (
    "job.private's output is a private collection, not a PCollection: Beam's steps, side inputs "
    "and DataFrames (to_dataframe) do not take it; apply a beamsynth mechanism first (private | "
    "bs.Count(epsilon=...), bs.Marginals, ...) and give its output to Beam, or route "
    "private.dead_letters (the rejected elements) to Beam")
_ONE_BUDGET = ("Use either the API (one bs.PrivacyJob, bs.Synthesize, bs.Histogram, ...) or the "
               "YAML steps (one job_budget) in one pipeline")


def claim_pipeline_budget(pipeline: beam.Pipeline, holder: str, *,
                          job: PrivacyJob | None = None) -> None:
    """Register ``holder`` (a step spending from its own accountant, e.g. a Beam YAML step's job
    ledger) as spending on ``pipeline``'s records, and ``job`` as a PrivacyJob that ledger made;
    raises ``ValueError`` (build time) when another PrivacyJob already spends there (rule 3: two
    budgets over the same records would each be spent in full)."""
    if job is not None:
        _LEDGER_JOBS.add(job)
    others = [j for j in _jobs_of(pipeline) if j not in _LEDGER_JOBS]
    if others:
        raise ValueError(
            f"{holder}: this pipeline already has a bs.PrivacyJob ({others[0].name!r}, "
            f"{others[0].accountant.total}); a Beam YAML step keeps its own job budget, so both "
            "would spend in full over the same records. " + _ONE_BUDGET)
    _PIPELINE_HOLDERS.setdefault(pipeline, holder)


def warn_ambiguous_values(schema: Schema, step: str, keys: Mapping[str, Any] | None = None) -> None:
    """Warn (when built; declared values only) about categories spelling one number or boolean
    (``"1"`` and ``"01"``): a pandas reader (``beam.io.ReadFromCsv``, ``ReadFromJson``) gives
    both as ``1`` unless another value of its chunk is no number, so whether a record is ``"01"``
    or ``"1"`` would depend on the other records (rule 6; H55). Text is judged as declared; a
    number goes to the category Python writes for it (``"1"``)."""
    for name, groups in ambiguous_values(schema).items():
        spelled = "; ".join(" and ".join(repr(v) for v in g) for g in groups[:3])
        _LOG.warning(
            "%s", f"{step}: column {name!r} of schema {schema.name!r} declares {spelled}: one "
            "value each to a reader that parses numbers and booleans (pandas: beam.io.ReadFromCsv, "
            "ReadFromJson), which gives them alike unless another value of the chunk is no "
            "number, so one record could move others between these categories; read the column "
            "as text (ReadFromCsv(path, dtype={...: str})) or declare one spelling per value")
    for name, why in reader_caveats(schema, keys).items():  # what no encoder can undo (H66)
        _LOG.warning("%s", f"{step}: column {name!r} of schema {schema.name!r} is {why}")


def _not_a_number(name: str, value: Any, rule: str, example: str) -> TypeError:
    """``TypeError`` echoing ``value`` and saying what to pass (text from argparse or a config
    parsed for the user to see, e.g. ``pass epsilon=1.0``)."""
    try:
        fix = f"pass {name}={float(value)!r} (a number, not text: float(...) a value read from " \
              "the command line or a config)" if isinstance(value, str) else None
    except ValueError:
        fix = None
    return TypeError(f"{name} must be a number {rule}, got {type(value).__name__} ({value!r}); "
                     + (fix or f"pass a number, e.g. {name}={example}"))


def check_epsilon(epsilon: Any, *, name: str = "epsilon") -> float:
    """A mechanism's ε share: a finite number > 0 (message echoes the bad value)."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)):
        raise _not_a_number(name, epsilon, "> 0", "0.5")
    if not (epsilon > 0 and epsilon != float("inf")):
        raise ValueError(f"{name} ({epsilon!r}) must be a finite number > 0")
    return float(epsilon)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrivacyUnit:
    """Who is protected: one record (``id_column=None``) or one person with all their records.

    Args:
      id_column: the field naming a person; ``None`` makes every record its own unit.
      max_contributions: records kept per person (chosen uniformly at random) before anything is
        measured; 1 without an id column.
    """

    id_column: str | None = None
    max_contributions: int = 1

    def __post_init__(self) -> None:
        if self.id_column is not None and (not isinstance(self.id_column, str) or not self.id_column):
            raise ValueError(f"id_column ({self.id_column!r}) must be None or a field name")
        k = self.max_contributions
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"max_contributions ({k!r}) must be an int >= 1")
        if self.id_column is None and k != 1:
            raise ValueError(f"max_contributions ({k}) needs an id_column; without one every "
                             "record is its own privacy unit")

    @classmethod
    def records(cls) -> PrivacyUnit:
        """Every record is one privacy unit."""
        return cls()

    def to_dict(self) -> dict[str, Any]:
        """Manifest form."""
        return {"privacy_id": self.id_column, "max_contributions": self.max_contributions,
                "neighbouring": "add/remove one privacy unit"}


WARN_UNRECORDED = True
"""Log when a job that spent budget is discarded (or the interpreter exits) and no
``bs.WriteManifest`` took its manifest and ``job.accountant.to_dict()`` was never read: its spends
are then recorded nowhere (brief rule 3: every spend is in the manifest). Tests turn it off."""


def _warn_unrecorded(name: str, accountant: PrivacyAccountant, recorded: dict[str, Any]) -> None:
    if not WARN_UNRECORDED or recorded["by"] is not None or accountant.exported:
        return
    _LOG.warning("PrivacyJob %r spent %s in %d step(s) (%s) but no bs.WriteManifest took its "
                 "manifest and job.accountant.to_dict() was never read: these spends are recorded "
                 "nowhere. Apply `bs.WriteManifest(job=job, path=...)` in the pipeline, or keep "
                 "job.accountant.to_dict() with the release", name,
                 f"ε={accountant.spent_epsilon:g}, δ={accountant.spent_delta:g}",
                 len(accountant.spends), ", ".join(s.step for s in accountant.spends[:4])
                 + (", ..." if len(accountant.spends) > 4 else ""))


class PrivacyJob:
    """One pipeline's privacy budget, privacy unit and randomness mode.

    Args:
      epsilon: total ε of every beamsynth release in the pipeline (> 0).
      delta: total δ (default 0; only δ-spending mechanisms such as SBHG use it).
      privacy_unit: :class:`PrivacyUnit` (default: one record).
      seed: ``None`` (secure noise, the default) or an int for tests and demos only; the manifest
        then says ``seeded: not for release`` and a warning is logged when the job is made (a
        job without ``bs.WriteManifest`` is marked too).
      name: the job's name in the manifest.
      disjoint: declare that no privacy unit of this job is in any other job's data in the same
        pipeline (e.g. two tenants' tables). A pipeline holds one job unless every job in it says
        ``disjoint=True``: two jobs over the same people would each spend a full budget on them.
        The manifest states the declaration; beamsynth cannot check it.
    """

    def __init__(self, *, epsilon: float, delta: float = 0.0,
                 privacy_unit: PrivacyUnit | None = None, seed: int | None = None,
                 name: str = "beamsynth job", disjoint: bool = False) -> None:
        unit = PrivacyUnit() if privacy_unit is None else privacy_unit
        if not isinstance(unit, PrivacyUnit):
            raise TypeError(f"privacy_unit must be a PrivacyUnit, got {type(unit).__name__} "
                            f"({unit!r})")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__} ({seed!r})")
        if isinstance(delta, bool) or not isinstance(delta, (int, float)):
            raise _not_a_number("delta", delta, "in [0, 1)", "1e-6")
        self.accountant = PrivacyAccountant(total=as_budget(check_epsilon(epsilon), delta))
        self.unit = unit
        self.seed = seed
        self.name = str(name)
        if not isinstance(disjoint, bool):
            raise TypeError(f"disjoint must be True or False, got {type(disjoint).__name__} "
                            f"({disjoint!r})")
        self.disjoint = disjoint
        if seed is not None:
            _LOG.warning("PrivacyJob %r: seed=%d: %s (fixed noise is for tests and demos; the "
                         "manifest says so)", self.name, seed, _SEEDED)
        self.sources: list[dict[str, Any]] = []   # one entry per private collection
        self.count_outputs: list[beam.PCollection] = []  # (source, field, n) exact, private
        self.rejected_sources: list[str] = []  # named by count_rejected: job.private's sources
        self.mechanisms: list[dict[str, Any]] = []
        self.windows: DeclaredWindows | None = None  # the declared windows of its collections
        self._windowing: str | None = None  # first collection's windowing, for the message
        self._frozen: str | None = None
        self._pipeline: weakref.ref[beam.Pipeline] | None = None  # the one pipeline it budgets
        self._unrecorded: weakref.finalize | None = None  # warns if spends never reach a manifest
        self._recorded = {"by": None}  # set by freeze(); read by the finalizer (never holds self)

    def private(self, schema: Schema | str, **kwargs: Any) -> MakePrivate:
        """``records | job.private(schema, ...)``: a :class:`MakePrivate` step of this job.

        Keywords (each optional; ``help(bs.MakePrivate)`` has the details):
          keys: declared prefix keys ``{name: bs.TextKey(...) | bs.SpatialKey(...) |
            bs.HierarchyKey(...)}`` for ``bs.PrefixTree``.
          position_field: the field (dict key, row field, Arrow column) holding each element's
            position in its source, for dead letters (else their position is ``None``).
          source: the input's name in dead letters and the manifest (default: the step label;
            one per job.private of the job, a repeat refused when built).
          windows: ``bs.DeclaredWindows(start=, end=, size=)``: one release per declared window.
          batch_rows: rows per encoded batch (default 20,000).
          label: the step's label (or ``records | "Label" >> job.private(schema)``).

        Input: dicts, schema'd ``beam.Row``s / named tuples or pyarrow Tables/RecordBatches; bad
        elements go to ``.dead_letters`` with a reason. Output: a private collection for
        beamsynth's mechanisms (``bs.Count``, ``bs.Marginals``, ``bs.PrivBayes``, ...)."""
        return MakePrivate(job=self, schema=schema, **kwargs)

    def count_rejected(self, dead_letters: beam.PCollection, *, source: str) -> None:
        """Count records rejected *before* ``job.private`` (a parse or filter step of your own) in
        the manifest's exact counts of ``source``: each element of ``dead_letters`` is one record
        read and rejected, so ``read = used + rejected + dropped by the bound`` still holds. Call
        it before ``bs.WriteManifest``; the counts are private, like every operational count."""
        if self._frozen is not None:
            raise ValueError(f"count_rejected({source!r}) is called after {self._frozen!r} took "
                             "the job's manifest; call it before bs.WriteManifest")
        if not isinstance(source, str) or not source:
            raise ValueError(f"source ({source!r}) must be a non-empty string")
        if not isinstance(dead_letters, beam.PCollection):
            raise TypeError(f"dead_letters must be a PCollection, got {type(dead_letters).__name__}")
        self.rejected_sources.append(source)  # WriteManifest checks job.private names it
        self.count_outputs.append(
            dead_letters
            | f"CountRejected[{source}]" >> beam.FlatMap(
                lambda _, s=source: [(s, "read", 1), (s, "rejected", 1)])
            | f"GlobalRejected[{source}]" >> beam.WindowInto(GlobalWindows()))
        # (source, field, 1) in the global window (the manifest's one combine): exact, private

    def step_seed(self, step: str) -> int | None:
        """The seed of one step: ``None`` in secure mode (each transform draws its own run secret),
        else an int derived from the job seed and the step name, so two steps never share noise."""
        return None if self.seed is None else child_seed(self.seed, step)

    def spend(self, step: str, budget: ApproxDP, *, mechanism: str,
              details: Mapping[str, Any] | None = None) -> ApproxDP:
        """Spend on the job's accountant (raises ``BudgetExceededError`` when it does not fit)."""
        if self._frozen is not None:
            raise ValueError(f"step {step!r} is applied after {self._frozen!r} took the job's "
                             "manifest; apply every mechanism before bs.WriteManifest")
        self._refuse_delta(step, budget)
        spent = self.accountant.spend(step, budget, mechanism=mechanism, details=details)
        if self._unrecorded is None:
            self._unrecorded = weakref.finalize(self, _warn_unrecorded, self.name, self.accountant,
                                                self._recorded)
        return spent

    def _refuse_delta(self, step: str, budget: ApproxDP) -> None:
        """A step with δ > 0 on a job of δ = 0: ``BudgetExceededError`` naming the job's δ (the
        accountant's 'only (ε=1, δ=0) remains' hides which of the two does not fit)."""
        total = self.accountant.total
        if budget.delta > 0 and total.delta == 0:
            raise BudgetExceededError(
                f"step {step!r} asks for {budget}, but this job's total {total} has δ = 0 (pure "
                "ε-DP), so no step can spend a δ: give the job one, e.g. bs.PrivacyJob(epsilon="
                f"{total.epsilon:g}, delta={budget.delta:g}), or use a step without δ (nothing "
                "was spent)")

    def check_fits(self, step: str, budget: ApproxDP) -> None:
        """Raise ``BudgetExceededError`` naming ``step`` if ``budget`` does not fit (no spend)."""
        if self._frozen is not None:
            raise ValueError(f"step {step!r} is applied after {self._frozen!r} took the job's "
                             "manifest; apply every mechanism before bs.WriteManifest")
        self._refuse_delta(step, budget)
        if not self.accountant.can_spend(budget):
            probe = PrivacyAccountant(total=self.accountant.total)
            for s in self.accountant.spends:
                probe.spend(s.step, s.budget, mechanism=s.mechanism)
            probe.spend(step, budget, mechanism="probe")  # raises with the accountant's message

    def freeze(self, by: str) -> None:
        """No spend after this (the manifest has been taken by step ``by``)."""
        self._frozen = by
        self._recorded["by"] = by

    def use_windows(self, step: str, windows: DeclaredWindows | None) -> None:
        """Every private collection of a job shares one windowing (the ε holds per window)."""
        what = "the global window" if windows is None else repr(windows)
        if self._windowing is None:
            self.windows, self._windowing = windows, what
        elif windows != self.windows:
            raise ValueError(f"{step}: windowing {what} differs from the job's other private "
                             f"collections ({self._windowing}); the job's ε is per declared "
                             "window, so every input of one job uses the same windows")

    @property
    def seeded(self) -> bool:
        """True for tests and demos (not for release)."""
        return self.seed is not None


class PrivateCollection:
    """Encoded, contribution-bounded records of one input, bound to a :class:`PrivacyJob`.

    ``private = records | job.private(schema)``; apply beamsynth mechanisms to it
    (``private | bs.Count(epsilon=0.1)``) and route ``private.dead_letters`` to a sink. It is not
    a PCollection, nor a tuple of them: Beam's own steps (``beam.Map``, ``beam.Flatten``,
    ``beam.CoGroupByKey``, ``beam.Partition``, side inputs, DataFrames) are refused when the
    pipeline is built, saying what to do (join upstream before ``job.private``, or measure
    first). Until the fifteenth session it was a tuple ``(batches, dead_letters)`` to Beam, so
    ``{"a": private} | beam.CoGroupByKey()`` built and failed only in the run, and
    ``private.batches`` handed the exact encoded records to any Beam step.

    Attributes:
      dead_letters: ``PCollection[beam.Row]`` of rejected elements ``(source, position, reason,
        element)`` (private: keep them with the data owner).
      schema: the declared schema (with the job's privacy id).
      job: the job whose budget every mechanism spends.
      layout: where declared prefix keys sit in the encoded records.
      source: the name of this input in dead letters and the manifest.
      windows: the :class:`DeclaredWindows` of the records (``None``: the global window).
    """

    def __init__(self, *, job: PrivacyJob, layout: KeyLayout, batches: beam.PCollection,
                 dead_letters: beam.PCollection, source: str,
                 windows: DeclaredWindows | None = None) -> None:
        self.job, self.layout, self._batches = job, layout, batches
        self.dead_letters, self.source, self.windows = dead_letters, source, windows

    def exact_batches(self) -> beam.PCollection:
        """The encoded, contribution-bounded records (``PCollection[EncodedBatch]``: schema cells,
        then declared key symbols) **as they are: exact, no noise, no budget spent**. For
        mechanisms of your own (which must spend on ``private.job`` and add noise) and for tests
        and audits; anything written from it is not differentially private."""
        return self._batches

    @property
    def batches(self) -> Any:
        """Refused: the encoded records are exact (``private.batches | beam.Map(...)`` released
        them without noise or spend until the fifteenth session)."""
        raise NotAPCollectionError(
            "private.batches: the encoded records are exact (no noise, no budget spent), so they "
            "are no longer an attribute that Beam's steps take; apply a beamsynth mechanism "
            "(private | bs.Count(epsilon=...), bs.Marginals, bs.Synthesize, ...) and give its "
            "output to Beam. A mechanism of your own or an audit that must see the exact records "
            "calls private.exact_batches() (not DP)")

    def __iter__(self) -> Any:
        """Refused: Beam iterates a non-PCollection input to make a ``Create`` of it
        (``{"a": private} | beam.CoGroupByKey()``, ``(private, other) | beam.Flatten()``), which
        built and failed only in the run (``argument after * must be an iterable, not
        _InvalidUnpickledPCollection``)."""
        raise NotAPCollectionError(_NOT_A_PCOLLECTION + "; to join or merge it with other data "
                                   "(beam.CoGroupByKey, beam.Flatten), join or merge the records "
                                   "upstream and make the result private once (joined | "
                                   "job.private(schema)), or measure each private collection "
                                   "first and join the released outputs")

    def __getitem__(self, index: Any) -> Any:
        """Refused (``private[0]`` was the exact encoded records)."""
        return self.batches

    @property
    def schema(self) -> Schema:
        """The declared schema."""
        return self.layout.schema

    @property
    def pipeline(self) -> beam.Pipeline:
        """The pipeline the collection belongs to."""
        return self._batches.pipeline

    @property
    def max_contributions(self) -> int:
        """Records per privacy unit after bounding (every mechanism's sensitivity)."""
        return self.job.unit.max_contributions

    @property
    def element_type(self) -> Any:
        """Refused: Beam asks for it where a PCollection is converted (``to_dataframe(private)``,
        side inputs); the message says what to apply (``to_dataframe`` failed with
        ``'PrivateCollection' object has no attribute 'element_type'``)."""
        raise NotAPCollectionError(
            _NOT_A_PCOLLECTION + "; convert a mechanism's output, e.g. to_dataframe(private | "
            "bs.Count(epsilon=...)) or to_dataframe(private | bs.PrivBayes(epsilon=..., rows=...))")

    @property
    def windowing(self) -> Any:
        """Refused, like :attr:`element_type` (``beam.pvalue.AsList(private)`` said
        ``'PrivateCollection' object has no attribute 'windowing'``)."""
        return self.element_type

    def __repr__(self) -> str:
        caller = sys._getframe(1)
        if (caller.f_code.co_name in _BEAM_APPLY and caller.f_code.co_filename.endswith(
                os.path.join("apache_beam", "pipeline.py"))):
            # p.apply(beam.Map(f), private): Beam found no PCollection in it and is formatting
            # its own NotImplementedError ("... does not properly override
            # _extract_input_pvalues, returned {'None': PrivateCollection(...)}"); ours instead
            step = caller.f_locals.get("transform")
            raise NotAPCollectionError(_beam_step_refused(
                getattr(step, "label", "p.apply"), step, how="p.apply(step, private)"))
        return f"PrivateCollection(source={self.source!r}, schema={self.schema.name!r})"

    def __or__(self, step: Any) -> Any:
        """``private | bs.Count(...)`` goes on to the mechanism's ``__ror__``; a Beam step is
        refused when built (inside Beam it failed on the tuple, ``PrivateCollection.__new__()
        takes 1 positional argument but 2 were given``)."""
        target = getattr(step, "transform", step)  # "Label" >> step wraps it
        if not isinstance(target, beam.PTransform) or isinstance(target, PrivateTransform):
            return NotImplemented
        raise TypeError(_beam_step_refused(step.label, target))


def _first_free(name: str, taken: Any) -> str:
    """``name_2``, ``name_3``, ...: the first not ``taken`` (``--auto_unique_labels``' renaming of
    a step label or a source name another step of the job already has)."""
    k = 2
    while taken(f"{name}_{k}"):
        k += 1
    return f"{name}_{k}"


_BEAM_APPLY = ("_apply_internal", "apply")
"""Beam's ``Pipeline`` methods that format a refused input into their error (2.77; earlier)."""


def _beam_step_refused(label: str, target: Any, *, how: str = "") -> str:
    """Why Beam's own step ``target`` does not apply to a private collection, and what to do
    (``private | beam.Map(f)`` and ``p.apply(beam.Map(f), private)`` alike)."""
    if isinstance(target, PrivateTransform):  # p.apply(bs.Count(...), private)
        name = type(target).__name__
        return (f"{label}: a beamsynth mechanism applies to a private collection as private | "
                f"bs.{name}(...) (or private | \"Label\" >> bs.{name}(...)), which spends its "
                f"budget on the job when the pipeline is built; {how or 'p.apply'} is refused")
    again = " (it is private already)" if isinstance(target, MakePrivate) else (
        "; bs.WriteManifest applies to the pipeline: p | bs.WriteManifest(job=job, path=...)"
        if type(target).__name__ == "WriteManifest" else "")
    return (f"{label}: job.private's output is a private collection, not a PCollection: "
            f"Beam's own steps do not apply to it{' (' + how + ')' if how else ''}; apply a "
            "beamsynth mechanism (private | bs.Count(epsilon=...), bs.Marginals, ...) and give "
            "its output to Beam, or route private.dead_letters (the rejected elements) to "
            f"Beam's sinks{again}")


# bs.PrivacyJob(1.0), bs.PrivacyUnit("user", 2), privacy_unt=...: the keywords, the nearest one
PrivacyUnit.__init__ = _keywords_checked(PrivacyUnit.__init__)  # type: ignore[method-assign]
PrivacyJob.__init__ = _keywords_checked(PrivacyJob.__init__)  # type: ignore[method-assign]


class PrivateTransform(beam.PTransform):
    """Base of the mechanisms that apply to a :class:`PrivateCollection`.

    ``private | mech`` (or ``private | "Label" >> mech``) first calls :meth:`bind`, which spends
    the mechanism's budget on the job (build time), then applies :meth:`expand` to
    ``private.exact_batches()``. Anything else on the left fails when the pipeline is built.
    """

    mechanism = ""
    _private: PrivateCollection | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None and not getattr(init, "_keywords_checked", False):
            cls.__init__ = _keywords_checked(init)  # type: ignore[method-assign]
        if "expand" in cls.__dict__:  # typed at the public step, not at each inner one
            cls.expand = typed_boundary(cls.__dict__["expand"])  # type: ignore[method-assign]

    def _refuse(self, left: Any) -> None:
        kind = type(left).__name__
        if isinstance(left, beam.pvalue.PCollection):
            kind = f"PCollection[{left.element_type}]"
        raise TypeError(
            f"{type(self).__name__} applies to a private collection, got {kind}; make one "
            "with `private = records | job.private(schema)` and apply `private | "
            f"bs.{type(self).__name__}(...)`")

    def type_check_inputs(self, pvalueish: Any) -> None:
        """Refuse anything but a private collection's batches (``pcoll | mech`` lands here)."""
        if self._private is None or pvalueish is not self._private.exact_batches():
            self._refuse(pvalueish)
        super().type_check_inputs(pvalueish)

    def __ror__(self, left: Any, label: str | None = None) -> Any:
        if not isinstance(left, PrivateCollection):
            self._refuse(left)
        if label is not None:
            self.label = label
        self._unique_label(left.pipeline)  # before bind: a refused step spends nothing
        self._unique_step(left.job, left.pipeline)
        self._private = left
        self.bind(left)
        return left.pipeline.apply(self, left.exact_batches())

    def _unique_label(self, pipeline: beam.Pipeline) -> None:
        """Refuse (or, under ``--auto_unique_labels``, rename) a label already in the pipeline
        before anything is spent, so the accountant never holds a spend of a step Beam refused."""
        full = "/".join([pipeline._current_transform().full_label, self.label]).lstrip("/")
        if full not in pipeline.applied_labels:
            return
        if pipeline._options.view_as(StandardOptions).auto_unique_labels:
            self.label = pipeline._generate_unique_label(self)
            return
        name = type(self).__name__
        raise RuntimeError(f"a step labelled {full!r} is already in the pipeline (nothing was "
                           f"spent); give this one its own label: private | \"My{name}\" >> "
                           f"bs.{name}(...)")

    def _unique_step(self, job: PrivacyJob, pipeline: beam.Pipeline) -> None:
        """Refuse (or, under ``--auto_unique_labels``, rename) a label another mechanism of the
        job already spent under, before anything is spent: the label names the step's spends,
        its manifest entry and its run-time figures (rows_out, run-time choices), so two
        composites' inner steps labelled alike were one step there (rows_out 40 + 40 for steps
        that released 10 and 30; H77). Beam allows them (their full labels differ)."""
        def taken(label: str) -> bool:
            return any(m.get("step") == label for m in job.mechanisms) or any(
                s.step == label or s.step.startswith(f"{label}/") for s in job.accountant.spends)
        if not taken(self.label):
            return
        if pipeline._options.view_as(StandardOptions).auto_unique_labels:
            self.label = _first_free(self.label, taken)
            return
        name = type(self).__name__
        raise RuntimeError(f"a step labelled {self.label!r} has already spent on this job (in "
                           "another composite: the manifest names steps by label; nothing was "
                           f"spent); give this one its own label: private | \"My{name}\" >> "
                           f"bs.{name}(...)")

    def bind(self, private: PrivateCollection) -> None:
        """Validate against the schema and spend on the job (called at build time)."""
        raise NotImplementedError

    @property
    def private(self) -> PrivateCollection:
        """The private collection this transform was applied to."""
        if self._private is None:
            raise TypeError(f"{type(self).__name__} has not been applied to a private collection")
        return self._private

    def record(self, details: Mapping[str, Any]) -> None:
        """Note this mechanism in the job (for the manifest's details)."""
        self.private.job.mechanisms.append({"step": self.label, "mechanism": self.mechanism,
                                            "source": self.private.source, **details})


def _required_fields(layout: KeyLayout) -> list[str]:
    """Fields every element must carry: non-nullable declared columns, the privacy id, the
    declared keys' columns (a missing one rejects the element)."""
    schema = layout.schema
    fields = [c.name for c in schema.columns if not c.nullable] + (
        [schema.privacy_id] if schema.privacy_id else [])
    for codec in layout.keys.values():
        fields += [c for c in codec.input_columns if c not in fields]
    return fields


def _required_label(field: str, layout: KeyLayout) -> str:
    """``'user' (the privacy id)``, ``'query' (key 'q')`` or ``'income'``: a field in a message."""
    if field == layout.schema.privacy_id:
        return f"{field!r} (the privacy id)"
    keys = [k for k, codec in layout.keys.items() if field in codec.input_columns]
    return f"{field!r} (key {keys[0]!r})" if keys else repr(field)


def _check_schema(schema: Any) -> Schema:
    if isinstance(schema, str):
        return load_schema(schema)
    if not isinstance(schema, Schema):
        raise TypeError(f"schema must be a Schema or a schema file/bundled name, got "
                        f"{type(schema).__name__} ({schema!r})")
    return schema


def _with_unit(schema: Schema, unit: PrivacyUnit) -> Schema:
    if unit.id_column is None:
        if schema.privacy_id is not None:
            raise ValueError(
                f"schema {schema.name!r} names privacy_id {schema.privacy_id!r} but the job's "
                "privacy unit is one record; declare PrivacyUnit(id_column="
                f"{schema.privacy_id!r}, max_contributions=K) on the job")
        return schema
    if schema.privacy_id not in (None, unit.id_column):
        raise ValueError(f"schema privacy_id ({schema.privacy_id!r}) differs from the job's "
                         f"id_column ({unit.id_column!r})")
    if unit.id_column in schema.names:
        raise ValueError(f"id_column {unit.id_column!r} is a declared column of schema "
                         f"{schema.name!r}; a privacy id must not be released: remove it from "
                         "the schema's columns (job.private reads it from each element)")
    return dataclasses.replace(schema, privacy_id=unit.id_column)


_INPUT_HINT = convert_to_beam_type(INPUT_TYPES)


def _may_hold_records(hint: Any) -> bool:
    """Whether some elements of a PCollection typed ``hint`` can be records: a union with a record
    type among its members, or any dict type. Such an input is judged element by element (others
    are dead letters), never refused when built: ``beam.Create`` types its PCollection from the
    values, so ``Create(dicts + [None])`` is ``Union[NoneType, Dict[str, str]]`` and
    ``Create(dicts + [{1: 2}])`` is ``Dict[Union[int, str], ...]``; refusing those made whether the
    pipeline builds depend on one element (rules 7, 8; found by H30). A type with no record
    member (``str`` from ``ReadFromText``) gets a build-time warning instead (H55)."""
    if isinstance(hint, typehints.UnionConstraint):
        return any(_may_hold_records(h) for h in hint.union_types)
    if isinstance(hint, (typehints.DictConstraint, RowTypeConstraint)):
        return True
    if isinstance(hint, type) and issubclass(hint, tuple) and hasattr(hint, "_fields"):
        return True  # schema'd rows typed as generated NamedTuples
    try:
        return typehints.is_consistent_with(hint, _INPUT_HINT)
    except Exception:  # a hint Beam cannot compare: leave it to Beam's own check
        return False


class MakePrivate(beam.PTransform):
    """User elements → a :class:`PrivateCollection` of encoded, bounded records.

    Args:
      job: the :class:`PrivacyJob` whose budget and privacy unit apply.
      schema: declared schema (a :class:`~beamsynth.schemas.schema.Schema`, a file or a bundled
        name such as ``"adult"``).
      keys: declared prefix keys ``{name: codec}`` (``bs.TextKey``, ``bs.SpatialKey``,
        ``bs.HierarchyKey``) for :class:`~beamsynth.transforms.private_prefix.PrefixTree`.
      position_field: a field holding each element's position in its source (numbers dead letters;
        without it their position is ``None``).
      source: the input's name in dead letters and the manifest (default: the step label); one
        per ``job.private`` of the job: a repeat is refused when built (H83).
      batch_rows: rows per encoded batch.
      windows: :class:`~beamsynth.transforms.windows.DeclaredWindows` to release once per declared
        window (timestamped input in the global window is windowed here; input already windowed
        with equal ``DeclaredWindows`` is accepted as is). Elements stamped outside the declared
        range become dead letters. ``None``: the global window, or the input's own
        ``DeclaredWindows``.

    Input: ``PCollection`` of dicts, schema'd ``beam.Row``s / named tuples (``ReadFromParquet(
    as_rows=True)``, ``beam.Select``, ``to_pcollection``), or pyarrow Tables/RecordBatches.
    Output: a :class:`PrivateCollection` (not a PCollection: apply beamsynth mechanisms to it).
    Spends no budget: encoding, bounding and dead letters are not releases (the dead letters and
    the exact counts are private; keep them with the data owner). Dead letters are in the global
    window, also under declared windows.
    """

    @_keywords_checked  # job.private(schema, key=...) names the nearest keyword
    def __init__(self, *, job: PrivacyJob, schema: Schema | str,
                 keys: Mapping[str, KeyCodec] | None = None, position_field: str | None = None,
                 source: str | None = None, batch_rows: int = DEFAULT_BATCH_ROWS,
                 windows: DeclaredWindows | None = None, label: str | None = None) -> None:
        super().__init__(label)
        if windows is not None and not isinstance(windows, DeclaredWindows):
            raise TypeError(f"windows must be None or bs.DeclaredWindows(start=, end=, size=), got "
                            f"{declared_instead(windows)}")
        if not isinstance(job, PrivacyJob):
            raise TypeError(f"job must be a PrivacyJob, got {type(job).__name__} ({job!r})")
        if source is not None and (not isinstance(source, str) or not source):
            raise ValueError(f"source ({source!r}) must be None or a non-empty string")
        self._job = job
        self._layout = KeyLayout(_with_unit(_check_schema(schema), job.unit), keys)
        warn_ambiguous_values(self._layout.schema, f"job.private({self._layout.schema.name})",
                              self._layout.keys)
        self._position, self._source, self._batch_rows = position_field, source, batch_rows
        self._windows = windows
        EncodeElements(layout=self._layout, source="check", position_field=position_field,
                       batch_rows=batch_rows)  # validates now
        self.with_input_types(INPUT_TYPES)

    def default_label(self) -> str:
        return f"MakePrivate({self._layout.schema.name})"

    def type_check_inputs(self, pvalueish: Any) -> None:
        """Beam's check of ``INPUT_TYPES``, plus schema'd rows typed as generated NamedTuples
        (``ReadFromParquet(as_rows=True)``, ``to_pcollection``), which are no ``beam.Row``
        subclass to Beam but are read by field name like one."""
        behind = self._warn_read_behind(pvalueish)
        hint = getattr(pvalueish, "element_type", None)
        self._check_declared_hint(hint)
        if _may_hold_records(hint):  # incl. named tuples and a type beam.Create inferred
            if behind <= 0:  # behind a user step, the rows' fields may be a sample's
                # a DataFrame read's rows are read with every declared field (expand)
                self._check_fields(declared_row_type(pvalueish, self._read_names()) or hint)
            return
        try:
            super().type_check_inputs(pvalueish)
        except TypeCheckError:  # a type admitting no record (str lines): warn, never refuse
            # beam.Create types its PCollection from the values: Create(["a", "b"]) is str and
            # Create(["a", "b", {...}]) a Union holding dicts, so a refusal made whether the
            # pipeline builds depend on one element (rule 7; H55). Every element is then a dead
            # letter with its reason ("element of type str is not a dict, ..."), as for typed
            # rows lacking every field (_check_fields).
            _LOG.warning(
                "%s", f"{self.label}: its input is typed {hint} (no dict, beam.Row, named tuple "
                "or pyarrow Table/RecordBatch), so every element would be a dead letter and "
                "every release learned from no record; job.private takes dicts, beam.Rows (or "
                "named tuples) and pyarrow Tables/RecordBatches: parse each element first, e.g. "
                "beam.Map(json.loads) for JSON lines or a csv parse to dicts (docs/beam-api.md, "
                "'Inputs')")

    def _read_names(self) -> list[str]:
        return wanted_fields(self._layout) + ([self._position] if self._position else [])

    def _warn_read_behind(self, pvalueish: Any) -> int:
        """Rows of a Beam DataFrame read (``ReadFromJson``, ``ReadFromCsv``, ...) are read with
        every field this step reads, whatever Beam sampled when built (``expand``,
        :mod:`~beamsynth.transforms.frame_fields`); a DataFrame read behind other steps gets a
        warning, the same whatever was sampled. Returns how many steps behind the read is (-1:
        none)."""
        behind = dataframe_read_behind(pvalueish)
        if behind > 0 and not getattr(self, "_warned_read", False):
            self._warned_read = True
            _LOG.warning(
                "%s", f"{self.label}: its input comes from a Beam DataFrame read (beam.io."
                "ReadFromJson, ReadFromCsv, to_pcollection) through other steps; Beam types that "
                "read's rows from a sample taken when the pipeline is built (for ReadFromJson the "
                "first records of the first file), so one record there can decide which fields "
                "every row has, and job.private declares the read's fields only when applied to "
                "its output directly: apply job.private to the read and transform after it, or "
                "read with beam.io.ReadFromText + json.loads (docs/beam-api.md, 'Inputs')")
        return behind

    def _check_declared_hint(self, hint: Any) -> None:
        """``job.private(schema).with_input_types(T)``: Beam refuses an input inconsistent with a
        composite's declared ``T``; ``job.private`` judges every element whatever the hints, so a
        mismatch is a warning (a refusal would let a type that ``beam.Create`` or
        ``ReadFromJson`` infers from the records decide whether a release happens; H55). Before
        H81 the user's hint was ignored without a word."""
        declared = self.get_type_hints().input_types
        if not declared or not declared[0] or hint is None or hint == typehints.Any:
            return
        wanted = declared[0][0]
        if wanted in (INPUT_TYPES, _INPUT_HINT) or typehints.is_consistent_with(hint, wanted):
            return
        _LOG.warning(
            "%s", f"{self.label}: its input is typed {hint}, not the with_input_types({wanted}) "
            "declared on it; job.private does not check elements against that hint: it judges "
            "each element (dicts, beam.Rows, named tuples, pyarrow Tables/RecordBatches; anything "
            "else a dead letter); fix or drop the hint")

    def _check_fields(self, hint: Any) -> None:
        """Warn (when built) about typed rows carrying none of the fields read, or lacking a
        required one (the parse or the renaming forgotten): every element would then be a dead
        letter and every release learned from no record. A warning, not a refusal: Beam infers
        some element types from the records themselves (``ReadFromJson``, ``Create``), so a
        refusal would make whether a release happens depend on one record (rule 7; H45,
        tests/audit/test_session13_redteam.py). Field names only."""
        if isinstance(hint, RowTypeConstraint):
            names = [name for name, _ in hint._fields]
        elif isinstance(hint, type) and issubclass(hint, tuple) and hasattr(hint, "_fields"):
            names = list(hint._fields)  # schema'd rows typed as generated NamedTuples
        else:
            return
        if self._position is not None and self._position not in names:
            _LOG.warning(
                "%s", f"{self.label}: position_field {self._position!r} is not a field of its "
                f"input rows ({names}), so every dead letter's position would be None; attach "
                "the position upstream under that name (e.g. beam.Select(..., "
                f"{self._position}=...)) or name one of the rows' fields")
        wanted = wanted_fields(self._layout)
        if not {n for w in wanted for n in (w, avro_field_name(w))}.intersection(names):
            _LOG.warning(
                "%s", f"{self.label}: its input rows have fields {names}, none of the fields it reads "
                f"({', '.join(wanted[:6])}{', ...' if len(wanted) > 6 else ''}), so every element "
                "would be a dead letter; parse or rename upstream so each declared column is a "
                "field (beam.io.ReadFromCsv(path, header=0, names=[bs.field_name(c) for c in "
                "header]), beam.Select, ...; docs/beam-api.md, 'Inputs')")
            return
        lacking = [_required_label(f, self._layout) for f in _required_fields(self._layout)
                   if f not in names and avro_field_name(f) not in names]
        if lacking:  # every element would lack it: a dead letter each, releases on no record
            _LOG.warning(
                "%s", f"{self.label}: its input rows have fields {names} and lack {', '.join(lacking)}, "
                "which every element needs (a missing required field makes the element a dead "
                "letter, so every element would be one and every release learned from no "
                "record); add the field upstream under its declared name or bs.field_name(...) "
                "(beam.Select, the reader's names=), declare the column nullable: true, or make "
                "the job private over the columns the rows have (schema.select([...]))")

    def display_data(self) -> dict[str, Any]:
        """Schema, privacy unit, windows, the source's name and the position field (a runner's
        step panel: where dead letters come from and how they are numbered); no data value."""
        unit = self._job.unit
        return display_items(
            schema=self._layout.schema.name, columns=len(self._layout.schema.columns),
            keys=",".join(self._layout.keys), privacy_id=unit.id_column,
            max_contributions=unit.max_contributions, windows=self._windows,
            source=self._source_name(), position_field=self._position)

    def _source_name(self) -> str:
        return self._source or self.label

    def _unique_source(self, pipeline: beam.Pipeline) -> str:
        """This step's source name, refused (``RuntimeError`` for a label, ``ValueError`` for a
        ``source=``; under ``--auto_unique_labels`` a label becomes ``<label>_2``, ...) where
        another ``job.private`` of the job has it, when built: the name keys the manifest's
        exact counts and the bound's seed, so two composites' ``"Private" >> job.private(...)``
        were one source, listed twice with merged counts and one seeded bound (H83)."""
        def taken(name: str) -> bool:
            return any(s["source"] == name for s in self._job.sources)
        source = self._source_name()
        if not taken(source):
            return source
        if self._source is not None:
            raise ValueError(f"{self.label}: source {source!r} is already a job.private source "
                             "of this job (the manifest counts records by source); give each "
                             "input its own source=")
        if pipeline._options.view_as(StandardOptions).auto_unique_labels:
            return _first_free(source, taken)
        raise RuntimeError(f"a job.private step labelled {source!r} is already a source of this "
                           "job (in another composite: the manifest counts records by source); "
                           "give this one its own label: records | \"MyPrivate\" >> "
                           "job.private(schema) (or source=)")

    def _declared(self, elements: beam.PCollection) -> DeclaredWindows | None:
        """The declared windows of the release, or ``ValueError`` (build time)."""
        windowfn = elements.windowing.windowfn
        declared = self._windows
        if not isinstance(windowfn, (GlobalWindows, DeclaredWindows)) or (
                declared is not None and isinstance(windowfn, DeclaredWindows)
                and windowfn != declared):
            raise ValueError(
                f"{self.label}: the input is windowed ({type(windowfn).__name__}); the beamsynth "
                "API releases over the global window only, or once per declared window: pass "
                "windows=bs.DeclaredWindows(start=..., end=..., size=...) to job.private on "
                "timestamped input in the global window (docs/beam-api.md, docs/streaming.md)")
        check_release_windowing(elements, self.label, qualify=False)  # triggers that fire twice
        declared = declared if declared is not None else (
            windowfn if isinstance(windowfn, DeclaredWindows) else None)
        if declared is None and not elements.is_bounded:
            raise ValueError(
                f"{self.label}: the input is unbounded (a stream) in the global window, whose "
                "release would never fire; pass windows=bs.DeclaredWindows(start=..., end=..., "
                "size=...) to job.private (one release per declared window, docs/streaming.md)")
        return declared

    def _check_runner(self, elements: beam.PCollection, declared: DeclaredWindows | None) -> None:
        runner = elements.pipeline.runner
        name = f"{type(runner).__module__}.{type(runner).__qualname__}"
        option = str(elements.pipeline.options.view_as(StandardOptions).runner or "")
        stock = [n for n in (name, option) if n.split(".")[-1] == "DaskRunner"
                 and not n.startswith("beamsynth.")]
        if stock:
            raise ValueError(
                f"{self.label}: the beamsynth API emits each bundle's last batch from "
                "finish_bundle, whose output Beam's DaskRunner drops (docs/runners.md); use "
                "beamsynth's DaskRunner (--runner dask, beamsynth.runners.dask_runner.DaskRunner), "
                "or the direct, flink, spark or dataflow runner")
        if declared is not None and "dask" in f"{name} {option}".lower():
            raise ValueError(
                f"{self.label}: declared windows were not tested on the DaskRunner (docs/"
                "streaming.md); run windowed releases on the direct, flink, spark or dataflow "
                "runner")

    def _check_one_job(self, pipeline: beam.Pipeline) -> None:
        """One :class:`PrivacyJob` per pipeline (its ε is the pipeline's total), or only jobs that
        all declare ``disjoint=True``; else ``ValueError`` (build time)."""
        jobs = _jobs_of(pipeline)
        if any(j is self._job for j in jobs):
            return
        holder = _PIPELINE_HOLDERS.get(pipeline)
        if holder is not None and self._job not in _LEDGER_JOBS:
            raise ValueError(
                f"{self.label}: this pipeline already has {holder}, which keeps its own job "
                f"budget; a PrivacyJob ({self._job.name!r}, {self._job.accountant.total}) would "
                "add its whole budget over the same records. " + _ONE_BUDGET)
        if jobs and not (self._job.disjoint and all(j.disjoint for j in jobs)):
            other = jobs[0]
            raise ValueError(
                f"{self.label}: this pipeline already has a PrivacyJob ({other.name!r}, "
                f"{other.accountant.total}); a second job ({self._job.name!r}, "
                f"{self._job.accountant.total}) would add its whole budget to the first one's "
                "over the same records. Use one bs.PrivacyJob per pipeline and call job.private "
                "on every source (its ε is the pipeline's total), or, only for jobs over disjoint "
                "people, declare disjoint=True on every job")
        job = self._job
        if job._pipeline is not None and job._pipeline() is not pipeline:
            raise ValueError(
                f"{self.label}: job {job.name!r} ({job.accountant.total}) already belongs to "
                "another pipeline (its spends and exact counts are that pipeline's manifest); "
                "make a new bs.PrivacyJob for each pipeline, e.g. inside the loop that builds "
                "them (runs over the same people add up: give each its share of the total ε)")
        job._pipeline = weakref.ref(pipeline)
        _PIPELINE_JOBS.setdefault(pipeline, []).append(weakref.ref(job))

    @typed_boundary  # typed at the public step, not at each inner one
    def expand(self, elements):
        self._warn_read_behind(elements)  # also here: Beam skips type_check_inputs unless checking
        elements = with_declared_fields(elements, self._read_names())
        # a DataFrame read's rows, every declared field a field (H103); any other input as is
        declared = self._declared(elements)
        self._check_runner(elements, declared)
        self._check_one_job(elements.pipeline)
        job, source = self._job, self._unique_source(elements.pipeline)
        job.use_windows(self.label, declared)
        outside = None
        if declared is not None:
            if isinstance(elements.windowing.windowfn, GlobalWindows):
                elements = elements | "Window" >> beam.WindowInto(declared)
                # user elements, in their declared (fixed) window
            split = elements | "DropOutside" >> beam.ParDo(
                _OutsideFn(declared, source, self._position)).with_outputs("outside", main="inside")
            elements = split.inside
            outside = split.outside | "GlobalOutside" >> beam.WindowInto(GlobalWindows())
            # inside: user elements stamped in [start, end); outside: dead-letter Rows (global)
            if not elements.is_bounded:  # a stream: records late for their window's release
                gate = elements | "SplitLate" >> SplitLate()
                elements = gate["on_time"]
                late = (gate["late"]
                        | "LateDeadLetters" >> beam.ParDo(_LateFn(source, self._position))
                        | "GlobalLate" >> beam.WindowInto(GlobalWindows()))
                outside = (outside, late) | "JoinLate" >> beam.Flatten()
                # dead-letter Rows (global): outside the declared range, or late
            elements.element_type = INPUT_TYPES
        enc = elements | "Encode" >> EncodeElements(
            layout=self._layout, source=source, position_field=self._position,
            batch_rows=self._batch_rows)
        batches = enc["batches"]
        # EncodedBatch of in-domain records (schema cells, then key symbols)
        if self._layout.schema.privacy_id is not None:
            batches = batches | "BoundContributions" >> BoundContributions(
                max_contributions=job.unit.max_contributions,
                seed=job.step_seed(f"{source}/bound"))  # the source's own (H83)
            # EncodedBatch, <= max_contributions rows per privacy id
        parts = [enc["stats"] | "ReadCounts" >> beam.FlatMap(
                     lambda s: [(source, "read", s.read), (source, "rejected", s.rejected),
                                (source, "privacy_ids_rounded", s.rounded_ids)])]
        if batches is enc["batches"]:  # nothing bounded: every encoded record is used
            parts.append(batches | "UsedCounts" >> beam.FlatMap(
                lambda b: [(source, "encoded", len(b)), (source, "used", len(b))]))
        else:
            parts += [enc["batches"] | "EncodedCounts" >> beam.Map(lambda b: (source, "encoded", len(b))),
                      batches | "UsedCounts" >> beam.Map(lambda b: (source, "used", len(b)))]
        dead = enc["dead_letters"]
        if declared is not None:
            parts = [p | f"Global{i}" >> beam.WindowInto(GlobalWindows()) for i, p in enumerate(parts)]
            parts.append(outside | "OutsideCounts" >> beam.FlatMap(
                lambda d: [(source, "read", 1), (source, "rejected", 1)]))
            dead = ((dead | "GlobalDeadLetters" >> beam.WindowInto(GlobalWindows()), outside)
                    | "JoinDeadLetters" >> beam.Flatten())
            # dead-letter Rows (global window): encoding rejects and elements outside the windows
            if not dead.is_bounded:  # a stream: see stamp_now
                dead = dead | "StampNow" >> beam.Map(stamp_now)
        counts = tuple(parts) | "FlattenCounts" >> beam.Flatten()
        # (source, field, rows) exact counts: private, for the manifest's operational part
        job.count_outputs.append(counts)
        job.sources.append({"source": source, "schema": self._layout.schema.name,
                            "schema_sha256": self._layout.schema.fingerprint(),
                            "privacy_ids": self._layout.schema.privacy_ids
                            if self._layout.schema.privacy_id is not None else None,
                            "keys": {k: c.to_spec() for k, c in self._layout.keys.items()},
                            "windows": None if declared is None else declared.describe()})
        batches.element_type = EncodedBatch
        dead.element_type = DEAD_LETTER_TYPE
        self.with_output_types(typehints.Union[EncodedBatch, DEAD_LETTER_TYPE])  # its two outputs
        current = elements.pipeline._current_transform()  # this step, being applied
        for tag, pcoll in (("batches", batches), ("dead_letters", dead)):
            current.add_output(pcoll, tag)  # the step's outputs in the graph runners see
        return PrivateCollection(job=job, layout=self._layout, batches=batches,
                                 dead_letters=dead, source=source, windows=declared)
        # not a PValue nor a tuple of them: Beam hands the object back as is


def stamp_now(row: Any, ts: Any = beam.DoFn.TimestampParam) -> Any:
    """A stream's dead letter (``beam.Map(stamp_now)``) at max(its timestamp, now): encoding rejects carry their window's
    start and late ones their window, behind the watermark, so a sink that windows them by event
    time (``WriteToText(..., triggering_frequency=)``: allowed lateness 0) dropped them, silently."""
    return beam.window.TimestampedValue(row, max(ts, Timestamp.now()))


class _OutsideFn(beam.DoFn):
    """Elements stamped in a declared window pass; the others become dead letters (``outside``),
    each judged on its own timestamp (stable)."""

    def __init__(self, windows: DeclaredWindows, source: str, position_field: str | None) -> None:
        self._windows, self._source, self._position = windows, source, position_field

    def process(self, element: Any, ts=beam.DoFn.TimestampParam):
        if self._windows.contains(ts):
            yield element
            return
        reason = self._windows.outside_reason(ts)
        for d in reject_elements(element, source=self._source, position_field=self._position,
                                 reason=reason):
            yield beam.pvalue.TaggedOutput("outside", d)


class _LateFn(beam.DoFn):
    """Elements that missed their window's release (``SplitLate``'s late panes) → dead letters."""

    def __init__(self, source: str, position_field: str | None) -> None:
        self._source, self._position = source, position_field

    def process(self, element: Any, window=beam.DoFn.WindowParam):
        yield from reject_elements(element, source=self._source, position_field=self._position,
                                   reason=f"arrived after window {window_text(window)} was released")


class WindowRowsFn(beam.DoFn):
    """``fn(element, *args)`` rows with the element's window start prepended (``window_start``)."""

    def __init__(self, fn: Any, args: tuple[Any, ...]) -> None:
        self._fn, self._args = fn, args

    def process(self, element: Any, window=beam.DoFn.WindowParam):
        start = iso_seconds(window.start)
        for row in self._fn(element, *self._args):
            yield beam.Row(**{WINDOW_FIELD: start}, **row._asdict())


def release_rows(private: PrivateCollection, fn: Any, *args: Any,
                 row_type: RowTypeConstraint, order: Any = None) -> beam.PTransform:
    """Released values → rows (``FlatMap(fn, *args)`` typed ``row_type``); under declared windows
    every row gets ``window_start`` (its window's start, ISO 8601 UTC) as first field.

    ``order``: for a release made of several elements per window whose size is bounded by declared
    numbers (prefix-tree levels, decoded key tables, plausible's shards), a key of one element:
    the elements are gathered per window and their rows emitted in that key's order, so a sink
    gets the same rows in the same order on every runner (the order the runner finished the
    elements in is no part of the release; rule 7, H81). The gather puts every row of the window
    on one worker: ``Synthesize``'s sampling shards are not gathered (each shard's rows in sample
    order, shards in the runner's order; H82: gathering 1M rows took 4.7x the launcher's and 3x
    the worker's memory on ``direct-multi``). Post-processing of released values only."""
    if order is not None:
        return _RowsInOrder(private, fn, args, row_type, order)
    if private.windows is None:
        return beam.FlatMap(fn, *args).with_output_types(row_type)
    return beam.ParDo(WindowRowsFn(fn, args)).with_output_types(window_row_type(row_type))


class _RowsInOrder(beam.PTransform):
    """:func:`release_rows` with ``order``: one ``GroupByKey`` per window, then rows element by
    element in key order (elements with equal keys keep their arrival order, so keys must tell
    a release's elements apart)."""

    def __init__(self, private: PrivateCollection, fn: Any, args: tuple[Any, ...],
                 row_type: RowTypeConstraint, order: Any) -> None:
        super().__init__()
        self._private, self._fn, self._args = private, fn, args
        self._row_type, self._order = row_type, order

    def expand(self, released):
        gathered = (released
                    | "KeyAll" >> beam.Map(_keyed_zero)
                    | "GatherAll" >> beam.GroupByKey())
        # (0, Iterable[released element]) per window
        return gathered | "InOrder" >> release_rows(self._private, _rows_in_order, self._fn,
                                                    self._order, *self._args,
                                                    row_type=self._row_type)


def _keyed_zero(element: Any) -> tuple[int, Any]:
    return 0, element


def _rows_in_order(keyed: tuple[int, Any], fn: Any, order: Any, *args: Any):
    for element in sorted(keyed[1], key=order):
        yield from fn(element, *args)


def window_row_type(row_type: RowTypeConstraint) -> RowTypeConstraint:
    """``row_type`` with ``window_start: str`` first."""
    return RowTypeConstraint.from_fields([(WINDOW_FIELD, str), *row_type._fields])


def pure(epsilon: float) -> PureDP:
    """A pure ε budget from a validated share."""
    return PureDP(epsilon=check_epsilon(epsilon))


def names_of(schema: Schema, columns: Sequence[str], what: str) -> list[int]:
    """Column positions of ``columns`` (error lists the schema's columns)."""
    out = []
    for c in columns:
        if not isinstance(c, str) or c not in schema.names:
            hint = _declared_name_hint(schema, c)
            raise ValueError(f"{what}: {c!r} is not a declared column of schema {schema.name!r} "
                             f"({hint}columns: {schema.names})")
        out.append(schema.names.index(c))
    return out


def _declared_name_hint(schema: Schema, name: Any) -> str:
    """``"did you mean 'native-country'?; "`` for a column's field name (``native_country``, what
    output rows and job.private use), another case or a close spelling; else ``""``."""
    if not isinstance(name, str):
        return ""
    parts = [_declared_name(schema, x.strip()) for x in name.split(",")] if "," in name else []
    if parts and all(parts):  # "sex,income": a table's output key, not a column
        return (f"a table is a tuple of column names: did you mean {tuple(parts)!r} (its output "
                f"key is {','.join(parts)!r})?; ")
    close = schema.nearest_name(name)
    return f"did you mean {close!r}?; " if close else ""


def _declared_name(schema: Schema, name: str) -> str | None:
    """The declared column ``name`` is, under its own or its field name (``native_country``)."""
    return next((d for d in schema.names if name in (d, avro_field_name(d))), None)
