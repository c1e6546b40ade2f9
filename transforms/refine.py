"""Adaptive refinement of a fitted model with privately selected, coarsened 2-way marginals.

A Bayesian network with ``k`` parents per column covers at most ``k·(d−1)`` of the ``d(d−1)/2``
column pairs; on Adult the pairs it leaves out (age × hours-per-week, age × education, …) carry
most of the remaining 2-way and 3-way error, even at ε = 5. This step adds what the network
misses, in the spirit of AIM (McKenna, Mullins, Sheldon, Miklau, "AIM: An Adaptive and Iterative
Mechanism for Differentially Private Synthetic Data", VLDB 2022, §4: select the marginal the
current model gets most wrong, measure it, refit, repeat) and PrivSyn (Zhang et al., USENIX
Security 2021, §4–5: 2-way marginals chosen by dependence, records adjusted to match them):

1. **Pool** (post-processing): ``min(pool_rows, max(20,000, 8·n̂))`` records sampled from the
   fitted network (``n̂`` its noisy total), all with weight 1. The model is the weighted pool from now on.
2. **Coarsen** (post-processing): every column with more than ``groups`` declared cells is mapped
   to ``groups`` groups using the model's own (noisy) 1-way marginal: ordered domains (integer,
   float, date, datetime) into contiguous groups of about equal model mass, categorical domains
   into the ``groups − 1`` most frequent categories plus one group for the rest. A coarse pair
   table has at most ``groups²`` cells, so its noise per cell buys far more than a full-resolution
   one (Adult's 14 × 14-bin pairs would drown in noise at these budgets). With the A/B switch
   :data:`PAIR_CELLS` (off by default; issue 18, eleventh session) the ``groups²`` cells belong
   to the table, not to each column (:func:`pair_group_counts`): in a pair with a column of
   fewer than ``groups`` declared cells that column is kept whole and the other gets
   ``⌊C/cells⌋`` groups (Adult: sex × age 2 × 12 instead of 2 × 5), where ``C = min(groups², ⌊n̂/(θ·b)⌋)`` keeps the table
   θ-useful (θ = :data:`PAIR_CELLS_THETA` = 4, PrivBayes §4.4; ``b`` the tables' noise scale,
   ``n̂`` the network's noisy total: PUMS 1k at ε = 2 keeps 2 × 5). A function of declared
   sizes and released values; same number of tables, same sensitivity and noise per table.
3. **Rounds** (``rounds`` of them, ``pairs`` tables in all):

   a. *Select* (private): each not-yet-measured pair ``(a, b)`` is scored
      ``‖T_ab − M_ab‖₁ − cells_ab·b_t``, where ``T_ab`` is the exact coarse count table,
      ``M_ab`` the current model's estimate of it in counts (scaled to the network's noisy total:
      fixed by earlier releases) and ``b_t`` the data-independent noise scale of a refinement
      table. One pick is **permute-and-flip**
      (:func:`~beamsynth.transforms.noise.permute_and_flip`) with ``ε_sel/pairs``. **Sensitivity**
      (add/remove one privacy unit of ≤ m records): ``T_ab`` changes by at most ``m`` in L1 and
      ``M_ab`` not at all, so ``Δ = m``.
      *A declared target's pairs first* (issue 18, sixteenth session, H85): with a declared
      target ``T`` and ``RefinePlan.target_picks = r > 0`` (``--pb-refine-target-picks``), the
      first ``r`` picks are permute-and-flip over the not-yet-measured pairs that contain ``T``
      only (all pairs again once none is left); later picks as above. The candidate set of a
      pick is then a function of the declared target, the schema and the earlier (released)
      picks, never of the data; the score, its sensitivity ``Δ = m``, ``ε_sel/pairs`` per pick,
      the number of picks and the tables' noise are unchanged, so the spends are the same to
      the last digit (a restricted exponential-type mechanism over a public candidate set is
      ε-DP with the same Δ: McKenna & Sheldon 2020, §3). Why: a minority label's pairs have
      small count errors whatever the model gets wrong about it, so the error-ranked picks
      skip them (census_kdd: 0 of 37 income pairs; docs/privbayes.md "Sixteenth session: the
      declared target's pairs first (issue 18, H85)", which describes this refinement; it is
      ours, not the PrivBayes paper's).
      *A floor of target pairs* (``refine_target_picks="auto"``, seventeenth session, H88):
      ``RefinePlan.target_floor = f`` (``min(TARGET_FLOOR, pairs)``) makes a pick
      target-only when the picks left are just enough to bring the measured target pairs up to
      ``f``; picks that the score gives the target anyway count, so where they reach ``f``
      before the last picks the release equals ``r = 0``'s (COMPAS, Adult: most seeds). Opt-in,
      not the default: where it fires the label's AUC gains (census_kdd ε ≤ 1 +0.09 to +0.16,
      ACS with target DPHY +0.12 to +0.18), but the displaced pairs cost TVD2 beyond noise
      where ``P`` is small (ACS ε = 0.5 / 1: +0.0035 / +0.0016; eighteenth session, H95).
      Whether a pick is
      restricted is a function of the declared target, the declared picks and the earlier
      released picks only, so the privacy argument above holds unchanged (docs/privbayes.md
      "Seventeenth session: a rule for the target's picks (issue 18, H88)" and "Eighteenth
      session: ``refine_target_picks="auto"`` as the default?").
   b. *Measure* (private): the picked coarse tables with discrete Laplace noise of scale
      ``m·pairs/ε_meas`` on every cell (L1 sensitivity ``m`` each, ε split equally).
   c. *Fit* (post-processing): each noisy table ``N`` is shrunk toward the model's estimate
      ``B`` by the James–Stein factor ``λ = max(0, 1 − cells·Var(noise)/‖N − B‖²)`` (an
      empirical-Bayes weight from released quantities only), made non-negative with the total
      kept (:func:`~beamsynth.transforms.privbayes.norm_sub`), and given the model's own 1-way
      margins by iterative proportional fitting, so it moves the dependence only. The pool's
      weights are then raked (IPF, ``rake_iterations`` sweeps) to every target so far and to the
      network's 1-way margins: the minimum-KL adjustment of the network's distribution that
      matches them (Deming–Stephan). Each raking ends with one more sweep of the 1-way margins
      (:data:`RAKE_END_ON_MARGINS`, read into the plan when it is made:
      ``RefinePlan.rake_end_on_margins``), so the last word is the network's 1-way estimate, not a
      noisy coarse pair (issue 18, H44).

Privacy: ``ε_sel + ε_meas`` by sequential (adaptive) composition, pure DP (δ = 0), add/remove
neighbours; the selection scores and the measurements read only exact coarse tables derived from
the same one-pass marginal counts, everything else reads released tables. Sampling
(:class:`RefinedModel`) draws a fresh pool per shard from the network, rakes it to the released
targets and takes a systematic sample of the weighted pool: post-processing only.

The network's own released tables are raked too (``base_targets``, before the coarse pairs), so
folding in a pair does not undo what the network measured.

Measured on Adult, ε = 1 (``docs/privbayes.md``): Beam-free harness, PrivBayes k = 2 alone
TVD2/TVD3 0.0436/0.0876 (10 seeds); k = 1 plus 15 coarse pairs in 3 rounds 0.0392–0.0399 /
0.0787–0.0802 (blocks of 10–24 seeds); the ``synthesize`` pipeline over seeds 0–9 0.0395/0.0795,
and 0.0389/0.0784 with the pair-balanced sampling of :class:`RefinedModel`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from beamsynth.transforms.balance import balance_pairs
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant, PureDP, zcdp_approx
from beamsynth.transforms.consistency import norm_sub
from beamsynth.transforms.measure import NoisyMarginal
from beamsynth.transforms.noise import (
    RandomSource,
    discrete_gaussian,
    discrete_laplace,
    discrete_laplace_scale,
    permute_and_flip,
    sample_categorical,
)
from beamsynth.transforms.synthesis import SynthesisModel

__all__ = [
    "DEFAULT_REFINE_FRACTION",
    "DEFAULT_REFINE_GROUPS",
    "DEFAULT_REFINE_PAIRS",
    "DEFAULT_REFINE_ROUNDS",
    "DEFAULT_REFINE_TARGET_PICKS",
    "PAIR_CELLS",
    "PAIR_CELLS_THETA",
    "POOL_FACTOR",
    "REFINE_MIN_PAIRS",
    "REFINE_MIN_TABLE_EPSILON",
    "SELECTION_SHARE",
    "TARGET_FLOOR",
    "POOL_MIN_ROWS",
    "POOL_ROWS",
    "RAKE_END_ON_MARGINS",
    "RAKE_ITERATIONS",
    "SAMPLE_RAKE_ITERATIONS",
    "RefineMeasurement",
    "RefinePlan",
    "RefinedModel",
    "RakeTarget",
    "coarse_groups",
    "coarse_table",
    "pair_group_counts",
    "measure_refinement",
    "plan_refinement",
    "rake_weights",
    "smoothed_proportions",
    "spend_refinement",
    "systematic_indices",
    "systematic_resample",
    "target_from_noisy",
    "target_pick_fields",
]

DEFAULT_REFINE_PAIRS = 15
DEFAULT_REFINE_ROUNDS = 3
DEFAULT_REFINE_GROUPS = 5
# with a declared target, the refinement's first picks drawn among its pairs only (H85)
DEFAULT_REFINE_TARGET_PICKS: int | str = 0
# refine_target_picks="auto" (H88): at least min(TARGET_FLOOR, pairs) of the picks are the
# declared target's pairs, the last ones restricted only where the score gave it fewer
TARGET_FLOOR = 5
DEFAULT_REFINE_FRACTION = 0.25  # of the method's ε: 1/5 of it selects, 4/5 measures
SELECTION_SHARE = 0.2
REFINE_MIN_TABLE_EPSILON = 0.01  # plan_privbayes measures no more tables than get this ε each ...
REFINE_MIN_PAIRS = 3  # ... and drops the refinement when that allows fewer than this many
POOL_ROWS = 200_000  # records in the measurement step's pool (fixed: memory flat in n)
POOL_FACTOR = 8  # a sampling shard of n rows rakes a pool of max(8n, POOL_MIN_ROWS) records
POOL_MIN_ROWS = 20_000
RAKE_ITERATIONS = 10
SAMPLE_RAKE_ITERATIONS = 5  # sweeps when a sampling shard rakes its pool (as good as 10 on Adult)
# A/B switch: the raking ends with a sweep of the 1-way margins (H44). Read when a plan is made
# (plan_refinement, the zCDP plan: RefinePlan.rake_end_on_margins) and carried to the workers and
# into the fitted RefinedModel (sixteenth session, H78), never read in a measuring or sampling step
RAKE_END_ON_MARGINS = True
# A/B switch (off: the default layout, groups per column): a small column leaves its share of the
# groups² cells to the other (pair_group_counts) while n̂ ≥ θ·cells·b. Eleventh session: TVD2/3
# better on Adult/ACS, GBM AUC lower on Adult (docs/privbayes.md), so not the default
PAIR_CELLS = False
PAIR_CELLS_THETA = 4.0


@dataclass(frozen=True)
class RefinePlan:
    """Data-independent parameters of the refinement (fixed when the pipeline is built)."""

    pairs: int
    rounds: int
    groups: int
    selection_budget: PureDP
    measure_budget: PureDP
    max_contributions: int
    pool_rows: int = POOL_ROWS
    rake_iterations: int = RAKE_ITERATIONS
    # zCDP mode (PrivBayes noise="gaussian"): every table gets discrete Gaussian noise of this σ
    # (m²/(2σ²)-zCDP each); measure_budget is then the Laplace-equivalent ε (same noise std), used
    # only for the data-independent selection penalty
    sigma: float | None = None
    delta: float = 0.0  # the method's δ (reports each Gaussian table's own (ε, δ))
    # the A/B switch PAIR_CELLS as read when the plan was made (plan_refinement / the zCDP plan),
    # so a worker in a fresh process measures the cells the launcher planned (fifteenth session)
    pair_cells: bool = False
    # the A/B switch RAKE_END_ON_MARGINS as read when the plan was made: every raking of the
    # measuring step and of the fitted model's sampling (sixteenth session, H78)
    rake_end_on_margins: bool = True
    # a declared target (column index) and how many of the first picks are drawn among its pairs
    # only (H85; 0: none). Fixed when the plan is made, from the declared target and the option
    target: int | None = None
    target_picks: int = 0
    # refine_target_picks="auto" (H88): at least this many picks are the target's pairs, the
    # last picks restricted only as far as needed (0: none). Fixed when the plan is made
    target_floor: int = 0

    @property
    def pick_epsilon(self) -> float:
        """Permute-and-flip budget of each pick."""
        return self.selection_budget.epsilon / self.pairs

    @property
    def table_epsilon(self) -> float:
        """Discrete Laplace budget of each measured table."""
        return self.measure_budget.epsilon / self.pairs

    @property
    def table_scale(self) -> float:
        """Discrete Laplace scale of every refinement table (Gaussian mode: the Laplace scale
        with the same noise std, σ/√2, for the selection penalty)."""
        if self.sigma is not None:
            return self.sigma / math.sqrt(2.0)
        return discrete_laplace_scale(sensitivity=self.max_contributions, epsilon=self.table_epsilon)

    @property
    def table_budget(self) -> ApproxDP:
        """What one table costs on its own: ``PureDP(table_epsilon)``; Gaussian mode: the
        (ε, δ) of its ρ at the method's δ (Bun & Steinke 2016, ``ε = ρ + 2√(ρ ln 1/δ)``)."""
        if self.sigma is None:
            return PureDP(epsilon=self.table_epsilon)
        return zcdp_approx(self.table_rho, self.delta)

    @property
    def table_rho(self) -> float:
        """ρ of one Gaussian table: L2 sensitivity m (≤ L1), ``m²/(2σ²)``-zCDP (0 without σ)."""
        return 0.0 if self.sigma is None else self.max_contributions ** 2 / (2 * self.sigma ** 2)

    def target_only(self, pick: int, measured: int, picks: int, available: int) -> bool:
        """Whether pick ``pick`` (0-based, of ``picks``) is drawn among the declared target's
        pairs only: one of the first ``target_picks`` (H85), or, under ``target_floor`` (H88),
        when the ``picks − pick`` picks left are just enough to bring the ``measured`` target
        pairs (released picks) up to the floor, at most the ``available`` candidate pairs with
        the target. Public values only: declared, planned and released."""
        if self.target is None:
            return False
        floor = min(self.target_floor, available)
        return pick < self.target_picks or (measured < floor and picks - pick <= floor - measured)

    def target_fields(self, pairs: int) -> dict[str, Any]:
        """This plan's target fields for a plan of ``pairs`` picks (a resized or zCDP plan)."""
        return target_pick_fields(self.target, "auto" if self.target_floor else self.target_picks,
                                  pairs)

    def per_round(self) -> list[int]:
        """Picks in each round (as even as possible, earlier rounds first)."""
        q, r = divmod(self.pairs, self.rounds)
        return [q + (1 if i < r else 0) for i in range(self.rounds)]

    def details(self) -> dict[str, Any]:
        """Manifest details."""
        return {"pairs": self.pairs, "rounds": self.rounds, "groups": self.groups,
                "selection_epsilon": self.selection_budget.epsilon,
                "epsilon_per_pick": self.pick_epsilon,
                "measure_epsilon": self.measure_budget.epsilon,
                "epsilon_per_table": self.table_epsilon, "table_scale": self.table_scale,
                "pool_rows": self.pool_rows, "rake_iterations": self.rake_iterations,
                **({} if not self.target_picks else {"target_picks": self.target_picks}),
                **({} if not self.target_floor else {"target_floor": self.target_floor}),
                **({} if self.sigma is None else {"noise": "discrete Gaussian", "sigma": self.sigma,
                                                  "rho_per_table": self.table_rho})}


