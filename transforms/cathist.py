"""CatHist: ε-DP categorical histograms over a declared, possibly huge domain (seed 000).

Seed 000 (Section 2, Theorem 2.2) shows that no DP mechanism may release only the values seen in
the data: the domain has to be declared independently of the data. Section 3, Algorithm 1 then
gives a mechanism that needs only the declared domain (size ``n``, e.g. 104,334² word pairs), ε and
a data-independent *tolerance for random values* ρ:

    noise every one of the ``n`` bins, keep the bins whose noisy count is ``≥ τ``,

simulated without touching the ``n - a`` empty bins one by one (``a`` = distinct in-domain values
present in the data).

**Privacy (what this module implements).** Neighbours: add or remove one privacy unit, which
contributes at most ``k = max_contributions`` records after
:class:`~beamsynth.transforms.units.BoundContributions`, so the histogram over the declared
domain has L1 sensitivity ``k``. Noise: the discrete Laplace (two-sided geometric) law
``P(Z = z) = (1-q)/(1+q)·q^|z|`` with ``q = exp(-ε/k)`` (scale ``k/ε``) on every bin; this is
ε-DP for the whole noisy histogram (Laplace mechanism on integers). Thresholding at τ, choosing
which bins to print and sorting them are post-processing, so the release is **ε-DP with δ = 0**.
τ depends only on (ε, k, ρ, n), all public.

**Conversion from the paper.** The paper uses the continuous ``Lap(1/ε)`` and
``p = ½·exp(-ετ)``, ``τ = -(1/ε)·ln(2(1-ρ^{1/n}))`` and ``τ + Exp(ε)`` weights. We release
integers, so with the discrete law and an integer ``τ ≥ 1``:

* tail: ``P(Z ≥ t) = q^t / (1+q)`` for integers ``t ≥ 1``
  (``Σ_{z≥t} (1-q)/(1+q)·q^z = q^t/(1+q)``);
* tolerance: ``ρ(τ) = (1 - q^τ/(1+q))^n``, the probability that none of ``n`` empty bins
  survives; τ is the **smallest** integer ``≥ 1`` with ``ρ(τ) ≥ ρ`` (so the requested
  tolerance is met), and the achieved ``ρ(τ)`` is reported. From ``p ≤ 1 - ρ^{1/n}``:
  ``τ = ⌈(ln(1 - ρ^{1/n}) + ln(1+q)) / ln q⌉``, with ``1 - ρ^{1/n} = -expm1(ln ρ / n)``, then
  checked against its neighbours in log space (``n·log1p(-p)``), which is stable for n up to
  10^12 and beyond and ρ near 0 or 1;
* weights of surviving empty bins: ``P(Z = τ + j | Z ≥ τ) = (1-q)·q^j``, i.e. ``τ + Geometric``
  (failures before the first success, success probability ``1-q``) — the exact discrete
  analogue of the paper's memoryless ``τ + Exp(ε)``;
* the paper draws the number of random bins from ``Binomial(n, p)``; the exact count of trials is
  ``n - a`` (the active bins are noised explicitly), which we use.
* The paper analyses add/remove neighbours already (sensitivity 1 per record); with ``k``
  records per unit the scale becomes ``k/ε``.

**Equality in distribution** with "noise all n bins, keep ≥ τ". The ``n`` noisy bins are
independent. (1) For the ``a`` active bins we draw ``c_i + Z_i`` exactly as the brute-force
mechanism does. (2) Each of the ``n - a`` empty bins survives independently with probability
``p = P(Z ≥ τ)``, so the number of survivors is ``K ~ Binomial(n - a, p)``; given ``K``, by
exchangeability the set of survivors is a uniform ``K``-subset of the empty bins (drawn with
``Domain.sample_distinct(rs, K, exclude=active)``), and the survivors' values are i.i.d. from the
law of ``Z`` given ``Z ≥ τ``, independent of which bins survived. (3) Released pairs are sorted by
cell index, so the output order does not reveal which bins were active. Hence the released set
of (category, count) pairs has exactly the brute-force law.

**Empty input.** With no rows, ``a = 0`` and the release is ``K ~ Binomial(n, p)`` random
categories with ``τ + Geometric`` counts — still ε-DP, and with probability ``ρ(τ)`` empty.
Windowed input: one release per **declared** window, records or not
(:func:`~beamsynth.transforms.measure.combine_globally`; other windowing is refused at build
time), and one in the global window, even on empty input.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa

from beamsynth.schemas.domains import Domain
from beamsynth.schemas.schema import Column, EncodedBatch
from beamsynth.transforms.budget import ApproxDP
from beamsynth.transforms.conventions import display_items, element_types
from beamsynth.transforms.measure import combine_globally, window_labels
from beamsynth.transforms.noise import (
    RandomSource,
    binomial,
    discrete_laplace,
    geometric,
    run_seed,
    sample_categorical,
)

__all__ = [
    "CatHistPlan",
    "ColumnCells",
    "DPCategoricalHistogram",
    "ReleasedHistogram",
    "SampleCategoricalColumn",
    "ValueCountsCombineFn",
    "achieved_tolerance",
    "count_values",
    "histogram_table",
    "log_tail",
    "merge_value_counts",
    "plan_cathist",
    "release_histogram",
    "sample_column",
    "threshold_for_tolerance",
]

PAPER = "Seed 000 (CatHist), Section 3, Algorithm 1; discrete-Laplace conversion in beamsynth.transforms.cathist"
_MAX_CELLS = 2**63 - 1  # cell indices travel as int64


# -- exact arithmetic of the discrete law ----------------------------------------------------------
def _check_epsilon(epsilon: Any) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)):
        raise TypeError(f"epsilon must be a number, got {type(epsilon).__name__} ({epsilon!r})")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon ({epsilon!r}) must be a finite number > 0")
    return float(epsilon)


def _check_tolerance(tolerance: Any) -> float:
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)):
        raise TypeError(f"tolerance must be a number, got {type(tolerance).__name__} ({tolerance!r})")
    if not (0.0 < tolerance < 1.0):
        raise ValueError(f"tolerance ρ ({tolerance!r}) must be in the open interval (0, 1)")
    return float(tolerance)


def _check_count(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < low:
        raise ValueError(f"{name} ({value!r}) must be an int >= {low}")
    return int(value)


def log_tail(tau: int, log_q: float) -> float:
    """``ln P(Z ≥ τ)`` of the discrete Laplace law ``∝ q^|z|`` for an integer ``τ ≥ 1``.

    ``P(Z ≥ τ) = q^τ / (1 + q)``; with ``log_q = ln q < 0`` this is ``τ·ln q - log1p(q)``.
    """
    if tau < 1:
        raise ValueError(f"tau ({tau!r}) must be an int >= 1")
    return tau * log_q - math.log1p(math.exp(log_q))


def achieved_tolerance(tau: int, log_q: float, n: int) -> float:
    """``(1 - P(Z ≥ τ))^n``: probability that none of ``n`` empty bins reaches ``τ``."""
    return math.exp(n * math.log1p(-math.exp(log_tail(tau, log_q))))


def threshold_for_tolerance(*, log_q: float, tolerance: float, n: int) -> int:
    """Smallest integer ``τ ≥ 1`` with ``(1 - q^τ/(1+q))^n ≥ ρ`` (see the module docstring)."""
    log_rho = math.log(tolerance)
    p_max = -math.expm1(log_rho / n)  # 1 - ρ^(1/n), stable for huge n and ρ near 1
    raw = (math.log(p_max) + math.log1p(math.exp(log_q))) / log_q
    tau = max(1, math.ceil(raw - 1e-9))

    def ok(t: int) -> bool:
        return n * math.log1p(-math.exp(log_tail(t, log_q))) >= log_rho

    while not ok(tau):
        tau += 1
    while tau > 1 and ok(tau - 1):
        tau -= 1
    return tau


@dataclass(frozen=True)
class CatHistPlan:
    """The data-independent parameters of one CatHist release (computed before any data is read).

    Attributes:
      epsilon: ε of the release (pure DP, δ = 0).
      sensitivity: k, records per privacy unit (L1 sensitivity of the histogram).
      tolerance: requested ρ.
      domain_size: n, cells of the declared domain.
      tau: integer threshold; bins are released iff their noisy count is ``≥ tau``.
      log_q: ``ln q = -ε/k`` (discrete Laplace scale ``k/ε``).
    """

    epsilon: float
    sensitivity: int
    tolerance: float
    domain_size: int
    tau: int
    log_q: float

    @property
    def q(self) -> float:
        """Ratio of the discrete Laplace law, ``exp(-ε/k)``."""
        return math.exp(self.log_q)

    @property
    def scale(self) -> float:
        """Discrete Laplace scale ``k/ε``."""
        return -1.0 / self.log_q

    @property
    def tail_probability(self) -> float:
        """``p = P(Z ≥ τ) = q^τ/(1+q)``: survival probability of one empty bin."""
        return math.exp(log_tail(self.tau, self.log_q))

    @property
    def achieved_tolerance(self) -> float:
        """``(1-p)^n ≥ ρ``: probability that no empty bin survives when the data is empty."""
        return achieved_tolerance(self.tau, self.log_q, self.domain_size)

    def details(self) -> dict[str, Any]:
        """Manifest form (public: no data-dependent value)."""
        return {
            "domain_size": self.domain_size,
            "tolerance": self.tolerance,
            "achieved_tolerance": self.achieved_tolerance,
            "tau": self.tau,
            "tail_probability": self.tail_probability,
            "noise": "discrete Laplace (two-sided geometric)",
            "scale": self.scale,
            "sensitivity": self.sensitivity,
            "neighbouring": "add/remove one privacy unit",
            "paper": PAPER,
        }


def plan_cathist(
    *, epsilon: float, tolerance: float, domain_size: int, max_contributions: int = 1
) -> CatHistPlan:
    """Validate (ε, ρ, n, k) and derive τ; raises ``ValueError``/``TypeError`` echoing bad values."""
    eps = _check_epsilon(epsilon)
    rho = _check_tolerance(tolerance)
    n = _check_count("domain_size", domain_size, 1)
    if n > _MAX_CELLS:
        raise ValueError(f"domain_size ({n}) must be < 2**63 (cell indices are int64)")
    k = _check_count("max_contributions", max_contributions, 1)
    log_q = -eps / k
    tau = threshold_for_tolerance(log_q=log_q, tolerance=rho, n=n)
    return CatHistPlan(eps, k, rho, n, tau, log_q)


# -- counting values present (columnar, mergeable) -------------------------------------------------
def merge_value_counts(parts: Iterable[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Merge ``(cells, counts)`` pairs into one pair with unique sorted cells."""
    parts = [(np.asarray(c, np.int64), np.asarray(n, np.int64)) for c, n in parts]
    parts = [p for p in parts if p[0].size]
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if len(parts) == 1:
        return parts[0]
    cells = np.concatenate([c for c, _ in parts])
    counts = np.concatenate([n for _, n in parts])
    uniq, inv = np.unique(cells, return_inverse=True)
    return uniq, np.bincount(inv, weights=counts, minlength=uniq.size).astype(np.int64)


