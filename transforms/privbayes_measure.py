"""PrivBayes measurement: the only step that reads the exact candidate counts.

* :func:`measure_privbayes` — the DP size count (when planned), then the network's structure
  (:func:`~beamsynth.transforms.privbayes_structure.choose_structure`) or, below the θ-useful
  size, the small-input model (``_measure_forest``, ``_measure_independent``); the noisy tables
  (``_release_tables``: discrete Laplace, or discrete Gaussian under a zCDP plan); with
  ``plan.refine``, the refinement rounds on the network fitted from those tables (with the DP
  count, as many pairs as :meth:`~beamsynth.transforms.privbayes_sizing.NetworkSizing.refine_plan`
  chooses from it);
* :class:`PrivBayesMeasureFn` — the DoFn running it on one element per window;
  :class:`PrivBayesMeasurement` — what it releases.

Shapes: ``tuple[np.ndarray, ...]`` (exact counts of every candidate family, one element per
window) → :class:`PrivBayesMeasurement` (structure, ``NoisyMarginal`` tables, refinement tables,
the public size decision).

Privacy (add/remove one privacy unit of at most ``m`` records): spends exactly the plan spent at
build time (:mod:`~beamsynth.transforms.privbayes_plan`): the size count with discrete Laplace,
Δ = m; each structure step with permute-and-flip on InDif, Δ = 4m (PrivBayes Alg. 4, PrivSyn §4,
McKenna & Sheldon 2020); the tables with discrete Laplace, Δ = m, ``ε_t`` by
``split_network_budget`` (√cells moved toward the 1-way margins, H59; PrivBayes §4.2, add/remove
counts), or discrete Gaussian, L2 Δ = m, ``ρ_t ∝ cells^⅔`` (Canonne, Kamath & Steinke 2020);
the refinement as in :mod:`~beamsynth.transforms.refine`. Sequential (or zCDP)
composition gives the plan's total (a zCDP plan's DP size count is pure ε_c and composes with its
(ε − ε_c, δ) by basic composition: every model chosen from it, the forest with pure ε − ε_c
included, is (ε − ε_c, δ)-DP); what follows the noisy tables is post-processing. The
degree and the refinement's number of pairs/rounds chosen from the DP count are post-processing
of it; a larger refinement splits the same planned ε_sel/ε_meas over more picks/tables, so the
total is unchanged. Draws come
from the stream ``(seed, "privbayes", window)``, so a retried bundle redraws identically.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np

from beamsynth.transforms.budget import PureDP, zcdp_approx
from beamsynth.transforms.measure import (
    NoisyMarginal,
    gaussian_marginals,
    noisy_marginals,
    window_labels,
)
from beamsynth.transforms.noise import RandomSource, discrete_laplace, discrete_laplace_scale
from beamsynth.transforms.privbayes_model import DEFAULT_SAMPLING, DEFAULT_SHRINK, _fit_network
from beamsynth.transforms.privbayes_plan import PrivBayesPlan
from beamsynth.transforms.privbayes_sizing import (
    SPLIT_CELLS_CAP,
    ForestPlan,
    choose_forest,
    gaussian_refine_rho,
    split_marginal_budget,
    split_network_budget,
)
from beamsynth.transforms.privbayes_star import measure_star, plan_star
from beamsynth.transforms.privbayes_structure import (
    _family_table,
    choose_structure,
    family_specs,
)
from beamsynth.transforms.refine import RefineMeasurement, measure_refinement
from beamsynth.transforms.synthesis import norm_sub_probabilities

__all__ = [
    "PrivBayesMeasureFn",
    "PrivBayesMeasurement",
    "REFINE_PICK_PREFIX",
    "measure_privbayes",
    "refine_pick_choices",
    "sizing_choices",
]

SIZING_METRICS_NAMESPACE = "beamsynth"


# -- measurement (the only step that reads exact counts) -----------------------------------------
@dataclass(frozen=True)
class PrivBayesMeasurement:
    """What the measurement releases: the private structure and the noisy family tables."""

    structure: tuple[tuple[int, tuple[int, ...]], ...]
    marginals: tuple[NoisyMarginal, ...]
    refinement: RefineMeasurement | None = None
    sizing: dict[str, Any] | None = None  # run-time size decision (DP n̂, degree): public


def measure_privbayes(
    counts: Sequence[np.ndarray],
    families: Sequence[tuple[int, ...]],
    *,
    shape: Sequence[int],
    names: Sequence[str],
    plan: PrivBayesPlan,
    rs: RandomSource,
    ordered: Sequence[bool] | None = None,
    shrink: float = DEFAULT_SHRINK,
    sampling: str = DEFAULT_SAMPLING,
) -> PrivBayesMeasurement:
    """Structure (permute-and-flip) then noisy family tables from exact candidate counts, then
    (``plan.refine``) the refinement rounds of :func:`~beamsynth.transforms.refine.measure_refinement`
    on the network fitted from those tables (``shrink``, ``sampling`` as in :func:`fit_privbayes`;
    ``ordered``: whether each column's declared domain is ordered, default all unordered)."""
    tables = {tuple(f): np.asarray(t) for f, t in zip(families, counts)}
    d = len(shape)
    degree, sizing, refine = plan.degree, None, plan.refine
    if plan.sizing is not None and plan.sizing.count_budget is not None and plan.degree > 0:
        # n̂: the exact count (every family table sums to it) + discrete Laplace, Δ = m
        exact_rows = int(np.asarray(counts[0]).sum()) if len(counts) else 0
        count_scale = discrete_laplace_scale(sensitivity=plan.max_contributions,
                                             epsilon=plan.sizing.count_budget.epsilon)
        rows_hat = exact_rows + int(discrete_laplace(rs.child("size_count"), count_scale, 1)[0])
        degree = plan.sizing.degree(rows_hat)  # post-processing of the DP count
        sizing = {"rows_hat": rows_hat, "degree": degree, "max_degree": plan.degree}
        if degree > 0 and refine is not None:
            # the refinement's size from the same DP count (post-processing; its ε fixed at build
            # time and split over the chosen picks/tables: NetworkSizing.refine_plan)
            refine = plan.sizing.refine_plan(rows_hat, refine)
            sizing.update(refine_pairs=refine.pairs, refine_rounds=refine.rounds)
        if degree == 0:
            # the forest gets ε − ε_c in both modes: the Laplace plan's network ε, or a zCDP
            # plan's pure (ε − ε_c) (its network ε are Laplace-equivalents, not budget; the count
            # composes with the (ε − ε_c, δ) spend by basic composition: gaussian_plan)
            forest_eps = _planned_epsilon(plan) if plan.zcdp is None else plan.zcdp.budget.epsilon
            if plan.target is not None:  # a declared target: its star, same ε (H41)
                star = plan_star(rows_hat, forest_eps, shape, plan.target,
                                 max_contributions=plan.max_contributions)
                if star.columns:
                    return PrivBayesMeasurement(*measure_star(tables, shape, names, star, rs),
                                                sizing={**sizing, "star_columns": len(star.columns)})
            forest = plan.sizing.small_forest(rows_hat, forest_eps)  # plan_forest, or H49's band
            sizing["forest_steps"] = forest.steps
            if forest.steps > 0:
                return _measure_forest(tables, shape, names, forest, rs, sizing)
            return _measure_independent(tables, shape, names, plan, rs, sizing)
    if plan.star is not None:
        return PrivBayesMeasurement(*measure_star(tables, shape, names, plan.star, rs))
    if plan.forest is not None:
        return _measure_forest(tables, shape, names, plan.forest, rs, None)
    # the penalty uses the scale the tables would get if every column had a family (data-independent;
    # a zCDP network's families get 1 − the plan's one_way_share of the tables' ρ: σ × 1/√(1 − share))
    scale = plan.penalty * plan.table_scale(plan.max_tables)
    if plan.zcdp is not None and d > 1 and degree > 0:
        scale /= math.sqrt(1.0 - plan.zcdp.one_way_share)
    # a zCDP refinement cut at run time (H47) gives the dropped pairs' ρ to the tables (sum kept)
    marginal_rho = None if plan.zcdp is None else plan.zcdp.marginal_rho
    if marginal_rho is not None and refine is not None and refine.pairs < plan.refine.pairs:
        marginal_rho += gaussian_refine_rho(plan.refine) - gaussian_refine_rho(refine)
        scale *= math.sqrt(plan.zcdp.marginal_rho / marginal_rho)
    # the target as a parent (H58): the plan's one gate (H78, PrivBayesPlan.target_parent_at:
    # public rows, else this window's DP count; mode and θ_T the plan's, H65), where the counted
    # families are the plan's (a direct caller that counted the label-free ones: no target)
    target, useful = None, math.nan
    if plan.parent_target is not None and _covers(tables, plan.counted_families(shape)):
        target, useful = plan.target_parent_at(None if sizing is None else sizing["rows_hat"])
    if sizing is not None and not math.isnan(useful):
        sizing = {**sizing, "target_parent_usefulness": useful,
                  "target_parent": "required" if target is not None else "off"}
    if d > 1 and degree > 0:
        structure = choose_structure(
            tables, shape, degree=degree, epsilon=plan.step_epsilon,
            sensitivity=plan.score_sensitivity, noise_scale=scale, rs=rs.child("structure"),
            max_family_cells=plan.max_family_cells, exact_degree=plan.exact_degree,
            target=target, target_required=plan.target_required)
    else:
        structure = [(c, ()) for c in range(d)]
    specs = family_specs(structure)
    # zCDP: every column not released as a 1-way table already gets one (after the families)
    one_way = ([] if plan.zcdp is None or plan.zcdp.one_way_share <= 0
               else [(c,) for c in range(d) if (c,) not in specs])
    exact = [_family_table(tables, s) for s in [*specs, *one_way]]
    if plan.zcdp is not None or plan.split_table_weight is None:  # ∝ √cells (zCDP: unused)
        budgets = split_marginal_budget(plan.marginal_budget, [t.size for t in exact])
    else:  # H59, at the weight the plan carries (H67: not the worker's module switch)
        budgets = split_network_budget(plan.marginal_budget, [*specs, *one_way], shape,
                                       table_weight=plan.split_table_weight)
    released = _release_tables(exact, [*specs, *one_way], names, budgets, plan, rs, marginal_rho,
                               one_way=len(one_way))
    measurement = PrivBayesMeasurement(tuple((x, tuple(p)) for x, p in structure), released,
                                       sizing=sizing)
    if refine is None:
        return measurement
    # post-processing: the network (and its tables as targets) from the released tables only
    network, base_targets = _fit_network(measurement, shape, names, shrink, sampling,
                                         one_way_estimate=plan.one_way_estimate)
    total = max(float(np.mean([m.values.sum() for m in released])), 1.0)
    pairs = [(a, b) for a in range(d) for b in range(a + 1, d)
             if any(a in f and b in f for f in tables)]
    refinement = measure_refinement(
        lambda a, b: _family_table(tables, (a, b)), network, total=total,
        ordered=list(ordered) if ordered is not None else [False] * d, names=names,
        plan=refine, rs=rs.child("refine"), candidates=pairs, base_targets=base_targets)
    return PrivBayesMeasurement(measurement.structure, released, refinement, sizing=sizing)


def _covers(tables: dict[tuple[int, ...], np.ndarray], families: Sequence[tuple[int, ...]]) -> bool:
    """Whether every family is a counted table or inside one (its exact counts exist). Where
    k + 1 ≥ d the label-free families are the whole table and cover the target's (H67)."""
    keys = [set(k) for k in tables]
    return all(tuple(f) in tables or any(set(f) <= k for k in keys) for f in families)


def _planned_epsilon(plan: PrivBayesPlan) -> float:
    """The network ε planned at build time: structure + marginals + refinement shares."""
    total = plan.marginal_budget.epsilon
    if plan.structure_budget is not None:
        total += plan.structure_budget.epsilon
    if plan.refine is not None:
        total += plan.refine.selection_budget.epsilon + plan.refine.measure_budget.epsilon
    return total


def _measure_forest(tables: dict[tuple[int, ...], np.ndarray], shape: Sequence[int],
                    names: Sequence[str], forest: ForestPlan, rs: RandomSource,
                    sizing: dict[str, Any] | None) -> PrivBayesMeasurement:
    """The small-input model: the private forest (:func:`choose_forest`), then every column's
    1-way table (``forest.one_way_budget``, ∝ √cells) and each chosen edge's 2-way table
    (``forest.pair_budget``, ∝ √cells; with no edge chosen the 1-way tables get it too), all
    discrete Laplace. Sequential composition: structure + one-way + pairs = the planned ε.

    ``forest.score == "margins"`` (H102): the 1-way tables are released **first** and the
    structure scored against them (:func:`~beamsynth.transforms.privbayes_sizing.margin_score`,
    the tables Norm-Sub'd to distributions: post-processing); then the edges' tables (with no
    edge chosen, a second set of 1-way tables on the pair budget, combined with the first by
    inverse variance in the fit). Each step's choice depends only on earlier releases, so the
    total is still their sum (adaptive sequential composition, Dwork & Roth 2014 §3.5)."""
    d = len(shape)
    cells = [int(shape[c]) for c in range(d)]
    one_way = [(c,) for c in range(d)]
    if forest.score == "margins":
        released = noisy_marginals([_family_table(tables, s) for s in one_way], specs=one_way,
                                   names=names,
                                   budgets=split_marginal_budget(forest.one_way_budget, cells),
                                   sensitivity=float(forest.max_contributions),
                                   rs=rs.child("marginals"))
        margins = dict(enumerate(norm_sub_probabilities(released)))  # released values only
        structure = choose_forest(tables, shape, plan=forest, rs=rs.child("forest"),
                                  margins=margins)
        fams = [(x, *ps) for x, ps in structure if ps]
        specs = fams or one_way  # no edge chosen: the pair budget on a second set of 1-way tables
        exact = [_family_table(tables, s) for s in specs]
        released += noisy_marginals(exact, specs=specs, names=names,
                                    budgets=split_marginal_budget(forest.pair_budget,
                                                                  [t.size for t in exact]),
                                    sensitivity=float(forest.max_contributions),
                                    rs=rs.child("pairs"))
    else:
        structure = choose_forest(tables, shape, plan=forest, rs=rs.child("forest"))
        fams = [(x, *ps) for x, ps in structure if ps]
        specs = one_way + fams
        exact = [_family_table(tables, s) for s in specs]
        if fams:
            budgets = (split_marginal_budget(forest.one_way_budget, cells)
                       + split_marginal_budget(forest.pair_budget, [t.size for t in exact[d:]]))
        else:
            budgets = split_marginal_budget(
                PureDP(epsilon=forest.one_way_budget.epsilon + forest.pair_budget.epsilon), cells)
        released = noisy_marginals(exact, specs=specs, names=names, budgets=budgets,
                                   sensitivity=float(forest.max_contributions),
                                   rs=rs.child("marginals"))
    if sizing is not None:
        sizing = {**sizing, "forest_edges": len(fams)}
    return PrivBayesMeasurement(tuple((x, tuple(p)) for x, p in structure), released,
                                sizing=sizing)


def _measure_independent(tables: dict[tuple[int, ...], np.ndarray], shape: Sequence[int],
                         names: Sequence[str], plan: PrivBayesPlan, rs: RandomSource,
                         sizing: dict[str, Any]) -> PrivBayesMeasurement:
    """The run-time fallback (degree 0): every column's 1-way table, discrete Laplace, with the
    whole network ε planned at build time (structure + marginals + refinement shares; sequential
    composition, nothing left unspent), split ∝ √cells (:func:`split_marginal_budget`); under a
    zCDP plan discrete Gaussian with its whole ρ = zcdp_rho(ε − ε_c, δ), ∝ cells^⅔."""
    total = _planned_epsilon(plan)
    specs = [(c,) for c in range(len(shape))]
    exact = [_family_table(tables, s) for s in specs]
    budgets = split_marginal_budget(PureDP(epsilon=total), [t.size for t in exact])
    # zCDP plan: the whole ρ = zcdp_rho(ε − ε_c, δ) on the 1-way tables
    released = _release_tables(exact, specs, names, budgets, plan, rs,
                               None if plan.zcdp is None else plan.zcdp.spent_rho)
    return PrivBayesMeasurement(tuple((c, ()) for c in range(len(shape))), released, sizing=sizing)


def _release_tables(exact: Sequence[np.ndarray], specs: Sequence[tuple[int, ...]],
                    names: Sequence[str], budgets: Sequence[PureDP], plan: PrivBayesPlan,
                    rs: RandomSource, rho: float | None, one_way: int = 0) -> tuple[NoisyMarginal, ...]:
    """The tables with discrete Laplace at ``budgets`` (pure plan), or, with ``rho`` (zCDP plan),
    discrete Gaussian with ρ split ∝ min(cells, 10⁴)^⅔ (minimizes the expected total L1 noise
    Σ cells_i·σ_i for Σ m²/(2σ_i²) = ρ; cap as :data:`SPLIT_CELLS_CAP`). With ``one_way`` > 0
    (zCDP network) the last ``one_way`` tables are the explicit 1-way tables: they get
    the plan's ``zcdp.one_way_share`` (``privbayes_sizing.GAUSSIAN_ONE_WAY_SHARE`` when built) of
    ``rho`` and the families the rest, each part split ∝
    cells^⅔; zCDP composition: the ρ_i still add up to ``rho``."""
    m = float(plan.max_contributions)
    if rho is None:
        return noisy_marginals(exact, specs=specs, names=names, budgets=budgets, sensitivity=m,
                               rs=rs.child("marginals"))
    w = np.minimum(np.asarray([t.size for t in exact], dtype=np.float64), SPLIT_CELLS_CAP) ** (2 / 3)
    parts = [slice(0, len(exact))] if not one_way else [slice(0, len(exact) - one_way),
                                                        slice(len(exact) - one_way, len(exact))]
    share = 0.0 if plan.zcdp is None else plan.zcdp.one_way_share
    shares = [1.0] if not one_way else [1.0 - share, share]
    rhos = np.zeros(len(exact))
    for part, share in zip(parts, shares):
        rhos[part] = rho * share * w[part] / w[part].sum()
    sigmas = m / np.sqrt(2 * rhos)
    delta = plan.zcdp.budget.delta
    table_budgets = [zcdp_approx(float(r), delta) for r in rhos]
    return gaussian_marginals(exact, specs=specs, names=names, sigmas=sigmas, rhos=rhos,
                              budgets=table_budgets, sensitivity=m, rs=rs.child("marginals"))


REFINE_PICK_PREFIX = "privbayes_refine_pick_"
"""Prefix of a refinement pick's record: ``privbayes_refine_pick_<j>:["col_a", "col_b"]``."""


def refine_pick_choices(measurement: PrivBayesMeasurement) -> tuple[str, ...]:
    """The refinement's picks of one window, in pick order, as record names (Beam counters for
    the CLI, ``(name, 1)`` records for the API/YAML manifests): ``privbayes_refine_pick_<j>:``
    + the JSON list of the pair's declared names. Each pair is a DP output (the refinement's
    selection, :mod:`~beamsynth.transforms.refine`; post-processing to publish), no exact count."""
    if measurement.refinement is None:
        return ()
    return tuple(f"{REFINE_PICK_PREFIX}{j}:{json.dumps(list(t.names))}"
                 for j, t in enumerate(measurement.refinement.tables, 1))


def sizing_choices(sizing: dict[str, Any] | None) -> tuple[str, ...]:
    """The run-time choices of one window's measurement as the names of the Beam counters the CLI
    reads (``privbayes_degree_<k>``; at k = 0 which small-input model ran: ``privbayes_k0_independent``,
    ``privbayes_k0_forest_edges_<e>`` or ``privbayes_k0_star_<c>``; ``privbayes_target_parent_<mode>``,
    ``privbayes_refine_pairs_<p>``). Functions of the DP count n̂, the forest's DP picks and the
    declared plan only (post-processing): no exact count, no data value. ``()``: no run-time sizing."""
    if sizing is None:
        return ()
    out = [f"privbayes_degree_{sizing['degree']}"]
    if sizing["degree"] == 0:  # √cells 1-way tables, or the forest with its chosen edges
        small = ("privbayes_k0_independent" if "forest_edges" not in sizing
                 else f"privbayes_k0_forest_edges_{sizing['forest_edges']}")
        if "star_columns" in sizing:  # the declared target's star (H41)
            small = f"privbayes_k0_star_{sizing['star_columns']}"
        out.append(small)
    if "target_parent" in sizing:  # "useful"/auto's run-time gate (same DP count)
        out.append(f"privbayes_target_parent_{sizing['target_parent']}")
    if "refine_pairs" in sizing:  # the refinement's run-time size (same DP count)
        out.append(f"privbayes_refine_pairs_{sizing['refine_pairs']}")
    return tuple(out)


class PrivBayesMeasureFn(beam.DoFn):
    """Exact candidate counts (one element per window) → :class:`PrivBayesMeasurement`.

    Randomness from ``(seed, "privbayes", window)``, never worker or arrival order.
    """

    def __init__(self, *, families: Sequence[tuple[int, ...]], shape: Sequence[int],
                 names: Sequence[str], plan: PrivBayesPlan, seed: int | None,
                 ordered: Sequence[bool] | None = None, shrink: float = DEFAULT_SHRINK,
                 sampling: str = DEFAULT_SAMPLING) -> None:
        self._families = [tuple(f) for f in families]
        self._shape, self._names = tuple(shape), tuple(names)
        self._plan, self._seed = plan, seed
        self._ordered = None if ordered is None else tuple(bool(o) for o in ordered)
        self._shrink, self._sampling = float(shrink), sampling

    def process(self, counts, window=beam.DoFn.WindowParam):
        rs = RandomSource(seed=self._seed).child("privbayes", *window_labels(window))
        out = measure_privbayes(counts, self._families, shape=self._shape, names=self._names,
                                plan=self._plan, rs=rs, ordered=self._ordered,
                                shrink=self._shrink, sampling=self._sampling)
        for name in sizing_choices(out.sizing):  # the run-time size decision (DP n̂): public
            beam.metrics.Metrics.counter(SIZING_METRICS_NAMESPACE, name).inc()
        for name in refine_pick_choices(out):  # the refinement's DP picks: public
            beam.metrics.Metrics.counter(SIZING_METRICS_NAMESPACE, name).inc()
        yield out
