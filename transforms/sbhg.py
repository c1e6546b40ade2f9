"""SBHG: the stability-based hashed Gibbs sampler (Li, Karwa, Slavković, Steorts; seed 002).

Three steps, each a Beam-free core plus one wiring step in :class:`DPHashedConditionals`:

1. **Hash selection (SBHG+EM, Remark 3.2).** One pass counts every 2-way table
   (:class:`~beamsynth.transforms.measure.MarginalCountsCombineFn`). For each feature ``j`` the
   ``R`` features of highest mutual information with ``X_j`` are chosen by ``R`` rounds of the
   exponential mechanism (without replacement) on the score :func:`mi_score`, so the hash
   ``h_j(x) = (x_{h1}, ..., x_{hR})`` is itself DP.
2. **Hashed conditionals (Algorithm 2, lines 1-6).** A second pass counts ``C_{j,m}``: the
   number of records with ``X_j = x`` and ``h_j(X_-j) = m``, as sparse sorted-unique arrays (only
   non-empty cells exist; the hash spaces can be huge). The stability-based algorithm (SBA,
   Algorithm 1) releases them: every non-empty cell gets ``z = c + DLap(b)``, cells with
   ``z < t`` are dropped.
3. **Gibbs sampling (Algorithm 2, lines 7-21, Remark 3.3).** :class:`SBHGModel` runs many
   independent chains in vectorised form; a proposal that lands on a hash value without a
   released conditional is rejected (the old value is kept). Pure post-processing.

Privacy (add/remove one privacy unit, each unit at most ``k`` records after
:class:`~beamsynth.transforms.units.BoundContributions`):

* Selection: ``p·R`` exponential-mechanism draws, each ``ε_sel/(p·R)``-DP with the score
  sensitivity ``Δ = k·(ln C + 1)`` of :func:`mi_score_sensitivity`; together ``ε_sel``-DP.
* Conditionals: per feature :func:`sba_threshold` gives ``(ε_c/p, δ/p)``; every record is in
  every feature's table, so the ``p`` tables compose to ``(ε_c, δ)``.
* Total ``(ε_sel + ε_c, δ)`` by basic sequential composition (adaptive: the hash is chosen
  first, Remark 3.2).

Theorem 3.1 of the paper is for replace-one neighbours (sensitivity 2, ``b = 2/ε``,
``t = 1 + (2/ε)·ln(2/δ)``, continuous Laplace). This module redoes it for add/remove neighbours
with discrete Laplace noise and ``k`` contributions (:func:`sba_delta` has the proof).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np

from beamsynth.schemas.schema import EncodedBatch
from beamsynth.transforms.budget import ApproxDP
from beamsynth.transforms.conventions import display_items, element_types
from beamsynth.transforms.measure import MarginalCountsCombineFn, combine_globally, window_labels
from beamsynth.transforms.noise import (
    RandomSource,
    discrete_laplace,
    discrete_laplace_scale,
    exponential_mechanism,
    run_seed,
    sample_categorical,
)
from beamsynth.transforms.synthesis import SynthesisModel

__all__ = [
    "DEFAULT_MI_COUNT_CAP",
    "DPHashedConditionals",
    "HashedCountsFn",
    "ReleasedConditionals",
    "SBHGModel",
    "SparseCountsCombineFn",
    "capped_xlogx",
    "choose_hash_size",
    "hash_keys",
    "hashed_counts",
    "key_space",
    "merge_sparse",
    "mi_score",
    "mi_score_sensitivity",
    "sba_delta",
    "sba_release",
    "sba_threshold",
    "select_hash_features",
]

DEFAULT_MI_COUNT_CAP = 10**7
_MAX_KEY_SPACE = 2**62  # hashed cell keys are int64
_MAX_PAIR_CELLS = 2_000_000  # dense 2-way tables for the selection pass


# -- 1. the mutual-information score and its sensitivity --------------------------------------------
def choose_hash_size(rows: float, epsilon: float, shape: Sequence[int], *, top_r: int,
                     max_contributions: int = 1, theta: float | None = None,
                     min_cell_count: float = 0.0) -> int:
    """Hash features per column worth releasing for ``rows·ε`` (issue 18): the largest
    ``r ≤ top_r`` whose tables ``X_j × h_j`` (``g^(r+1)`` cells for the geometric-mean declared
    column size ``g``) are θ-useful, :func:`~beamsynth.transforms.privbayes.network_usefulness`
    ``≥ theta`` (default :data:`~beamsynth.transforms.privbayes.SIZING_THETA`) **and** whose mean
    count per cell, ``rows/g^(r+1)``, reaches ``min_cell_count`` (the SBA threshold: cells below
    it are dropped, so tables of smaller mean counts release almost nothing; PUMS, 1,000 rows,
    ε = 1: r = 1 without it gave TVD1 0.29); 0 means the caller falls back to independent 1-way
    marginals. A pure function of public values (a public ``rows``, ε, δ and the declared shape),
    so it spends nothing."""
    from beamsynth.transforms.privbayes import SIZING_THETA, network_usefulness

    theta = SIZING_THETA if theta is None else theta
    g = math.exp(float(np.mean(np.log(np.asarray(shape, dtype=np.float64)))))
    for r in range(int(top_r), 0, -1):
        if (network_usefulness(rows, epsilon, shape, r, max_contributions=max_contributions) >= theta
                and rows / g ** (r + 1) >= min_cell_count):
            return r
    return 0


def capped_xlogx(c: np.ndarray, cap: int) -> np.ndarray:
    """``g_C(c) = c·ln c`` for ``c ≤ C``, continued linearly with slope ``ln C + 1`` above ``C``.

    ``g_C`` is convex with increments ``g_C(c+1) - g_C(c)`` in ``[0, ln C + 1]`` (``g_C(0) = 0``),
    which is what bounds the sensitivity of :func:`mi_score` independently of the data size.
    """
    c = np.asarray(c, dtype=np.float64)
    cap_f = float(cap)
    low = np.where(c > 0, c * np.log(np.maximum(c, 1.0)), 0.0)
    high = cap_f * math.log(cap_f) + (c - cap_f) * (math.log(cap_f) + 1.0)
    return np.where(c <= cap_f, low, high)


def mi_score(table: np.ndarray, cap: int = DEFAULT_MI_COUNT_CAP) -> float:
    """Count-weighted plug-in mutual information ``n·I(X;Y)`` (nats) of a 2-way count table.

    ``n·I = Σ g(c_xy) - Σ g(c_x) - Σ g(c_y) + g(n)`` with ``g = capped_xlogx(·, cap)``; exact
    ``n·I`` whenever every count (and ``n``) is at most ``cap``.
    """
    t = np.asarray(table, dtype=np.float64)
    if t.ndim != 2:
        raise ValueError(f"mi_score needs a 2-way table, got shape {t.shape}")
    return float(
        capped_xlogx(t, cap).sum()
        - capped_xlogx(t.sum(axis=1), cap).sum()
        - capped_xlogx(t.sum(axis=0), cap).sum()
        + capped_xlogx(np.array(t.sum()), cap)
    )


def mi_score_sensitivity(*, cap: int = DEFAULT_MI_COUNT_CAP, max_contributions: int = 1) -> float:
    """Add/remove sensitivity of :func:`mi_score`: ``k·(ln C + 1)``.

    Proof. Adding one record at cell (x, y) changes the score by
    ``Δ = d(c_xy) - d(c_x) - d(c_y) + d(n)`` where ``d(c) = g(c+1) - g(c)`` is non-decreasing
    (``g`` convex), ``d(0) = 0`` and ``d ≤ ln C + 1`` (for integer ``c < C``,
    ``d(c) ≤ ln(c+1) + 1``; above ``C`` it is ``ln C + 1``). Since ``c_xy ≤ c_x`` and
    ``c_y ≤ n``: ``Δ ≤ d(n) - d(c_y) ≤ d(n) ≤ ln C + 1`` and ``Δ ≥ d(c_xy) - d(c_x) ≥ -d(c_x)
    ≥ -(ln C + 1)``. Removing a record is adding it to the smaller dataset. A unit adds or removes
    at most ``k`` records, one at a time: ``|Δ| ≤ k·(ln C + 1)``, for every data size ``n``
    (the uncapped score has sensitivity ``≈ ln n + 1``, which is private, hence the cap).
    Checked by brute force in ``tests/unit/test_sbhg.py``.
    """
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 2:
        raise ValueError(f"cap ({cap!r}) must be an int >= 2")
    if isinstance(max_contributions, bool) or not isinstance(max_contributions, int) or max_contributions < 1:
        raise ValueError(f"max_contributions ({max_contributions!r}) must be an int >= 1")
    return max_contributions * (math.log(cap) + 1.0)


def select_hash_features(
    pair_tables: dict[tuple[int, int], np.ndarray],
    *,
    num_features: int,
    top_r: int,
    epsilon_each: float,
    sensitivity: float,
    cap: int,
    rs: RandomSource,
) -> tuple[tuple[int, ...], ...]:
    """SBHG+EM (Remark 3.2): for each feature ``j``, ``min(R, p-1)`` features chosen one at a time
    by the exponential mechanism on :func:`mi_score` (``ε_each``-DP per draw, sensitivity
    ``sensitivity``), without replacement. Returns sorted parent tuples, one per feature.

    ``pair_tables[(a, b)]`` (``a < b``) is the exact 2-way count table of columns a and b.
    """
    r_eff = min(top_r, num_features - 1)
    parents: list[tuple[int, ...]] = []
    for j in range(num_features):
        others = [m for m in range(num_features) if m != j]
        scores = np.array([mi_score(pair_tables[(min(j, m), max(j, m))], cap) for m in others])
        chosen: list[int] = []
        for r in range(r_eff):
            left = [i for i in range(len(others)) if others[i] not in chosen]
            pick = exponential_mechanism(rs.child("select", j, r), scores[left],
                                         epsilon=epsilon_each, sensitivity=sensitivity)
            chosen.append(others[left[pick]])
        parents.append(tuple(sorted(chosen)))
    return tuple(parents)


# -- 2. hashed conditional counts (sparse) ------------------------------------------------------------
def hash_keys(codes: np.ndarray, cols: Sequence[int], shape: Sequence[int]) -> np.ndarray:
    """Mixed-radix key of the values of ``cols`` (the hash ``h(X_-j)``); 0 when ``cols`` is empty."""
    key = np.zeros(codes.shape[0], dtype=np.int64)
    for c in cols:
        key = key * int(shape[c]) + codes[:, c].astype(np.int64)
    return key


def key_space(j: int, parents: Sequence[int], shape: Sequence[int]) -> int:
    """Number of cells ``(h, x_j)`` of feature ``j``'s hashed table."""
    return int(shape[j]) * math.prod(int(shape[c]) for c in parents)