def plan_refinement(budget: PureDP, *, pairs: int = DEFAULT_REFINE_PAIRS,
                    rounds: int = DEFAULT_REFINE_ROUNDS, groups: int = DEFAULT_REFINE_GROUPS,
                    max_contributions: int = 1, pool_rows: int = POOL_ROWS,
                    rake_iterations: int = RAKE_ITERATIONS, target: int | None = None,
                    target_picks: int | str = 0) -> RefinePlan:
    """Validate and split ``budget`` (the refinement's whole ε): 1/5 selection, 4/5 measurement.
    ``target`` (a declared column index) and ``target_picks``: the first ``target_picks`` picks
    are drawn among the target's pairs only, or ``"auto"``: at least ``min(TARGET_FLOOR,
    pairs)`` picks are (module docstring; ignored without a target)."""
    if not isinstance(budget, PureDP):
        raise TypeError(f"budget must be a PureDP, got {type(budget).__name__}")
    for name, value, low in (("pairs", pairs, 1), ("rounds", rounds, 1), ("groups", groups, 2),
                             ("max_contributions", max_contributions, 1),
                             ("pool_rows", pool_rows, 1_000), ("rake_iterations", rake_iterations, 1),
                             ("target_picks", 0 if target_picks == "auto" else target_picks, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} ({value!r}) must be an int >= {low}")
    if rounds > pairs:
        raise ValueError(f"rounds ({rounds}) must be at most pairs ({pairs})")
    if groups > 64:
        raise ValueError(f"groups ({groups}) must be at most 64")
    if target is not None and (isinstance(target, bool) or not isinstance(target, int) or target < 0):
        raise ValueError(f"target ({target!r}) must be None or a column index >= 0")
    sel = budget.epsilon * SELECTION_SHARE
    return RefinePlan(pairs=pairs, rounds=rounds, groups=groups,
                      selection_budget=PureDP(epsilon=sel),
                      measure_budget=PureDP(epsilon=budget.epsilon - sel),
                      max_contributions=max_contributions, pool_rows=pool_rows,
                      rake_iterations=rake_iterations, pair_cells=PAIR_CELLS,
                      rake_end_on_margins=RAKE_END_ON_MARGINS,
                      **target_pick_fields(target, target_picks, pairs))


def target_pick_fields(target: int | None, target_picks: int | str, pairs: int) -> dict[str, Any]:
    """``RefinePlan`` fields for a declared target's first picks (H85): none without a target or
    picks (the plan then equals one made before the option existed), else the target and
    ``min(target_picks, pairs)``; ``"auto"`` (H88): the target and the floor ``min(TARGET_FLOOR,
    pairs)``. Declared values only."""
    if target is None or target_picks == 0:
        return {}
    if target_picks == "auto":
        return {"target": int(target), "target_floor": min(TARGET_FLOOR, int(pairs))}
    return {"target": int(target), "target_picks": min(int(target_picks), int(pairs))}


def spend_refinement(accountant: PrivacyAccountant, plan: RefinePlan, prefix: str,
                     largest: RefinePlan | None = None, note: str | None = None) -> None:
    """Record the two spends (selection, measurement) on ``accountant`` (raises if overspent).

    ``largest``: the plan with the most pairs the run may choose instead of ``plan`` (same
    ε_sel/ε_meas split over more picks/tables, chosen from a DP count at run time); the details
    then give picks/tables, rounds, ε per pick/table and the scale as ``[min, max]`` over the
    pair counts the run can choose, and ``note`` (added as ``"pairs_note"``) says so."""
    m = plan.max_contributions

    def span(value: Any) -> Any:  # [min, max] over plan .. largest (plan's value without one)
        low, high = value(plan), value(plan if largest is None else largest)
        return low if low == high else sorted([low, high])

    extra = {} if note is None else {"pairs_note": note}
    if plan.target_picks:  # H85: the first picks' candidates, a declared set (same Δ, ε per pick)
        extra["target_picks"] = plan.target_picks
    if plan.target_floor:  # H88: the last picks' candidates where the floor needs them
        extra["target_floor"] = plan.target_floor
    accountant.spend(
        f"{prefix}.selection", plan.selection_budget,
        mechanism="permute-and-flip on ‖T − M‖₁ − cells·b of coarse 2-way tables",
        details={"picks": span(lambda r: r.pairs), "rounds": span(lambda r: r.rounds),
                 "epsilon_per_pick": span(lambda r: r.pick_epsilon),
                 "sensitivity": float(m), "neighbours": "add/remove one privacy unit",
                 "paper": "AIM §4 (McKenna et al. 2022), permute-and-flip (McKenna & Sheldon 2020)",
                 **extra})
    accountant.spend(
        f"{prefix}.marginals", plan.measure_budget,
        mechanism="discrete Laplace on the selected coarse 2-way marginals",
        details={"tables": span(lambda r: r.pairs), "epsilon_per_table": span(lambda r: r.table_epsilon),
                 "scale": span(lambda r: r.table_scale), "sensitivity_per_table": float(m),
                 "groups_per_column": plan.groups,
                 "paper": "PrivSyn §4 (Zhang et al. 2021), AIM §4", **extra})


# -- post-processing helpers -----------------------------------------------------------------------
def coarse_groups(mass: np.ndarray, groups: int, *, ordered: bool) -> np.ndarray:
    """Group index of every cell of one column (post-processing of a released 1-way marginal).

    At most ``groups`` groups, numbered ``0..g−1`` with every number used. Ordered domains: cells
    in declared order cut into contiguous runs of about equal ``mass`` (a cell goes to the group
    its mid-point mass falls in). Unordered: the ``groups − 1`` heaviest cells alone, the rest
    together (ties broken by declared order). A column of ``groups`` cells or fewer is unchanged.
    """
    p = np.clip(np.asarray(mass, dtype=np.float64).ravel(), 0.0, None)
    k = p.size
    if k <= groups:
        return np.arange(k, dtype=np.int64)
    p = p / p.sum() if p.sum() > 0 else np.full(k, 1.0 / k)
    if ordered:
        mid = np.cumsum(p) - p / 2
        g = np.minimum((mid * groups).astype(np.int64), groups - 1)
    else:
        order = np.argsort(-p, kind="stable")
        g = np.full(k, groups - 1, dtype=np.int64)
        g[order[: groups - 1]] = np.arange(groups - 1)
    # renumber the groups actually used 0..g-1 (a heavy cell can swallow a whole quantile run)
    _, g = np.unique(g, return_inverse=True)
    return g.astype(np.int64)


def pair_group_counts(size_a: int, size_b: int, groups: int,
                      max_cells: int | None = None) -> tuple[int, int]:
    """Groups per column of one coarse pair table: ``groups`` each, except that a column
    declaring fewer than ``groups`` cells is kept whole and the other column gets
    ``max(groups, ⌊max_cells/cells⌋)`` groups (``max_cells``, default ``groups²``: Adult, 5
    groups, sex × age is 2 × 12, not 2 × 5). ``measure_refinement`` passes the θ-useful cap
    :data:`PAIR_CELLS_THETA`. From public values only; :func:`coarse_groups` then caps each
    count at the column's own cells."""
    cap = groups * groups if max_cells is None else min(groups * groups, int(max_cells))
    if size_a < groups <= size_b:
        return size_a, max(groups, cap // size_a)
    if size_b < groups <= size_a:
        return max(groups, cap // size_b), size_b
    return groups, groups


def coarse_table(table: np.ndarray, ga: np.ndarray, gb: np.ndarray) -> np.ndarray:
    """Sum a ``[a, b]`` table into ``[group(a), group(b)]``."""
    t = np.asarray(table, dtype=np.float64)
    na, nb = int(ga.max()) + 1, int(gb.max()) + 1
    keys = (ga[:, None] * nb + gb[None, :]).ravel()
    return np.bincount(keys, weights=t.ravel(), minlength=na * nb).reshape(na, nb)


def _ipf_margins(table: np.ndarray, rows: np.ndarray, cols: np.ndarray, *, tol: float = 1e-9,
                 max_sweeps: int = 5_000) -> np.ndarray:
    """``table`` given row sums ``rows`` and column sums ``cols`` (equal totals) by IPF. Cells
    that are zero in ``table`` start at 10⁻³ of the independence table ``rows·cols/total``, so a
    margin that Norm-Sub emptied can still be met; sweeps stop when every margin is within
    ``tol``·total."""
    rows = np.asarray(rows, dtype=np.float64)
    cols = np.asarray(cols, dtype=np.float64)
    total = float(rows.sum())
    if total <= 0:
        return np.zeros((rows.size, cols.size))
    seed = np.outer(rows, cols) / total
    t = np.asarray(table, dtype=np.float64)
    t = np.where(t > 0, t, 1e-3 * seed)
    for _ in range(max_sweeps):
        t *= (rows / np.maximum(t.sum(axis=1), 1e-300))[:, None]
        t *= (cols / np.maximum(t.sum(axis=0), 1e-300))[None, :]
        if np.abs(t.sum(axis=1) - rows).max() <= tol * total:
            break
    return t


def target_from_noisy(noisy: np.ndarray, estimate: np.ndarray, variance: float, total: float) -> np.ndarray:
    """A refinement target from a released table (post-processing): James–Stein shrinkage of
    ``noisy`` toward the model ``estimate`` (both in counts), Norm-Sub to ``total``, then the
    estimate's row and column sums by IPF. Returned as proportions."""
    n = np.asarray(noisy, dtype=np.float64)
    b = np.asarray(estimate, dtype=np.float64)
    dist = float(((n - b) ** 2).sum())
    lam = max(0.0, 1.0 - n.size * variance / dist) if dist > 0 else 0.0
    t = norm_sub(b + lam * (n - b), max(total, 1.0))
    if t.sum() <= 0:
        t = b.copy()
    t = _ipf_margins(t, b.sum(axis=1), b.sum(axis=0))
    s = t.sum()
    return t / s if s > 0 else np.full(t.shape, 1.0 / t.size)


@dataclass(frozen=True)
class RakeTarget:
    """A released table folded into the model: columns, per-column groupings (cell → group; the
    identity for a full-resolution table) and the target proportions over the groups
    (post-processing of the noisy table)."""

    columns: tuple[int, ...]
    groups: tuple[np.ndarray, ...]
    proportions: np.ndarray

    def keys(self, codes: np.ndarray) -> np.ndarray:
        """Flat (coarse) cell of every row."""
        key = np.zeros(codes.shape[0], dtype=np.int64)
        for c, g, size in zip(self.columns, self.groups, self.proportions.shape):
            key = key * int(size) + g[codes[:, c]]
        # the pool's keys are held for every target while raking: 4 bytes a row when they fit
        return key.astype(np.int32) if self.proportions.size < 2**31 else key


def rake_weights(codes: np.ndarray, shape: Sequence[int], targets: Sequence[RakeTarget],
                 iterations: int = RAKE_ITERATIONS, weights: np.ndarray | None = None, *,
                 end_on_margins: bool = True) -> np.ndarray:
    """IPF weights for the rows of ``codes`` matching every target's proportions while keeping
    the rows' own 1-way margins (post-processing). Cells no row reaches are left alone.

    Each of the ``iterations`` sweeps rakes the 1-way margins, then every target in order; with
    ``end_on_margins`` (default; the plan's ``rake_end_on_margins``, read from
    :data:`RAKE_END_ON_MARGINS` when it was made) a last sweep of the 1-way margins follows, so the
    weights end on the rows' own 1-way margins (the network's, for a pool drawn from it) rather
    than on the last target. Privacy: unchanged — the rows and the targets are released values
    (a pool sampled from the released network, post-processed noisy tables), and the order of
    the IPF sweeps reads nothing else (post-processing, Dwork & Roth 2014, Prop. 2.1)."""
    n = codes.shape[0]
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64).copy()
    if n == 0 or not targets:
        return w
    ones = []  # (column codes, the rows' own 1-way proportions), computed once
    for j in range(codes.shape[1]):
        column = np.ascontiguousarray(codes[:, j])  # read 2·iterations times: one contiguous copy
        counts = np.bincount(column, minlength=int(shape[j])).astype(np.float64)
        ones.append((column, counts / counts.sum()))
    keyed = [(t.keys(codes), t.proportions.ravel()) for t in targets]

    def update(w: np.ndarray, w_sum: float, idx: np.ndarray, prop: np.ndarray) -> tuple[np.ndarray, float]:
        # w_sum is w.sum(), carried from the step that made w (the same value, summed once)
        cur = np.bincount(idx, weights=w, minlength=prop.size)
        factor = prop * w_sum
        factor /= np.maximum(cur, 1e-300)
        factor[~(cur > 0)] = 1.0  # cells no row reaches keep their rows' weights
        new = factor.take(idx)
        new *= w  # w · factor[idx], in place: the same products, two arrays fewer a step
        total = new.sum()
        # a target that would zero every row (its support misses all of them) is skipped
        return (new, total) if total > 0 and np.isfinite(total) else (w, w_sum)

    w_sum = w.sum()
    for _ in range(iterations):
        for idx, prop in ones + keyed:
            w, w_sum = update(w, w_sum, idx, prop)
    if end_on_margins:  # a last sweep: the weights end on the rows' own 1-way margins
        for idx, prop in ones:
            w, w_sum = update(w, w_sum, idx, prop)
    return w


def smoothed_proportions(table: np.ndarray, floor: float = 1e-3) -> np.ndarray:
    """``table`` as proportions with its empty cells given ``floor`` × the independence table of
    its own 1-way margins (post-processing), so raking to it never zeroes every pool row that a
    noisy zero happens to cover. A table without mass is uniform."""
    t = np.clip(np.asarray(table, dtype=np.float64), 0.0, None)
    total = t.sum()
    if total <= 0:
        return np.full(t.shape, 1.0 / t.size)
    seed = np.ones(())
    for axis in range(t.ndim):
        others = tuple(a for a in range(t.ndim) if a != axis)
        seed = np.multiply.outer(seed, t.sum(axis=others) / total) if seed.ndim else t.sum(axis=others) / total
    t = np.where(t > 0, t / total, floor * seed)
    return t / t.sum()


def systematic_indices(codes: np.ndarray, weights: np.ndarray, n: int, rs: RandomSource,
                       shape: Sequence[int]) -> np.ndarray:
    """Indices of ``n`` rows drawn from the weighted ``codes`` by systematic sampling over the
    rows sorted lexicographically (columns with more cells first): every row is drawn with
    probability ∝ its weight, and the sample's marginals of the leading sort columns stay within
    a row of the weighted pool's (post-processing). In sort order, not shuffled."""
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    by_size = sorted(range(codes.shape[1]), key=lambda j: -int(shape[j]))
    order = np.lexsort(tuple(codes[:, j] for j in reversed(by_size)))
    cum = np.cumsum(np.asarray(weights, dtype=np.float64)[order])
    if cum[-1] <= 0:
        raise ValueError("weights must have a positive total")
    u = (np.arange(n) + rs.child("offset").uniform(1)[0]) / n * cum[-1]
    return order[np.minimum(np.searchsorted(cum, u, side="right"), order.size - 1)]


def systematic_resample(codes: np.ndarray, weights: np.ndarray, n: int, rs: RandomSource,
                        shape: Sequence[int]) -> np.ndarray:
    """``n`` rows drawn by :func:`systematic_indices`, then shuffled (post-processing)."""
    if n == 0:
        return np.zeros((0, codes.shape[1]), dtype=np.int64)
    picked = codes[systematic_indices(codes, weights, n, rs, shape)]
    return picked[np.argsort(rs.child("shuffle").uniform(n), kind="stable")]


# -- measurement ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RefineMeasurement:
    """What the refinement releases (``tables``: the noisy coarse pairs, in pick order, with the
    groupings they were measured on) and its post-processing (``targets``)."""

    tables: tuple[NoisyMarginal, ...]
    targets: tuple[RakeTarget, ...]
    details: dict[str, Any] = field(default_factory=dict)


def measure_refinement(
    pair_counts: Callable[[int, int], np.ndarray],
    model: SynthesisModel,
    *,
    total: float,
    ordered: Sequence[bool],
    names: Sequence[str],
    plan: RefinePlan,
    rs: RandomSource,
    candidates: Sequence[tuple[int, int]] | None = None,
    base_targets: Sequence[RakeTarget] = (),
) -> RefineMeasurement:
    """Select, measure and fold in ``plan.pairs`` coarse pairs (module docstring).

    ``pair_counts(a, b)`` returns the exact full-resolution ``[a, b]`` count table (the only
    access to the private data); ``model`` is the fitted network (released), ``total`` its noisy
    record count, ``ordered`` the declared order of each column's domain. ``candidates``: the
    pairs whose exact counts exist (default: all). ``base_targets``: the network's own released
    tables as targets (post-processing), raked before the refinement's in every round so that
    folding in a coarse pair does not undo what the network measured.
    """
    shape = [int(s) for s in model.shape]
    d = len(shape)
    cands = list(candidates) if candidates is not None else [
        (a, b) for a in range(d) for b in range(a + 1, d)]
    if d < 2 or not cands:
        return RefineMeasurement((), (), {"pairs": 0})
    # pool: 8 records per (noisy) record, between POOL_MIN_ROWS and plan.pool_rows
    pool_rows = int(min(plan.pool_rows, max(POOL_MIN_ROWS, 8 * total)))
    pool = model.sample_codes(pool_rows, rs.child("pool"))
    # post-processing: groupings from the network's own (noisy) 1-way marginals
    masses = [np.bincount(pool[:, j], minlength=shape[j]) for j in range(d)]
    # cells a table may spread over while it stays θ-useful: n̂ ≥ θ·cells·b (public values)
    max_cells = int(total / (PAIR_CELLS_THETA * plan.table_scale))
    # (column, groups) → (group of every cell, the pool's coarse codes): each column is coded once
    # per group count (the pool has up to plan.pool_rows rows; a pair's keys are built when scored)
    cached: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}

    def column_groups(j: int, g: int) -> tuple[np.ndarray, np.ndarray]:
        if (j, g) not in cached:
            cells = coarse_groups(masses[j], g, ordered=bool(ordered[j]))
            cached[(j, g)] = cells, cells[pool[:, j]].astype(np.int32)
        return cached[(j, g)]

    def pair_groups(a: int, b: int) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
        ga, gb = (pair_group_counts(shape[a], shape[b], plan.groups, max_cells)
                  if plan.pair_cells else (plan.groups, plan.groups))
        return column_groups(a, ga), column_groups(b, gb)

    weights = np.ones(pool.shape[0])
    groupings = {p: pair_groups(*p) for p in cands}
    scale = plan.table_scale
    exact: dict[tuple[int, int], np.ndarray] = {}
    released: list[NoisyMarginal] = []
    targets: list[RakeTarget] = []
    left = list(cands)
    # measured: the target's pairs picked so far, of the available candidates with the target
    pick, measured, picks = 0, 0, min(plan.pairs, len(cands))
    available = sum(plan.target in p for p in cands)
    for r, count in enumerate(plan.per_round()):
        factor = total / weights.sum()
        estimates = {}
        scores = []
        for a, b in left:
            (ga, ca), (gb, cb) = groupings[(a, b)]
            if (a, b) not in exact:
                exact[(a, b)] = coarse_table(pair_counts(a, b), ga, gb)
            t = exact[(a, b)]
            key = ca * t.shape[1] + cb
            est = np.bincount(key, weights=weights, minlength=t.size).reshape(t.shape) * factor
            estimates[(a, b)] = est
            scores.append(float(np.abs(t - est).sum()) - t.size * scale)
        for _ in range(min(count, len(left))):
            # H85/H88: a pick among the declared target's pairs only (a candidate set fixed by
            # the target and the earlier released picks; same Δ and ε): RefinePlan.target_only
            among = ([j for j, p in enumerate(left) if plan.target in p]
                     if plan.target_only(pick, measured, picks, available) else [])
            among = among or list(range(len(left)))  # no target pair left: every pair
            i = among[permute_and_flip(rs.child("select", pick),
                                       np.asarray([scores[j] for j in among]),
                                       epsilon=plan.pick_epsilon,
                                       sensitivity=float(plan.max_contributions))]
            a, b = left.pop(i)
            scores.pop(i)
            measured += plan.target in (a, b)
            t = exact[(a, b)]
            (ga, _), (gb, _) = groupings[(a, b)]
            meta = {"coarse": True, "groups": [ga.tolist(), gb.tolist()], "round": r}
            if plan.sigma is None:
                noisy = t.astype(np.int64) + discrete_laplace(rs.child("measure", pick), scale, t.shape)
                kind, noise_scale = "discrete Laplace", scale
            else:  # zCDP mode: L2 sensitivity m (≤ L1), m²/(2σ²)-zCDP per table
                noisy = t.astype(np.int64) + discrete_gaussian(rs.child("measure", pick), plan.sigma,
                                                               t.shape)
                kind, noise_scale = "discrete Gaussian", plan.sigma
                meta["rho"] = plan.table_rho
            released.append(NoisyMarginal(
                columns=(a, b), names=(names[a], names[b]), shape=tuple(t.shape), values=noisy,
                scale=noise_scale, budget=plan.table_budget,
                sensitivity=float(plan.max_contributions), meta=meta, noise=kind))
            # post-processing from here on: the released table and the model only
            prop = target_from_noisy(noisy, estimates[(a, b)], released[-1].variance, total)
            targets.append(RakeTarget((a, b), (ga, gb), prop))
            pick += 1
        weights = rake_weights(pool, shape, [*base_targets, *targets], plan.rake_iterations,
                               end_on_margins=plan.rake_end_on_margins)
    return RefineMeasurement(tuple(released), tuple(targets),
                             {"pairs": len(released), "rounds": plan.rounds, "groups": plan.groups,
                              "selected": [[names[a], names[b]] for a, b in
                                           (m.columns for m in released)]})


class RefinedModel(SynthesisModel):
    """A network refined by raked coarse pairs (post-processing only). ``targets`` are raked in
    order; the first ``base_targets`` of them are the network's own tables (``describe`` lists
    them apart from the refinement's).

    ``sample_codes(n)`` draws ``max(8n, 20,000)`` records from the network and rakes them to the
    released targets (keeping their own 1-way margins). ``sampling="balanced"`` (default) then
    takes ``n`` rows by systematic sampling of the weighted pool (:func:`systematic_indices`) and
    swaps rows so that the sample's 2-way tables match the weighted pool's
    (:func:`~beamsynth.transforms.balance.balance_pairs`): the rows carry little sampling error on
    top of the model's. ``sampling="iid"`` draws the ``n`` rows independently ∝ weight.
    ``end_on_margins``: whether each raking ends on the pool's 1-way margins (the plan's
    ``rake_end_on_margins``, carried in the model to the sampling workers, H78).
    """

    def __init__(self, base: SynthesisModel, targets: Sequence[RakeTarget], *,
                 names: Sequence[str] | None = None, iterations: int = SAMPLE_RAKE_ITERATIONS,
                 base_targets: int = 0, sampling: str = "balanced",
                 end_on_margins: bool = True) -> None:
        if sampling not in ("balanced", "iid"):
            raise ValueError(f"sampling ({sampling!r}) must be one of ('balanced', 'iid')")
        if isinstance(base_targets, bool) or not isinstance(base_targets, int) \
                or not 0 <= base_targets <= len(targets):
            raise ValueError(f"base_targets ({base_targets!r}) must be an int in [0, {len(targets)}]")
        self._base = base
        self._targets = tuple(targets)
        self._names = list(names) if names is not None else None
        self._iterations = int(iterations)
        self._base_targets = base_targets
        self._sampling = sampling
        self._end_on_margins = bool(end_on_margins)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._base.shape)

    @property
    def base(self) -> SynthesisModel:
        """The unrefined network."""
        return self._base

    @property
    def targets(self) -> tuple[RakeTarget, ...]:
        return self._targets

    @property
    def iterations(self) -> int:
        """IPF sweeps of each raking (fixed when the model was made)."""
        return self._iterations

    @property
    def end_on_margins(self) -> bool:
        """Whether each raking ends on the pool's 1-way margins (fixed when the model was made)."""
        return self._end_on_margins

    def sample_codes(self, n: int, rs: RandomSource) -> np.ndarray:
        if not self._targets:
            return self._base.sample_codes(n, rs)
        if n == 0:
            return np.zeros((0, len(self.shape)), dtype=np.int64)
        pool = self._base.sample_codes(max(POOL_FACTOR * n, POOL_MIN_ROWS), rs.child("pool"))
        if max(self.shape) < 2**31:  # the pool lives through raking and balancing: 4 bytes a code
            pool = pool.astype(np.int32)
        w = rake_weights(pool, self.shape, self._targets, self._iterations,
                         end_on_margins=self._end_on_margins)
        if self._sampling == "iid":
            return pool[sample_categorical(rs.child("iid"), w, n)].astype(np.int64)
        picked = systematic_indices(pool, w, n, rs.child("resample"), self.shape)
        picked = balance_pairs(pool, w, picked, rs.child("balance"))
        return pool[picked[np.argsort(rs.child("shuffle").uniform(n), kind="stable")]].astype(np.int64)

    def describe(self) -> dict[str, Any]:
        name = (lambda c: self._names[c]) if self._names else (lambda c: c)
        out = dict(self._base.describe())
        out["sampling"] = self._sampling
        cols = [[name(c) for c in t.columns] for t in self._targets]
        # the first base_targets targets are the network's own tables, the rest the refinement's
        out["kept_tables"] = cols[:self._base_targets]
        out["refined_with"] = cols[self._base_targets:]
        return out
