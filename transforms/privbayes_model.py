"""PrivBayes fit and sampling (post-processing only): released tables → a network that samples rows.

* :func:`make_consistent` — the released tables made to agree on shared 1-way marginals
  (inverse-variance weighted means and a least-squares projection, PriView, Qardaji et al. 2014
  §4.2), then non-negativity with the total kept
  (:func:`~beamsynth.transforms.consistency.norm_sub`, PrivSyn's Norm-Sub);
* :func:`_one_way_estimates`, :func:`_with_margins` — each column's inverse-variance weighted
  1-way estimate and every table given those margins by IPF (issue 18; :data:`ONE_WAY_ESTIMATE`
  is the benchmarks' A/B switch, set it on this module before the plan is built: the plan carries
  it to the workers, ``PrivBayesPlan.one_way_estimate``, H78);
* :func:`conditional_from_table` — ``P(X | Π)`` shrunk toward ``P(X)`` in parent cells of little
  mass; :func:`_fit_network` and :func:`fit_privbayes` — the network, wrapped with a refinement
  in :class:`~beamsynth.transforms.refine.RefinedModel`;
* :class:`PrivBayesModel` — ancestral sampling, ``"balanced"`` (systematic within each parent
  cell, :func:`balanced_uniforms`) or ``"iid"``.

Shapes: :class:`~beamsynth.transforms.privbayes_measure.PrivBayesMeasurement` (structure +
``NoisyMarginal`` tables) → :class:`PrivBayesModel` or ``RefinedModel``; ``sample_codes(n, rs)``
→ int64 codes of shape ``(n, columns)``. Beam-free.

Privacy: reads only released values (noisy tables, their public scales and the declared shape),
so all of it is post-processing and spends nothing. Sampling draws come from
:class:`~beamsynth.transforms.noise.RandomSource` streams labelled by column and are not
privacy-critical.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from beamsynth.transforms.consistency import norm_sub
from beamsynth.transforms.measure import NoisyMarginal
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.privbayes_structure import marginalize
from beamsynth.transforms.refine import RakeTarget, RefinedModel, _ipf_margins, smoothed_proportions
from beamsynth.transforms.synthesis import SynthesisModel

if TYPE_CHECKING:  # annotations only
    from beamsynth.transforms.privbayes_measure import PrivBayesMeasurement

__all__ = [
    "DEFAULT_SAMPLING",
    "DEFAULT_SHRINK",
    "PrivBayesModel",
    "SAMPLING_MODES",
    "balanced_uniforms",
    "conditional_from_table",
    "fit_privbayes",
    "make_consistent",
]

DEFAULT_SHRINK = 0.1
SAMPLING_MODES = ("balanced", "iid")
DEFAULT_SAMPLING = "balanced"


# -- post-processing: consistency, non-negativity, conditionals ----------------------------------
def make_consistent(marginals: Sequence[NoisyMarginal], rounds: int = 3) -> list[np.ndarray]:
    """Tables made to agree on every shared column's 1-way marginal (post-processing).

    For each column in two or more tables, the 1-way estimate is the inverse-variance weighted
    mean of the tables' sums (a table of ``C`` cells summed to a column of ``c`` cells has
    per-cell variance ``(C/c)·var``); each table is then moved by the least-squares projection
    onto that constraint (the difference spread evenly over the summed cells). Repeated
    ``rounds`` times for overlapping constraints. Totals are made equal the same way.
    """
    tables = [m.values.astype(np.float64).copy() for m in marginals]
    var = [max(m.variance, 1e-12) for m in marginals]
    cols = [list(m.columns) for m in marginals]
    all_cols = sorted({c for cs in cols for c in cs})
    for _ in range(rounds):
        # totals
        w = np.array([1.0 / (var[i] * tables[i].size) for i in range(len(tables))])
        totals = np.array([t.sum() for t in tables])
        target = float((w * totals).sum() / w.sum())
        for i, t in enumerate(tables):
            t += (target - totals[i]) / t.size
        for c in all_cols:
            holders = [i for i, cs in enumerate(cols) if c in cs]
            if len(holders) < 2:
                continue
            sums, weights = [], []
            for i in holders:
                s = marginalize(tables[i], cols[i], [c])
                spread = tables[i].size / s.size
                sums.append(s)
                weights.append(1.0 / (var[i] * spread))
            est = sum(wi * si for wi, si in zip(weights, sums)) / sum(weights)
            for i, s in zip(holders, sums):
                axis = cols[i].index(c)
                spread = tables[i].size / s.size
                shape = [1] * tables[i].ndim
                shape[axis] = s.size
                tables[i] += ((est - s) / spread).reshape(shape)
    return tables


def conditional_from_table(table: np.ndarray, prior: np.ndarray, strength: float) -> np.ndarray:
    """``P(X | Π)`` rows from a non-negative table ``[x, π...]`` (post-processing).

    Row ``π`` is ``(T[·, π] + strength·prior) / (T[π] + strength)``: parent cells with little
    (noisy) mass fall back on the child's marginal ``prior`` instead of on noise. Returns an
    array ``[π_flat, x]`` of probability rows.
    """
    t = np.asarray(table, dtype=np.float64)
    cx = t.shape[0]
    rows = t.reshape(cx, -1).T
    prior = np.asarray(prior, dtype=np.float64)
    prior = prior / prior.sum() if prior.sum() > 0 else np.full(cx, 1.0 / cx)
    out = rows + strength * prior[None, :]
    sums = out.sum(axis=1, keepdims=True)
    zero = sums[:, 0] <= 0
    out[zero] = 1.0 / cx
    sums[zero] = 1.0
    return out / sums


def balanced_uniforms(groups: np.ndarray, rs: RandomSource) -> np.ndarray:
    """Stratified uniforms: row ``i`` in a group of ``n_g`` rows gets ``(r_i + U_g)/n_g``, where
    ``r_i`` is a uniformly random rank within the group and ``U_g ~ U[0, 1)`` one offset per group.

    Each value is marginally ``U[0, 1)``; inverted through a CDF, a group of ``n_g`` rows receives
    every category ``c`` exactly ``⌊n_g p_c⌋`` or ``⌈n_g p_c⌉`` times (systematic sampling), and
    which rows get which value is a uniformly random assignment (independent of everything but
    the group). Post-processing randomness only.
    """
    g = np.asarray(groups, dtype=np.int64).ravel()
    n = g.size
    if n == 0:
        return np.zeros(0)
    order = np.lexsort((rs.child("order").uniform(n), g))
    sorted_g = g[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_g)) + 1]
    sizes = np.diff(np.r_[starts, n])
    which = np.repeat(np.arange(starts.size), sizes)
    offsets = rs.child("offset").uniform(starts.size)
    u = np.empty(n)
    u[order] = (np.arange(n) - starts[which] + offsets[which]) / sizes[which]
    return u


def _invert_cdf_rows(cdf: np.ndarray, rows: np.ndarray, u: np.ndarray) -> np.ndarray:
    """``min(#{j : cdf[rows[i], j] ≤ u[i]}, K−1)`` for every ``i`` without an ``n × K`` array.

    One ``searchsorted`` over the rows laid end to end, row ``r`` shifted by ``r`` (its values lie
    in ``[r, r+1]``), so memory is ``O(n + R·K)`` whatever the domain size ``K`` (a declared
    integer column can have millions of cells). Exact for the single-row case; with ``R`` parent
    cells the shift costs ``log2(R)`` bits of the uniform's 53 (post-processing only).
    """
    k = cdf.shape[1]
    if cdf.shape[0] == 1:
        idx = np.searchsorted(cdf[0], u, side="right")
    else:
        r = np.asarray(rows, dtype=np.int64)
        flat = (cdf + np.arange(cdf.shape[0], dtype=np.float64)[:, None]).ravel()
        idx = np.searchsorted(flat, r + u, side="right") - r * k
    return np.clip(idx, 0, k - 1)


class PrivBayesModel(SynthesisModel):
    """Bayesian network ``Π_i P(X_i | Π_i)`` sampled ancestrally (post-processing only).

    ``sampling``: ``"balanced"`` (default; systematic sampling of each child within each parent
    cell, :func:`balanced_uniforms`) or ``"iid"`` (independent uniforms per row).
    """

    def __init__(self, shape: Sequence[int], structure: Sequence[tuple[int, tuple[int, ...]]],
                 conditionals: Sequence[np.ndarray], names: Sequence[str] | None = None,
                 *, sampling: str = DEFAULT_SAMPLING) -> None:
        if sampling not in SAMPLING_MODES:
            raise ValueError(f"sampling ({sampling!r}) must be one of {SAMPLING_MODES}")
        self._sampling = sampling
        self._shape = tuple(int(s) for s in shape)
        self._structure = [(int(x), tuple(int(p) for p in ps)) for x, ps in structure]
        if sorted(x for x, _ in self._structure) != list(range(len(self._shape))):
            raise ValueError(f"structure must place every column once, got {self._structure}")
        self._cdfs = []
        for (x, ps), cond in zip(self._structure, conditionals):
            rows = math.prod(self._shape[p] for p in ps)
            if cond.shape != (rows, self._shape[x]):
                raise ValueError(f"conditional of column {x} has shape {cond.shape}, "
                                 f"expected {(rows, self._shape[x])}")
            cdf = np.cumsum(cond, axis=1)
            cdf[:, -1] = 1.0
            self._cdfs.append(cdf)
        self._names = list(names) if names is not None else None

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def structure(self) -> list[tuple[int, tuple[int, ...]]]:
        """``(column, parents)`` in sampling order."""
        return list(self._structure)

    def conditional(self, column: int) -> np.ndarray:
        """``P(column | parents)`` as ``[parent cell, value]`` probability rows."""
        for (x, _), cdf in zip(self._structure, self._cdfs):
            if x == column:
                return np.diff(cdf, axis=1, prepend=0.0)
        raise KeyError(column)

    def sample_codes(self, n: int, rs: RandomSource) -> np.ndarray:
        out = np.zeros((n, len(self._shape)), dtype=np.int64)
        for (x, ps), cdf in zip(self._structure, self._cdfs):
            if ps:
                pidx = np.ravel_multi_index(tuple(out[:, p] for p in ps), [self._shape[p] for p in ps])
            else:
                pidx = np.zeros(n, dtype=np.int64)
            if self._sampling == "balanced":
                u = balanced_uniforms(pidx, rs.child("balanced", x))
            else:
                u = rs.child("column", x).uniform(n)
            out[:, x] = _invert_cdf_rows(cdf, pidx, u)
        return out

    def describe(self) -> dict[str, Any]:
        name = (lambda c: self._names[c]) if self._names else (lambda c: c)
        return {"model": "PrivBayes network", "sampling": self._sampling,
                "structure": [[name(x), [name(p) for p in ps]] for x, ps in self._structure]}


NETWORK_TARGET_MAX_CELLS = 100_000  # network tables above this size are not raking targets


def _fit_network(measurement: PrivBayesMeasurement, shape: Sequence[int],
                 names: Sequence[str] | None, shrink: float, sampling: str, *,
                 one_way_estimate: str = "mean") -> tuple[PrivBayesModel, list[RakeTarget]]:
    """:func:`_fit_network_margins` without the 1-way estimates (the measuring step's pool)."""
    return _fit_network_margins(measurement, shape, names, shrink, sampling,
                                one_way_estimate=one_way_estimate)[:2]


def _fit_network_margins(measurement: PrivBayesMeasurement, shape: Sequence[int],
                         names: Sequence[str] | None, shrink: float, sampling: str,
                         coarse: Sequence[NoisyMarginal] = (), whole_only: bool = False,
                         alive: bool = False, one_way_estimate: str = "mean",
                         ) -> tuple[PrivBayesModel, list[RakeTarget], dict[int, np.ndarray]]:
    """The network from released tables only, those tables (consistent, non-negative) as
    raking targets for the refinement (multi-column tables of at most
    :data:`NETWORK_TARGET_MAX_CELLS` cells), and every column's 1-way estimate (the mean of
    its sums over the non-negative tables that hold it; with ``coarse``, the refinement's
    released coarse pairs, its group totals combined with theirs: :func:`combine_coarse_margins`).
    ``one_way_estimate`` (one of :data:`ONE_WAY_ESTIMATES`, the plan's): ``"mean"`` or
    ``"first"`` (the first holder's sums, no IPF: the release before issue 18)."""
    ms = list(measurement.marginals)
    tables = make_consistent(ms)
    total = max(float(np.mean([t.sum() for t in tables])), 0.0)
    tables = [norm_sub(t, total) for t in tables]
    one_way = _one_way_estimates(ms, tables, estimate=one_way_estimate)
    if coarse and alive:
        one_way, precision = _one_way_alive(ms, tables)
        one_way = combine_coarse_margins(one_way, ms, coarse, precision=precision)
    elif coarse:
        one_way = combine_coarse_margins(one_way, ms, coarse, whole_only=whole_only)
    if one_way_estimate == "mean":
        tables = [_with_margins(t, m.columns, one_way) if len(m.columns) > 1 else one_way[m.columns[0]]
                  for m, t in zip(ms, tables)]
    conditionals = []
    for x, ps in measurement.structure:
        i = next(j for j, m in enumerate(ms) if m.columns == (x, *ps)) if ps else None
        if i is None:
            prior = one_way[x]
            conditionals.append((prior / prior.sum() if prior.sum() > 0
                                 else np.full(shape[x], 1.0 / shape[x]))[None, :])
            continue
        strength = shrink * shape[x] * ms[i].scale
        conditionals.append(conditional_from_table(tables[i], one_way[x], strength))
    network = PrivBayesModel(shape, measurement.structure, conditionals, names, sampling=sampling)
    targets = [RakeTarget(tuple(m.columns), tuple(np.arange(int(shape[c])) for c in m.columns),
                          smoothed_proportions(t))
               for m, t in zip(ms, tables)
               if len(m.columns) > 1 and t.size <= NETWORK_TARGET_MAX_CELLS and t.sum() > 0]
    return network, targets, one_way


# A/B switch for benchmarks: "first" = the first holder's sums, no IPF (before issue 18). Read when
# the plan is built (plan_privbayes: PrivBayesPlan.one_way_estimate) and carried to the measuring
# and Fit steps; never read on a worker (sixteenth session, H78)
ONE_WAY_ESTIMATES = ("mean", "first")
ONE_WAY_ESTIMATE = "mean"
MARGIN_SWEEPS = 50


def _with_margins(table: np.ndarray, columns: Sequence[int], one_way: dict[int, np.ndarray],
                  sweeps: int = MARGIN_SWEEPS) -> np.ndarray:
    """``table`` (non-negative, over ``columns``) given the 1-way margins ``one_way[c]`` by
    iterative proportional fitting (post-processing). Empty cells stay empty unless a margin
    needs mass where the whole slice is empty; there the slice gets the product of the other
    margins."""
    t = np.asarray(table, dtype=np.float64).copy()
    total = float(t.sum())
    if total <= 0:
        return t
    targets = []
    for axis, c in enumerate(columns):
        m = np.clip(np.asarray(one_way[c], dtype=np.float64), 0.0, None)
        targets.append(m * total / m.sum() if m.sum() > 0 else t.sum(
            axis=tuple(a for a in range(t.ndim) if a != axis)))
    # a slice with target mass but no table mass: seed it with the independence product
    seed = np.ones(())
    for m in targets:
        seed = np.multiply.outer(seed, m / total) if seed.ndim else m / total
    t = np.where(t > 0, t, 1e-6 * total * seed)
    for _ in range(sweeps):
        for axis, m in enumerate(targets):
            others = tuple(a for a in range(t.ndim) if a != axis)
            cur = t.sum(axis=others)
            shape = [1] * t.ndim
            shape[axis] = m.size
            t *= np.where(cur > 0, m / np.maximum(cur, 1e-300), 0.0).reshape(shape)
    return t


def _one_way_estimates(ms: Sequence[NoisyMarginal], tables: Sequence[np.ndarray], *,
                       estimate: str = "mean") -> dict[int, np.ndarray]:
    """Each column's 1-way estimate from the consistent, non-negative tables (post-processing):
    the mean of its sums over every table that holds it, weighted by the inverse noise variance
    of the sum (a table of ``C`` cells with per-cell variance ``v`` summed to ``c`` cells:
    ``v·C/c`` per cell; public: scales and declared sizes). The tables agree on it before
    Norm-Sub (:func:`make_consistent`); Norm-Sub then moves each table's sums differently, and
    their mean is closer to the truth than any one of them (docs/privbayes.md, issue 18).
    ``estimate="first"``: the first holder's sums (the A/B switch's other arm)."""
    sums: dict[int, list[tuple[float, np.ndarray]]] = {}
    for m, t in zip(ms, tables):
        for c in m.columns:
            s = marginalize(t, m.columns, [c])
            sums.setdefault(c, []).append((s.size / (max(m.variance, 1e-12) * t.size), s))
    if estimate == "first":
        return {c: v[0][1] for c, v in sums.items()}
    return {c: sum(w * s for w, s in v) / sum(w for w, _ in v) for c, v in sums.items()}


def _one_way_alive(ms: Sequence[NoisyMarginal], tables: Sequence[np.ndarray],
                   ) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """:func:`_one_way_estimates` with per-cell weights that count only the cells Norm-Sub kept:
    a cell ``x`` of a column summed from a non-negative table over ``k_x`` positive cells has
    noise variance about ``v·max(k_x, 1)`` (the zeroed cells carry no noise). Returns the
    estimates and their per-cell precisions. Released values only (post-processing)."""
    acc: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    for m, t in zip(ms, tables):
        alive = (np.asarray(t) > 0).astype(np.float64)
        for c in m.columns:
            s = marginalize(t, m.columns, [c])
            k = np.maximum(marginalize(alive, m.columns, [c]), 1.0)
            acc.setdefault(c, []).append((1.0 / (max(m.variance, 1e-12) * k), s))
    est = {c: sum(w * s for w, s in v) / sum(w for w, _ in v) for c, v in acc.items()}
    return est, {c: sum(w for w, _ in v) for c, v in acc.items()}


def _fine_precision(ms: Sequence[NoisyMarginal]) -> dict[int, float]:
    """Each column's summed inverse per-cell variance over the tables that hold it (public:
    scales and declared sizes): the precision of :func:`_one_way_estimates`' mean per cell."""
    out: dict[int, float] = {}
    for m in ms:
        cells = math.prod(int(s) for s in m.shape)
        for axis, c in enumerate(m.columns):
            out[c] = out.get(c, 0.0) + int(m.shape[axis]) / (max(m.variance, 1e-12) * cells)
    return out


def combine_coarse_margins(one_way: dict[int, np.ndarray], ms: Sequence[NoisyMarginal],
                           coarse: Sequence[NoisyMarginal], *,
                           whole_only: bool = False,
                           precision: dict[int, Any] | None = None) -> dict[int, np.ndarray]:
    """Every column's 1-way estimate given the information of the refinement's released coarse
    pairs too (issue 18, H69; post-processing).

    A coarse pair over ``(a, b)`` with groupings ``g_a``, ``g_b`` (cell → group, in its
    ``meta["groups"]``) summed over ``b`` estimates ``a``'s group totals with per-group variance
    ``v·cells/groups_a`` (``v`` its per-cell noise variance). For each column and grouping, the
    group totals ``M_g`` of the network estimate (per-cell precision ``W`` from
    :func:`_fine_precision`, so variance ``n_g/W`` for a group of ``n_g`` cells) and the
    inverse-variance mean ``z̄_g`` of the coarse sums (precision ``U``) are combined by inverse
    variance, ``T_g = (W·M_g/n_g + U·z̄_g)/(W/n_g + U)``, clipped at 0, and the group's cells are
    rescaled to it (the fine profile within a group is the network's; a group the estimate left
    empty gets ``T_g`` spread evenly). A column of at most ``groups`` cells is its own grouping,
    so there every cell is combined; ``whole_only`` keeps only those. Groupings are handled one
    after the other. ``precision``: per-column per-cell precisions of ``one_way`` (arrays, e.g.
    :func:`_one_way_alive`'s) in place of :func:`_fine_precision`'s. Reads only
    released tables, their public scales and the declared shape: post-processing (Dwork & Roth
    2014, Prop. 2.1), no spend, no draw."""
    prec = _fine_precision(ms) if precision is None else precision
    by_column: dict[int, dict[tuple[int, ...], list[tuple[np.ndarray, float]]]] = {}
    for r in coarse:
        groups = r.meta.get("groups") if r.meta else None
        if groups is None or len(r.columns) != 2:
            continue
        t = np.asarray(r.values, dtype=np.float64)
        for axis, c in enumerate(r.columns):
            z = t.sum(axis=1 - axis)
            var = max(r.variance, 1e-12) * t.size / z.size
            by_column.setdefault(c, {}).setdefault(tuple(int(g) for g in groups[axis]), []).append((z, var))
    out = {c: np.asarray(v, dtype=np.float64).copy() for c, v in one_way.items()}
    for c, groupings in by_column.items():
        if c not in out or c not in prec:
            continue
        est = out[c]
        for key, sums in groupings.items():
            g = np.asarray(key, dtype=np.int64)
            if g.size != est.size or (whole_only and int(g.max()) + 1 < g.size):
                continue
            n_g = np.bincount(g, minlength=int(g.max()) + 1).astype(np.float64)
            big_m = np.bincount(g, weights=est, minlength=n_g.size)
            u = sum(1.0 / v for _, v in sums)
            z_bar = sum(z / v for z, v in sums) / u
            cell_var = 1.0 / np.broadcast_to(np.asarray(prec[c], dtype=np.float64), est.shape)
            w = 1.0 / np.bincount(g, weights=cell_var, minlength=n_g.size)  # 1 / Var(M_g)
            target = np.clip((w * big_m + u * z_bar) / (w + u), 0.0, None)
            ratio = np.where(big_m > 0, target / np.maximum(big_m, 1e-300), 0.0)
            est = np.where(big_m[g] > 0, est * ratio[g], (target / n_g)[g])
        out[c] = est
    return out


def fit_privbayes(
    measurement: PrivBayesMeasurement, shape: Sequence[int], names: Sequence[str] | None = None,
    *, shrink: float = DEFAULT_SHRINK, sampling: str = DEFAULT_SAMPLING,
    refine_margins: str = "alive", one_way_estimate: str = "mean", rake_end_on_margins: bool = True,
) -> PrivBayesModel | RefinedModel:
    """Fit the network from released tables only: consistency → Norm-Sub → shrunk conditionals;
    with a refinement, the network wrapped in a :class:`~beamsynth.transforms.refine.RefinedModel`
    that rakes it to the network's own multi-column tables and then to the refinement's targets
    (keeping the network's tables as targets: Adult ε = 1, 12 paired seeds, TVD2/TVD3 −0.0006 /
    −0.0009, better in 10 / 12 of them).

    ``shrink`` multiplies the fallback strength ``c_X · b`` (about the noise mass one row of the
    conditional carries) used by :func:`conditional_from_table`. ``sampling`` is passed to
    :class:`PrivBayesModel`, or with a refinement to the
    :class:`~beamsynth.transforms.refine.RefinedModel` (``"balanced"``: pair-balanced rows from
    the raked pool; ``"iid"``: independent draws from it), whose pool the network draws i.i.d.
    (Adult ε = 1, 14 seeds: same TVD2/TVD3 as a balanced pool, without its per-column sort).

    ``refine_margins`` (one of :data:`REFINE_MARGINS_MODES`, default ``"alive"``; in the
    pipeline the plan's ``refine_margins``): which of the refinement's released pure-ε coarse
    pairs also feed each column's 1-way estimate (:func:`combine_coarse_margins`), after which
    the refinement's targets are re-fitted to the new margins; ``"off"`` is the release before
    H69. ``one_way_estimate`` (:data:`ONE_WAY_ESTIMATES`) and ``rake_end_on_margins`` (the
    refined model's raking, :func:`~beamsynth.transforms.refine.rake_weights`): the plan's
    ``one_way_estimate`` and ``refine.rake_end_on_margins`` in the pipeline. Every choice is an
    argument with a fixed default, never a module global read here: the Fit step runs on
    workers, which see their own fresh modules (H78). Post-processing either way.
    """
    if sampling not in SAMPLING_MODES:
        raise ValueError(f"sampling ({sampling!r}) must be one of {SAMPLING_MODES}")
    if refine_margins not in REFINE_MARGINS_MODES:
        raise ValueError(f"refine_margins ({refine_margins!r}) must be one of {REFINE_MARGINS_MODES}")
    if one_way_estimate not in ONE_WAY_ESTIMATES:
        raise ValueError(f"one_way_estimate ({one_way_estimate!r}) must be one of {ONE_WAY_ESTIMATES}")
    if measurement.refinement is None or not measurement.refinement.targets:
        return _fit_network(measurement, shape, names, shrink, sampling,
                            one_way_estimate=one_way_estimate)[0]
    # refined: the network only feeds the raked pool, which the refined model samples itself
    # (``sampling`` applies there); i.i.d. pool draws are as good and cost no per-column sort
    mode = refine_margins
    # pure-ε refinement tables only: the zCDP plans (explicit 1-way tables) were not measured
    coarse = [] if mode == "off" else [t for t in measurement.refinement.tables
                                       if t.noise == "discrete Laplace"]
    network, targets, one_way = _fit_network_margins(measurement, shape, names, shrink, "iid",
                                                     coarse, whole_only=mode == "whole",
                                                     alive=mode == "alive",
                                                     one_way_estimate=one_way_estimate)
    refined = list(measurement.refinement.targets)
    if coarse:  # the coarse targets given the combined margins' group totals (post-processing)
        refined = [_target_on_margins(t, one_way) for t in refined]
    return RefinedModel(network, [*targets, *refined], names=names,
                        base_targets=len(targets), sampling=sampling,
                        end_on_margins=rake_end_on_margins)


# Which of the refinement's released coarse pairs feed the network's 1-way estimates (issue 18,
# H69; :func:`combine_coarse_margins`): "off" none (the release before H69), "whole" the columns
# a coarse pair keeps whole (at most ``groups`` declared cells), "all" every column's group totals,
# "alive" as "all" with the network's sums weighted by the cells Norm-Sub kept (_one_way_alive).
# Default "alive" since the fifteenth session (lead, from H69's paired runs: TVD1/2/3 lower or
# level on every input measured); the plan carries it to the workers (refine_margins), read
# from DEFAULT_REFINE_MARGINS when the plan is built (fit_privbayes' own default is "alive").
REFINE_MARGINS_MODES = ("off", "whole", "all", "alive")
DEFAULT_REFINE_MARGINS = "alive"


def _target_on_margins(target: RakeTarget, one_way: dict[int, np.ndarray]) -> RakeTarget:
    """A 2-column coarse target re-fitted (IPF) to the grouped 1-way estimates, which
    :func:`combine_coarse_margins` moved after the target was made (post-processing)."""
    if len(target.columns) != 2:
        return target
    margins = []
    for c, g, size in zip(target.columns, target.groups, target.proportions.shape):
        p = np.clip(np.asarray(one_way[c], dtype=np.float64), 0.0, None)
        p = p / p.sum() if p.sum() > 0 else np.full(p.size, 1.0 / p.size)
        margins.append(np.bincount(np.asarray(g, dtype=np.int64), weights=p, minlength=int(size)))
    prop = _ipf_margins(target.proportions, margins[0], margins[1])
    s = prop.sum()
    return RakeTarget(target.columns, target.groups, prop / s if s > 0 else target.proportions)
