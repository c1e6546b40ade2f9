"""PrivBayes model size from ``n̂·ε``, the small-input forest model (issue 18), and ε over tables.

* :func:`network_usefulness`, :func:`choose_network_degree`, :class:`NetworkSizing` — the largest
  degree ``k`` whose typical family is θ-useful (PrivBayes §4.4, in count units; AIM-style
  budget-aware sizing, McKenna et al. 2022 §4), from a public row count or a DP count;
* :class:`ForestPlan`, :func:`plan_forest`, :func:`choose_forest` — where no network is θ-useful:
  every column's 1-way table plus a private forest of the affordable 2-way tables, run only
  where its selection resolves a strong pair (:func:`forest_resolves`; else the √cells
  independent model with the whole ε; under a zCDP plan it gets the pure ε − ε_count, as in the
  Laplace plan: :func:`~beamsynth.transforms.privbayes_plan.gaussian_plan`);
* :func:`split_marginal_budget` — ``ε_i ∝ √min(cells_i, SPLIT_CELLS_CAP)`` over released tables;
* :func:`split_network_budget` — a pure-ε network's tables: the √cells split moved toward the
  tables that carry the columns' 1-way margins (issue 18, H59);
* :func:`refine_pairs_for_rows`, :func:`refine_rounds_for_pairs`, :func:`refine_size` — how many
  coarse pairs the refinement measures when ``n̂·ε`` supports more than requested (wide tables,
  issue 18), from a public row count at build time or the DP count at run time
  (:meth:`NetworkSizing.refine_plan`); :func:`gaussian_refine_pairs_for_rows`,
  :func:`gaussian_refine_size`, :func:`resize_gaussian_refinement` — the same for the zCDP
  plan's discrete Gaussian tables (``n̂·√ρ``).

Shapes: public numbers and the declared shape in, frozen plans out; :func:`choose_forest` reads
the exact candidate counts (``dict[tuple[int, ...], np.ndarray]``) inside the measurement step
and returns ``[(column, parents), ...]``. Beam-free.

Privacy (add/remove one privacy unit of at most ``m`` records): the sizing rules are functions of
public values only (declared shape, ε, and ``rows`` public or a DP count: post-processing) and
spend nothing; the DP count is planned in :mod:`~beamsynth.transforms.privbayes_plan` and
released in the measurement step. The forest is ``steps`` permute-and-flip picks of
``ε_s/steps`` each (InDif − cells·b, Δ = 4m; the 'no edge' candidate scores a constant), then
discrete Laplace 1-way and edge tables (Δ = m per table, PrivBayes §4.2): ``ε_s + ε_1 + ε_2`` by
sequential composition.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from beamsynth.transforms.budget import PureDP
from beamsynth.transforms.noise import RandomSource, discrete_laplace_scale, permute_and_flip
from beamsynth.transforms.privbayes_structure import (
    INDIF_SENSITIVITY,
    MAX_FAMILY_CELLS,
    _family_table,
    family_cells,
    indif_score,
)

__all__ = [
    "SIZE_COUNT_FRACTION",
    "SIZING_THETA",
    "NetworkSizing",
    "FOREST_ONE_WAY_FRACTION",
    "FOREST_STRUCTURE_FRACTION",
    "FOREST_THETA",
    "FOREST_MIN_DEPENDENCE",
    "FOREST_SCORE",
    "FOREST_SCORES",
    "MARGIN_SCORE_SENSITIVITY",
    "margin_score",
    "forest_resolves",
    "NETWORK_THETA",
    "NETWORK_FOREST_THETA",
    "BAND_FOR_ZCDP",
    "BAND_FOREST_ONE_WAY_FRACTION",
    "band_forest",
    "ForestPlan",
    "plan_forest",
    "choose_forest",
    "network_usefulness",
    "choose_network_degree",
    "SPLIT_CELLS_CAP",
    "GAUSSIAN_ONE_WAY_SHARE",
    "split_marginal_budget",
    "NETWORK_SPLIT_TABLE_WEIGHT",
    "split_network_budget",
    "REFINE_NOISE_MASS",
    "REFINE_PICKS_PER_ROUND",
    "refine_pairs_for_rows",
    "refine_rounds_for_pairs",
    "refine_size",
    "GAUSSIAN_REFINE_NOISE_MASS",
    "GAUSSIAN_REFINE_MIN_TABLE_RHO",
    "GAUSSIAN_REFINE_PAIRS_PER_COLUMN",
    "gaussian_refine_pairs_for_rows",
    "gaussian_refine_size",
    "resize_gaussian_refinement",
    "gaussian_refine_split",
    "GAUSSIAN_REFINE_DOWN",
    "gaussian_refine_coarse_cells",
    "gaussian_refine_pairs_down",
    "shrink_gaussian_refinement",
    "gaussian_refine_rho",
]

SIZING_THETA = 2.5  # usefulness a k-parent family needs (docs/privbayes.md "Model size from n̂·ε")
SIZE_COUNT_FRACTION = 0.02  # share of ε for n̂ when no public row count is given
SIZING_CELLS_CAP = 1_000  # a column counts with at most this many cells in the typical family
FOREST_ONE_WAY_FRACTION = 0.8  # small inputs: share of ε on every column's 1-way table ...
FOREST_STRUCTURE_FRACTION = 0.1  # ... on choosing the forest's edges (the rest: its 2-way tables)
FOREST_THETA = 4.0  # usefulness a forest edge's 2-way table needs (n̂·ε_t/(m·cells))
FOREST_MIN_DEPENDENCE = 0.6  # δ*: a step must resolve a pair this dependent (forest_resolves)
# The forest's edge score (issue 18, H102): "margins" releases every 1-way table first and scores a
# pair by its distance from the product of those released margins (margin_score: sensitivity m,
# a quarter of InDif's 4m), so the steps resolve as before with a quarter of the structure share,
# and the other three quarters go to the 1-way tables; "indif": InDif on the data's own margins,
# structure first (the release before H102). Read when the plan is built (NetworkSizing.forest_score)
FOREST_SCORES = ("indif", "margins")
FOREST_SCORE = "margins"
MARGIN_SCORE_SENSITIVITY = 1  # per record: margin_score moves by at most 1 (one cell, fixed reference)
NETWORK_THETA = 4.5  # PrivBayes keeps a k = 1 network from here (below: the forest model)
# ... but below this usefulness a resolving forest replaces it (H49, issue 18; zCDP plans too: H53),
# there with this share of ε on the 1-way tables (the rest less the structure: its 2-way tables).
# 9: a hand calibration on measured cells (H53): above ACS 6,107 ε 2 (8.4), below ACS 27k ε 0.5 (9.3)
NETWORK_FOREST_THETA = 9.0
BAND_FOREST_ONE_WAY_FRACTION = 0.6
# the band applies to zCDP plans sized from the DP count too, as it does with public rows (H53);
# False is an A/B of the run-time path only (the network there, as before H53)
BAND_FOR_ZCDP = True
REFINE_NOISE_MASS = 0.9  # κ: the refinement tables' summed expected L1 noise stays ≤ κ·n̂ ...
REFINE_PICKS_PER_ROUND = 5  # ... and its pairs are picked at most this many per round
REFINE_PAIRS_RULE = ("P = min(countable pairs, d, ⌊√(κ·n̂·ε_meas/(m·groups²))⌋) in max(rounds, "
                     f"⌈P/{REFINE_PICKS_PER_ROUND}⌉) rounds where P exceeds the requested pairs, "
                     "else the requested pairs that get ε ≥ 0.01 each; κ = "
                     f"{REFINE_NOISE_MASS}")
# zCDP plan (noise="gaussian"): the same rule for discrete Gaussian tables (docs/privbayes.md
# "Twelfth session: Gaussian mode on wide tables")
GAUSSIAN_REFINE_NOISE_MASS = 3.6  # κ_G: reproduces the tuned 40 pairs on Adult at ε = 1, δ = 1e-9
GAUSSIAN_REFINE_MIN_TABLE_RHO = 2.5e-5  # ρ floor per table: σ ≤ 141, the std of Laplace b = 100
GAUSSIAN_REFINE_PAIRS_PER_COLUMN = 1.5  # the Gaussian rule's cap: ⌊1.5·d⌋ pairs (Laplace: d)
GAUSSIAN_REFINE_PAIRS_RULE = (
    "P = min(countable pairs, ⌊1.5·d⌋, ⌊ρ_meas/ρ_min⌋, ⌊(κ_G·n̂·√(π·ρ_meas)/(m·groups²))^(2/3)⌋) in "
    f"max(rounds, ⌈P/{REFINE_PICKS_PER_ROUND}⌉) rounds where P exceeds the requested pairs, else "
    f"the requested pairs (≥ ρ_min each) in the requested rounds; κ_G = "
    f"{GAUSSIAN_REFINE_NOISE_MASS}, ρ_min = {GAUSSIAN_REFINE_MIN_TABLE_RHO}")


# -- model size from n̂ and ε ---------------------------------------------------------------------
def network_usefulness(rows: float, epsilon: float, shape: Sequence[int], degree: int, *,
                       max_contributions: int = 1) -> float:
    """θ-usefulness of a typical ``degree``-parent family (PrivBayes §4.4, in count units).

    ``rows·ε / (d·m·g^(k+1))``: the signal per cell of a ``(k+1)``-way table, ``rows/g^(k+1)``
    (``g`` = geometric mean of the declared column sizes, each capped at
    :data:`SIZING_CELLS_CAP`), over the discrete Laplace scale ``m·d/ε`` a table gets when ``ε``
    is split evenly over the ``d`` tables of the network. A pure function of public values:
    ``rows`` is a public row count or a DP estimate (post-processing), the rest is declared.
    """
    d = max(1, len(shape))
    g = math.exp(float(np.mean(np.log(np.minimum(np.asarray(shape, dtype=np.float64),
                                                 SIZING_CELLS_CAP)))))
    return max(float(rows), 0.0) * float(epsilon) / (d * max_contributions * g ** (degree + 1))


def choose_network_degree(rows: float, epsilon: float, shape: Sequence[int], *, max_degree: int,
                          max_contributions: int = 1, theta: float = SIZING_THETA) -> int:
    """The largest ``k ≤ max_degree`` whose families are θ-useful
    (:func:`network_usefulness` ``≥ theta``), else 0: the independent model.

    AIM-style budget-aware sizing (McKenna et al. 2022 §4: a marginal is worth measuring only if
    its noise per cell is small against ``n̂/cells``), with PrivBayes' θ-usefulness as the rule
    (Zhang et al. §4.4, θ = 4 there). ``theta`` (:data:`SIZING_THETA`) is calibrated on Adult
    subsamples (docs/privbayes.md "Model size from n̂·ε"). Monotone in ``rows·ε``; one column
    has nothing to condition on (0).
    """
    if len(shape) < 2:
        return 0
    for k in range(int(max_degree), 0, -1):
        if network_usefulness(rows, epsilon, shape, k, max_contributions=max_contributions) >= theta:
            return k
    return 0


def band_forest(rows: float, epsilon: float, shape: Sequence[int], *, count_epsilon: float = 0.0,
                max_contributions: int = 1, max_family_cells: int = MAX_FAMILY_CELLS,
                forest_theta: float = NETWORK_FOREST_THETA,
                score: str = FOREST_SCORE) -> ForestPlan | None:
    """The forest that replaces a ``k = 1`` network which is θ-useful but less than
    ``forest_theta``-useful (issue 18, H49), or ``None`` (keep the network).

    In that band (:func:`network_usefulness` at ``k = 1`` below ``forest_theta``) it is
    :func:`plan_forest` with the model's ε (``epsilon − count_epsilon``, what the run-time
    fallback gets) and :data:`BAND_FOREST_ONE_WAY_FRACTION` = 0.6 of it on the 1-way tables (0.1
    structure, 0.3 on the edges' tables: more, larger edges than below the band) if that forest
    resolves, else the small-input forest's 0.8 / 0.1 / 0.1 split if that one resolves, else
    ``None``.

    Why: under pure ε a ``k = 1`` network's 1-way estimates come from noisier 2-way family
    tables (about twice independent's 1-way L1 noise, docs/privbayes.md H38), so on small inputs
    its TVD1 was above ``--method independent``'s (Beam-free harness, DP count, 5 paired seeds:
    ACS 6,107 rows ε = 2 0.0246 vs 0.0177, COMPAS 5,050 ε = 0.5 0.0350 vs 0.0248, Adult 5,000
    ε = 2 0.0238 vs 0.0211); the forest was at or below independent on TVD1/2/3 there
    (docs/privbayes.md "Thirteenth session"). Where no forest resolves a pair the network is
    kept (NLTCS 1,000 ε = 0.5: √cells 1-way tables would lose the network's TVD2/3).
    ``forest_theta`` = :data:`NETWORK_FOREST_THETA` = 9, a hand calibration on measured cells
    (H53): above the band's cells (COMPAS 5,050 ε = 0.5: 6.2, Adult 5,000 ε = 2: 7.4, ACS 6,107
    ε = 2: 8.4) and below ACS 27,253 rows at ε = 0.5 (9.3 from the DP count), whose network's
    TVD2 (0.084) the forest gave up (0.104; independent 0.107) at 10; Adult 32k at ε = 0.5 (12.2)
    keeps its network too. A pure function of public values (``rows`` public or a DP
    count: post-processing); spends nothing."""
    if network_usefulness(rows, epsilon, shape, 1, max_contributions=max_contributions) >= forest_theta:
        return None
    for one_way in (BAND_FOREST_ONE_WAY_FRACTION, FOREST_ONE_WAY_FRACTION):
        forest = plan_forest(rows, epsilon - count_epsilon, shape,
                             max_contributions=max_contributions, max_family_cells=max_family_cells,
                             one_way_fraction=one_way, score=score)
        if forest.steps > 0:
            return forest
    return None


@dataclass(frozen=True)
class NetworkSizing:
    """How the network's size is chosen: from a public row count ``rows`` at build time, or from
    a DP count (``count_budget``, discrete Laplace, Δ = m) in the measurement step. ``epsilon`` is
    the model's total ε, the one the rule (:func:`choose_network_degree`) weighs n̂ against."""

    epsilon: float
    max_degree: int
    shape: tuple[int, ...]
    max_contributions: int = 1
    rows: int | None = None
    count_budget: PureDP | None = None
    theta: float = NETWORK_THETA
    refine_pairs_for_rows: int = 0  # public rows: the refinement's pairs by refine_pairs_for_rows
    # the refinement's requested pairs and rounds and the pairs with exact counts (refine_size)
    refine_requested: int = 0
    refine_rounds: int = 0
    refine_countable: int = 0
    refine_noise: str = "laplace"  # "gaussian": the zCDP plan's rule (gaussian_refine_size)
    forest_theta: float | None = NETWORK_FOREST_THETA  # the band where a resolving forest wins
    # the A/B switches BAND_FOR_ZCDP and GAUSSIAN_REFINE_DOWN as read when the plan is built
    # (plan_privbayes), so that a worker sizing from the DP count in a fresh process uses the
    # launcher's values, not its module's (H67's lesson for split_table_weight)
    band_for_zcdp: bool = True
    refine_down: bool = True
    max_family_cells: int = MAX_FAMILY_CELLS  # the forest's pair cap (plan_forest), as planned
    forest_score: str = FOREST_SCORE  # the forest's edge score (plan_forest), FOREST_SCORE as planned

    def degree(self, rows_hat: float) -> int:
        """The degree for an estimate ``rows_hat`` (public or DP: post-processing).

        :func:`choose_network_degree` with :attr:`theta`; where it keeps ``k = 1`` but the
        network is less than :attr:`forest_theta`-useful, it returns 0 if the small-input forest
        resolves at ``rows_hat`` (:meth:`small_forest`): the run then fits that forest (or the
        declared target's star) with the same ε — a Laplace plan's network ε, a zCDP plan's pure
        ``ε − ε_c`` (its run-time fallback, within its ``(ε − ε_c, δ)`` spend), so a zCDP plan
        sized from the DP count gets the model a public ``--input-rows`` of the same size gets at
        build time (H53; :data:`BAND_FOR_ZCDP`). Public values only."""
        k = choose_network_degree(rows_hat, self.epsilon, self.shape, max_degree=self.max_degree,
                                  max_contributions=self.max_contributions, theta=self.theta)
        if k >= 1 and self._band_forest(rows_hat) is not None:
            return 0
        return k

    def _band_forest(self, rows_hat: float) -> ForestPlan | None:
        if self.forest_theta is None or (self.refine_noise != "laplace" and not self.band_for_zcdp):
            return None
        return band_forest(rows_hat, self.epsilon, self.shape,
                           count_epsilon=0.0 if self.count_budget is None else self.count_budget.epsilon,
                           max_contributions=self.max_contributions,
                           max_family_cells=self.max_family_cells, forest_theta=self.forest_theta,
                           score=self.forest_score)

    def small_forest(self, rows_hat: float, epsilon: float) -> ForestPlan:
        """The forest a ``k = 0`` run fits with the model's ``epsilon``: the band's
        (:func:`band_forest`) where it replaced a θ-useful network, else :func:`plan_forest`
        (0.8 / 0.1 / 0.1; ``steps = 0``: the √cells 1-way tables). Public values only."""
        if choose_network_degree(rows_hat, self.epsilon, self.shape, max_degree=self.max_degree,
                                 max_contributions=self.max_contributions, theta=self.theta) >= 1:
            band = self._band_forest(rows_hat)
            if band is not None:
                return band
        return plan_forest(rows_hat, epsilon, self.shape, max_contributions=self.max_contributions,
                           max_family_cells=self.max_family_cells, score=self.forest_score)

    def refine_plan(self, rows_hat: float, refine: Any) -> Any:
        """The refinement plan (:class:`~beamsynth.transforms.refine.RefinePlan`) for a DP count
        ``rows_hat`` (post-processing): ``refine`` with the pairs and rounds of
        :func:`refine_size`, its ``selection_budget`` and ``measure_budget`` unchanged (so each
        pick gets ``ε_sel/P``, each table ``ε_meas/P``); a zCDP refinement (``sigma``) with the
        pairs and rounds of :func:`gaussian_refine_size` and its ``ρ_sel``/``ρ_meas`` unchanged
        (:func:`resize_gaussian_refinement`). ``None`` or a disabled refinement come back as they
        are."""
        if refine is None or self.refine_requested <= 0:
            return refine
        if refine.sigma is not None:
            if self.refine_noise != "gaussian":
                return refine
            pairs, rounds = gaussian_refine_size(
                rows_hat, refine.pairs * refine.table_rho, self.shape,
                requested=self.refine_requested, planned=refine.pairs, rounds=self.refine_rounds,
                countable=self.refine_countable, groups=refine.groups,
                max_contributions=self.max_contributions)
            if (pairs, rounds) == (refine.pairs, refine.rounds):
                # small n̂·√ρ: fewer pairs at the planned σ, the rest of ρ on the tables (H47)
                small = gaussian_refine_pairs_down(
                    rows_hat, refine.pairs * refine.table_rho, self.shape, planned=refine.pairs,
                    groups=refine.groups, max_contributions=self.max_contributions,
                    enabled=self.refine_down)
                if small < refine.pairs:
                    return shrink_gaussian_refinement(refine, small, min(refine.rounds, small))
                return refine
            return resize_gaussian_refinement(refine, pairs, rounds)
        pairs, rounds = refine_size(
            rows_hat, refine.measure_budget.epsilon, self.shape, requested=self.refine_requested,
            planned=refine.pairs, rounds=self.refine_rounds, countable=self.refine_countable,
            groups=refine.groups, max_contributions=self.max_contributions)
        if (pairs, rounds) == (refine.pairs, refine.rounds):
            return refine
        return dataclasses.replace(refine, pairs=pairs, rounds=rounds)

    def refine_plan_for(self, refine: Any, pairs: int) -> Any:
        """The plan :meth:`refine_plan` returns when it chooses ``pairs`` (for the manifest: the
        run-time ``P`` is reported through a metric; the rounds and ε per pick/table follow)."""
        if refine is None or pairs == refine.pairs:
            return refine
        rounds = refine_rounds_for_pairs(pairs, self.refine_rounds)
        if refine.sigma is not None:
            return resize_gaussian_refinement(refine, pairs, rounds)
        return dataclasses.replace(refine, pairs=pairs, rounds=rounds)

    def refine_largest(self, refine: Any) -> Any:
        """The plan with the most pairs :meth:`refine_plan` can choose at run time from a DP
        count (``min(countable, d)`` pairs, where that exceeds the requested count), or ``None``
        when the run always keeps ``refine`` (public rows, zCDP, no refinement, or a rule that
        cannot raise the request; zCDP: also capped by the ρ floor per table). Public: a function
        of the declared shape and parameters."""
        if (refine is None or self.refine_requested <= 0 or self.rows is not None
                or self.count_budget is None
                or (refine.sigma is not None and self.refine_noise != "gaussian")):
            return None
        most = min(int(self.refine_countable), len(self.shape))
        if refine.sigma is not None:  # the Gaussian rule's caps: ⌊1.5·d⌋ and the ρ floor
            most = min(int(self.refine_countable),
                       math.floor(GAUSSIAN_REFINE_PAIRS_PER_COLUMN * len(self.shape)),
                       int(refine.pairs * refine.table_rho / GAUSSIAN_REFINE_MIN_TABLE_RHO + 1e-9))
        if most <= max(self.refine_requested, refine.pairs):
            return None
        return self.refine_plan_for(refine, most)

    def details(self) -> dict[str, Any]:
        """Manifest details: the rule, where n̂ comes from, and (public rows) the decision."""
        out: dict[str, Any] = {
            "rule": "largest k <= max_degree with n̂·ε/(d·m·g^(k+1)) >= theta (k = 1 below "
                    f"forest_theta = {self.forest_theta} only if the forest below does not "
                    "resolve), else 0 = every "
                    "1-way table + a forest of θ-useful pairs (plan_forest) if its steps resolve "
                    "a pair of dependence δ* among the K affordable ones (n̂·δ*·ε_step/(8m) >= "
                    f"ln(K+1), δ* = {FOREST_MIN_DEPENDENCE}: forest_resolves), else independent "
                    "1-way marginals with the whole ε, ∝ √cells (AIM-style sizing, PrivBayes "
                    "θ-usefulness)",
            "theta": self.theta, "forest_theta": self.forest_theta
            if self.refine_noise == "laplace" or self.band_for_zcdp else None,
            "max_degree": self.max_degree, "epsilon": self.epsilon,
            "forest_score": self.forest_score + (
                ": the forest's 1-way tables are released first and its steps score pairs "
                "against them (S, Δ = m), the resolution above at a quarter of the structure "
                "share, the other three quarters on the 1-way tables (H102)"
                if self.forest_score == "margins" else ": InDif, structure first"),
            "rows_source": "public input row count (CLI --input-rows)" if self.rows is not None
            else "DP count in the measurement step (discrete Laplace, Δ = m)"}
        if self.refine_requested > 0:
            out.update(refine_pairs_rule=GAUSSIAN_REFINE_PAIRS_RULE
                       if self.refine_noise == "gaussian" else REFINE_PAIRS_RULE,
                       refine_pairs_source="public input row count (CLI --input-rows), at build "
                       "time" if self.rows is not None else "the DP count n̂ (size_count), in the "
                       "measurement step: post-processing, the refinement's "
                       + ("ρ_sel and ρ_meas" if self.refine_noise == "gaussian" else "ε")
                       + " fixed at build time")
        if self.count_budget is not None:
            out["count_epsilon"] = self.count_budget.epsilon
        if self.rows is not None:
            k = self.degree(self.rows)
            out.update(rows=self.rows, chosen_degree=k,
                       usefulness_k1=network_usefulness(self.rows, self.epsilon, self.shape, 1,
                                                        max_contributions=self.max_contributions),
                       chosen="1-way tables + forest of affordable pairs (plan 'forest'; "
                              "none affordable: independent 1-way marginals)" if k == 0
                       else f"network with {k} parent(s) per column",
                       refine_pairs_for_rows=self.refine_pairs_for_rows)
        return out


# -- refinement size from n̂ and ε (wide tables) ---------------------------------------------------
def refine_pairs_for_rows(rows: float, measure_epsilon: float, shape: Sequence[int], *,
                          groups: int, max_contributions: int = 1,
                          noise_mass: float = REFINE_NOISE_MASS) -> int:
    """How many coarse 2-way tables the refinement can measure at ``n̂ = rows`` (issue 18).

    ``P`` tables share ``measure_epsilon`` equally, so each gets discrete Laplace of scale
    ``b = m·P/ε_meas`` on at most ``groups²`` cells; their summed expected L1 noise is about
    ``P²·groups²·m/ε_meas``. The rule keeps it at most ``noise_mass·n̂``:
    ``P = ⌊√(κ·n̂·ε_meas/(m·groups²))⌋`` (equivalently, each table is θ-useful in PrivBayes'
    sense, §4.4, with θ = P/κ growing with the number of tables), capped at ``d`` (one pair per
    column beside the network's ``d−1``: sampling rakes to every target, so its cost stays linear
    in ``d``). κ = :data:`REFINE_NOISE_MASS` = 0.9 reproduces the default 15 pairs on Adult at
    ε = 1 (``n̂·ε_meas/25`` = 260); census_kdd (199,523 rows, 41 columns) gets 37 at ε = 1.
    A pure function of public values (``rows`` public or a DP count, the declared shape, ε):
    no budget, no data.
    """
    d = len(shape)
    if d < 2 or rows <= 0 or measure_epsilon <= 0:
        return 0
    cells = int(groups) ** 2
    p = math.sqrt(noise_mass * float(rows) * float(measure_epsilon) / (max_contributions * cells))
    return int(min(d, math.floor(p + 1e-9)))


def refine_rounds_for_pairs(pairs: int, rounds: int) -> int:
    """Selection rounds for ``pairs`` picks: at least ``rounds`` (at most ``pairs``) and at most
    :data:`REFINE_PICKS_PER_ROUND` picks per round (the default 15 pairs in 3 rounds), so that a
    larger refinement keeps selecting against a model refined by its earlier picks (AIM §4's
    select–measure–refit loop). Post-processing of public numbers."""
    if pairs <= 0:
        return 0
    return max(min(int(rounds), pairs), math.ceil(pairs / REFINE_PICKS_PER_ROUND))


def refine_size(rows: float, measure_epsilon: float, shape: Sequence[int], *, requested: int,
                planned: int, rounds: int, countable: int, groups: int,
                max_contributions: int = 1) -> tuple[int, int]:
    """``(pairs, rounds)`` of the refinement at ``n̂ = rows``: the one rule for a public row count
    (:func:`~beamsynth.transforms.privbayes_plan.plan_privbayes`, build time) and for the DP count
    (:meth:`NetworkSizing.refine_plan`, measurement step).

    ``P = min(countable, refine_pairs_for_rows(...))`` in :func:`refine_rounds_for_pairs` rounds
    when ``P`` exceeds both the ``requested`` pairs and the ``planned`` ones (the requested count
    capped by the countable pairs and the ε ≥ 0.01-per-table floor); otherwise ``planned`` in
    ``min(rounds, planned)`` rounds. The rule only raises the requested count: where ``n̂·ε``
    does not support more than requested (Adult: ``d`` = 15), the floor-capped plan stays as it
    was. A pure function of public values (``rows`` public or a DP count, the declared shape, ε,
    the parameters): no budget, no data.
    """
    wide = min(int(countable), refine_pairs_for_rows(rows, measure_epsilon, shape, groups=groups,
                                                     max_contributions=max_contributions))
    if wide > requested and wide > planned:
        return wide, refine_rounds_for_pairs(wide, rounds)
    return planned, min(int(rounds), planned)


def gaussian_refine_pairs_for_rows(rows: float, measure_rho: float, shape: Sequence[int], *,
                                   groups: int, max_contributions: int = 1,
                                   noise_mass: float = GAUSSIAN_REFINE_NOISE_MASS) -> int:
    """How many coarse 2-way tables a zCDP refinement (``noise="gaussian"``) can measure at
    ``n̂ = rows``: :func:`refine_pairs_for_rows` for discrete Gaussian tables.

    ``P`` tables share ``measure_rho`` equally, so each gets σ = m·√(P/(2ρ_meas)) on at most
    ``groups²`` cells; a cell's expected |noise| is about σ·√(2/π), so the tables' summed expected
    L1 noise is ``groups²·m·P^{3/2}/√(π·ρ_meas)``. The rule keeps it at most ``κ_G·n̂``:
    ``P = ⌊(κ_G·n̂·√(π·ρ_meas)/(m·groups²))^{2/3}⌋``, capped at ``⌊1.5·d⌋``
    (:data:`GAUSSIAN_REFINE_PAIRS_PER_COLUMN`; the Laplace rule's cap is ``d``: a Gaussian table's
    noise grows like ``√P``, not ``P``, so more pairs per column stay useful, and the raking cost
    stays linear in ``d``). κ_G = :data:`GAUSSIAN_REFINE_NOISE_MASS` = 3.6 reproduces the tuned
    40 pairs of 8 groups on Adult at ε = 1, δ = 1e-9 (32,561 rows, ρ_meas = 0.0063); census_kdd
    (199,523 rows, 41 columns) reaches the cap 61 at every ε ≥ 0.5. A pure function of public values
    (``rows`` public or a DP count, the declared shape, ρ): no budget, no data.
    """
    d = len(shape)
    if d < 2 or rows <= 0 or measure_rho <= 0:
        return 0
    cells = int(groups) ** 2
    p = (noise_mass * float(rows) * math.sqrt(math.pi * float(measure_rho))
         / (max_contributions * cells)) ** (2 / 3)
    return int(min(math.floor(GAUSSIAN_REFINE_PAIRS_PER_COLUMN * d), math.floor(p + 1e-9)))


def gaussian_refine_size(rows: float, measure_rho: float, shape: Sequence[int], *, requested: int,
                         planned: int, rounds: int, countable: int, groups: int,
                         max_contributions: int = 1,
                         min_table_rho: float = GAUSSIAN_REFINE_MIN_TABLE_RHO) -> tuple[int, int]:
    """``(pairs, rounds)`` of a zCDP refinement at ``n̂ = rows``: :func:`refine_size` with
    :func:`gaussian_refine_pairs_for_rows`, also capped by the ρ floor per table
    (``⌊ρ_meas/min_table_rho⌋``). Where ``P`` exceeds both the ``requested`` and the ``planned``
    pairs: ``P`` in :func:`refine_rounds_for_pairs` rounds (at most 5 picks a round); otherwise
    ``planned`` in ``min(rounds, planned)`` rounds (Adult and ACS: 40 pairs in 3 rounds, as
    tuned). Public values only (build time with ``--input-rows``, the DP count at run time)."""
    floor = int(measure_rho / min_table_rho + 1e-9) if measure_rho > 0 else 0
    wide = min(int(countable), floor, gaussian_refine_pairs_for_rows(
        rows, measure_rho, shape, groups=groups, max_contributions=max_contributions))
    if wide > requested and wide > planned:
        return wide, refine_rounds_for_pairs(wide, rounds)
    return planned, min(int(rounds), planned)


def resize_gaussian_refinement(refine: Any, pairs: int, rounds: int) -> Any:
    """A zCDP refinement plan (``refine.sigma`` set) re-split over ``pairs`` picks and tables with
    the same ``ρ_sel`` and ``ρ_meas``: each pick ``ε = √(2ρ_sel/P)`` (``ε²/2``-zCDP, Bun & Steinke
    2016 Prop. 1.4), each table ``σ = m/√(2ρ_meas/P)`` (``m²/(2σ²)``-zCDP, CKS 2020 Thm. 4), so
    the ``P`` picks and ``P`` tables cost ``ρ_sel + ρ_meas`` whatever ``P`` is (zCDP composition);
    ``measure_budget`` stays the Laplace-equivalent ε (same std) the selection penalty uses."""
    return dataclasses.replace(refine, pairs=int(pairs), rounds=int(rounds), **gaussian_refine_split(
        refine.pairs * refine.pick_epsilon ** 2 / 2, refine.pairs * refine.table_rho, int(pairs),
        refine.max_contributions))


def gaussian_refine_split(selection_rho: float, measure_rho: float, pairs: int,
                          max_contributions: int) -> dict[str, Any]:
    """A zCDP refinement's ``ρ_sel`` and ``ρ_meas`` split equally over ``pairs`` picks and tables:
    the ``RefinePlan`` fields ``sigma`` (σ = m/√(2ρ_meas/P)), ``selection_budget`` (P picks of
    ε = √(2ρ_sel/P)) and ``measure_budget`` (the tables' Laplace-equivalent ε, same std, for the
    selection penalty only). Used by the build-time plan and :func:`resize_gaussian_refinement`."""
    m = max_contributions
    sigma = m / math.sqrt(2 * measure_rho / pairs)
    return {"sigma": sigma,
            "selection_budget": PureDP(epsilon=math.sqrt(2 * selection_rho / pairs) * pairs),
            "measure_budget": PureDP(epsilon=pairs * math.sqrt(2) * m / sigma)}


# zCDP refinement sized DOWN at small n̂·√ρ (H47, issue 18): fewer pairs at the planned σ
GAUSSIAN_REFINE_DOWN = True  # False: the planned pairs whatever n̂ (the release before H47)
REFINE_MIN_PAIRS_DOWN = 3  # the fewest pairs the downward rule keeps (refine.REFINE_MIN_PAIRS)
GAUSSIAN_REFINE_DOWN_RULE = (
    "where P_small = ⌊(κ_G·n̂·√(π·ρ_meas)/(m·c̄))^(2/3)⌋ (c̄: the mean declared coarse cells "
    "min(groups, cells_a)·min(groups, cells_b) over the countable pairs) is below the planned "
    f"pairs, max({REFINE_MIN_PAIRS_DOWN}, P_small) pairs keep the planned ε per pick and σ per "
    "table, and the refinement's ρ of the pairs dropped, (1 − P/planned)·(ρ_sel + ρ_meas), goes "
    "to the network's tables: the parts still add up to ρ")


def gaussian_refine_coarse_cells(shape: Sequence[int], groups: int,
                                 max_family_cells: int = MAX_FAMILY_CELLS) -> float:
    """Mean declared cells of a coarse refinement table, ``min(groups, cells_a)·min(groups,
    cells_b)`` over the pairs with exact counts (at most ``max_family_cells`` cells): 4 on
    NLTCS' binary columns, 45.9 on Adult, against the ``groups²`` = 64 the wide rule assumes.
    Declared shape only."""
    g = int(groups)
    cells = [min(g, int(a)) * min(g, int(b)) for a, b in itertools.combinations(shape, 2)
             if int(a) * int(b) <= max_family_cells]
    return float(np.mean(cells)) if cells else float(g * g)


def gaussian_refine_pairs_down(rows: float, measure_rho: float, shape: Sequence[int], *,
                               planned: int, groups: int, max_contributions: int = 1,
                               noise_mass: float = GAUSSIAN_REFINE_NOISE_MASS,
                               enabled: bool = True) -> int:
    """The pairs a zCDP refinement planned with ``planned`` pairs and ``measure_rho`` keeps at
    ``n̂ = rows`` (H47, issue 18): ``planned`` unless
    ``P_small = ⌊(κ_G·n̂·√(π·ρ_meas)/(m·c̄))^{2/3}⌋`` is smaller, then ``max(3, P_small)``.

    :func:`gaussian_refine_pairs_for_rows`'s noise-mass rule (κ_G = 3.6, the tables' summed
    expected L1 noise ≤ κ_G·n̂, each at the planned σ) with the mean declared coarse cells ``c̄``
    (:func:`gaussian_refine_coarse_cells`) instead of ``groups²``: Adult 32k at ε = 1, δ = 1e-9
    gives 49 (the 40 planned stay), NLTCS 1,000 15 / 24 / 38 at ε = 0.5 / 1 / 2, COMPAS 5,050
    13 / 20 / 31, Adult 5,000 at ε = 2 22. The caller keeps each kept pair's ε per pick and σ
    (:func:`shrink_gaussian_refinement`) and gives the dropped pairs' ρ to the network's
    tables: on the Beam-free harness (DP count, 6 paired seeds) that removed the Gaussian TVD1
    loss on NLTCS 1,000 at ε = 0.5 (+0.0108 ± 0.0030 → −0.0002 ± 0.0022 against Laplace) and
    kept its TVD2/TVD3 wins (docs/privbayes.md "Thirteenth session: `--pb-noise auto`"). A
    pure function of public values (``rows`` public or the DP count, declared shape, ρ).
    ``enabled``: the plan's ``NetworkSizing.refine_down`` (the A/B switch
    :data:`GAUSSIAN_REFINE_DOWN` read when the plan was built; never read here, H78)."""
    if not enabled:
        return int(planned)
    if planned <= 0 or len(shape) < 2 or measure_rho <= 0:
        return int(planned)
    cells = gaussian_refine_coarse_cells(shape, groups)
    p = (noise_mass * max(float(rows), 0.0) * math.sqrt(math.pi * float(measure_rho))
         / (max_contributions * cells)) ** (2 / 3)
    small = max(REFINE_MIN_PAIRS_DOWN, math.floor(p + 1e-9))
    return int(min(int(planned), small))



def shrink_gaussian_refinement(refine: Any, pairs: int, rounds: int) -> Any:
    """A zCDP refinement plan cut to ``pairs`` picks and tables at the **same** ε per pick and σ
    per table: it costs ``ρ_sel·P/planned + ρ_meas·P/planned``; the rest of its ρ,
    :func:`gaussian_refine_rho` of the planned minus the cut plan, is the caller's to give the
    network's tables (zCDP composition: the parts still add up to the planned ρ)."""
    m = refine.max_contributions
    return dataclasses.replace(refine, pairs=int(pairs), rounds=int(rounds), **gaussian_refine_split(
        pairs * refine.pick_epsilon ** 2 / 2, pairs * refine.table_rho, int(pairs), m))


def gaussian_refine_rho(refine: Any) -> float:
    """ρ of a zCDP refinement plan: ``P`` picks of ``ε²/2`` and ``P`` tables of ``table_rho``
    (0 for ``None`` or a Laplace refinement)."""
    if refine is None or refine.sigma is None:
        return 0.0
    return refine.pairs * (refine.pick_epsilon ** 2 / 2 + refine.table_rho)


# -- the small-input model: 1-way tables + a budget-aware forest -----------------------------------
@dataclass(frozen=True)
class ForestPlan:
    """The model where a network is not θ-useful (issue 18): every column's 1-way table plus a
    forest of at most ``steps`` edges among the **affordable** pairs (declared 2-way tables of at
    most ``max_pair_cells`` cells), each edge chosen by permute-and-flip, each chosen edge's
    2-way table released. Data-independent (from n̂, ε and the declared shape)."""

    steps: int
    max_pair_cells: int
    structure_budget: PureDP | None  # None with no step (no affordable pair)
    one_way_budget: PureDP
    pair_budget: PureDP | None
    max_contributions: int = 1
    rows: float = 0.0
    theta: float = FOREST_THETA
    affordable_steps: int = 0  # r of the affordable pairs; steps = 0 if the steps cannot resolve
    score: str = "indif"  # the edge score (FOREST_SCORES): "margins" releases the 1-way tables first

    @property
    def score_sensitivity(self) -> float:
        """Add/remove sensitivity of one step's score: ``4m`` for InDif, ``m`` for
        :func:`margin_score` against the released 1-way tables."""
        per_record = MARGIN_SCORE_SENSITIVITY if self.score == "margins" else INDIF_SENSITIVITY
        return float(per_record * self.max_contributions)

    @property
    def step_epsilon(self) -> float:
        """Permute-and-flip budget of each edge step."""
        return 0.0 if self.structure_budget is None else self.structure_budget.epsilon / self.steps

    @property
    def pair_scale(self) -> float:
        """Discrete Laplace scale of an edge table when ``steps`` tables share the pair budget
        evenly (the penalty's data-independent scale)."""
        if self.pair_budget is None:
            return math.inf
        return discrete_laplace_scale(sensitivity=self.max_contributions,
                                      epsilon=self.pair_budget.epsilon / self.steps)

    def details(self) -> dict[str, Any]:
        """Manifest details."""
        return {"model": "1-way tables + forest of affordable 2-way tables", "steps": self.steps,
                "affordable_steps": self.affordable_steps,
                "max_pair_cells": self.max_pair_cells, "theta": self.theta,
                "structure_epsilon": self.step_epsilon * self.steps,
                "epsilon_per_step": self.step_epsilon,
                "one_way_epsilon": self.one_way_budget.epsilon,
                "pair_epsilon": 0.0 if self.pair_budget is None else self.pair_budget.epsilon,
                "structure_score": self.score,
                "score": ("S − cells·b, S = Σ|n(x,y) − n̂·q_a(x)·q_b(y)| against the released 1-way "
                          "tables q (released first; sensitivity m)" if self.score == "margins"
                          else "InDif − cells·b (sensitivity 4m)")
                         + " (permute-and-flip; a 'no edge' candidate scores 0)"}


def _forest_edges(pairs: Sequence[tuple[int, int]], d: int) -> int:
    """Size of a spanning forest of the graph ``pairs`` on ``d`` columns."""
    root = list(range(d))

    def find(x: int) -> int:
        while root[x] != x:
            root[x] = root[root[x]]
            x = root[x]
        return x

    edges = 0
    for a, b in pairs:
        ra, rb = find(a), find(b)
        if ra != rb:
            root[ra], edges = rb, edges + 1
    return edges


def forest_resolves(rows: float, step_epsilon: float, candidates: int, *,
                    max_contributions: int = 1,
                    min_dependence: float = FOREST_MIN_DEPENDENCE,
                    score_sensitivity: float = INDIF_SENSITIVITY) -> bool:
    """Whether one forest step can single out a strongly dependent pair (issue 18, H35):
    ``rows·δ*·ε_step/(2·Δ) ≥ ln(K + 1)`` with ``Δ = 4m`` (:func:`indif_score`), ``K``
    affordable pairs and the 'no edge' candidate.

    A pair whose InDif exceeds every other candidate's by ``rows·δ*`` (``δ*`` =
    :data:`FOREST_MIN_DEPENDENCE`, an L1 distance between the pair's joint and the product of
    its margins) then gets at least the weight ``e^{ε_step·rows·δ*/(2Δ)} ≥ K + 1`` of all
    ``K + 1`` candidates at uniform (exponential-mechanism weights; McKenna & Sheldon 2020 show
    permute-and-flip is never worse in expected score). Below it the steps are near-uniform over
    weak pairs and the forest's 20% of ε is better spent on the 1-way tables: German credit
    (21 columns, affordable pairs of 4–8 cells at 600–1,000 rows) lost to independent marginals
    on TVD1/2/3 with the forest (docs/privbayes.md "Model size from n̂·ε"). A pure function of
    public values (``rows`` public or a DP count: post-processing); spends nothing.
    ``score_sensitivity``: the score's per-record Δ (InDif's 4; :func:`margin_score`'s 1, whose
    steps resolve as well with a quarter of the ε).
    """
    if candidates < 1 or not step_epsilon > 0:
        return False
    resolution = (max(float(rows), 0.0) * float(min_dependence) * float(step_epsilon)
                  / (2 * score_sensitivity * max_contributions))
    return resolution >= math.log(candidates + 1)


def plan_forest(rows: float, epsilon: float, shape: Sequence[int], *, max_contributions: int = 1,
                one_way_fraction: float = FOREST_ONE_WAY_FRACTION,
                structure_fraction: float = FOREST_STRUCTURE_FRACTION,
                theta: float = FOREST_THETA,
                max_family_cells: int = MAX_FAMILY_CELLS,
                min_dependence: float | None = FOREST_MIN_DEPENDENCE,
                score: str = FOREST_SCORE) -> ForestPlan:
    """Size the small-input model from public values only (``rows`` public or a DP count).

    ``ε`` is split into ``one_way_fraction`` (every column's 1-way table), ``structure_fraction``
    (the edge steps) and the rest (the edges' 2-way tables). With ``r`` edges sharing the pair
    budget evenly, a pair is affordable when its table is θ-useful,
    ``rows·(ε_pairs/r)/(m·cells) ≥ theta`` (PrivBayes §4.4's usefulness per table, the rule of
    :func:`network_usefulness` for one declared pair); ``steps`` is the largest ``r ≤ d−1``
    whose affordable pairs hold a forest of ``r`` edges (0: no pair is affordable, the model is
    the independent one and gets the whole ε on its 1-way tables). The forest also needs steps
    that resolve a pair of dependence ``min_dependence`` among the affordable ones
    (:func:`forest_resolves`; ``None`` skips the check); else ``steps = 0`` (the independent
    model with the whole ε) and ``affordable_steps`` keeps ``r``.

    ``score`` (:data:`FOREST_SCORES`): with ``"margins"`` the steps score pairs by
    :func:`margin_score` against the released 1-way tables (sensitivity ``m`` instead of InDif's
    ``4m``): the same resolution (``ε_step/Δ``, which :func:`forest_resolves` checks at InDif's
    ``Δ``) then costs a quarter of ``structure_fraction``, and the other three quarters are added to
    the 1-way tables' budget (issue 18, H102). The steps and the pair budget are the same.
    """
    if score not in FOREST_SCORES:
        raise ValueError(f"score ({score!r}) must be one of {FOREST_SCORES}")
    shape = [int(c) for c in shape]
    d, m = len(shape), int(max_contributions)
    eps_s, eps_1 = epsilon * structure_fraction, epsilon * one_way_fraction
    eps_2 = epsilon - eps_s - eps_1
    pairs = list(itertools.combinations(range(d), 2))

    def cap(r: int) -> int:
        return int(min(max(float(rows), 0.0) * eps_2 / r / (m * theta), max_family_cells))

    steps = 0
    for r in range(d - 1, 0, -1):
        if _forest_edges([(a, b) for a, b in pairs if shape[a] * shape[b] <= cap(r)], d) >= r:
            steps = r
            break
    affordable = sum(1 for a, b in pairs if steps and shape[a] * shape[b] <= cap(steps))
    if steps == 0 or (min_dependence is not None and not forest_resolves(
            rows, eps_s / steps, affordable, max_contributions=m, min_dependence=min_dependence)):
        return ForestPlan(0, 0, None, PureDP(epsilon=float(epsilon)), None, m, float(rows), theta,
                          affordable_steps=steps, score=score)
    if score == "margins":  # the same resolution ε_step/Δ at Δ = m: a quarter of the share
        eps_s, eps_1 = (eps_s * MARGIN_SCORE_SENSITIVITY / INDIF_SENSITIVITY,
                        eps_1 + eps_s * (1 - MARGIN_SCORE_SENSITIVITY / INDIF_SENSITIVITY))
    return ForestPlan(steps, cap(steps), PureDP(epsilon=eps_s), PureDP(epsilon=eps_1),
                      PureDP(epsilon=eps_2), m, float(rows), theta, affordable_steps=steps,
                      score=score)


def margin_score(joint: np.ndarray, margin_a: np.ndarray, margin_b: np.ndarray,
                 rows: float) -> float:
    """``S = Σ |n(x,y) − rows·q_a(x)·q_b(y)|``: the pair's distance from the product of its
    columns' **released** 1-way distributions ``q_a``, ``q_b`` (Norm-Sub'd noisy tables) at the
    public or DP row count ``rows`` (issue 18, H102).

    The reference ``rows·q_a ⊗ q_b`` is a function of released values only, so adding or removing
    one record moves one cell of ``n`` by 1 and ``S`` by at most 1
    (:data:`MARGIN_SCORE_SENSITIVITY`; ``m`` for a unit of ``m`` records), where InDif, whose
    reference is the data's own margins, moves by up to 4 (:func:`indif_score`). Noise in ``q``
    adds about ``rows·(‖q_a − p_a‖₁ + ‖q_b − p_b‖₁)`` to every pair of those columns; it is small
    against the dependence a step must resolve (``rows·δ*``, :data:`FOREST_MIN_DEPENDENCE`)."""
    t = np.asarray(joint, dtype=np.float64)
    if t.ndim != 2:
        raise ValueError(f"joint must be a 2-d table, got shape {t.shape}")
    ref = float(rows) * np.outer(np.asarray(margin_a, dtype=np.float64),
                                 np.asarray(margin_b, dtype=np.float64))
    if ref.shape != t.shape:
        raise ValueError(f"margins {ref.shape} do not match the table {t.shape}")
    return float(np.abs(t - ref).sum())


def choose_forest(tables: dict[tuple[int, ...], np.ndarray], shape: Sequence[int], *,
                  plan: ForestPlan, rs: RandomSource,
                  margins: dict[int, np.ndarray] | None = None) -> list[tuple[int, tuple[int, ...]]]:
    """Private forest over the affordable pairs (the small-input model's structure).

    ``plan.steps`` steps; each picks by permute-and-flip (``plan.step_epsilon``, sensitivity
    ``4m``: :func:`indif_score`) one pair joining two trees of the forest so far, scored
    ``InDif(a, b) − cells(a, b)·b`` (``b`` = :attr:`ForestPlan.pair_scale`, data-independent), or
    the 'no edge' candidate of score 0 (a constant: it adds no sensitivity). Each step is
    ``step_epsilon``-DP, the structure ``steps·step_epsilon``-DP by sequential composition (the
    candidate set of a step depends only on earlier outputs). The forest is oriented from its
    lowest-numbered column of each tree (post-processing). Returns ``[(column, parents), ...]``
    in sampling order.

    ``plan.score == "margins"`` (H102): ``margins`` maps every column to its released 1-way
    distribution and a pair scores ``margin_score(n_ab, q_a, q_b, plan.rows) − cells·b`` with
    sensitivity ``m`` (:attr:`ForestPlan.score_sensitivity`); the 1-way tables are released
    before this step (sequential composition, adaptively: Dwork & Roth 2014 §3.5).
    """
    d = len(shape)
    cands = [(a, b) for a, b in itertools.combinations(range(d), 2)
             if shape[a] * shape[b] <= plan.max_pair_cells]
    if plan.score == "margins":
        if margins is None:
            raise ValueError("a 'margins' forest scores against the released 1-way tables: "
                             "pass margins")
        raw = {p: margin_score(_family_table(tables, p), margins[p[0]], margins[p[1]], plan.rows)
               for p in cands}
    else:
        raw = {p: indif_score(_family_table(tables, p)) for p in cands}
    scores = {p: raw[p] - family_cells(shape, p) * plan.pair_scale for p in cands}
    root = list(range(d))

    def find(x: int) -> int:
        while root[x] != x:
            x = root[x]
        return x

    edges: list[tuple[int, int]] = []
    for step in range(plan.steps):
        open_pairs = [p for p in cands if find(p[0]) != find(p[1])]
        if not open_pairs:
            break
        pick = permute_and_flip(rs.child("edge", step),
                                np.asarray([scores[p] for p in open_pairs] + [0.0]),
                                epsilon=plan.step_epsilon, sensitivity=plan.score_sensitivity)
        if pick < len(open_pairs):
            a, b = open_pairs[pick]
            edges.append((a, b))
            root[find(a)] = find(b)
    adjacent: dict[int, list[int]] = {c: [] for c in range(d)}
    for a, b in edges:
        adjacent[a].append(b)
        adjacent[b].append(a)
    seen: set[int] = set()
    order: list[tuple[int, tuple[int, ...]]] = []
    for top in range(d):
        if top in seen:
            continue
        seen.add(top)
        order.append((top, ()))
        queue = [top]
        while queue:
            u = queue.pop(0)
            for v in sorted(adjacent[u]):
                if v not in seen:
                    seen.add(v)
                    order.append((v, (u,)))
                    queue.append(v)
    return order


SPLIT_CELLS_CAP = 10_000  # tables above this many cells earn no larger share of ε
# zCDP network (noise="gaussian"): share of the tables' ρ on every column's own 1-way table
# (privbayes_measure._release_tables; docs/privbayes.md "Twelfth session: explicit 1-way tables")
GAUSSIAN_ONE_WAY_SHARE = 0.2


# pure-ε network: weight of the tables' summed L1 noise against the 1-way margins' in
# split_network_budget (H59, issue 18); None: the √cells split (the release before H59). An A/B
# switch read when the plan is built (PrivBayesPlan.split_table_weight, H67), never on a worker
NETWORK_SPLIT_TABLE_WEIGHT: float | None = 1.0


def split_network_budget(budget: PureDP, specs: Sequence[Sequence[int]], shape: Sequence[int], *,
                         table_weight: float | None = 1.0) -> list[PureDP]:
    """ε over a pure-ε network's released tables (``specs``, each a tuple of columns): the
    √cells split of :func:`split_marginal_budget` moved toward the tables that carry the
    columns' 1-way margins (issue 18, H59).

    A column's 1-way estimate is the inverse-variance mean of its sums over the tables that hold
    it (:func:`~beamsynth.transforms.privbayes_model._one_way_estimates`): a table of ``C``
    cells with discrete Laplace at ``ε_t`` (variance ``∝ 1/ε_t²``) summed to a column of ``c``
    cells has per-cell variance ``∝ (C/c)/ε_t²``. The split minimizes
    ``J₁(ε)/J₁(ε⁰) + w·T₂(ε)/T₂(ε⁰)`` over ``Σ ε_t = ε`` (``ε⁰``: the √cells split), where
    ``J₁ = Σ_c c·(Σ_{t∋c} ε_t²·c/C_t)^{-1/2}`` is the columns' summed 1-way L1 noise (up to a
    constant) and ``T₂ = Σ_t C_t/ε_t`` the tables' (√cells minimizes ``T₂`` alone, Lagrange);
    ``w`` = ``table_weight`` (default 1, the default of :data:`NETWORK_SPLIT_TABLE_WEIGHT`,
    which only the plan reads; ``None``: the √cells split; the argument is never replaced by the
    module's switch here, so a measuring step on a worker splits as planned, H78). Cells are
    capped at :data:`SPLIT_CELLS_CAP` as in the √cells split. Why: the √cells split leaves a
    small table that is its column's only source (ACS's DVET × HOUSING_TYPE, 21 cells) a small
    ε, so that column's margin is several times noisier than independent marginals'
    (docs/privbayes.md "Fourteenth session: TVD1 against independent"). Solved by L-BFGS-B over
    softmax weights from ``ε⁰`` (deterministic); the result is normalized so that the ε_t add
    up to ``budget.epsilon`` (sequential composition). A function of the chosen
    structure (a released, private choice) and the declared shape only: post-processing,
    spends nothing beyond ``budget``."""
    weight = table_weight
    specs = [tuple(int(c) for c in s) for s in specs]
    cells = np.minimum([float(math.prod(int(shape[c]) for c in s)) for s in specs], SPLIT_CELLS_CAP)
    base = split_marginal_budget(budget, cells)
    if weight is None or len(specs) < 2 or all(len(s) < 2 for s in specs):
        return base
    columns = sorted({c for s in specs for c in s})
    k = np.minimum([float(shape[c]) for c in columns], SPLIT_CELLS_CAP)
    # a[c, t] = c/C_t: the precision of column c's sums from table t per unit ε_t²
    a = np.zeros((len(columns), len(specs)))
    for t, s in enumerate(specs):
        for c in s:
            a[columns.index(c), t] = k[columns.index(c)] / cells[t]
    total = float(budget.epsilon)
    e0 = np.asarray([b.epsilon for b in base]) / total

    def parts(e: np.ndarray) -> tuple[float, np.ndarray, float, np.ndarray]:
        prec = a @ (e * e)
        j1 = float(np.sum(k / np.sqrt(prec)))
        g1 = -e * (a.T @ (k * prec ** -1.5))
        return j1, g1, float(np.sum(cells / e)), -cells / (e * e)

    j0, _, t0, _ = parts(e0)

    def objective(z: np.ndarray) -> tuple[float, np.ndarray]:
        w = np.exp(z - z.max())
        e = w / w.sum()
        j1, g1, t2, g2 = parts(e)
        g = g1 / j0 + weight * g2 / t0
        return j1 / j0 + weight * t2 / t0, e * (g - float(e @ g))

    from scipy.optimize import minimize  # a runtime dependency (pyproject), loaded where used

    z = minimize(objective, np.log(e0), jac=True, method="L-BFGS-B").x
    w = np.exp(z - z.max())
    return [PureDP(epsilon=total * u / SPLIT_GRID) for u in _grid_shares(w / w.sum())]


# The optimized shares are rounded to multiples of 1/SPLIT_GRID (2⁻²⁰ of ε): the iterative solver's
# last bits can differ between machines (BLAS kernels, libm), and a recomputed measurement must
# draw with the same scales (privacy rule 4); a difference far below the grid almost never crosses
# a grid boundary. The cost is at most 2⁻²⁰·ε per table.
SPLIT_GRID = 1 << 20


def _grid_shares(shares: np.ndarray) -> list[int]:
    """``shares`` (positive, summing to ~1) as whole grid units summing to exactly
    :data:`SPLIT_GRID`: floors, at least 1 each, the rest to the largest remainders (ties: the
    earlier table)."""
    raw = np.asarray(shares, dtype=np.float64) * SPLIT_GRID
    units = [max(1, int(math.floor(r))) for r in raw]
    rest = SPLIT_GRID - sum(units)
    order = sorted(range(len(units)), key=lambda i: (-(raw[i] - math.floor(raw[i])), i))
    step = 1 if rest >= 0 else -1
    i = 0
    while rest != 0:
        j = order[i % len(order)]
        if step > 0 or units[j] > 1:
            units[j] += step
            rest -= step
        i += 1
    return units


def split_marginal_budget(budget: PureDP, cells: Sequence[int]) -> list[PureDP]:
    """ε_i ∝ √min(cells_i, 10⁴): ``√cells`` minimizes the expected total L1 noise
    Σ cells_i·m/ε_i for Σ ε_i = ε (Lagrange); the cap (:data:`SPLIT_CELLS_CAP`) stops one huge
    declared table (a parentless column with a 10⁶-value declared range) from taking nearly all
    of ε from the small tables that carry the correlations: beyond ~10⁴ cells a table's noise
    swamps any realistic count per cell whatever its share. No Adult table chosen at ε ≤ 5 is that
    large, so the split there is unchanged. Depends only on the chosen structure and the declared
    shape."""
    w = np.sqrt(np.minimum(np.asarray(cells, dtype=np.float64), SPLIT_CELLS_CAP))
    w = w / w.sum()
    return [PureDP(epsilon=float(budget.epsilon * wi)) for wi in w]