def hashed_counts(codes: np.ndarray, parents: Sequence[Sequence[int]], shape: Sequence[int]
                  ) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """Non-empty cells of every feature's hashed table as ``(keys, counts)`` sorted-unique arrays.

    The key of a record in feature ``j``'s table is ``h_j(x)·K_j + x_j``; each record is in
    exactly one cell of each feature's table.
    """
    out = []
    for j, pa in enumerate(parents):
        keys = hash_keys(codes, pa, shape) * int(shape[j]) + codes[:, j].astype(np.int64)
        uniq, cnt = np.unique(keys, return_counts=True)
        out.append((uniq.astype(np.int64), cnt.astype(np.int64)))
    return tuple(out)


def merge_sparse(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Sum of two sparse count vectors given as sorted-unique ``(keys, counts)``."""
    keys = np.concatenate([a[0], b[0]])
    counts = np.concatenate([a[1], b[1]])
    uniq, inv = np.unique(keys, return_inverse=True)
    return uniq, np.bincount(inv, weights=counts, minlength=uniq.size).astype(np.int64)


SparseCounts = tuple[tuple[np.ndarray, np.ndarray], ...]


class HashedCountsFn(beam.DoFn):
    """``EncodedBatch`` → sparse hashed counts of the batch, given the selected parents (side input)."""

    def __init__(self, shape: Sequence[int]) -> None:
        self._shape = tuple(int(s) for s in shape)

    def process(self, batch: EncodedBatch, parents: tuple[tuple[int, ...], ...]
                ) -> Iterable[SparseCounts]:
        if len(batch):
            yield hashed_counts(batch.codes, parents, self._shape)


class SparseCountsCombineFn(beam.CombineFn):
    """Sums sparse per-feature counts; accumulator ``None`` or a list of ``(keys, counts)``.

    Only non-empty cells are ever stored, which is exactly what SBA needs. Output: a tuple of
    ``num_features`` pairs (empty arrays on empty input).
    """

    def __init__(self, num_features: int) -> None:
        if isinstance(num_features, bool) or not isinstance(num_features, int) or num_features < 1:
            raise ValueError(f"num_features ({num_features!r}) must be an int >= 1")
        self._p = num_features

    def create_accumulator(self) -> list[tuple[np.ndarray, np.ndarray]] | None:
        return None

    def add_input(self, acc, counts: SparseCounts):
        if len(counts) != self._p:
            raise ValueError(f"expected counts for {self._p} features, got {len(counts)}")
        if acc is None:
            return [(k.copy(), c.copy()) for k, c in counts]
        return [merge_sparse(a, b) for a, b in zip(acc, counts)]

    def merge_accumulators(self, accumulators: Any):
        merged = None
        for acc in accumulators:
            if acc is None:
                continue
            merged = acc if merged is None else [merge_sparse(a, b) for a, b in zip(merged, acc)]
        return merged

    def extract_output(self, acc) -> SparseCounts:
        if acc is None:
            empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
            return tuple(empty for _ in range(self._p))
        return tuple(acc)


# -- the stability-based algorithm (SBA) -------------------------------------------------------------
def _log_tail(m: float, scale: float) -> float:
    """``ln P(Z ≥ m)`` of the discrete Laplace law, integer ``m ≥ 0``: ``P = q^m / (1 + q)``."""
    q = math.exp(-1.0 / scale)
    return -m / scale - math.log1p(q)


def sba_delta(threshold: int, scale: float, max_contributions: int = 1) -> float:
    """δ of SBA with discrete Laplace noise of ``scale``, keep rule ``z ≥ threshold``, k contributions.

    Add/remove neighbours ``D ⊂ D'`` (``D'`` has one more unit, at most ``k`` more records).
    Split the cells of ``D'`` into those non-empty in ``D`` (A) and the new ones (B: at most
    ``k`` cells with counts ``c_i ≥ 1``, ``Σ c_i ≤ k``). On A the count vectors differ by at most
    ``k`` in L1, so the per-cell noisy-and-thresholded outputs have a pointwise probability ratio
    ``≤ e^{k/b} = e^ε`` (thresholding ``P(c+Z < t)`` obeys the same shift bound). ``M(D)`` never
    outputs a B cell; ``M(D')`` outputs one with probability
    ``P_B ≤ Σ_i P(Z ≥ t - c_i)``. Hence for every output ``o`` without B cells,
    ``P_{D'}(o) / P_D(o) ∈ [e^{-ε}(1 - P_B), e^ε]``, and the hockey-stick divergences in both
    directions are at most ``P_B``: ``(ε, P_B)``-DP.

    ``f(c) = P(Z ≥ t - c) = q^{t-c}/(1+q)`` is convex and increasing in ``c``, so over all ways
    to split ``≤ k`` records into new cells the sum is largest either for one cell of count ``k``
    or for ``k`` cells of count 1: ``δ = max(f(k), k·f(1))`` (valid for ``t ≥ k``).

    Compared with the paper (replace-one, sensitivity 2, continuous Laplace ``b = 2/ε``,
    ``t = 1 + (2/ε)·ln(2/δ)``): add/remove halves the sensitivity for ``k = 1`` (``b = 1/ε``) and
    the threshold becomes ``t = 1 + ⌈b·ln(1/((1+q)·δ))⌉``; :func:`sba_threshold` computes it.
    """
    k = int(max_contributions)
    t = int(threshold)
    if t < k:
        raise ValueError(f"threshold ({threshold}) must be >= max_contributions ({k})")
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale ({scale!r}) must be a finite number > 0")
    return math.exp(max(_log_tail(t - k, scale), math.log(k) + _log_tail(t - 1, scale)))


def sba_threshold(*, epsilon: float, delta: float, max_contributions: int = 1) -> tuple[float, int]:
    """``(scale, threshold)`` of an ``(ε, δ)``-DP SBA release under add/remove neighbours.

    ``scale = k/ε`` (discrete Laplace); ``threshold`` is the smallest integer ``t ≥ k`` with
    :func:`sba_delta` ``(t) ≤ δ``.
    """
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta ({delta!r}) must be in (0, 1): SBA needs δ > 0")
    k = int(max_contributions)
    if k < 1:
        raise ValueError(f"max_contributions ({max_contributions!r}) must be >= 1")
    b = discrete_laplace_scale(sensitivity=k, epsilon=epsilon)
    log1pq = math.log1p(math.exp(-1.0 / b))
    t = max(k, math.ceil(max(k + b * (-math.log(delta) - log1pq),
                             1 + b * (math.log(k) - math.log(delta) - log1pq))))
    while sba_delta(t, b, k) > delta:
        t += 1
    while t - 1 >= k and sba_delta(t - 1, b, k) <= delta:
        t -= 1
    return b, int(t)


def sba_release(keys: np.ndarray, counts: np.ndarray, *, scale: float, threshold: int,
                rs: RandomSource) -> tuple[np.ndarray, np.ndarray]:
    """SBA (Algorithm 1) on the non-empty cells: ``z = c + DLap(scale)``, keep ``z ≥ threshold``."""
    if keys.size == 0:
        return keys.astype(np.int64), counts.astype(np.int64)
    z = counts.astype(np.int64) + discrete_laplace(rs, scale, counts.size)
    keep = z >= threshold
    return keys[keep].astype(np.int64), z[keep]


@dataclass(frozen=True)
class ReleasedConditionals:
    """The DP output of SBHG's measurement: hash parents and surviving noisy cells per feature.

    ``cells[j] = (keys, values)``: key ``h_j·K_j + x_j`` and noisy count ``z ≥ threshold``.
    """

    shape: tuple[int, ...]
    parents: tuple[tuple[int, ...], ...]
    cells: tuple[tuple[np.ndarray, np.ndarray], ...]
    scale: float
    threshold: int
    budget_per_feature: ApproxDP


class _SelectParentsFn(beam.DoFn):
    def __init__(self, *, pairs, num_features, top_r, epsilon_each, sensitivity, cap, seed, step):
        self._pairs, self._p, self._r = pairs, num_features, top_r
        self._eps, self._sens, self._cap, self._seed, self._step = epsilon_each, sensitivity, cap, seed, step

    def process(self, tables, window=beam.DoFn.WindowParam):
        rs = RandomSource(seed=self._seed).child(self._step, *window_labels(window))
        if self._r == 0 or self._p == 1:
            yield tuple(() for _ in range(self._p))
            return
        yield select_hash_features(
            dict(zip(self._pairs, tables)), num_features=self._p, top_r=self._r,
            epsilon_each=self._eps, sensitivity=self._sens, cap=self._cap, rs=rs)


class _ReleaseSBAFn(beam.DoFn):
    def __init__(self, *, shape, scale, threshold, budget, seed, step):
        self._shape, self._scale, self._t = shape, scale, threshold
        self._budget, self._seed, self._step = budget, seed, step

    def process(self, counts, parents, window=beam.DoFn.WindowParam):
        rs = RandomSource(seed=self._seed).child(self._step, *window_labels(window))
        cells = tuple(
            sba_release(k, c, scale=self._scale, threshold=self._t, rs=rs.child("sba", j))
            for j, (k, c) in enumerate(counts))
        yield ReleasedConditionals(self._shape, tuple(parents), cells, self._scale, self._t,
                                   self._budget)


class _FitFn(beam.DoFn):
    def __init__(self, gibbs: dict[str, Any]) -> None:
        self._gibbs = gibbs

    def process(self, released: ReleasedConditionals):
        yield SBHGModel(released, **self._gibbs)


@element_types(input=EncodedBatch, output=SynthesisModel)
class DPHashedConditionals(beam.PTransform):
    """SBHG's measurement + fit: ``PCollection[EncodedBatch]`` → one :class:`SBHGModel` per window.

    Privacy (add/remove one privacy unit, ≤ ``max_contributions`` = k records each; seed 002
    §3.3, Theorem 3.1 converted from replace-one, Remark 3.2 for the DP hash):

    * ``selection_budget`` (pure ε_sel): ``p·R`` exponential-mechanism draws, ``ε_sel/(p·R)``
      each, on :func:`mi_score` with sensitivity ``k·(ln C + 1)`` (:func:`mi_score_sensitivity`).
    * ``conditional_budget`` (ε_c, δ): SBA per feature with ``(ε_c/p, δ/p)``: discrete Laplace of
      scale ``b = k·p/ε_c`` on each non-empty hashed cell, drop below ``t`` from
      :func:`sba_threshold` (proof of δ in :func:`sba_delta`).

    Args (keyword-only):
      shape: cells per column (public, from the schema).
      selection_budget: PureDP for the hash selection (ignored when ``top_r`` is 0 or p = 1).
      conditional_budget: ApproxDP with δ > 0 for the SBA releases.
      top_r: features per hash (R); ``min(R, p-1)`` are used.
      max_contributions: k.
      mi_count_cap: C of :func:`capped_xlogx` (public).
      burn_in, thin, chain_length, init_sweeps, support_check: Gibbs settings (:class:`SBHGModel`).
      seed: ``None`` (secure) or an int for tests.
    """

    def __init__(self, *, shape: Sequence[int], selection_budget: ApproxDP | None,
                 conditional_budget: ApproxDP, top_r: int = 2, max_contributions: int = 1,
                 mi_count_cap: int = DEFAULT_MI_COUNT_CAP, burn_in: int = 50, thin: int = 5,
                 chain_length: int = 20, init_sweeps: int = 10, support_check: str = "cell",
                 seed: int | None = None, label: str | None = None) -> None:
        super().__init__(label)
        self._shape = tuple(int(s) for s in shape)
        p = len(self._shape)
        if p < 1 or any(s < 1 for s in self._shape):
            raise ValueError(f"shape ({shape!r}) must list >= 1 column sizes, each >= 1")
        if isinstance(top_r, bool) or not isinstance(top_r, int) or top_r < 0:
            raise ValueError(f"top_r ({top_r!r}) must be an int >= 0")
        if isinstance(max_contributions, bool) or not isinstance(max_contributions, int) or max_contributions < 1:
            raise ValueError(f"max_contributions ({max_contributions!r}) must be an int >= 1")
        if not isinstance(conditional_budget, ApproxDP) or conditional_budget.delta <= 0:
            raise ValueError(f"conditional_budget must be an ApproxDP with delta > 0, got {conditional_budget!r}")
        self._r = min(top_r, p - 1)
        if self._r > 0 and (not isinstance(selection_budget, ApproxDP) or selection_budget.delta != 0):
            raise ValueError(f"selection_budget must be a PureDP when top_r > 0, got {selection_budget!r}")
        worst = max(
            key_space(j, sorted((i for i in range(p) if i != j), key=lambda i: -self._shape[i])[: self._r],
                      self._shape)
            for j in range(p))
        if worst >= _MAX_KEY_SPACE:
            raise ValueError(f"top_r ({top_r}) makes hashed tables of up to {worst} cells, above "
                             f"{_MAX_KEY_SPACE}; use a smaller top_r or coarser bins")
        self._pairs = [(a, b) for a in range(p) for b in range(a + 1, p)] if self._r > 0 else []
        big = [(a, b) for a, b in self._pairs if self._shape[a] * self._shape[b] > _MAX_PAIR_CELLS]
        if big:
            raise ValueError(f"2-way tables {big[:3]} exceed {_MAX_PAIR_CELLS} cells; bin those "
                             "columns coarser or use top_r=0")
        self._k = max_contributions
        self._cap = mi_count_cap
        self._sensitivity = mi_score_sensitivity(cap=mi_count_cap, max_contributions=max_contributions)
        self._eps_each = (selection_budget.epsilon / (p * self._r)) if self._r > 0 else None
        self.per_feature = ApproxDP(epsilon=conditional_budget.epsilon / p,
                                    delta=conditional_budget.delta / p)
        self.scale, self.threshold = sba_threshold(
            epsilon=self.per_feature.epsilon, delta=self.per_feature.delta, max_contributions=max_contributions)
        self._gibbs = {"burn_in": burn_in, "thin": thin, "chain_length": chain_length,
                       "init_sweeps": init_sweeps, "support_check": support_check}
        SBHGModel.check_gibbs(**self._gibbs)
        self._seed = run_seed(seed)  # None → this transform's run secret, drawn at build time

    def default_label(self) -> str:
        return (f"SBHG(ε_c={self.per_feature.epsilon * len(self._shape):g}, "
                f"δ={self.per_feature.delta * len(self._shape):g}, R={self._r})")

    def display_data(self) -> dict[str, Any]:
        p = len(self._shape)
        return display_items(
            mechanism="SBHG: exponential mechanism (hash features) + SBA (discrete Laplace, threshold)",
            epsilon=self.per_feature.epsilon * p + (self._eps_each or 0.0) * p * self._r,
            delta=self.per_feature.delta * p, noise="discrete Laplace (SBA)",
            sba_scale=self.scale, sba_threshold=self.threshold, top_r=self._r,
            em_epsilon_each=self._eps_each or 0.0, columns=p,
            declared_cells=sum(self._shape))

    def details(self) -> dict[str, Any]:
        """Mechanism parameters (for the accountant and manifest)."""
        return {"top_r": self._r, "em_draws": len(self._shape) * self._r,
                "em_epsilon_each": self._eps_each, "mi_score_sensitivity": self._sensitivity,
                "mi_count_cap": self._cap, "sba_scale": self.scale, "sba_threshold": self.threshold,
                "sba_per_feature": self.per_feature.to_dict(), **self._gibbs}

    def expand(self, batches):
        # batches: EncodedBatch (bounded: <= k records per privacy unit)
        p = len(self._shape)
        step = self.label
        if self._r > 0:
            pair_tables = combine_globally(
                batches, MarginalCountsCombineFn(self._pairs, self._shape), "CountPairs")
            # tuple[np.ndarray, ...]: exact 2-way tables, one per pair
        else:
            pair_tables = combine_globally(batches, beam.combiners.CountCombineFn(), "CountBatches")
            # int (unused: no selection)
        parents = pair_tables | "SelectParents" >> beam.ParDo(_SelectParentsFn(
            pairs=self._pairs, num_features=p, top_r=self._r, epsilon_each=self._eps_each,
            sensitivity=self._sensitivity, cap=self._cap, seed=self._seed, step=f"{step}/select"))
        # tuple[tuple[int, ...], ...]: DP-chosen hash features per feature
        counts = combine_globally(
            batches | "HashedCounts" >> beam.ParDo(HashedCountsFn(self._shape),
                                                   beam.pvalue.AsSingleton(parents)),
            # SparseCounts of one batch
            SparseCountsCombineFn(p), "SumHashedCounts")
        # SparseCounts: non-empty cells (keys, counts) per feature
        released = counts | "ReleaseSBA" >> beam.ParDo(_ReleaseSBAFn(
            shape=self._shape, scale=self.scale, threshold=self.threshold, budget=self.per_feature,
            seed=self._seed, step=f"{step}/sba"), beam.pvalue.AsSingleton(parents))
        # ReleasedConditionals (DP)
        return released | "FitGibbs" >> beam.ParDo(_FitFn(self._gibbs))
        # SBHGModel


# -- 3. the Gibbs sampler (post-processing) ---------------------------------------------------------
def _lookup(sorted_keys: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of ``queries`` in ``sorted_keys`` and whether each was found."""
    if sorted_keys.size == 0:
        return np.zeros(queries.shape, dtype=np.int64), np.zeros(queries.shape, dtype=bool)
    pos = np.searchsorted(sorted_keys, queries)
    pos_c = np.minimum(pos, sorted_keys.size - 1)
    return pos_c, sorted_keys[pos_c] == queries


class _Conditional:
    """One feature's released hashed conditionals in CSR form for vectorised sampling."""

    def __init__(self, j: int, parents: tuple[int, ...], shape: tuple[int, ...],
                 keys: np.ndarray, values: np.ndarray) -> None:
        self.j, self.parents, self.k = j, parents, int(shape[j])
        order = np.argsort(keys, kind="stable")
        self.cell_keys = keys[order].astype(np.int64)
        w = values[order].astype(np.float64)
        self.cum = np.cumsum(w)
        hk = self.cell_keys // self.k
        self.hkeys, starts = np.unique(hk, return_index=True)
        self.seg = np.r_[starts, self.cell_keys.size].astype(np.int64)
        marg = np.bincount((self.cell_keys % self.k).astype(np.int64), weights=w, minlength=self.k)
        self.marginal = marg / marg.sum() if marg.sum() > 0 else np.full(self.k, 1.0 / self.k)

    def hash(self, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return hash_keys(x, self.parents, shape)

    def propose(self, h: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``x_j ~ P(X_j | h)`` where ``h`` has a released conditional; ``found`` says where."""
        g, found = _lookup(self.hkeys, h)
        prop = np.zeros(h.shape, dtype=np.int64)
        if not found.any():
            return prop, found
        gs = g[found]
        s, e = self.seg[gs], self.seg[gs + 1]
        base = np.where(s > 0, self.cum[np.maximum(s - 1, 0)], 0.0)
        total = self.cum[e - 1] - base
        idx = np.searchsorted(self.cum, base + u[found] * total, side="right")
        idx = np.clip(idx, s, e - 1)
        prop[found] = self.cell_keys[idx] % self.k
        return prop, found

    def valid(self, h: np.ndarray, xj: np.ndarray, support_check: str) -> np.ndarray:
        """Remark 3.3: does ``h`` have a released conditional (``hash``), and does it give ``x_j``
        positive mass (``cell``)?"""
        if support_check == "hash":
            return _lookup(self.hkeys, h)[1]
        return _lookup(self.cell_keys, h * self.k + xj)[1]


class SBHGModel(SynthesisModel):
    """Gibbs sampler over released hashed conditionals (Algorithm 2 lines 7-21, Remark 3.3).

    Post-processing only: reads nothing but :class:`ReleasedConditionals`.

    Chains: ``ceil(n / chain_length)`` independent chains run side by side (vectorised); each
    emits one record every ``thin`` sweeps after ``burn_in`` sweeps, ``chain_length`` records in
    all. ``SampleSynthetic`` runs one call per shard with its own random stream, so chains of
    different shards are independent.

    Start (line 9): every column from its released noisy marginal (the sum over hash values of
    its released cells; uniform if nothing was released), then ``init_sweeps`` relaxed sweeps
    that redraw ``x_j`` from ``P(X_j | h_j(x))`` when released, else from the marginal, always
    accepted, which moves chains into the released support.

    Sweep (lines 11-19): for each feature ``j`` in order, propose ``x_j`` from
    ``P_ε(X_j | h_j(x))``; keep the old value when ``h_j(x)`` has no released conditional. The
    rejection rule of Remark 3.3 (Algorithm 2's lines 14-17 print accept/reject the wrong way
    round): the proposal is rejected when it moves another feature ``l`` (with ``j`` in its hash)
    from a released to an unreleased conditional. ``support_check="hash"`` is the paper's rule
    (``h_l`` has a released conditional); ``"cell"`` (default) also requires that conditional to
    give the current ``x_l`` positive mass, which keeps structural zeros between linked features.

    Emission: only records whose every feature sits on released support are emitted; chains that
    never reach the support are replaced by new chains (up to 8 rounds, after which the remaining
    rows are taken from the last states as they are, counted in ``describe()["unsupported"]`` of
    the last call).
    """

    def __init__(self, released: ReleasedConditionals, *, burn_in: int = 50, thin: int = 5,
                 chain_length: int = 20, init_sweeps: int = 10, support_check: str = "cell") -> None:
        self.check_gibbs(burn_in=burn_in, thin=thin, chain_length=chain_length,
                         init_sweeps=init_sweeps, support_check=support_check)
        self._released = released
        self._shape = tuple(int(s) for s in released.shape)
        self.burn_in, self.thin, self.chain_length = burn_in, thin, chain_length
        self.init_sweeps, self.support_check = init_sweeps, support_check
        self._cond = [_Conditional(j, pa, self._shape, k, v)
                      for j, (pa, (k, v)) in enumerate(zip(released.parents, released.cells))]
        self._dependents = [[lc for lc in self._cond if j in lc.parents] for j in range(len(self._shape))]
        self.unsupported = 0

    @staticmethod
    def check_gibbs(*, burn_in: int, thin: int, chain_length: int, init_sweeps: int,
                    support_check: str) -> None:
        """Validate Gibbs settings (raises ValueError echoing the bad value)."""
        for name, v, lo in (("burn_in", burn_in, 0), ("thin", thin, 1),
                            ("chain_length", chain_length, 1), ("init_sweeps", init_sweeps, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name} ({v!r}) must be an int >= {lo}")
        if support_check not in ("cell", "hash"):
            raise ValueError(f"support_check ({support_check!r}) must be 'cell' or 'hash'")

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def released(self) -> ReleasedConditionals:
        """The DP measurement this model was fitted from."""
        return self._released

    @property
    def parents(self) -> tuple[tuple[int, ...], ...]:
        """The DP-selected hash features of each column."""
        return self._released.parents

    def released_cells(self) -> list[int]:
        """Number of released cells per feature."""
        return [c.cell_keys.size for c in self._cond]

    def valid_matrix(self, x: np.ndarray) -> np.ndarray:
        """``(rows, p)`` booleans: does each feature of each row sit on released support?"""
        return np.stack([c.valid(c.hash(x, self._shape), x[:, c.j], self.support_check)
                         for c in self._cond], axis=1) if self._cond else np.ones((x.shape[0], 0), bool)

    def sweep(self, x: np.ndarray, valid: np.ndarray, rs: RandomSource, *, relaxed: bool = False) -> None:
        """One Gibbs sweep over all features in order, in place (``valid`` is kept up to date)."""
        for c in self._cond:
            self.update_feature(c.j, x, valid, rs, relaxed=relaxed)

    def update_feature(self, j: int, x: np.ndarray, valid: np.ndarray, rs: RandomSource, *,
                       relaxed: bool = False) -> None:
        """One Gibbs step for feature ``j`` on every chain (lines 12-18 with Remark 3.3), in place."""
        shape = self._shape
        c = self._cond[j]
        u = rs.child("u", j).uniform(x.shape[0])
        h = c.hash(x, shape)
        prop, found = c.propose(h, u)
        if relaxed:
            missing = ~found
            if missing.any():
                prop[missing] = sample_categorical(rs.child("m", j), c.marginal, int(missing.sum()))
            accept = np.ones(x.shape[0], dtype=bool)
        else:
            accept = found & (prop != x[:, j])
        new_valid = {}
        if accept.any():
            xp = x.copy()
            xp[:, j] = np.where(accept, prop, x[:, j])
            for lc in self._dependents[j]:
                after = lc.valid(lc.hash(xp, shape), xp[:, lc.j], self.support_check)
                if not relaxed:
                    accept &= ~(valid[:, lc.j] & ~after)  # Remark 3.3: reject, keep old value
                new_valid[lc.j] = after
        x[:, j] = np.where(accept, prop, x[:, j])
        for lj, after in new_valid.items():
            valid[:, lj] = np.where(accept, after, valid[:, lj])
        valid[:, j] = np.where(accept, c.valid(h, x[:, j], self.support_check), valid[:, j])

    def _run_chains(self, chains: int, rs: RandomSource) -> tuple[np.ndarray, np.ndarray]:
        p = len(self._shape)
        x = np.empty((chains, p), dtype=np.int64)
        for c in self._cond:
            x[:, c.j] = sample_categorical(rs.child("start", c.j), c.marginal, chains)
        valid = self.valid_matrix(x)
        for s in range(self.init_sweeps):
            self.sweep(x, valid, rs.child("init", s), relaxed=True)
        valid = self.valid_matrix(x)
        out, ok = [], []
        total = self.burn_in + self.thin * (self.chain_length - 1) + 1
        for s in range(total):
            self.sweep(x, valid, rs.child("sweep", s))
            t = s - self.burn_in
            if t >= 0 and t % self.thin == 0:
                out.append(x.copy())
                ok.append(valid.all(axis=1))
        return np.concatenate(out), np.concatenate(ok)

    def sample_codes(self, n: int, rs: RandomSource) -> np.ndarray:
        p = len(self._shape)
        if n <= 0:
            return np.zeros((0, p), dtype=np.int64)
        kept: list[np.ndarray] = []
        have = 0
        last = np.zeros((0, p), dtype=np.int64)
        rate = 1.0  # share of emitted records on released support, learned from the last round
        for rnd in range(8):
            want = (n - have) / (self.chain_length * rate) * (1.0 if rnd == 0 else 1.2)
            chains = max(1, min(math.ceil(want), 64 * math.ceil(n / self.chain_length)))
            recs, ok = self._run_chains(chains, rs.child("round", rnd))
            rate = max(float(ok.mean()), 0.02)
            good = recs[ok]
            kept.append(good[: n - have])
            have += min(good.shape[0], n - have)
            last = recs[~ok]
            if have >= n:
                break
        self.unsupported = n - have
        if have < n:
            kept.append(last[: n - have] if last.shape[0] >= n - have else
                        np.resize(last if last.size else recs, (n - have, p)))
        return np.concatenate(kept)[:n]

    def describe(self) -> dict[str, Any]:
        return {"model": "SBHG (stability-based hashed Gibbs sampler)",
                "parents": [list(pa) for pa in self._released.parents],
                "released_cells": self.released_cells(), "sba_threshold": self._released.threshold,
                "sba_scale": self._released.scale, "burn_in": self.burn_in, "thin": self.thin,
                "chain_length": self.chain_length, "init_sweeps": self.init_sweeps,
                "support_check": self.support_check, "unsupported": self.unsupported}