def count_values(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact ``(cells, counts)`` of the values present in a 1-d code array (sorted by cell)."""
    codes = np.asarray(codes, dtype=np.int64)
    if codes.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    cells, counts = np.unique(codes, return_counts=True)
    return cells, counts.astype(np.int64)


class ValueCountsCombineFn(beam.CombineFn):
    """Exact counts of the distinct values of one column of :class:`EncodedBatch` inputs.

    Accumulator: ``(cells, counts)`` int64 arrays, cells unique and sorted. ``add_input`` counts a
    whole batch with ``np.unique`` (columnar); merge adds counts of equal cells. Output: the same
    pair (empty arrays on empty input).
    """

    def __init__(self, column: int = 0) -> None:
        self._column = _check_count("column", column, 0)

    def create_accumulator(self) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)

    def add_input(self, acc, batch: EncodedBatch):
        return merge_value_counts([acc, count_values(batch.codes[:, self._column])])

    def merge_accumulators(self, accumulators):
        return merge_value_counts(accumulators)

    def extract_output(self, acc):
        return acc


# -- the release (Beam-free) -----------------------------------------------------------------------
@dataclass(frozen=True)
class ReleasedHistogram:
    """A released CatHist histogram: cells (sorted) and their noisy counts, all ``≥ τ``.

    It says nothing about which cells were present in the data (that would break DP).
    """

    cells: np.ndarray
    counts: np.ndarray
    plan: CatHistPlan

    def __len__(self) -> int:
        return int(self.cells.size)

    @property
    def total(self) -> int:
        """Sum of the released noisy counts."""
        return int(self.counts.sum())


def release_histogram(
    cells: np.ndarray,
    counts: np.ndarray,
    *,
    plan: CatHistPlan,
    domain: Domain,
    rs: RandomSource,
) -> ReleasedHistogram:
    """The CatHist release from exact counts of the values present (see the module docstring).

    Args:
      cells: distinct in-domain cell indices present in the data (int64, unique).
      counts: their exact counts (after contribution bounding).
      plan: from :func:`plan_cathist` (``plan.domain_size`` must equal ``domain.size``).
      domain: the declared domain, used only to draw labels of empty bins without enumerating.
      rs: the random stream of this release.
    """
    cells = np.asarray(cells, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    if cells.shape != counts.shape or cells.ndim != 1:
        raise ValueError(f"cells {cells.shape} and counts {counts.shape} must be equal 1-d shapes")
    if domain.size != plan.domain_size:
        raise ValueError(f"domain size ({domain.size}) differs from the plan's n ({plan.domain_size})")
    if cells.size and (cells.min() < 0 or cells.max() >= plan.domain_size):
        raise ValueError(
            f"cells must lie in [0, {plan.domain_size}); {int(np.sum((cells < 0) | (cells >= plan.domain_size)))}"
            " do not (out-of-domain values belong on the rejected output; values not echoed: "
            "they are private)"
        )
    if np.unique(cells).size != cells.size:
        raise ValueError("cells must be distinct (merge counts first)")
    active = cells.size
    noisy = counts + discrete_laplace(rs.child("active"), plan.scale, active)
    keep = noisy >= plan.tau
    k_out = binomial(rs.child("k_out"), plan.domain_size - active, plan.tail_probability)
    rand_cells = np.asarray(
        domain.sample_distinct(rs.child("labels"), k_out, exclude=cells.tolist()), dtype=np.int64
    )
    rand_counts = plan.tau + geometric(rs.child("weights"), plan.q, k_out)
    all_cells = np.concatenate([cells[keep], rand_cells])
    all_counts = np.concatenate([noisy[keep], rand_counts.astype(np.int64)])
    order = np.argsort(all_cells, kind="stable")
    return ReleasedHistogram(all_cells[order], all_counts[order], plan)


def histogram_table(
    released: ReleasedHistogram, decode: Any, *, column: str = "category", count: str = "count"
) -> pa.Table:
    """Post-processing: a pyarrow Table (category, noisy count), largest counts first.

    ``decode`` maps an int64 cell array to labels (``Domain.decode_many`` or ``Column.decode``).
    """
    order = np.lexsort((released.cells, -released.counts))
    cells = released.cells[order]
    labels = [None if v is None else str(v) for v in decode(cells)] if cells.size else []
    return pa.table({column: pa.array(labels, type=pa.string()),
                     count: pa.array(released.counts[order], type=pa.int64())})


def sample_column(released: ReleasedHistogram, rows: int, rs: RandomSource) -> np.ndarray:
    """Post-processing: ``rows`` cells drawn i.i.d. proportionally to the released counts.

    With nothing released the cells are uniform over the declared domain (nothing was learned).
    """
    rows = _check_count("rows", rows, 0)
    if released.cells.size == 0:
        return rs.integers(released.plan.domain_size, rows)
    idx = sample_categorical(rs, released.counts.astype(np.float64), rows)
    return released.cells[idx]


class ColumnCells(Domain):
    """The cells of a schema column as a domain: the declared domain plus the null cell if nullable.

    Lets CatHist treat null as one more category of a nullable open column.
    """

    kind = "column-cells"

    def __init__(self, column: Column) -> None:
        if not isinstance(column, Column):
            raise TypeError(f"column must be a Column, got {type(column).__name__}")
        self._column = column

    @property
    def size(self) -> int:
        return self._column.cells

    def encode(self, value: Any) -> int:
        codes, _ = self._column.encode([value])
        return int(codes[0])

    def decode(self, index: int) -> Any:
        return self._column.decode(np.asarray([index], dtype=np.int64))[0]

    def decode_many(self, indices: np.ndarray, rs: RandomSource | None = None) -> list[Any]:
        return self._column.decode(np.asarray(indices, dtype=np.int64), rs)

    def to_spec(self) -> dict[str, Any]:
        return {"column": self._column.name, "nullable": self._column.nullable,
                "domain": self._column.domain.to_spec()}


# -- Beam ------------------------------------------------------------------------------------------
class _ReleaseFn(beam.DoFn):
    """Exact value counts → ReleasedHistogram; randomness from (seed, step, window)."""

    def __init__(self, *, plan: CatHistPlan, domain: Domain, seed: int | None, step: str) -> None:
        self._plan, self._domain, self._seed, self._step = plan, domain, seed, step

    def process(self, cells_counts, window=beam.DoFn.WindowParam):
        cells, counts = cells_counts
        rs = RandomSource(seed=self._seed).child(self._step, *window_labels(window))
        yield release_histogram(cells, counts, plan=self._plan, domain=self._domain, rs=rs)


@element_types(input=EncodedBatch, output=ReleasedHistogram)
class DPCategoricalHistogram(beam.PTransform):
    """ε-DP histogram of one column over a declared (possibly 10^10-cell) domain: CatHist.

    Args:
      domain: the declared domain (its cells are the codes of ``column``).
      budget: pure ε budget (already spent on the accountant by the caller, with
        ``self.plan.details()``).
      tolerance: ρ in (0, 1), the probability that no value from outside the data is released
        (for empty data); higher ρ → higher threshold τ.
      max_contributions: k, records per privacy unit after bounding (sensitivity).
      column: position of the column in the input :class:`EncodedBatch` codes.
      seed: ``None`` (secure, default) or an int for tests and demos.

    Input: ``PCollection[EncodedBatch]`` (contribution-bounded, in-domain codes).
    Output: one :class:`ReleasedHistogram` per window.

    Privacy: add/remove one privacy unit; L1 sensitivity ``k``; discrete Laplace noise of scale
    ``k/ε`` on every one of the ``n`` bins (simulated exactly for empty bins); threshold τ from
    (ε, k, ρ, n); ε-DP, δ = 0. Seed 000, Section 3, Algorithm 1 (see the module docstring for the
    discrete conversion and the equality-in-distribution argument).
    """

    def __init__(
        self,
        *,
        domain: Domain,
        budget: ApproxDP,
        tolerance: float,
        max_contributions: int = 1,
        column: int = 0,
        seed: int | None = None,
        label: str | None = None,
    ) -> None:
        super().__init__(label)
        if not isinstance(domain, Domain):
            raise TypeError(f"domain must be a Domain, got {type(domain).__name__}")
        if not isinstance(budget, ApproxDP):
            raise TypeError(f"budget must be a PureDP budget, got {type(budget).__name__}")
        if budget.delta != 0:
            raise ValueError(f"CatHist is pure ε-DP; budget delta ({budget.delta}) must be 0")
        self._plan = plan_cathist(epsilon=budget.epsilon, tolerance=tolerance,
                                  domain_size=domain.size, max_contributions=max_contributions)
        self._domain = domain
        self._column = _check_count("column", column, 0)
        self._seed = run_seed(seed)  # None → this transform's run secret, drawn at build time

    @property
    def plan(self) -> CatHistPlan:
        """The data-independent parameters (τ, achieved ρ, n, scale)."""
        return self._plan

    def default_label(self) -> str:
        return f"DPCategoricalHistogram(ε={self._plan.epsilon:g}, ρ={self._plan.tolerance:g})"

    def display_data(self) -> dict[str, Any]:
        p = self._plan
        return display_items(mechanism="CatHist (thresholded discrete Laplace histogram)",
                             epsilon=p.epsilon, delta=0.0, tolerance=p.tolerance, tau=p.tau,
                             domain_size=p.domain_size, noise="discrete Laplace",
                             noise_scale=p.scale)

    def expand(self, batches):
        # batches: EncodedBatch (codes[rows, columns])
        counts = combine_globally(batches, ValueCountsCombineFn(self._column), "CountValues")
        # (cells int64[a], counts int64[a]) per window
        return counts | "ReleaseCatHist" >> beam.ParDo(
            _ReleaseFn(plan=self._plan, domain=self._domain, seed=self._seed, step=self.label))
        # ReleasedHistogram per window


class _SampleColumnFn(beam.DoFn):
    def __init__(self, *, domain: Domain, rows: int, name: str, seed: int | None) -> None:
        self._domain, self._rows, self._name, self._seed = domain, rows, name, seed

    def process(self, released: ReleasedHistogram, window=beam.DoFn.WindowParam):
        rs = RandomSource(seed=self._seed).child("sample-column", self._name, *window_labels(window))
        cells = sample_column(released, self._rows, rs)
        labels = self._domain.decode_many(cells)
        yield pa.table({self._name: pa.array([None if v is None else str(v) for v in labels],
                                             type=pa.string())})


@element_types(input=ReleasedHistogram, output=pa.Table)
class SampleCategoricalColumn(beam.PTransform):
    """Post-processing: a synthetic column of ``rows`` values sampled from a released histogram.

    Input: ``PCollection[ReleasedHistogram]`` (one per window). Output: one pyarrow Table per
    window with a single string column ``name``. No budget is spent.
    """

    def __init__(self, *, domain: Domain, rows: int, name: str = "category",
                 seed: int | None = None, label: str | None = None) -> None:
        super().__init__(label)
        if not isinstance(domain, Domain):
            raise TypeError(f"domain must be a Domain, got {type(domain).__name__}")
        self._fn = _SampleColumnFn(domain=domain, rows=_check_count("rows", rows, 0),
                                   name=str(name), seed=run_seed(seed))

    def display_data(self) -> dict[str, Any]:
        """What is sampled (post-processing: no budget)."""
        return display_items(mechanism="sampling from a released histogram (post-processing, no "
                             "budget)", rows=self._fn._rows, domain_size=self._fn._domain.size)

    def expand(self, released):
        # released: ReleasedHistogram per window
        return released | "SampleColumn" >> beam.ParDo(self._fn)
        # pyarrow.Table with one column
