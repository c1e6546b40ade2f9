"""Plausible deniability: seed-based synthesis filtered by a privacy test (seed 001).

Bindschaedler, Shokri, Gunter, "Plausible Deniability for Privacy-Preserving Data Synthesis",
VLDB 2017 (``../shared/seeds/001_a58ab0304eaaa797.txt``; formulas restated in
``../shared/notes/algorithms.md`` and re-derived/checked by brute force in ``tests/unit``).

Pipeline (one composite transform per mechanism, arithmetic in the Beam-free functions below):

1. :class:`SplitForPlausible` — a random, order-independent split of the (bounded) records into
   disjoint parts: seeds ``D_S``, structure ``D_T`` and parameters ``D_P`` (Section 3.5).
2. :class:`DPPlausibleBayesNet` — the generative model of Section 3, learned with privacy:
   structure by correlation-based feature selection (CFS, Section 3.3) on noisy entropies from one
   pass of pairwise counts over ``D_T``; parameters by sampling Dirichlet posteriors over noisy
   conditional counts of ``D_P`` (Section 3.4), the noise of a parent configuration derived lazily
   from a **secret** HMAC key. Everything after the two measurements is post-processing.
   Or :class:`DPPrivBayesGenerator` — the PrivBayes model (``transforms/privbayes.py``, with its
   refinement and its own accounting) on ``D_T ∪ D_P``, turned by post-processing into a
   :class:`NetworkGenerator` (:func:`privbayes_generator`). Both are
   :class:`SeedResamplingNetwork` s: ``Pr{y = M(d)} = 1[y_C = d_C]·Π_{resampled i} P(y_i | y_Π_i)``.
3. :class:`GenerateCandidates` — Mechanism 1 (Section 2): seeds drawn uniformly from ``D_S``
   (Poissonized: seed ``d`` yields ``Poisson(rows/|D_S|)`` candidates), the last ``ω`` attributes of a
   topological order resampled, the rest copied (Section 3.1).
4. :class:`PlausibleDeniabilityFilter` — Privacy Test 1 (deterministic) or 2 (randomized threshold)
   with two outputs, ``released`` and ``rejected`` (Section 2.2). A generic path works for any
   :class:`PlausibleModel`; the fast path for seed-resampling networks groups candidates and seed
   records by their copied-attribute values (no candidate × record cross product).

Privacy (add/remove one privacy unit, contributions bounded to one record per unit before this
stage; with ``max_contributions = c`` every sensitivity below is multiplied by ``c``):

* structure: ``|H|+1`` queries on ``D_T`` (every single and pairwise entropy, plus the count of
  ``D_T``), basic sequential composition, see :func:`entropy_sum_sensitivity`;
* parameters: one table per attribute on ``D_P``, each record in exactly one cell per table, discrete
  Laplace of scale ``m/ε`` on every cell (sequential composition over the ``m`` tables);
* ``D_T``, ``D_P`` and ``D_S`` are disjoint and a unit's part depends only on the unit, so the model is
  ε-DP by parallel composition (structure and parameters each get the full model ε);
* with the PrivBayes generator, the model is PrivBayes's ε on ``D_T ∪ D_P`` (its own sequential
  composition, ``docs/privbayes.md``); the generator fitted to it is post-processing;
* Theorem 1 conditions on the model, which is a function of ``D_T ∪ D_P`` only, so it holds for
  either generator when a unit of ``D_S`` changes;
* the release of one candidate by Privacy Test 2 is ``(ε0 + ln(1 + γ/t), exp(-ε0(k - t)))``-DP
  (Theorem 1, :func:`theorem1_guarantee`); the ``Poisson(rows)`` invocations compose sequentially
  and are charged over a public bound ``C`` (:func:`candidate_release_cost`). Test 1 has no DP
  guarantee (only (k, γ)-plausible deniability, Definition 1).
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import math
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np

from beamsynth.schemas.schema import EncodedBatch, Schema
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant
from beamsynth.transforms.conventions import display_items, element_types
from beamsynth.transforms.measure import (
    MarginalCountsCombineFn,
    combine_globally,
    count_marginals,
    window_labels,
)
from beamsynth.transforms.noise import (
    RandomSource,
    RunSecret,
    discrete_laplace,
    discrete_laplace_scale,
    hypergeometric,
    laplace_internal,
    run_seed,
)
from beamsynth.transforms.privbayes import DPPrivBayes, PrivBayesModel, spend_privbayes
from beamsynth.transforms.refine import SAMPLE_RAKE_ITERATIONS, RefinedModel, rake_weights
from beamsynth.transforms.synthesis import SynthesisModel
from beamsynth.transforms.synthesis import _CountRowsFn as _CountRowsFn  # record count CombineFn

__all__ = [
    "DEFAULT_MAX_RECORDS",
    "REJECT_BELOW_K",
    "REJECT_NOISY_THRESHOLD",
    "CandidateBatch",
    "DPPlausibleBayesNet",
    "DPPrivBayesGenerator",
    "GENERATOR_MAX_CELLS",
    "GENERATOR_MAX_CONFIGS",
    "GENERATOR_MAX_PARENTS",
    "GENERATOR_POOL_ROWS",
    "NetworkGenerator",
    "SeedResamplingNetwork",
    "choose_parents",
    "copy_first_order",
    "fit_network_generator",
    "model_sample",
    "privbayes_generator",
    "GenerateCandidates",
    "OrderReleased",
    "PlausibleBayesNet",
    "PlausibleDeniabilityFilter",
    "PlausibleModel",
    "PlausibleStructure",
    "PerturbationModel",
    "RejectedCandidates",
    "SplitForPlausible",
    "cfs_structure",
    "count_plausible_generic",
    "clamped_entropy_sum_sensitivity",
    "entropy_sensitivity_add_remove",
    "entropy_sensitivity_replace_one",
    "entropy_sum",
    "entropy_sum_sensitivity",
    "group_keys",
    "learn_structure",
    "param_tables",
    "structure_specs",
    "noisy_entropies",
    "ordered_release",
    "candidate_bound",
    "candidate_release_cost",
    "check_sample",
    "plausible_interval",
    "poisson_counts",
    "privacy_test",
    "release_order",
    "release_shards",
    "seed_shards",
    "split_assignments",
    "symmetrical_uncertainty",
    "theorem1_guarantee",
    "topological_order",
    "unit_split_assignments",
    "record_ranks",
    "record_split_assignments",
    "record_uniforms",
]

METRICS_NAMESPACE = "beamsynth"
DEFAULT_MAX_RECORDS = 10**9
REJECT_BELOW_K = "fewer_than_k_plausible_seeds"
REJECT_NOISY_THRESHOLD = "below_noisy_threshold"
_LOG2E = 1.0 / math.log(2.0)
_BELOW_ONE = float(np.nextafter(1.0, 0.0))
_POISSON_TABLE_MAX = 10_000_000  # inversion table size limit (above: scipy's ppf, slower)
GENERATOR_POOL_ROWS = 100_000  # Adult ε=1, seeds 1-3: same accuracy/AUC as 200,000 (0.816/0.855), 2.7x faster
GENERATOR_MAX_PARENTS = 3
GENERATOR_MAX_CONFIGS = 2_000
GENERATOR_MAX_CELLS = 1_000_000  # a fitted conditional table never exceeds this many cells
_SMALL_CARD = 32  # conditionals with at most this many cells are inverted with one comparison


# =============================================================================================
# Entropy sensitivity (Section 3.3.1, Appendix B), converted to add/remove neighbours
# =============================================================================================
def entropy_sum(counts: np.ndarray) -> float:
    """``n·H`` in bits of a histogram: ``n·log2 n - Σ c·log2 c`` (0 for an empty histogram)."""
    c = np.asarray(counts, dtype=np.float64).ravel()
    c = c[c > 0]
    n = c.sum()
    if n <= 0:
        return 0.0
    return float(n * math.log2(n) - np.sum(c * np.log2(c)))


def entropy_sum_sensitivity(max_records: int) -> float:
    """Add/remove sensitivity of ``n·H`` (bits) over datasets of at most ``max_records`` records.

    Adding one record to cell ``c`` of a histogram of ``N`` records changes ``f = N·H`` by
    ``g(N) - g(c)`` with ``g(x) = (x+1)·log2(x+1) - x·log2 x``, increasing, ``g(0) = 0``; so the change
    lies in ``[0, g(N)]`` and the maximum, reached by adding a record to an empty cell, is
    ``g(n-1) = log2 n + (n-1)·log2(n/(n-1)) < log2 n + log2 e`` for the larger dataset of ``n``
    records. Checked exactly by brute force over all histograms in ``tests/unit/test_plausible.py``.
    We noise ``f`` (not ``H``) so the scale does not depend on the private ``n``; ``H`` is then
    ``f̃ / ñ`` with a separately noised count (post-processing).
    """
    n = int(max_records)
    if n < 1:
        raise ValueError(f"max_records ({max_records!r}) must be an int >= 1")
    if n == 1:
        return 0.0
    return math.log2(n) + (n - 1) * math.log2(n / (n - 1))


def clamped_entropy_sum_sensitivity(max_records: int, n: int) -> float:
    """Add/remove change of ``F = min(|D|, N)·H(D)`` (bits) between datasets of ``n`` and ``n + 1``
    records (``n ≥ N``, ``N = max_records``): ``F' - F = N·(Δf - H)/(n+1)`` with ``Δf ∈ [0,
    entropy_sum_sensitivity(n+1)]`` and ``H ∈ [0, log2 n]``. :func:`learn_structure` relies on
    this never exceeding ``entropy_sum_sensitivity(N)`` (checked in ``tests/unit``)."""
    big, n = int(max_records), int(n)
    if big < 2 or n < big:
        raise ValueError(f"need max_records ({max_records!r}) >= 2 and n ({n!r}) >= max_records")
    return big * max(entropy_sum_sensitivity(n + 1), math.log2(n)) / (n + 1)


def entropy_sensitivity_add_remove(n: int) -> float:
    """Bound on ``|H(D) - H(D')|`` (bits) for add/remove neighbours, the larger of size ``n >= 2``.

    ``H' - H = (Δf - H)/n`` with ``Δf ∈ [0, log2 n + log2 e]`` and ``H ∈ [0, log2(n-1)]`` give
    ``ΔH ≤ (log2 n + 1/ln 2)/n``. Stated for comparison with the paper's replace-one Lemma 1; the
    mechanism uses :func:`entropy_sum_sensitivity` (no dependence on the private ``n``).
    """
    if n < 2:
        raise ValueError(f"n ({n!r}) must be >= 2")
    return (math.log2(n) + _LOG2E) / n


def entropy_sensitivity_replace_one(n: int) -> float:
    """The paper's Lemma 1 (replace-one, ``n`` fixed): ``(1/n)·(2 + 1/ln 2 + 2·log2 n)``."""
    if n < 1:
        raise ValueError(f"n ({n!r}) must be >= 1")
    return (2.0 + _LOG2E + 2.0 * math.log2(n)) / n


def noisy_entropies(
    tables: Sequence[np.ndarray],
    n_records: int,
    *,
    shape: Sequence[int],
    epsilon: float,
    max_records: int,
    rs: RandomSource,
    count_fraction: float = 0.1,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Noisy single entropies ``H̃(X_i)`` and pairwise ``H̃(X_i, X_j)`` (bits) from exact tables.

    ``tables`` are the ``m`` single then ``m(m-1)/2`` pair tables (``itertools.combinations``
    order) of ``D_T``. Privacy (add/remove one record, ``ε``-DP by sequential composition):
    ``ε·count_fraction`` on ``|D_T|`` (discrete Laplace, sensitivity 1), the rest split equally
    over the ``f = n·H`` values, each with Laplace noise of scale ``Δf·Q/ε_f`` where
    ``Δf = entropy_sum_sensitivity(max_records)`` and ``Q`` the number of tables. The noisy scores
    are internal (only the chosen structure is released), hence continuous Laplace.
    Returns ``(H1[m], H2[m, m] (diagonal = H1), noisy count)``; values clipped to
    ``[0, log2(cells)]``.
    """
    m = len(shape)
    q = m + m * (m - 1) // 2
    if len(tables) != q:
        raise ValueError(f"need {q} tables (singles then pairs) for {m} columns, got {len(tables)}")
    eps_count = epsilon * count_fraction
    eps_each = (epsilon - eps_count) / q
    n_noisy = int(n_records) + int(discrete_laplace(rs.child("count"), 1.0 / eps_count, 1)[0])
    n_eff = max(n_noisy, 1)
    sens = max(entropy_sum_sensitivity(max_records), 1e-12)
    f = np.array([entropy_sum(t) for t in tables], dtype=np.float64)
    f = f + laplace_internal(rs.child("entropies"), sens / eps_each, q)
    h = f / n_eff
    cells = [shape[i] for i in range(m)] + [shape[i] * shape[j] for i, j in itertools.combinations(range(m), 2)]
    h = np.clip(h, 0.0, np.log2(np.maximum(np.asarray(cells, dtype=np.float64), 1.0)))
    h1 = h[:m]
    h2 = np.diag(h1).astype(np.float64)
    for idx, (i, j) in enumerate(itertools.combinations(range(m), 2)):
        h2[i, j] = h2[j, i] = h[m + idx]
    return h1, h2, n_noisy


def symmetrical_uncertainty(h1: np.ndarray, h2: np.ndarray) -> np.ndarray:
    """``corr(X,Y) = 2 - 2·H(X,Y)/(H(X)+H(Y))`` clipped to [0, 1] (Section 3.3), as an m×m matrix."""
    h1 = np.asarray(h1, dtype=np.float64)
    denom = h1[:, None] + h1[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        corr = np.where(denom > 0, 2.0 - 2.0 * np.asarray(h2) / denom, 0.0)
    corr = np.clip(corr, 0.0, 1.0)
    np.fill_diagonal(corr, 1.0)
    return corr


# =============================================================================================
# Structure: greedy acyclic CFS (Section 3.3)
# =============================================================================================
@dataclass(frozen=True)
class PlausibleStructure:
    """A DAG over the columns: ``parents[i]`` (column positions) and a topological ``order``."""

    parents: tuple[tuple[int, ...], ...]
    order: tuple[int, ...]

    def to_dict(self, names: Sequence[str] | None = None) -> dict[str, Any]:
        """JSON form (column names when given)."""
        nm = (lambda i: names[i]) if names is not None else (lambda i: i)
        return {"order": [nm(i) for i in self.order],
                "parents": {str(nm(i)): [nm(j) for j in ps] for i, ps in enumerate(self.parents)}}


def _merit(corr: np.ndarray, i: int, subset: Sequence[int]) -> float:
    if not subset:
        return 0.0
    s = list(subset)
    num = float(corr[i, s].sum())
    inter = float(corr[np.ix_(s, s)].sum() - len(s))  # Σ_{j≠l}
    return num / math.sqrt(len(s) + inter)


def _reaches(parents: list[list[int]], start: int, target: int) -> bool:
    """Whether ``target`` is an ancestor-or-self of ``start`` following parent links."""
    stack, seen = [start], set()
    while stack:
        v = stack.pop()
        if v == target:
            return True
        if v in seen:
            continue
        seen.add(v)
        stack.extend(parents[v])
    return False


def topological_order(parents: Sequence[Sequence[int]], shape: Sequence[int] | None = None) -> tuple[int, ...]:
    """Kahn's algorithm; among ready columns the one with fewest cells first, then lowest index.

    Columns early in the order are the ones copied from a seed; preferring small (public) domains
    there keeps more seeds plausible for the same ω. Deterministic, uses no data.
    """
    m = len(parents)
    size = [1] * m if shape is None else [int(s) for s in shape]
    remaining = {i: set(ps) for i, ps in enumerate(parents)}
    order: list[int] = []
    while remaining:
        ready = sorted((i for i, ps in remaining.items() if not ps), key=lambda v: (size[v], v))
        if not ready:
            raise ValueError(f"parents {parents!r} contain a cycle")
        v = ready[0]
        order.append(v)
        del remaining[v]
        for ps in remaining.values():
            ps.discard(v)
    if len(order) != m:
        raise ValueError("topological sort failed")
    return tuple(order)


def cfs_structure(corr: np.ndarray, shape: Sequence[int], *, max_parents: int, max_cost: int,
                  max_cells: float | None = None) -> PlausibleStructure:
    """Greedy acyclic correlation-based feature selection (post-processing of noisy entropies).

    Attributes are visited by decreasing total correlation; for each, parents are added greedily
    while the CFS merit ``Σ_j corr(i,j) / sqrt(|S| + Σ_{j≠l} corr(j,l))`` improves, the edge keeps
    the graph acyclic, ``|S| ≤ max_parents``, the configuration count ``Π |X_j| ≤ max_cost`` and,
    when given, the conditional table size ``|X_i|·Π |X_j| ≤ max_cells``.
    """
    corr = np.asarray(corr, dtype=np.float64)
    m = len(shape)
    parents: list[list[int]] = [[] for _ in range(m)]
    total = corr.sum(axis=1) - 1.0
    for i in sorted(range(m), key=lambda v: (-total[v], v)):
        chosen: list[int] = []
        best = 0.0
        while len(chosen) < max_parents:
            cand_best, cand_j = best, -1
            cost = math.prod(shape[j] for j in chosen)
            for j in range(m):
                if j == i or j in chosen or cost * shape[j] > max_cost:
                    continue
                if max_cells is not None and cost * shape[j] * shape[i] > max_cells:
                    continue
                if _reaches(parents, j, i):  # i is an ancestor of j: edge j -> i makes a cycle
                    continue
                mval = _merit(corr, i, chosen + [j])
                if mval > cand_best + 1e-12:
                    cand_best, cand_j = mval, j
            if cand_j < 0:
                break
            chosen.append(cand_j)
            parents[i] = sorted(chosen)
            best = cand_best
    ps = tuple(tuple(sorted(p)) for p in parents)
    return PlausibleStructure(parents=ps, order=topological_order(ps, shape))


# =============================================================================================
# The models
# =============================================================================================
class PlausibleModel(SynthesisModel):
    """A generative model usable by the privacy test: ``Pr{y = M(d)}`` for any seed ``d``.

    Subclasses implement :meth:`generate` and :meth:`log_prob` (natural log, ``-inf`` for 0),
    vectorized over batches. Models whose probability factorises as ``1[d_C = y_C]·q(y)`` also
    return the copied columns ``C`` from :meth:`copied_columns` and enable the fast path.
    """

    @abstractmethod
    def generate(self, seeds: np.ndarray, rs: RandomSource) -> tuple[np.ndarray, np.ndarray]:
        """Candidates ``y`` (one per seed row) and ``log Pr{y = M(seed)}``."""

    @abstractmethod
    def log_prob(self, y: np.ndarray, d: np.ndarray) -> np.ndarray:
        """``log Pr{y_a = M(d_b)}`` as a ``(len(y), len(d))`` matrix."""

    def copied_columns(self) -> tuple[int, ...] | None:
        """Columns copied from the seed when ``Pr{y=M(d)} = 1[d_C = y_C]·q(y)``; ``None`` otherwise."""
        return None


class PerturbationModel(PlausibleModel):
    """A public (data-free) seed model for the generic path: each attribute is kept with
    probability ``1 - p`` or replaced by a uniform value of its declared domain.

    ``Pr{y = M(d)} = Π_i ((1-p)·1[y_i = d_i] + p/|X_i|)``: it depends on which attributes differ,
    so seeds fall into different γ-intervals and the pass rate depends on γ (unlike the
    seed-resampling network). It learns nothing from data, so it costs no budget.
    """

    def __init__(self, *, shape: Sequence[int], p: float) -> None:
        if not (0.0 < p <= 1.0):
            raise ValueError(f"p ({p!r}) must be in (0, 1]")
        self._shape = tuple(int(s) for s in shape)
        self._p = float(p)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    def _factors(self) -> tuple[np.ndarray, np.ndarray]:
        card = np.asarray(self._shape, dtype=np.float64)
        return np.log((1 - self._p) + self._p / card), np.log(self._p / card)

    def generate(self, seeds: np.ndarray, rs: RandomSource) -> tuple[np.ndarray, np.ndarray]:
        y = np.array(seeds, dtype=np.int64, copy=True)
        for i, card in enumerate(self._shape):
            swap = rs.child("swap", i).uniform(len(y)) < self._p
            y[swap, i] = rs.child("value", i).integers(card, int(swap.sum()))
        return y, self._own_logp(y, seeds)

    def _own_logp(self, y: np.ndarray, d: np.ndarray) -> np.ndarray:
        same, diff = self._factors()
        return np.where(y == d, same[None, :], diff[None, :]).sum(axis=1)

    def log_prob(self, y: np.ndarray, d: np.ndarray) -> np.ndarray:
        same, diff = self._factors()
        eq = y[:, None, :] == d[None, :, :]
        return np.where(eq, same, diff).sum(axis=2)

    def sample_codes(self, n: int, rs: RandomSource) -> np.ndarray:
        """Uniform rows (the model has no data-free seed; used only through :meth:`generate`)."""
        return np.stack([rs.child("uniform", i).integers(c, n) for i, c in enumerate(self._shape)], axis=1)


def _hmac_seed(key: bytes, *labels: Any) -> int:
    msg = repr(labels).encode("utf-8")
    return int.from_bytes(hmac.new(key, msg, hashlib.sha256).digest(), "little")


class SeedResamplingNetwork(PlausibleModel):
    """A Bayesian network used as the seed-based generator of Section 3.2 (equations 2 and 3).

    The attributes follow a topological ``order`` of the DAG (``structure.parents``); a candidate
    copies the first ``m − ω`` attributes of that order from its seed and resamples the last ``ω``
    one after the other from ``P(X_i | Π_i)``, the parents taking the candidate's current values
    (copied or already resampled). So, for any record ``d``::

        Pr{y = M(d)} = 1[y_C = d_C] · Π_{i resampled} P(y_i | y_{Π_i})

    with ``C`` the copied attributes: every record agreeing with ``y`` on ``C`` is an equally likely
    seed, which the privacy test's fast path exploits (:meth:`copied_columns`). Subclasses provide
    the conditionals (:meth:`conditional_rows`); any DP model whose conditionals are post-processing
    of its release can be plugged in (:class:`PlausibleBayesNet`: the paper's own network;
    :class:`NetworkGenerator`: explicit tables, e.g. fitted to a PrivBayes model by
    :func:`fit_network_generator`).
    """

    _structure: PlausibleStructure
    _shape: tuple[int, ...]
    _omega: int

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def structure(self) -> PlausibleStructure:
        """The DAG and its topological (resampling) order."""
        return self._structure

    @property
    def omega(self) -> int:
        """Number of resampled attributes."""
        return self._omega

    def copied_columns(self) -> tuple[int, ...]:
        return tuple(sorted(self._structure.order[: len(self._shape) - self._omega]))

    def resampled_columns(self) -> tuple[int, ...]:
        """Resampled columns in generation (topological) order."""
        return self._structure.order[len(self._shape) - self._omega:]

    def config_index(self, i: int, codes: np.ndarray) -> np.ndarray:
        """Index of each row's parent configuration for attribute ``i``."""
        ps = self._structure.parents[i]
        if not ps:
            return np.zeros(codes.shape[0], dtype=np.int64)
        return np.ravel_multi_index(tuple(codes[:, j] for j in ps), tuple(self._shape[j] for j in ps)).astype(np.int64)

    @abstractmethod
    def conditional_rows(self, i: int, configs: np.ndarray) -> np.ndarray:
        """``P(X_i | pa = config)`` as one probability row per entry of ``configs``."""

    def _draw(self, i: int, y: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Inversion of each row's conditional CDF at ``u`` (scaled by the row total): the value
        and its probability. Works per distinct parent configuration, so memory is
        ``O(configurations·cells + rows)``, never ``rows × cells``."""
        uniq, inv = np.unique(self.config_index(i, y), return_inverse=True)
        inv = inv.ravel()
        probs = self.conditional_rows(i, uniq)
        cdf = np.cumsum(probs, axis=1)
        target = u * cdf[inv, -1]
        card = probs.shape[1]
        if card <= _SMALL_CARD:
            v = (cdf[inv] < target[:, None]).sum(axis=1)
        else:  # the same count of CDF entries below the target, by binary search per configuration
            v = np.empty(inv.size, dtype=np.int64)
            order = np.argsort(inv, kind="stable")
            bounds = np.searchsorted(inv[order], np.arange(uniq.size + 1))
            for r in range(uniq.size):
                idx = order[bounds[r]:bounds[r + 1]]
                v[idx] = np.searchsorted(cdf[r], target[idx], side="left")
        v = np.minimum(v, card - 1)
        return v, probs[inv, v]

    def generate(self, seeds: np.ndarray, rs: RandomSource) -> tuple[np.ndarray, np.ndarray]:
        y = np.array(seeds, dtype=np.int64, copy=True)
        logp = np.zeros(y.shape[0], dtype=np.float64)
        if y.shape[0] == 0:
            return y, logp
        for i in self.resampled_columns():
            v, p = self._draw(i, y, rs.child("resample", i).uniform(y.shape[0]))
            y[:, i] = v
            logp += np.log(p)
        return y, logp

    def log_q(self, y: np.ndarray) -> np.ndarray:
        """``log Π_{resampled i} P(y_i | y_PA(i))``: the seed-independent factor of ``Pr{y = M(d)}``."""
        out = np.zeros(y.shape[0], dtype=np.float64)
        for i in self.resampled_columns():
            uniq, inv = np.unique(self.config_index(i, y), return_inverse=True)
            out += np.log(self.conditional_rows(i, uniq)[inv.ravel(), y[:, i]])
        return out

    def log_prob(self, y: np.ndarray, d: np.ndarray) -> np.ndarray:
        cols = list(self.copied_columns())
        q = self.log_q(y)
        match = np.all(y[:, None, cols] == d[None, :, cols], axis=2) if cols else np.ones((len(y), len(d)), bool)
        return np.where(match, q[:, None], -np.inf)

    def sample_codes(self, n: int, rs: RandomSource) -> np.ndarray:
        """Forward sampling of ``n`` rows from scratch (no seed): the network as a plain model."""
        out = np.zeros((n, len(self._shape)), dtype=np.int64)
        for i in self._structure.order:
            out[:, i] = self._draw(i, out, rs.child("forward", i).uniform(n))[0]
        return out


class PlausibleBayesNet(SeedResamplingNetwork):
    """Bayesian network with lazily noised, Dirichlet-sampled conditionals (Section 3.4).

    Holds the **exact** parameter counts of ``D_P`` and the secret HMAC key, so it must stay inside
    the pipeline (it is a side input, never written). Every conditional ``P(X_i | pa)`` it uses is
    ``Dir(α + max(0, n_{i,pa} + Z))`` with ``Z`` discrete Laplace of scale ``m/ε_P`` per cell; ``Z``
    and the Dirichlet draw come from a :class:`RandomSource` seeded by ``HMAC(key, (i, pa))``, so
    every worker derives the same conditional for the same configuration, but nobody without the
    key can recompute (and subtract) the noise. Configurations are noised when first needed.
    """

    def __init__(self, *, structure: PlausibleStructure, shape: Sequence[int], counts: Sequence[np.ndarray],
                 noise_scale: float, alpha: float, omega: int, key: bytes) -> None:
        self._structure = structure
        self._shape = tuple(int(s) for s in shape)
        m = len(self._shape)
        if not (1 <= omega <= m):
            raise ValueError(f"omega ({omega!r}) must be in [1, {m}]")
        if len(key) < 16:
            raise ValueError("the HMAC key must have at least 16 bytes")
        self._counts = [np.asarray(c, dtype=np.int64).reshape(-1, self._shape[i]) for i, c in enumerate(counts)]
        self._scale = float(noise_scale)
        self._alpha = float(alpha)
        self._omega = int(omega)
        self._key = bytes(key)
        self._cache: list[np.ndarray | None] = [None] * m
        self._filled: list[np.ndarray | None] = [None] * m

    # -- pickling: drop caches (they are re-derived identically from the key) ---------------------
    def __getstate__(self) -> dict[str, Any]:
        st = dict(self.__dict__)
        st["_cache"] = [None] * len(self._shape)
        st["_filled"] = [None] * len(self._shape)
        return st

    def with_omega(self, omega: int) -> PlausibleBayesNet:
        """The same network resampling ``omega`` attributes (post-processing)."""
        return PlausibleBayesNet(structure=self._structure, shape=self._shape, counts=self._counts,
                                 noise_scale=self._scale, alpha=self._alpha, omega=omega, key=self._key)

    def describe(self) -> dict[str, Any]:
        return {"model": "plausible Bayesian network", "omega": self._omega,
                "structure": self._structure.to_dict(), "dirichlet_alpha": self._alpha,
                "noise_scale": self._scale}

    def conditional_rows(self, i: int, configs: np.ndarray) -> np.ndarray:
        """``P(X_i | pa = config)`` rows for each config index (lazily derived and cached)."""
        table = self._counts[i]
        if self._cache[i] is None:
            self._cache[i] = np.zeros(table.shape, dtype=np.float64)
            self._filled[i] = np.zeros(table.shape[0], dtype=bool)
        cache, filled = self._cache[i], self._filled[i]
        missing = np.unique(configs[~filled[configs]])
        for cfg in missing.tolist():
            # a secure keyed stream (AES-CTR, not Philox) under HMAC(model key, (i, pa))
            key = _hmac_seed(self._key, "plausible.params", i, int(cfg)).to_bytes(32, "little")
            rs = RandomSource(seed=RunSecret(key))
            noisy = table[cfg] + discrete_laplace(rs.child("noise"), self._scale, table.shape[1])
            conc = self._alpha + np.clip(noisy, 0, None).astype(np.float64)
            p = rs.child("dirichlet").numpy_generator().dirichlet(conc)
            p = np.clip(p, 1e-300, None)
            cache[cfg] = p / p.sum()
            filled[cfg] = True
        return cache[configs]


class NetworkGenerator(SeedResamplingNetwork):
    """A seed-resampling Bayesian network with explicit conditional tables (post-processing only).

    ``conditionals[i]`` is ``P(X_i | Π_i)`` as a ``[parent configuration, value]`` array over the
    declared cells (configurations in ``np.ravel_multi_index`` order of ``structure.parents[i]``),
    every row a probability vector with no zero entry. ``structure.order`` must be topological.
    Holds no data and no key: it is a function of a released model, so it may be written.
    """

    def __init__(self, *, structure: PlausibleStructure, shape: Sequence[int],
                 conditionals: Sequence[np.ndarray], omega: int, source: str = "explicit tables") -> None:
        self._structure = structure
        self._shape = tuple(int(s) for s in shape)
        m = len(self._shape)
        if isinstance(omega, bool) or not isinstance(omega, int) or not 1 <= omega <= m:
            raise ValueError(f"omega ({omega!r}) must be an int in [1, {m}]")
        if sorted(structure.order) != list(range(m)) or len(structure.parents) != m:
            raise ValueError(f"structure {structure!r} must order and parent each of the {m} columns once")
        pos = {c: r for r, c in enumerate(structure.order)}
        for i, ps in enumerate(structure.parents):
            if any(pos[p] >= pos[i] for p in ps):
                raise ValueError(f"order {structure.order!r} is not topological: column {i} has parents {ps!r}")
        if len(conditionals) != m:
            raise ValueError(f"need {m} conditionals, got {len(conditionals)}")
        self._cond = []
        for i, c in enumerate(conditionals):
            c = np.asarray(c, dtype=np.float64)
            want = (math.prod(self._shape[p] for p in structure.parents[i]), self._shape[i])
            if c.shape != want:
                raise ValueError(f"conditional of column {i} has shape {c.shape}, expected {want}")
            if not (np.all(c > 0) and np.allclose(c.sum(axis=1), 1.0, atol=1e-9)):
                raise ValueError(f"conditional of column {i} must have positive rows summing to 1")
            self._cond.append(c)
        self._omega = int(omega)
        self._source = str(source)

    def conditional_rows(self, i: int, configs: np.ndarray) -> np.ndarray:
        return self._cond[i][configs]

    def conditional(self, i: int) -> np.ndarray:
        """``P(X_i | Π_i)`` as ``[configuration, value]`` rows."""
        return self._cond[i].copy()

    def with_omega(self, omega: int) -> NetworkGenerator:
        """The same network resampling ``omega`` attributes (post-processing)."""
        return NetworkGenerator(structure=self._structure, shape=self._shape, conditionals=self._cond,
                                omega=omega, source=self._source)

    def describe(self) -> dict[str, Any]:
        return {"model": "seed-resampling network", "source": self._source, "omega": self._omega,
                "structure": self._structure.to_dict(),
                "copied": list(self.copied_columns()), "resampled": list(self.resampled_columns())}


def _weighted_entropy(keys: np.ndarray, card: int, x: np.ndarray, w: np.ndarray) -> tuple[float, int]:
    """``H(X | K)`` in nats of a weighted sample and the number of configurations of ``K`` used."""
    joint = np.bincount(keys * card + x, weights=w)
    joint = joint[joint > 0]
    configs = np.bincount(keys, weights=w)
    configs = configs[configs > 0]
    return float(np.sum(configs * np.log(configs)) - np.sum(joint * np.log(joint))) / float(w.sum()), configs.size


def choose_parents(pool: np.ndarray, weights: np.ndarray, *, shape: Sequence[int], column: int,
                   candidates: Sequence[int], max_parents: int, max_configs: int,
                   max_cells: int = GENERATOR_MAX_CELLS) -> tuple[int, ...]:
    """Greedy parents of ``column`` among ``candidates`` for a weighted sample (post-processing).

    Adds, while it pays, the candidate with the largest drop of ``H(X | Π)`` minus a BIC penalty
    ``(new free parameters)·ln(N)/(2N)`` (``N`` the sample's effective size), keeping the number
    of parent configurations ≤ ``max_configs`` and the table (configurations × cells) ≤
    ``max_cells`` (declared sizes). Reads only ``pool`` (records sampled from a DP model) and its
    weights.
    """
    w = np.asarray(weights, dtype=np.float64)
    n_eff = float(w.sum() ** 2 / max(float(np.sum(w * w)), 1e-300))
    pen = math.log(max(n_eff, 2.0)) / (2.0 * max(n_eff, 2.0))
    card = int(shape[column])
    x = pool[:, column].astype(np.int64)
    chosen: list[int] = []
    keys = np.zeros(pool.shape[0], dtype=np.int64)
    configs = 1
    h, _ = _weighted_entropy(keys, card, x, w)
    while len(chosen) < max_parents:
        best = None
        for j in candidates:
            if j in chosen or configs * int(shape[j]) > max_configs or \
                    configs * int(shape[j]) * card > max_cells:
                continue
            k2 = keys * int(shape[j]) + pool[:, j].astype(np.int64)
            h2, used = _weighted_entropy(k2, card, x, w)
            gain = (h - h2) - pen * (card - 1) * (configs * int(shape[j]) - configs)
            if gain > 1e-12 and (best is None or gain > best[0]):
                best = (gain, j, h2, k2)
        if best is None:
            break
        _, j, h, keys = best
        chosen.append(j)
        configs *= int(shape[j])
    return tuple(chosen)


def fit_network_generator(pool: np.ndarray, weights: np.ndarray | None, *, shape: Sequence[int], omega: int,
                          order: Sequence[int], max_parents: int = 3, max_configs: int = 2000,
                          prior_rows: float = 1.0, source: str = "weighted sample of a DP model") -> NetworkGenerator:
    """A :class:`NetworkGenerator` fitted to a weighted sample drawn from a released DP model.

    ``order`` is the resampling order (its first ``m − ω`` columns are copied from seeds, the
    rest resampled in that order); each column's parents are chosen among the columns before it
    (:func:`choose_parents`), and ``P(X | π) = (W(x, π) + a·P(x)) / (W(π) + a)`` with ``a =
    prior_rows`` (weights scaled to mean 1, so ``a`` counts sample rows): every row positive,
    configurations the sample never reaches fall back on the marginal. Post-processing of the
    model: no budget, no access to private records.
    """
    pool = np.asarray(pool, dtype=np.int64)
    m = len(shape)
    order = tuple(int(c) for c in order)
    if sorted(order) != list(range(m)):
        raise ValueError(f"order ({order!r}) must list each of the {m} columns once")
    w = np.ones(pool.shape[0]) if weights is None else np.asarray(weights, dtype=np.float64)
    if pool.shape[0] == 0 or not w.sum() > 0:
        raise ValueError("the sample must have at least one row of positive weight")
    w = w * (w.size / w.sum())
    parents: list[tuple[int, ...]] = [()] * m
    conds: list[np.ndarray] = [np.zeros(0)] * m
    for r, i in enumerate(order):
        ps = choose_parents(pool, w, shape=shape, column=i, candidates=order[:r], max_parents=max_parents,
                            max_configs=max_configs) if r else ()
        ps = tuple(sorted(ps))
        parents[i] = ps
        card = int(shape[i])
        n_cfg = math.prod(int(shape[p]) for p in ps)
        cfg = (np.ravel_multi_index(tuple(pool[:, p] for p in ps), tuple(int(shape[p]) for p in ps))
               if ps else np.zeros(pool.shape[0], dtype=np.int64))
        joint = np.bincount(cfg * card + pool[:, i], weights=w, minlength=n_cfg * card).reshape(n_cfg, card)
        marg = joint.sum(axis=0) + 1e-9
        marg = marg / marg.sum()
        cond = joint + prior_rows * marg[None, :]
        conds[i] = cond / cond.sum(axis=1, keepdims=True)
    structure = PlausibleStructure(parents=tuple(parents), order=order)
    return NetworkGenerator(structure=structure, shape=shape, conditionals=conds, omega=omega, source=source)


# =============================================================================================
# Privacy tests (Section 2.2) and Theorem 1
# =============================================================================================
def plausible_interval(logp: np.ndarray, gamma: float) -> np.ndarray:
    """The integer ``i ≥ 0`` with ``γ^-(i+1) < p ≤ γ^-i`` for ``p = exp(logp)``; ``-1`` when p = 0.

    Computed as ``floor(-ln p / ln γ)`` with a relative 1e-9 guard so probabilities equal to a
    power of γ up to round-off land in the interval the inequality assigns them.
    """
    logp = np.asarray(logp, dtype=np.float64)
    x = -logp / math.log(gamma)
    with np.errstate(invalid="ignore"):
        i = np.floor(x + 1e-9 * np.maximum(np.abs(x), 1.0))
    i = np.where(np.isfinite(logp), np.maximum(i, 0), -1)
    return i.astype(np.int64)


def count_plausible_generic(cand_logp: np.ndarray, logp_matrix: np.ndarray, gamma: float,
                            max_plausible: int | None = None) -> np.ndarray:
    """``k'`` per candidate: records whose ``Pr{y = M(d)}`` falls in the interval of the seed's.

    ``cand_logp[a]`` = log Pr{y_a = M(seed_a)}; ``logp_matrix[a, b]`` = log Pr{y_a = M(d_b)}.
    Capped at ``max_plausible`` (the early stop of Section 5; no effect on privacy).
    """
    ref = plausible_interval(cand_logp, gamma)
    idx = plausible_interval(logp_matrix, gamma)
    k = np.sum((idx == ref[:, None]) & (idx >= 0), axis=1).astype(np.int64)
    if max_plausible is not None:
        k = np.minimum(k, int(max_plausible))
    return k


def privacy_test(kprime: np.ndarray, *, k: int, epsilon0: float | None, rs: RandomSource | None) -> tuple[np.ndarray, np.ndarray]:
    """Privacy Test 1 (``epsilon0=None``: pass iff ``k' ≥ k``) or Test 2 (pass iff ``k' ≥ k + L``).

    Test 2 draws fresh ``L ~ Lap(1/ε0)`` per test (continuous Laplace: only the pass/fail bit is
    released, as in Theorem 1). Returns ``(passed, noisy_threshold)`` (threshold = k for Test 1).
    """
    kprime = np.asarray(kprime, dtype=np.int64)
    if epsilon0 is None:
        thr = np.full(kprime.shape, float(k))
    else:
        if rs is None:
            raise ValueError("the randomized test needs a RandomSource")
        thr = k + laplace_internal(rs, 1.0 / epsilon0, kprime.shape)
    return kprime >= thr, thr


def theorem1_guarantee(*, k: int, gamma: float, epsilon0: float, t: int) -> tuple[float, float]:
    """(ε, δ) of releasing one candidate with Privacy Test 2 (Theorem 1, Appendix C).

    ``ε = ε0 + ln(1 + γ/t)``, ``δ = exp(-ε0·(k - t))`` for an integer ``1 ≤ t < k``; the neighbours
    add or remove one record of the seed data set. Checked by brute-force hockey-stick divergence
    over all small datasets in ``tests/unit/test_plausible.py``.
    """
    if not (isinstance(k, int) and k >= 2):
        raise ValueError(f"k ({k!r}) must be an int >= 2")
    if not (isinstance(t, int) and 1 <= t < k):
        raise ValueError(f"t ({t!r}) must be an int in [1, {k - 1}]")
    if not gamma >= 1:
        raise ValueError(f"gamma ({gamma!r}) must be >= 1")
    if not epsilon0 > 0:
        raise ValueError(f"epsilon0 ({epsilon0!r}) must be > 0")
    return epsilon0 + math.log1p(gamma / t), math.exp(-epsilon0 * (k - t))


def poisson_counts(rs: RandomSource, lam: float, n: int) -> np.ndarray:
    """``n`` i.i.d. ``Poisson(lam)`` draws by inversion of ``RandomSource.uniform`` (no numpy RNG).

    These multiplicities decide how many candidates each seed yields, i.e. the number of
    invocations of Mechanism 1 and which seeds they use, so they are part of the mechanism, not
    post-processing: they come from the project's primitive stream. ``X = min{x : F(x) ≥ u}`` with
    the exact CDF table ``F`` (scipy, double precision) up to the quantile of the largest uniform.
    """
    lam = float(lam)
    if not (lam >= 0 and math.isfinite(lam)):
        raise ValueError(f"lam ({lam!r}) must be a finite number >= 0")
    n = int(n)
    if lam == 0 or n == 0:
        return np.zeros(n, dtype=np.int64)
    from scipy.stats import poisson

    u = rs.uniform(n)
    hi = int(poisson.ppf(_BELOW_ONE, lam))
    if hi > _POISSON_TABLE_MAX:
        return poisson.ppf(u, lam).astype(np.int64)
    table = poisson.cdf(np.arange(hi + 1), lam)
    return np.minimum(np.searchsorted(table, u, side="left"), hi).astype(np.int64)


def candidate_bound(rows: int, tail_delta: float) -> int:
    """The public bound ``C``: the smallest integer with ``P(Poisson(rows) > C) ≤ tail_delta``."""
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise ValueError(f"rows ({rows!r}) must be an int >= 0")
    if not (0 < tail_delta < 1):
        raise ValueError(f"tail_delta ({tail_delta!r}) must be in (0, 1)")
    if rows == 0:
        return 0
    from scipy.stats import poisson

    c = max(0, int(poisson.isf(tail_delta, rows)))
    while poisson.sf(c, rows) > tail_delta:
        c += 1
    while c > 0 and poisson.sf(c - 1, rows) <= tail_delta:
        c -= 1
    return c


def candidate_release_cost(*, rows: int, k: int, gamma: float, epsilon0: float, t: int,
                           tail_delta: float, max_contributions: int = 1) -> dict[str, Any]:
    """(ε, δ) of releasing every candidate of one run through Privacy Test 2 (add/remove one unit).

    One invocation of Mechanism 1 (a uniform seed of ``D_S``, one candidate, released or dropped)
    is ``(ε₁, δ₁) = (ε0 + ln(1 + γ/t), exp(-ε0(k - t)))``-DP for adding or removing one record of
    ``D_S`` (Theorem 1, :func:`theorem1_guarantee`). With ``c = max_contributions`` records per unit
    group privacy gives ``(c·ε₁, c·e^{(c-1)ε₁}·δ₁)`` per invocation.

    The number of invocations ``N`` is ``Poisson(rows)`` (each seed yields ``Poisson(rows/|D_S|)``
    candidates): its law does not depend on the data (``rows`` is public; with an empty ``D_S``
    every invocation outputs nothing). Let ``C`` be the smallest integer with
    ``P(N > C) ≤ δ_tail`` (:func:`candidate_bound`). Conditioned on ``N = n`` the release is the
    basic sequential composition of ``n`` invocations, ``(n·ε₁, n·δ₁)``-DP, so for every set ``S``
    of outputs and neighbours ``D, D'``::

        P[M(D) ∈ S] = Σ_n P(N=n) P[M_n(D) ∈ S]
                    ≤ Σ_{n≤C} P(N=n) (e^{n·ε₁} P[M_n(D') ∈ S] + n·δ₁) + P(N > C)
                    ≤ e^{C·ε₁} P[M(D') ∈ S] + C·δ₁ + δ_tail,

    i.e. the release is ``(C·ε₁, C·δ₁ + δ_tail)``-DP. This is valid only because ``N`` is drawn
    independently of the data; a data-dependent ``rows`` (a DP count) would make ``C`` adaptive.
    Returns the per-invocation, per-unit and composed numbers with ``C`` and ``δ_tail``.
    """
    eps1, delta1 = theorem1_guarantee(k=k, gamma=gamma, epsilon0=epsilon0, t=t)
    c = int(max_contributions)
    if c < 1:
        raise ValueError(f"max_contributions ({max_contributions!r}) must be an int >= 1")
    eps_u, delta_u = c * eps1, min(1.0, c * math.exp((c - 1) * eps1) * delta1)
    bound = candidate_bound(rows, tail_delta)
    return {
        "theorem": "Theorem 1 (Bindschaedler et al., VLDB 2017), composed over a public bound C on "
                   "the Poisson(rows) number of invocations of Mechanism 1",
        "per_invocation": {"epsilon": eps1, "delta": delta1, "k": k, "gamma": gamma,
                           "epsilon0": epsilon0, "t": t},
        "per_unit_invocation": {"epsilon": eps_u, "delta": delta_u, "max_contributions": c},
        "rows": rows, "C": bound, "tail_delta": tail_delta,
        "epsilon": bound * eps_u, "delta": min(1.0, bound * delta_u + tail_delta),
    }


# =============================================================================================
# Columnar helpers for the fast path
# =============================================================================================
def group_keys(codes: np.ndarray, cols: Sequence[int], shape: Sequence[int]) -> np.ndarray:
    """Collision-free integer keys of the values in ``cols``: ``(n, words)`` uint64 mixed radix."""
    n = codes.shape[0]
    words: list[np.ndarray] = []
    cur = np.zeros(n, dtype=np.uint64)
    radix = 1
    for c in cols:
        s = int(shape[c])
        if radix * s >= 2**63:
            words.append(cur)
            cur = np.zeros(n, dtype=np.uint64)
            radix = 1
        cur = cur * np.uint64(s) + codes[:, c].astype(np.uint64)
        radix *= s
    words.append(cur)
    return np.stack(words, axis=1)


def _shard_of(keys: np.ndarray, shards: int) -> np.ndarray:
    h = np.zeros(keys.shape[0], dtype=np.uint64)
    with np.errstate(over="ignore"):
        for w in range(keys.shape[1]):
            h = (h ^ keys[:, w]) * np.uint64(0x9E3779B97F4A7C15)
            h ^= h >> np.uint64(29)
    return (h % np.uint64(shards)).astype(np.int64)


def _unique_counts(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if keys.shape[0] == 0:
        return keys, counts
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    return uniq, np.bincount(inv.ravel(), weights=counts, minlength=uniq.shape[0]).astype(np.int64)


def lookup_counts(table_keys: np.ndarray, table_counts: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Counts of ``keys`` rows in a (keys, counts) table; 0 for absent keys (vectorized)."""
    if keys.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    if table_keys.shape[0] == 0:
        return np.zeros(keys.shape[0], dtype=np.int64)
    allk = np.concatenate([table_keys, keys], axis=0)
    _, inv = np.unique(allk, axis=0, return_inverse=True)
    inv = inv.ravel()
    per_id = np.bincount(inv[: table_keys.shape[0]], weights=table_counts, minlength=int(inv.max()) + 1)
    return per_id[inv[table_keys.shape[0]:]].astype(np.int64)


def split_assignments(rs: RandomSource, n: int, fractions: Sequence[float]) -> np.ndarray:
    """Part index of ``n`` rows: i.i.d. categorical draws with the given fractions (0 = seeds)."""
    cdf = np.cumsum(np.asarray(fractions, dtype=np.float64))
    cdf /= cdf[-1]
    return np.searchsorted(cdf, rs.uniform(n), side="right").astype(np.int64)


def record_ranks(codes: np.ndarray) -> np.ndarray:
    """Occurrence number of each row among the rows equal to it (0, 1, ... in row order)."""
    codes = np.asarray(codes)
    n = codes.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort(codes.T[::-1]) if codes.ndim == 2 and codes.shape[1] else np.arange(n)
    ordered = codes[order].reshape(n, -1)  # equal rows adjacent, in row order (lexsort is stable)
    starts = np.r_[0, np.flatnonzero((ordered[1:] != ordered[:-1]).any(axis=1)) + 1]
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
    return rank


def _hmac_uniforms(key: bytes, messages: Sequence[bytes]) -> np.ndarray:
    """A uniform on (0, 1) per message: the top 53 bits of ``HMAC-SHA256(key, message)``."""
    words = np.frombuffer(b"".join(hmac.digest(key, m, "sha256")[:8] for m in messages), dtype="<u8")
    u = ((words >> np.uint64(11)).astype(np.float64) + 0.5) / float(2**53)
    # the largest word + 0.5 rounds up to 2^53, i.e. u = 1.0: clamp to the largest double below 1
    # as RandomSource.uniform does (its mass, 2^-53, is unchanged)
    return np.minimum(u, _BELOW_ONE)


def record_uniforms(key: bytes, codes: np.ndarray, labels: Sequence[Any] = ()) -> np.ndarray:
    """A uniform per record from ``HMAC(key, (labels, record values, occurrence number))``.

    For records without privacy ids: the ``j``-th copy of a value always gets the same draw, so a
    record's draw depends on its own values and on how many equal records precede it, never on
    its batch or its neighbours. ``codes`` must hold **every** record equal to any of its rows (all
    records of a value shard, :func:`seed_shards`), so the occurrence numbers are global. Adding a
    record then adds one draw and changes none (a stable coupling, rule 6); distinct (value,
    occurrence) pairs get independent draws (PRF under the secret key).
    """
    codes = np.asarray(codes, dtype=np.int64)
    n = codes.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.float64)
    rows = np.ascontiguousarray(np.column_stack([codes, record_ranks(codes)]).astype("<i8"))
    width = 8 * rows.shape[1]
    buf, head = rows.tobytes(), repr(tuple(labels)).encode("utf-8") + b"\x00"
    return _hmac_uniforms(key, [head + buf[i * width:(i + 1) * width] for i in range(n)])


def _parts_from_uniforms(u: np.ndarray, fractions: Sequence[float]) -> np.ndarray:
    cdf = np.cumsum(np.asarray(fractions, dtype=np.float64))
    cdf /= cdf[-1]
    return np.searchsorted(cdf, u, side="right").astype(np.int64)


# =============================================================================================
# Element types
# =============================================================================================
@dataclass(frozen=True)
class CandidateBatch:
    """Candidates ``codes[c, m]`` with ``logp[c] = log Pr{y = M(seed)}`` of their own seed."""

    codes: np.ndarray
    logp: np.ndarray
    batch_id: str = ""

    def __len__(self) -> int:
        return int(self.codes.shape[0])


@dataclass(frozen=True)
class RejectedCandidates:
    """Rejected candidates (dead-letter output): codes, ``k'``, threshold and one reason each."""

    codes: np.ndarray
    kprime: np.ndarray
    reasons: np.ndarray

    def __len__(self) -> int:
        return int(self.codes.shape[0])

    def reason_counts(self) -> dict[str, int]:
        """Number of rejections per reason."""
        vals, cnt = np.unique(self.reasons, return_counts=True)
        return {str(v): int(c) for v, c in zip(vals, cnt)}


# =============================================================================================
# Beam: split
# =============================================================================================
def unit_split_assignments(key: bytes, pids: Sequence[Any], fractions: Sequence[float]) -> np.ndarray:
    """Part index per row from ``HMAC(key, privacy id)``: every record of a unit lands in one part.

    The uniform for a unit is the top 53 bits of its HMAC-SHA256 under a secret key shared by all
    workers (a side input), so the split is random, independent across units, and identical for all
    of one unit's records wherever they are processed.
    """
    return _parts_from_uniforms(_hmac_uniforms(key, [str(p).encode("utf-8") for p in pids]), fractions)


def record_split_assignments(key: bytes, codes: np.ndarray, fractions: Sequence[float],
                             labels: Sequence[Any] = ()) -> np.ndarray:
    """Part index per record without a privacy id, from :func:`record_uniforms` (one value shard)."""
    return _parts_from_uniforms(record_uniforms(key, codes, ("plausible.split", *labels)), fractions)


class _RouteSplitFn(beam.DoFn):
    """Batches with privacy ids pass; records without go to ``by_value`` as ``(shard, codes)``."""

    def __init__(self, shards: int) -> None:
        self._shards = shards

    def process(self, batch: EncodedBatch):
        if batch.pids is not None:
            yield batch
            return
        sh = seed_shards(batch.codes, self._shards)
        for s in np.unique(sh).tolist():
            yield beam.pvalue.TaggedOutput("by_value", (s, batch.codes[sh == s]))


def _sorted_shard(parts) -> np.ndarray:
    """All records of a value shard, in canonical (sorted) order: independent of arrival order."""
    codes = np.concatenate(list(parts), axis=0)
    return codes[np.lexsort(codes.T[::-1])] if codes.shape[0] > 1 else codes


class _SplitFn(beam.DoFn):
    """One part per record: per unit (``EncodedBatch`` with ids) or per (value, occurrence) for a
    value shard of records without ids (``(shard, [codes, ...])`` after a ``GroupByKey``)."""

    def __init__(self, fractions: tuple[float, float, float], out_rows: int = 50_000) -> None:
        self._fractions, self._out_rows = fractions, out_rows

    def process(self, element, key: bytes, window=beam.DoFn.WindowParam):
        if isinstance(element, EncodedBatch):  # privacy units: one part per unit (parallel composition)
            codes, pids = element.codes, element.pids
            part = unit_split_assignments(key, pids.tolist(), self._fractions)
        else:  # every record is its own unit: one draw per (value, occurrence), stable under add/remove
            codes, pids = _sorted_shard(element[1]), None
            part = record_split_assignments(key, codes, self._fractions, window_labels(window))
        for p, tag in enumerate(("seeds", "structure", "params")):
            idx = np.flatnonzero(part == p)
            for start in range(0, idx.size, self._out_rows):
                sel = idx[start:start + self._out_rows]
                sub = EncodedBatch(codes[sel], None if pids is None else pids[sel])
                yield sub if tag == "seeds" else beam.pvalue.TaggedOutput(tag, sub)


def _make_split_key(_: Any, seed: int | None) -> bytes:
    return RandomSource(seed=seed).child("plausible.split-key").secret_key()


@element_types(input=EncodedBatch, outputs={"seeds": EncodedBatch, "structure": EncodedBatch,
                                            "params": EncodedBatch})
class SplitForPlausible(beam.PTransform):
    """Random disjoint split of records into seeds / structure / parameters (Section 3.5).

    With privacy ids (``batch.pids``) the part of a unit is drawn from ``HMAC(secret key, id)`` so
    all its records share one part. Without, every record is its own unit: the records are grouped
    into ``shards`` public shards by their values (:func:`seed_shards`, one ``GroupByKey``) and the
    ``j``-th copy of a value draws its part from ``HMAC(secret key, (window, value, j))``
    (:func:`record_split_assignments`). Either way a unit's part depends on nothing but its own
    draw, independent across units, so the mechanisms that follow compose in parallel, and adding
    or removing a unit adds or removes exactly its records in one part (rule 6), whatever the
    batching. Until the ninth session records without ids drew from a stream keyed by their
    batch's content: equal batches got equal splits, and one added record redrew its whole batch
    (``tests/pipeline/test_plausible.py::test_split_without_ids_is_stable_independent_of_batching_and_of_equal_batches``).
    Returns a dict of three ``PCollection[EncodedBatch]``: ``seeds``, ``structure``, ``params``.
    """

    def __init__(self, *, fractions: Sequence[float] = (0.5, 0.2, 0.3), seed: int | None = None,
                 shards: int = 32, label: str | None = None) -> None:
        super().__init__(label)
        fr = tuple(float(f) for f in fractions)
        if len(fr) != 3 or any(not (f > 0) for f in fr):
            raise ValueError(f"fractions ({fractions!r}) must be three numbers > 0 (seeds, structure, params)")
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise ValueError(f"shards ({shards!r}) must be an int >= 1")
        self._fractions, self._seed, self._shards = fr, run_seed(seed), shards

    def display_data(self) -> dict[str, Any]:
        """The public split fractions (no budget: the split is disjoint, parts compose in parallel)."""
        seeds, structure, params = self._fractions
        return display_items(mechanism="random disjoint split (seeds / structure / parameters)",
                             seeds_fraction=seeds, structure_fraction=structure,
                             params_fraction=params, shards=self._shards)

    def expand(self, batches):
        # batches: EncodedBatch
        key = (batches.pipeline | "KeyOnce" >> beam.Create([None])
               | "SplitKey" >> beam.Map(_make_split_key, self._seed))
        # bytes: one secret key for the whole pipeline
        routed = batches | "Route" >> beam.ParDo(_RouteSplitFn(self._shards)).with_outputs(
            "by_value", main="with_ids")
        # with_ids: EncodedBatch with pids; by_value: (shard, codes[r, m]) of records without ids
        grouped = routed.by_value | "GroupByValue" >> beam.GroupByKey()
        # (shard, [codes, ...]): every record without id of the shard and window
        fn = _SplitFn(self._fractions)
        units = routed.with_ids | "AssignUnitParts" >> beam.ParDo(
            fn, beam.pvalue.AsSingleton(key)).with_outputs("structure", "params", main="seeds")
        records = grouped | "AssignRecordParts" >> beam.ParDo(
            fn, beam.pvalue.AsSingleton(key)).with_outputs("structure", "params", main="seeds")
        # seeds / structure / params: EncodedBatch sub-batches
        return {tag: (units[tag], records[tag]) | f"Flatten{tag.capitalize()}" >> beam.Flatten()
                for tag in ("seeds", "structure", "params")}


# =============================================================================================
# Beam: the DP model
# =============================================================================================
class _StructureFn(beam.DoFn):
    """Exact single/pair tables + count → noisy entropies → CFS structure (pure function of noise)."""

    def __init__(self, *, shape, epsilon, max_records, max_parents, max_cost, seed, step, cells_per_record=None):
        self._shape, self._eps, self._max_records = tuple(shape), epsilon, max_records
        self._max_parents, self._max_cost, self._seed, self._step = max_parents, max_cost, seed, step
        self._cells_per_record = cells_per_record

    def process(self, tables, n_records, window=beam.DoFn.WindowParam):
        rs = RandomSource(seed=self._seed).child(self._step, *window_labels(window))
        yield learn_structure(list(tables), n_records, shape=self._shape, epsilon=self._eps,
                              max_records=self._max_records, max_parents=self._max_parents,
                              max_cost=self._max_cost, rs=rs, cells_per_record=self._cells_per_record)


def structure_specs(m: int) -> list[tuple[int, ...]]:
    """Marginals measured for the structure: every single column, then every pair."""
    return [(i,) for i in range(m)] + list(itertools.combinations(range(m), 2))


def learn_structure(tables: Sequence[np.ndarray], n_records: int, *, shape: Sequence[int], epsilon: float,
                    max_records: int, max_parents: int, max_cost: int, rs: RandomSource,
                    cells_per_record: float | None = None) -> PlausibleStructure:
    """ε-DP structure from exact single/pair tables of ``D_T`` (:func:`structure_specs` order).

    Noisy entropies (:func:`noisy_entropies`, the only data access) → symmetrical uncertainty →
    greedy CFS (post-processing). With ``cells_per_record`` the conditional tables are limited to
    ``ñ_T · cells_per_record`` cells, ``ñ_T`` the **noisy** count of ``D_T`` (θ-usefulness of
    PrivBayes, Zhang et al. 2014: a table must hold enough records per cell to outweigh its noise;
    post-processing).

    More records than the declared ``max_records = N`` never fail the run (rule 7: the data's size
    must not decide whether a release happens): the measured values are then
    ``min(n, N)·H`` (every table scaled by ``N/n``, ``n·H`` being homogeneous of degree 1) and the
    count ``min(n, N)``, whose add/remove sensitivities stay ``entropy_sum_sensitivity(N)`` and 1
    (:func:`clamped_entropy_sum_sensitivity`, checked by brute force in ``tests/unit``). ``H̃`` is
    still ``f̃/ñ``, an estimate of the entropy of all of ``D_T``. Until the ninth session this
    raised, so the run crashed exactly when ``|D_T| > N``.
    """
    n_records = int(n_records)
    if n_records > max_records:
        tables = [np.asarray(t, dtype=np.float64) * (max_records / n_records) for t in tables]
        n_records = int(max_records)
    h1, h2, n_noisy = noisy_entropies(list(tables), n_records, shape=shape, epsilon=epsilon,
                                      max_records=max_records, rs=rs)
    corr = symmetrical_uncertainty(h1, h2)
    max_cells = None if cells_per_record is None else max(1.0, n_noisy * cells_per_record)
    return cfs_structure(corr, shape, max_parents=min(max_parents, len(shape) - 1), max_cost=max_cost,
                         max_cells=max_cells)


class _ParamCountsFn(beam.DoFn):
    """EncodedBatch → exact (parents..., child) count tables for one structure (list of arrays)."""

    def __init__(self, shape) -> None:
        self._shape = tuple(shape)

    def process(self, batch: EncodedBatch, structure: PlausibleStructure):
        yield param_tables(batch.codes, structure, self._shape)


def param_tables(codes: np.ndarray, structure: PlausibleStructure, shape: Sequence[int]) -> list[np.ndarray]:
    """Exact ``(parents..., child)`` count tables of ``codes`` for each attribute (``D_P`` only)."""
    specs = [tuple(structure.parents[i]) + (i,) for i in range(len(shape))]
    return count_marginals(codes, specs, shape)


class _SumTablesFn(beam.CombineFn):
    def create_accumulator(self):
        return None

    def add_input(self, acc, tables):
        if acc is None:
            return [t.copy() for t in tables]
        for a, t in zip(acc, tables):
            a += t
        return acc

    def merge_accumulators(self, accs):
        out = None
        for a in accs:
            if a is not None:
                out = self.add_input(out, a)
        return out

    def extract_output(self, acc):
        return acc


class _BuildModelFn(beam.DoFn):
    def __init__(self, *, shape, scale, alpha, omega, seed, step) -> None:
        self._shape, self._scale, self._alpha, self._omega = tuple(shape), scale, alpha, omega
        self._seed, self._step = seed, step

    def process(self, tables, structure: PlausibleStructure, window=beam.DoFn.WindowParam):
        if tables is None:  # empty parameter split: all-zero counts, still noised
            tables = param_tables(np.zeros((0, len(self._shape)), np.int64), structure, self._shape)
        key = RandomSource(seed=self._seed).child(self._step, "hmac-key", *window_labels(window)).secret_key()
        yield PlausibleBayesNet(structure=structure, shape=self._shape, counts=tables,
                                noise_scale=self._scale, alpha=self._alpha, omega=self._omega, key=key)


@element_types(inputs={"structure": EncodedBatch, "params": EncodedBatch},
               output=PlausibleBayesNet)
class DPPlausibleBayesNet(beam.PTransform):
    """ε-DP Bayesian network of Section 3 from disjoint structure and parameter splits.

    Input: ``{"structure": PCollection[EncodedBatch], "params": PCollection[EncodedBatch]}``
    (disjoint). Output: one :class:`PlausibleBayesNet` per window.

    Privacy (add/remove one record; multiply sensitivities by ``max_contributions``):

    * structure on ``D_T``: ``10%`` of ε on the count (discrete Laplace, sensitivity 1), the rest
      split over ``m + m(m-1)/2`` values ``f = n·H`` with Laplace of scale ``Δf·Q/ε``,
      ``Δf = log2 N + (N-1)·log2(N/(N-1))`` for the declared bound ``N = max_records``
      (:func:`entropy_sum_sensitivity`; the paper's Lemma 1 is for replace-one neighbours and a
      known ``n``). ε-DP by sequential composition (Section 3.3.1, 3.5).
    * parameters on ``D_P``: ``m`` tables (parents + child), each record in one cell per table,
      discrete Laplace of scale ``m·c/ε`` per cell (Section 3.4.1), noise derived lazily per parent
      configuration from ``HMAC(secret key, (i, configuration))``; ε-DP.
    * parallel composition over the disjoint splits: the model is ε-DP (δ = 0). We do not claim
      the subsampling amplification of Section 3.5.

    ``theta`` (default 4) additionally limits each conditional table to
    ``ñ_T·(|D_P|/|D_T|)·(ε/m)/(c·θ)`` cells using the noisy ``D_T`` count (post-processing; PrivBayes'
    θ-usefulness), since with small data the paper's ``maxcost`` alone lets noise swamp the tables.
    ``params_ratio`` is the split's public ratio ``|D_P|/|D_T|`` (fractions).
    """

    def __init__(self, *, shape: Sequence[int], budget: ApproxDP, omega: int, max_parents: int = 3,
                 max_cost: int = 1000, alpha: float = 1.0, max_records: int = DEFAULT_MAX_RECORDS,
                 theta: float | None = 4.0, params_ratio: float = 1.5,
                 max_contributions: int = 1, seed: int | None = None, label: str | None = None) -> None:
        super().__init__(label)
        if theta is not None and not (theta > 0 and math.isfinite(theta)):
            raise ValueError(f"theta ({theta!r}) must be a finite number > 0 or None")
        if not (params_ratio > 0 and math.isfinite(params_ratio)):
            raise ValueError(f"params_ratio ({params_ratio!r}) must be a finite number > 0")
        if not isinstance(budget, ApproxDP):
            raise TypeError(f"budget must be a PureDP/ApproxDP, got {type(budget).__name__}")
        m = len(shape)
        if not (isinstance(omega, int) and 1 <= omega <= m):
            raise ValueError(f"omega ({omega!r}) must be an int in [1, {m}]")
        if isinstance(max_parents, bool) or not (isinstance(max_parents, int) and max_parents >= 0):
            raise ValueError(f"max_parents ({max_parents!r}) must be an int >= 0")
        if not (isinstance(max_cost, int) and max_cost >= 1):
            raise ValueError(f"max_cost ({max_cost!r}) must be an int >= 1")
        if not (alpha > 0 and math.isfinite(alpha)):
            raise ValueError(f"alpha ({alpha!r}) must be a finite number > 0")
        if not (isinstance(max_records, int) and max_records >= 2):
            raise ValueError(f"max_records ({max_records!r}) must be an int >= 2")
        self._shape, self._eps, self._omega = tuple(int(s) for s in shape), budget.epsilon, omega
        self._max_parents, self._max_cost, self._alpha = min(max_parents, m - 1), max_cost, float(alpha)
        self._max_records, self._c, self._seed = max_records, int(max_contributions), run_seed(seed)
        self._theta, self._params_ratio = theta, float(params_ratio)

    @property
    def cells_per_record(self) -> float | None:
        """Table cells allowed per noisy record of ``D_T``: ``(|D_P|/|D_T|)·(ε/m)/(c·θ)`` (θ-usefulness)."""
        if self._theta is None:
            return None
        return self._params_ratio * (self._eps / len(self._shape)) / (self._c * self._theta)

    def display_data(self) -> dict[str, Any]:
        """ε, noise laws and sizes (never data values)."""
        return display_items(
            mechanism="plausible-deniability Bayesian network (Laplace entropies, discrete Laplace "
                      "tables)",
            epsilon=self._eps, delta=0.0, omega=self._omega, columns=len(self._shape),
            structure_noise="Laplace on n·H", entropy_scale=self.entropy_scale,
            parameter_noise="discrete Laplace", parameter_scale=self.param_scale,
            max_cost=self._max_cost, declared_cells=sum(self._shape))

    @property
    def param_scale(self) -> float:
        """Discrete Laplace scale per parameter cell: ``m·c/ε``."""
        return discrete_laplace_scale(sensitivity=len(self._shape) * self._c, epsilon=self._eps)

    @property
    def entropy_scale(self) -> float:
        """Laplace scale on each ``n·H`` value."""
        m = len(self._shape)
        q = m + m * (m - 1) // 2
        return self._c * entropy_sum_sensitivity(self._max_records) * q / (0.9 * self._eps)

    def expand(self, parts):
        m = len(self._shape)
        tables = combine_globally(parts["structure"], MarginalCountsCombineFn(structure_specs(m), self._shape),
                                  "PairCounts")
        # tuple[np.ndarray] exact single + pair tables of D_T (one pass)
        n_t = combine_globally(parts["structure"], _CountRowsFn(), "CountStructure")
        # int |D_T|
        structure = tables | "Structure" >> beam.ParDo(
            _StructureFn(shape=self._shape, epsilon=self._eps / self._c, max_records=self._max_records,
                         max_parents=self._max_parents, max_cost=self._max_cost, seed=self._seed,
                         step="plausible.structure", cells_per_record=self.cells_per_record),
            beam.pvalue.AsSingleton(n_t))
        # PlausibleStructure (post-processing of noisy entropies)
        counts = (parts["params"]
                  | "ParamCounts" >> beam.ParDo(_ParamCountsFn(self._shape), beam.pvalue.AsSingleton(structure)))
        # list[np.ndarray] exact conditional tables per batch of D_P
        summed = combine_globally(counts, _SumTablesFn(), "SumParamCounts")
        # list[np.ndarray] | None
        return summed | "BuildModel" >> beam.ParDo(
            _BuildModelFn(shape=self._shape, scale=self.param_scale, alpha=self._alpha, omega=self._omega,
                          seed=self._seed, step="plausible.params"), beam.pvalue.AsSingleton(structure))
        # PlausibleBayesNet (lazy noisy conditionals)


# =============================================================================================
# A PrivBayes network as the seed-based generator
# =============================================================================================


def copy_first_order(shape: Sequence[int]) -> tuple[int, ...]:
    """Columns by number of declared cells, then schema position (data-independent).

    The first ``m − ω`` are the ones a candidate copies from its seed: the privacy test counts
    the seeds that share all of them, so small domains keep more seeds plausible for the same ω.
    """
    return tuple(sorted(range(len(shape)), key=lambda c: (int(shape[c]), c)))


def model_sample(model: SynthesisModel, rows: int, rs: RandomSource) -> tuple[np.ndarray, np.ndarray | None, list[int]]:
    """``(records, weights, network order)`` describing a released model (post-processing).

    A refined PrivBayes model is its network's records raked to the released targets (the
    weighted pool its own sampler uses, with its sweeps); a plain network is sampled ancestrally. The order is the
    network's sampling (topological) order, or the schema order for other models.
    """
    shape = tuple(int(s) for s in model.shape)
    base = model.base if isinstance(model, RefinedModel) else model
    order = [x for x, _ in base.structure] if isinstance(base, PrivBayesModel) else list(range(len(shape)))
    if isinstance(model, RefinedModel) and model.targets:
        pool = base.sample_codes(rows, rs.child("pool"))
        return pool, rake_weights(pool, shape, model.targets, SAMPLE_RAKE_ITERATIONS), order
    return model.sample_codes(rows, rs.child("pool")), None, order


def privbayes_generator(model: SynthesisModel, *, omega: int, rs: RandomSource,
                        copy_order: Sequence[int] | None = None, pool_rows: int = GENERATOR_POOL_ROWS,
                        max_parents: int = GENERATOR_MAX_PARENTS,
                        max_configs: int = GENERATOR_MAX_CONFIGS) -> NetworkGenerator:
    """The seed-based generator of a released PrivBayes model (post-processing only).

    The copied columns are the first ``m − ω`` of ``copy_order`` (default
    :func:`copy_first_order`, declared sizes); the ``ω`` others are resampled in the network's
    own topological order, so every column is resampled after its network parents. The
    conditionals are fitted by :func:`fit_network_generator` to ``pool_rows`` records of the
    model (:func:`model_sample`: with the refinement, the raked pool), parents chosen among the
    columns before (up to ``max_parents``, ``max_configs`` configurations), so a resampled
    column may depend on any copied one (income on the copied relationship, say) and on the
    refinement's pairs. ``Pr{y = M(d)}`` is then exact for the fitted tables
    (:class:`SeedResamplingNetwork`).
    """
    shape = tuple(int(s) for s in model.shape)
    m = len(shape)
    if isinstance(omega, bool) or not isinstance(omega, int) or not 1 <= omega <= m:
        raise ValueError(f"omega ({omega!r}) must be an int in [1, {m}]")
    first = tuple(copy_first_order(shape) if copy_order is None else copy_order)
    if sorted(first) != list(range(m)):
        raise ValueError(f"copy_order ({copy_order!r}) must list each of the {m} columns once")
    pool, weights, net_order = model_sample(model, int(pool_rows), rs)
    if weights is not None and not (np.all(np.isfinite(weights)) and weights.sum() > 0):
        weights = None  # a degenerate raking (released tables only) falls back on the network's pool
    copied = list(first[: m - omega])
    order = copied + [c for c in net_order if c not in copied]
    return fit_network_generator(pool, weights, shape=shape, omega=omega, order=order, max_parents=max_parents,
                                 max_configs=max_configs,
                                 source=f"PrivBayes model ({type(model).__name__}), {int(pool_rows)} sampled records")


class _NetworkGeneratorFn(beam.DoFn):
    """Released model → :class:`NetworkGenerator` (post-processing; stream per window)."""

    def __init__(self, *, omega: int, pool_rows: int, max_parents: int, max_configs: int,
                 seed: int | None) -> None:
        self._omega, self._pool_rows, self._seed = omega, pool_rows, seed
        self._max_parents, self._max_configs = max_parents, max_configs

    def process(self, model: SynthesisModel, window=beam.DoFn.WindowParam):
        rs = RandomSource(seed=self._seed).child("plausible.generator", *window_labels(window))
        yield privbayes_generator(model, omega=self._omega, rs=rs, pool_rows=self._pool_rows,
                                  max_parents=self._max_parents, max_configs=self._max_configs)


@element_types(inputs={"structure": EncodedBatch, "params": EncodedBatch}, output=NetworkGenerator)
class DPPrivBayesGenerator(beam.PTransform):
    """ε-DP PrivBayes model of the model splits, turned into the seed-based generator.

    Input: ``{"structure": PCollection[EncodedBatch], "params": PCollection[EncodedBatch]}`` (the
    two model parts of :class:`SplitForPlausible`, disjoint from the seeds); both go to one
    :class:`~beamsynth.transforms.privbayes.DPPrivBayes` (its own accounting: structure by
    permute-and-flip, discrete Laplace family tables, refinement; ``budget.epsilon``-DP, pure,
    add/remove one unit of ≤ ``max_contributions`` records; ``sizing="auto"`` on the public
    ``rows`` or a DP count). Output: one :class:`NetworkGenerator` per window, fitted to the
    released model by :func:`privbayes_generator` (post-processing). The spends are in
    :attr:`plan` (``spend_privbayes``); pass ``accountant`` to record them here.
    """

    def __init__(self, *, schema: Schema, budget: ApproxDP, omega: int, rows: int | None = None,
                 max_contributions: int = 1, pool_rows: int = GENERATOR_POOL_ROWS,
                 max_parents: int = GENERATOR_MAX_PARENTS, max_configs: int = GENERATOR_MAX_CONFIGS,
                 seed: int | None = None, accountant: PrivacyAccountant | None = None, spend_prefix: str = "plausible.model",
                 label: str | None = None) -> None:
        super().__init__(label)
        m = len(schema.shape)
        if isinstance(omega, bool) or not isinstance(omega, int) or not 1 <= omega <= m:
            raise ValueError(f"omega ({omega!r}) must be an int in [1, {m}]")
        for name, value, low in (("pool_rows", pool_rows, 1_000), ("max_parents", max_parents, 0),
                                 ("max_configs", max_configs, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} ({value!r}) must be an int >= {low}")
        self._seed = run_seed(seed)
        self._privbayes = DPPrivBayes(schema=schema, budget=budget, sizing="auto", rows=rows,
                                      max_contributions=max_contributions, seed=self._seed)
        self.plan = self._privbayes.plan
        if accountant is not None:
            spend_privbayes(accountant, self.plan, spend_prefix)
        self._epsilon, self._omega, self._pool_rows = budget.epsilon, omega, pool_rows
        self._max_parents, self._max_configs = max_parents, max_configs

    def display_data(self) -> dict[str, Any]:
        """ε, degree and the generator's sizes (never data values)."""
        return display_items(mechanism="PrivBayes model as the seed-based generator", epsilon=self._epsilon,
                             delta=0.0, degree=self.plan.degree, omega=self._omega,
                             pool_rows=self._pool_rows, max_parents=self._max_parents,
                             max_configs=self._max_configs)

    def expand(self, parts):
        records = (parts["structure"], parts["params"]) | "ModelRecords" >> beam.Flatten()
        # EncodedBatch: D_T ∪ D_P (disjoint from the seeds)
        model = records | "PrivBayes" >> self._privbayes
        # PrivBayesModel | RefinedModel (the DP release)
        return model | "ToGenerator" >> beam.ParDo(_NetworkGeneratorFn(
            omega=self._omega, pool_rows=self._pool_rows, max_parents=self._max_parents,
            max_configs=self._max_configs, seed=self._seed))
        # NetworkGenerator (post-processing)


# =============================================================================================
# Beam: candidates
# =============================================================================================
def seed_shards(codes: np.ndarray, shards: int) -> np.ndarray:
    """Shard of each seed record from its values alone (equal records share a shard)."""
    codes = np.asarray(codes)
    if codes.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    return _shard_of(codes.astype(np.uint64), shards)


class _KeySeedsFn(beam.DoFn):
    """Seed records → ``(shard, codes)`` per shard present in the batch (shard from the values)."""

    def __init__(self, shards: int) -> None:
        self._shards = shards

    def process(self, batch: EncodedBatch):
        sh = seed_shards(batch.codes, self._shards)
        for s in np.unique(sh).tolist():
            yield s, batch.codes[sh == s]


class _GenerateFn(beam.DoFn):
    """Every seed of one value shard → candidates, from the stream ``(shard, window)``.

    The seeds are first put in canonical (sorted) order, so the draws depend on the shard's
    multiset of seeds and the run secret only: two seed batches with equal content (which a
    content-keyed stream made draw alike) are just equal records here, each with its own draws.
    """

    def __init__(self, seed: int | None, max_batch: int) -> None:
        self._seed, self._max_batch = seed, max_batch

    def process(self, kv, model: PlausibleModel, rows: int, n_seeds: int,
                window=beam.DoFn.WindowParam):
        shard, parts = kv
        codes = np.concatenate(list(parts), axis=0)
        codes = codes[np.lexsort(codes.T[::-1])] if codes.shape[0] > 1 else codes
        rs = RandomSource(seed=self._seed).child("plausible.candidates", shard, *window_labels(window))
        lam = float(rows) / max(int(n_seeds), 1)
        reps = poisson_counts(rs.child("poisson"), lam, codes.shape[0])
        idx = np.repeat(np.arange(codes.shape[0]), reps)
        for start in range(0, idx.size, self._max_batch):
            part = idx[start:start + self._max_batch]
            y, logp = model.generate(codes[part], rs.child("generate", start))
            beam.metrics.Metrics.counter(METRICS_NAMESPACE, "plausible_candidates").inc(len(part))
            yield CandidateBatch(y, logp, f"{shard}:{start}")


@element_types(input=EncodedBatch, output=CandidateBatch)
class GenerateCandidates(beam.PTransform):
    """Mechanism 1's generation step, Poissonized and columnar.

    Each seed record yields ``Poisson(rows/|D_S|)`` candidates (:func:`poisson_counts`, from
    ``RandomSource``), so the candidates' seeds are i.i.d. uniform over ``D_S`` and their number is
    ``Poisson(rows)``, independent of the data. Which seeds are used is part of Mechanism 1: the
    privacy of the candidates comes from the test (:func:`candidate_release_cost`), never from
    this step. The invocations must be independent, so the draws are keyed by a stable identity
    that no two seeds share: the seeds are grouped into ``shards`` public shards by their values
    (:func:`seed_shards`) and each shard draws from ``(shard, window)`` over its sorted seeds. Until
    the eighth session each seed *batch* drew from a stream keyed by its content, and two batches
    of equal content drew the same candidates and thresholds
    (``tests/pipeline/test_plausible.py::test_identical_seed_batches_draw_independent_candidates``).
    Input: ``PCollection[EncodedBatch]`` of seeds; side inputs: the model, ``rows`` and ``|D_S|``
    (singletons). Output: ``PCollection[CandidateBatch]`` of at most ``max_batch`` candidates.
    """

    def __init__(self, *, model, rows, n_seeds, seed: int | None = None, max_batch: int = 50_000,
                 shards: int = 32, label: str | None = None) -> None:
        super().__init__(label)
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise ValueError(f"shards ({shards!r}) must be an int >= 1")
        self._model, self._rows, self._n_seeds = model, rows, n_seeds
        self._seed, self._max_batch, self._shards = run_seed(seed), int(max_batch), shards

    def display_data(self) -> dict[str, Any]:
        """Batch size and public shard count only: the candidates' privacy comes from the test."""
        return display_items(mechanism="candidate generation (Mechanism 1, Poissonized)",
                             max_batch=self._max_batch, shards=self._shards)

    def expand(self, seeds):
        return (seeds
                | "KeySeeds" >> beam.ParDo(_KeySeedsFn(self._shards))
                # (shard, codes[r, m]): equal seeds share a shard
                | "GroupSeeds" >> beam.GroupByKey()
                # (shard, [codes, ...]): every seed of the shard and window
                | "Generate" >> beam.ParDo(
                    _GenerateFn(self._seed, self._max_batch), beam.pvalue.AsSingleton(self._model),
                    beam.pvalue.AsSingleton(self._rows), beam.pvalue.AsSingleton(self._n_seeds)))
        # CandidateBatch


# =============================================================================================
# Beam: the privacy test
# =============================================================================================
def _decide(kprime: np.ndarray, *, k: int, epsilon0: float | None, rs: RandomSource):
    passed, _thr = privacy_test(kprime, k=k, epsilon0=epsilon0, rs=rs.child("threshold"))
    reasons = np.where(kprime < k, REJECT_BELOW_K, REJECT_NOISY_THRESHOLD)
    return passed, reasons


def _emit(codes: np.ndarray, kprime: np.ndarray, passed: np.ndarray, reasons: np.ndarray):
    ok = np.flatnonzero(passed)
    bad = np.flatnonzero(~passed)
    beam.metrics.Metrics.counter(METRICS_NAMESPACE, "plausible_tested").inc(int(passed.size))
    beam.metrics.Metrics.counter(METRICS_NAMESPACE, "plausible_released").inc(int(ok.size))
    if ok.size:
        yield EncodedBatch(codes[ok])
    if bad.size:
        rej = RejectedCandidates(codes[bad], kprime[bad], reasons[bad])
        for reason, cnt in rej.reason_counts().items():
            beam.metrics.Metrics.counter(METRICS_NAMESPACE, f"plausible_rejected_{reason}").inc(cnt)
        yield beam.pvalue.TaggedOutput("rejected", rej)


class _GenericTestFn(beam.DoFn):
    """Candidates vs a uniform random sample (size ≤ max_check) of the seed data."""

    def __init__(self, *, k, gamma, epsilon0, max_plausible, seed, chunk=2_000_000):
        self._k, self._gamma, self._eps0, self._maxp = k, gamma, epsilon0, max_plausible
        self._seed, self._chunk = seed, chunk

    def process(self, cands: CandidateBatch, model: PlausibleModel, sample: np.ndarray,
                window=beam.DoFn.WindowParam):
        rs = RandomSource(seed=self._seed).child("plausible.test", cands.batch_id, *window_labels(window))
        step = max(1, self._chunk // max(sample.shape[0], 1))
        kp = np.zeros(len(cands), dtype=np.int64)
        for s in range(0, len(cands), step):
            y = cands.codes[s:s + step]
            mat = model.log_prob(y, sample) if sample.shape[0] else np.full((len(y), 0), -np.inf)
            kp[s:s + step] = count_plausible_generic(cands.logp[s:s + step], mat, self._gamma, self._maxp)
        passed, reasons = _decide(kp, k=self._k, epsilon0=self._eps0, rs=rs)
        yield from _emit(cands.codes, kp, passed, reasons)


class _CheckTagsFn(beam.DoFn):
    """One value shard of seed records → ``(tags, codes)`` of its ``size`` smallest tags.

    Tags are :func:`record_uniforms` under a key of the stream ``("plausible.check-sample",
    window)``: a record's tag depends on its values and occurrence number only, so the sample
    does not depend on the batching and adding a record changes it by at most that record in and
    one out.
    """

    def __init__(self, size: int, seed: int | None) -> None:
        self._size, self._seed = size, seed

    def process(self, kv, window=beam.DoFn.WindowParam):
        codes = _sorted_shard(kv[1])
        key = RandomSource(seed=self._seed).child("plausible.check-sample", *window_labels(window)).secret_key()
        yield _ReservoirFn.smallest(record_uniforms(key, codes), codes, self._size)


class _ReservoirFn(beam.CombineFn):
    """Uniform sample without replacement of ≤ size rows: keep the rows with the smallest tags."""

    def __init__(self, size: int) -> None:
        self._size = size

    @staticmethod
    def smallest(tags: np.ndarray, rows: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``size`` rows with the smallest tags (all of them if fewer)."""
        if tags.size > size:
            keep = np.argpartition(tags, size - 1)[:size]
            return tags[keep], rows[keep]
        return tags, rows

    def create_accumulator(self):
        return (np.zeros(0), None)

    def add_input(self, acc, tagged):
        return self._merge([acc, tagged])

    def _merge(self, accs):
        tags = [a[0] for a in accs if a[1] is not None]
        rows = [a[1] for a in accs if a[1] is not None]
        if not rows:
            return (np.zeros(0), None)
        return self.smallest(np.concatenate(tags), np.concatenate(rows, axis=0), self._size)

    def merge_accumulators(self, accs):
        return self._merge(list(accs))

    def extract_output(self, acc):
        if acc[1] is None:
            return None
        return acc[1][np.argsort(acc[0], kind="stable")]  # by tag: independent of merge order


def check_sample(records, *, size: int, seed: int | RunSecret | None, shards: int = 32, label: str = "CheckSample"):
    """Uniform sample of ≤ ``size`` records (``PCollection[EncodedBatch]``) per window, as one
    ``np.ndarray`` (or ``None`` when there are no records): value shards → smallest tags per
    shard → smallest overall (:class:`_CheckTagsFn`)."""
    tagged = (records
              | f"{label}Key" >> beam.ParDo(_KeySeedsFn(shards))
              # (shard, codes[r, m])
              | f"{label}Group" >> beam.GroupByKey()
              # (shard, [codes, ...])
              | f"{label}Tags" >> beam.ParDo(_CheckTagsFn(size, seed)))
    # (tags[t], codes[t, m]) of the t ≤ size smallest tags of a shard
    return combine_globally(tagged, _ReservoirFn(size), label)


class _KeyCountsFn(beam.DoFn):
    """Seed records → (shard, (copied-value keys, counts)) per shard present in the batch."""

    def __init__(self, shards: int) -> None:
        self._shards = shards

    def process(self, batch: EncodedBatch, model: PlausibleModel):
        keys = group_keys(batch.codes, model.copied_columns(), model.shape)
        uk, cnt = _unique_counts(keys, np.ones(keys.shape[0], dtype=np.int64))
        sh = _shard_of(uk, self._shards)
        for s in np.unique(sh).tolist():
            sel = sh == s
            yield s, (uk[sel], cnt[sel])


class _MergeKeyCountsFn(beam.CombineFn):
    def create_accumulator(self):
        return []

    def add_input(self, acc, kc):
        acc.append(kc)
        if len(acc) > 16:
            acc = [self._merge(acc)]
        return acc

    @staticmethod
    def _merge(parts):
        parts = [p for p in parts if p is not None and p[0].shape[0]]
        if not parts:
            return None
        keys = np.concatenate([p[0] for p in parts], axis=0)
        counts = np.concatenate([p[1] for p in parts])
        return _unique_counts(keys, counts)

    def merge_accumulators(self, accs):
        return [self._merge([p for a in accs for p in a])]

    def extract_output(self, acc):
        return self._merge(acc)


class _KeyCandidatesFn(beam.DoFn):
    """Candidates → (shard, (sub-batch, copied-value keys)) per shard present in the batch."""

    def __init__(self, shards: int) -> None:
        self._shards = shards

    def process(self, cands: CandidateBatch, model: PlausibleModel):
        keys = group_keys(cands.codes, model.copied_columns(), model.shape)
        sh = _shard_of(keys, self._shards)
        for s in np.unique(sh).tolist():
            sel = np.flatnonzero(sh == s)
            yield s, (CandidateBatch(cands.codes[sel], cands.logp[sel], f"{cands.batch_id}:{s}"), keys[sel])


class _FastTestFn(beam.DoFn):
    """Per shard: look candidates' copied values up in the seed counts; no cross product."""

    def __init__(self, *, k, epsilon0, max_plausible, max_check, seed):
        self._k, self._eps0, self._maxp, self._maxc, self._seed = k, epsilon0, max_plausible, max_check, seed

    def process(self, kv, n_seeds: int, window=beam.DoFn.WindowParam):
        shard, grouped = kv
        tables = [t for t in grouped["counts"] if t is not None]
        tk = np.concatenate([t[0] for t in tables], axis=0) if tables else np.zeros((0, 1), np.uint64)
        tc = np.concatenate([t[1] for t in tables]) if tables else np.zeros(0, np.int64)
        for cands, keys in grouped["candidates"]:
            rs = RandomSource(seed=self._seed).child("plausible.test", cands.batch_id, *window_labels(window))
            kp = fast_plausible_counts(lookup_counts(tk, tc, keys), n_seeds=n_seeds, max_check=self._maxc,
                                       max_plausible=self._maxp, rs=rs.child("check"))
            passed, reasons = _decide(kp, k=self._k, epsilon0=self._eps0, rs=rs)
            yield from _emit(cands.codes, kp, passed, reasons)


def fast_plausible_counts(matching: np.ndarray, *, n_seeds: int, max_check: int | None,
                          max_plausible: int | None, rs: RandomSource) -> np.ndarray:
    """``k'`` for the seed-resampling model from the number of seed records matching the copied values.

    Every matching record has the same ``Pr{y = M(d)} = q(y)`` (same interval), every other has 0,
    so ``k'`` = matching count. With ``max_check < |D_S|`` the generic path examines a uniform
    sample of ``max_check`` records: ``k' ~ Hypergeometric(|D_S|, matching, max_check)``, drawn here.
    Capped at ``max_plausible``.
    """
    kp = np.asarray(matching, dtype=np.int64)
    if max_check is not None and max_check < n_seeds and kp.size:
        kp = hypergeometric(rs, kp, np.maximum(n_seeds - kp, 0), max_check)  # exact, secure source
    if max_plausible is not None:
        kp = np.minimum(kp, int(max_plausible))
    return kp


@element_types(input=CandidateBatch, outputs={"released": EncodedBatch,
                                             "rejected": RejectedCandidates})
class PlausibleDeniabilityFilter(beam.PTransform):
    """Privacy Test 1 or 2 over candidate batches; outputs ``released`` and ``rejected``.

    Input: ``PCollection[CandidateBatch]``; constructor takes the seed records
    (``PCollection[EncodedBatch]``, the data ``D`` of the test) and the model (singleton
    ``PCollection[PlausibleModel]``). Output: ``{"released": PCollection[EncodedBatch],
    "rejected": PCollection[RejectedCandidates]}``.

    Test 1 (``epsilon0=None``): pass iff ``k' ≥ k`` — (k, γ)-plausible deniability, no DP.
    Test 2: pass iff ``k' ≥ k + Lap(1/ε0)`` (fresh noise per candidate); releasing one candidate is
    ``(ε0 + ln(1 + γ/t), exp(-ε0·(k-t)))``-DP for any ``1 ≤ t < k`` (Theorem 1, Section 2.3,
    add/remove one seed record; :func:`theorem1_guarantee`). ``max_plausible``/``max_check_plausible``
    stop the count early (speed and pass rate only, not privacy; Section 5).

    ``fast_path=True`` requires a model with :meth:`PlausibleModel.copied_columns`: seed counts per
    copied-value key (``CombinePerKey`` on hashed shards) are joined with candidates by
    ``CoGroupByKey``; otherwise every candidate is compared with one uniform sample of
    ``max_check_plausible`` seed records (generic path, any :class:`PlausibleModel`).
    """

    def __init__(self, *, records, model, k: int, gamma: float, epsilon0: float | None,
                 max_plausible: int | None = None, max_check_plausible: int | None = None,
                 fast_path: bool = True, shards: int = 16, seed: int | None = None,
                 label: str | None = None) -> None:
        super().__init__(label)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k ({k!r}) must be an int >= 1")
        if not (isinstance(gamma, (int, float)) and gamma > 1 and math.isfinite(gamma)):
            raise ValueError(f"gamma ({gamma!r}) must be a finite number > 1")
        if epsilon0 is not None and not (epsilon0 > 0 and math.isfinite(epsilon0)):
            raise ValueError(f"epsilon0 ({epsilon0!r}) must be a finite number > 0 or None (Test 1)")
        if max_plausible is not None and (not isinstance(max_plausible, int) or max_plausible < k):
            raise ValueError(f"max_plausible ({max_plausible!r}) must be an int >= k ({k}) or None")
        if max_check_plausible is not None and (not isinstance(max_check_plausible, int) or max_check_plausible < 1):
            raise ValueError(f"max_check_plausible ({max_check_plausible!r}) must be an int >= 1 or None")
        if not (isinstance(shards, int) and shards >= 1):
            raise ValueError(f"shards ({shards!r}) must be an int >= 1")
        self._records, self._model = records, model
        self._k, self._gamma, self._eps0 = k, float(gamma), epsilon0
        self._maxp, self._maxc = max_plausible, max_check_plausible
        self._fast, self._shards, self._seed = fast_path, shards, run_seed(seed)

    def display_data(self) -> dict[str, Any]:
        """Test parameters (never data values)."""
        return display_items(
            mechanism="plausible-deniability privacy test", k=self._k, gamma=self._gamma,
            test="deterministic (Test 1)" if self._eps0 is None else f"randomized, epsilon0={self._eps0}",
            epsilon0=self._eps0, path="fast" if self._fast else "generic",
            max_plausible=self._maxp, max_check_plausible=self._maxc)

    def expand(self, candidates):
        model = beam.pvalue.AsSingleton(self._model)
        if not self._fast:
            if self._maxc is None:
                raise ValueError("the generic path needs max_check_plausible (the sample size)")
            sample = check_sample(self._records, size=self._maxc, seed=self._seed)
            # np.ndarray (≤ max_check, m) | None
            sample = sample | "SampleOrEmpty" >> beam.Map(lambda s: np.zeros((0, 0), np.int64) if s is None else s)
            out = candidates | "TestGeneric" >> beam.ParDo(
                _GenericTestFn(k=self._k, gamma=self._gamma, epsilon0=self._eps0,
                               max_plausible=self._maxp, seed=self._seed),
                model, beam.pvalue.AsSingleton(sample)).with_outputs("rejected", main="released")
            return {"released": out.released, "rejected": out.rejected}
        n_seeds = combine_globally(self._records, _CountRowsFn(), "CountSeeds")
        # int |D_S|
        counts = (self._records
                  | "KeySeeds" >> beam.ParDo(_KeyCountsFn(self._shards), model)
                  # (shard, (keys[u, w] uint64, counts[u]))
                  | "MergeSeedCounts" >> beam.CombinePerKey(_MergeKeyCountsFn()))
        # (shard, (keys, counts) | None)
        keyed = candidates | "KeyCandidates" >> beam.ParDo(_KeyCandidatesFn(self._shards), model)
        # (shard, (CandidateBatch, keys))
        joined = {"counts": counts, "candidates": keyed} | "JoinByCopiedValues" >> beam.CoGroupByKey()
        # (shard, {"counts": [...], "candidates": [...]})
        out = joined | "TestFast" >> beam.ParDo(
            _FastTestFn(k=self._k, epsilon0=self._eps0, max_plausible=self._maxp, max_check=self._maxc,
                        seed=self._seed), beam.pvalue.AsSingleton(n_seeds)).with_outputs("rejected", main="released")
        return {"released": out.released, "rejected": out.rejected}


# =============================================================================================
# Beam: a release order that carries nothing of the input order
# =============================================================================================
def release_shards(codes: np.ndarray, shape: Sequence[int], shards: int) -> np.ndarray:
    """Shard of each released row from its values alone (rows with equal values share a shard)."""
    codes = np.asarray(codes)
    if codes.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    return _shard_of(group_keys(codes, range(len(shape)), shape), shards)


def release_order(codes: np.ndarray, rs: RandomSource) -> np.ndarray:
    """The rows of ``codes`` in an order that depends on their multiset and ``rs`` alone.

    The rows are sorted (lexicographically, column 0 first), then permuted by the ranks of
    ``rs.uniform(n)`` (a uniformly random permutation, reproduced exactly from the same labels on
    a re-execution). So however the rows arrived — in input order, per seed, per batch or per
    worker — the result is the same, and the order adds nothing to what the multiset says.
    Post-processing of released rows: no budget.
    """
    codes = np.asarray(codes)
    if codes.shape[0] <= 1:
        return codes.copy()
    canonical = codes[np.lexsort(codes.T[::-1])]
    return canonical[np.argsort(rs.uniform(canonical.shape[0]), kind="stable")]


def ordered_release(codes: np.ndarray, *, shape: Sequence[int], shards: int, seed: int | None,
                    labels: Sequence[Any] = ("global",)) -> list[tuple[str, np.ndarray]]:
    """Beam-free reference of :class:`OrderReleased` for one window: ``(label, rows)`` per
    non-empty shard, in label order (the order of the single output file)."""
    from beamsynth.transforms.synthesis import shard_label

    codes = np.asarray(codes)
    sh = release_shards(codes, shape, shards)
    out = []
    for s in np.unique(sh).tolist():
        rs = RandomSource(seed=seed).child("plausible.order", s, *labels)
        out.append((shard_label(s, labels), release_order(codes[sh == s], rs)))
    return sorted(out, key=lambda item: item[0])


class _KeyReleasedFn(beam.DoFn):
    """Released rows → ``(shard, rows)`` per shard present in the batch (shard from the values)."""

    def __init__(self, shape: Sequence[int], shards: int) -> None:
        self._shape, self._shards = tuple(shape), shards

    def process(self, batch: EncodedBatch):
        sh = release_shards(batch.codes, self._shape, self._shards)
        for s in np.unique(sh).tolist():
            yield s, batch.codes[sh == s]


class _OrderShardFn(beam.DoFn):
    """Every released row of one shard → ``(label, EncodedBatch)`` in :func:`release_order`."""

    def __init__(self, seed: int | None) -> None:
        self._seed = seed

    def process(self, kv, window=beam.DoFn.WindowParam):
        from beamsynth.transforms.synthesis import shard_label

        shard, parts = kv
        codes = np.concatenate(list(parts), axis=0)
        labels = window_labels(window)
        rs = RandomSource(seed=self._seed).child("plausible.order", shard, *labels)
        yield shard_label(shard, labels), EncodedBatch(release_order(codes, rs))


@element_types(input=EncodedBatch, output=tuple[str, EncodedBatch])
class OrderReleased(beam.PTransform):
    """Released records in an order that depends on neither the input order nor its partitioning.

    The privacy test emits candidates per seed, contiguously and in the order of the seed batch,
    so a file written in that order would mirror the private input order (with ``ω < m`` the
    copied attributes appear in input order). This step re-partitions the released rows by a hash
    of their **values** into ``shards`` public shards, and orders each shard by
    :func:`release_order` (sorted, then a permutation drawn from ``RandomSource`` labelled with the
    shard and the window). The output is then a function of the released multiset and the run's
    randomness only; its label (:func:`~beamsynth.transforms.synthesis.shard_label`: window,
    shard) orders the parts of a single-file write. Post-processing: no budget.

    Input: ``PCollection[EncodedBatch]`` (released rows). Output:
    ``PCollection[tuple[str, EncodedBatch]]``, one element per non-empty shard and window.
    """

    def __init__(self, *, shape: Sequence[int], shards: int = 16, seed: int | None = None,
                 label: str | None = None) -> None:
        super().__init__(label)
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise ValueError(f"shards ({shards!r}) must be an int >= 1")
        self._shape, self._shards, self._seed = tuple(int(s) for s in shape), shards, run_seed(seed)

    def display_data(self) -> dict[str, Any]:
        """Public shard count (post-processing: no budget; no data values)."""
        return display_items(step="order released rows by value shard, then a secret permutation",
                             shards=self._shards, columns=len(self._shape))

    def expand(self, released):
        return (released
                | "KeyByValues" >> beam.ParDo(_KeyReleasedFn(self._shape, self._shards))
                # (shard, codes[r, m]): rows with equal values share a shard
                | "GroupShards" >> beam.GroupByKey()
                # (shard, [codes, ...]): every released row of the shard and window
                | "Order" >> beam.ParDo(_OrderShardFn(self._seed)))
        # (label, EncodedBatch): sorted, then permuted with the (shard, window) stream
