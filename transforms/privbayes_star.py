"""PrivBayes' small-input model for a declared prediction target: a star around it (issue 18, H41).

Where no network is θ-useful (``k = 0``, :mod:`~beamsynth.transforms.privbayes_sizing`) a
label-agnostic model cannot know which of the few affordable pairs an evaluator needs; German
credit (700–800 rows) got AUC ≈ 0.5 from every model of that kind. With a **declared target**
``T`` (public, like the domains: the column the user will train models to predict; schema key
``target``, CLI ``--target``, API ``options={"target": ...}``) the model is a star:

* :func:`plan_star` — from public values only (``n̂`` public or a DP count, ε, declared shape):
  the columns ``X`` whose ``X × T`` table is θ-useful, ``n̂·ε_X/(m·cells_X) ≥`` :data:`STAR_THETA`,
  with ``ε_X ∝ √cells`` over the full star (every column's ``X × T`` table); those get a star edge,
  every other column its 1-way table;
* :func:`measure_star` — every released table (the star's ``X × T`` tables, the other columns'
  1-way tables) with discrete Laplace, ``ε_i ∝ √cells_i`` (:func:`split_marginal_budget`), L1 Δ = m
  per table; the structure ``T`` then ``X | T`` (naive-Bayes shape), fitted by
  :func:`~beamsynth.transforms.privbayes_model.fit_privbayes` (``T``'s margin from all star tables).

Shapes: public numbers in, a frozen :class:`StarPlan` out; :func:`measure_star` reads the exact
candidate counts (``dict[tuple[int, ...], np.ndarray]``) inside the measurement step and returns a
:class:`~beamsynth.transforms.privbayes_measure.PrivBayesMeasurement`-shaped tuple. Beam-free.

Privacy (add/remove one privacy unit of at most ``m`` records): no selection — the star's columns
are a function of public values (post-processing of the DP count at run time); each released
table is a count table of L1 sensitivity ``m``, discrete Laplace of scale ``m/ε_i``
(PrivBayes §4.2, add/remove counts; Canonne, Kamath & Steinke 2020 for the exact sampler), and
``Σ ε_i = ε`` by sequential composition: pure ε-DP (under a zCDP plan the model chosen from the
DP count is pure ``ε − ε_c``, as the forest, docs/privbayes.md "zCDP").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from beamsynth.transforms.budget import PureDP
from beamsynth.transforms.measure import NoisyMarginal, noisy_marginals
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.privbayes_sizing import split_marginal_budget
from beamsynth.transforms.privbayes_structure import _family_table

__all__ = ["STAR_THETA", "StarPlan", "plan_star", "star_specs", "measure_star", "resolve_target",
           "star_wording"]

STAR_THETA = 3.0  # usefulness an X × T table needs for a star edge (docs/privbayes.md, H41)


@dataclass(frozen=True)
class StarPlan:
    """The star around the declared target ``target``: ``columns`` get an ``X × T`` table, the
    other columns (not the target) a 1-way table; ``budget`` is the whole model ε, split ∝ √cells
    over those tables. Data-independent (from n̂, ε, the declared shape and target)."""

    target: int
    columns: tuple[int, ...]
    budget: PureDP
    max_contributions: int = 1
    rows: float = 0.0
    theta: float = STAR_THETA
    names: tuple[str, ...] | None = None  # the declared column names (public), for the manifest

    def details(self, names: Sequence[str] | None = None) -> dict[str, Any]:
        """Manifest details (public: the declared target and the rule's choice): columns by
        name (``names`` or the plan's own), the target's index too."""
        names = names if names is not None else self.names
        name = (lambda c: names[c]) if names is not None else (lambda c: c)
        return {"model": "star around the declared target: T then X | T (X × T tables) for the "
                         "columns whose X × T table is θ-useful, 1-way tables for the rest",
                "target": name(self.target), "target_index": self.target,
                "star_columns": [name(c) for c in self.columns],
                "theta": self.theta, "epsilon": self.budget.epsilon,
                "rule": "n̂·ε_X/(m·cells_X) >= theta with ε_X ∝ √cells over every column's "
                        "X × T table",
                "split": "ε_i ∝ √cells_i over the released tables (split_marginal_budget)",
                "sensitivity_per_table": self.max_contributions}


def star_wording(target: str | int | None) -> str:
    """The manifest's words for the star around ``target`` (its declared name, or its index)."""
    return (f"the star around the declared target {target!r} (T then X | T for every X whose "
            "X × T table is θ-useful at n̂, 1-way tables for the rest)")


def resolve_target(target: Any, names: Sequence[str]) -> int | None:
    """The declared target's column index (``None``: no target); a name not among the declared
    columns, or the only column, is a ``ValueError`` echoing it."""
    if target is None or target == "":
        return None
    if isinstance(target, bool) or not isinstance(target, str):
        raise TypeError(f"target ({target!r}) must be a declared column name")
    if target not in names:
        raise ValueError(f"target ({target!r}) is not a declared column; declared: {list(names)}")
    if len(names) < 2:
        raise ValueError(f"target ({target!r}) needs at least one other declared column")
    return list(names).index(target)


def plan_star(rows: float, epsilon: float, shape: Sequence[int], target: int, *,
              max_contributions: int = 1, theta: float = STAR_THETA,
              names: Sequence[str] | None = None) -> StarPlan:
    """The star's columns from public values only (``rows`` public or a DP count).

    Column ``X ≠ T`` gets a star edge when its ``X × T`` table is θ-useful under the full star's
    √cells split: ``rows·ε_X/(m·c_X) ≥ theta`` with ``c_X = |X|·|T|`` and
    ``ε_X = ε·√c_X/Σ_Y √c_Y`` (PrivBayes §4.4's usefulness per table). ``columns`` may be empty
    (then the caller keeps its label-agnostic model). A pure function of public values;
    ``names`` (the declared column names) only label the manifest's details."""
    shape = [int(c) for c in shape]
    m, t = int(max_contributions), int(target)
    others = [c for c in range(len(shape)) if c != t]
    cells = np.asarray([shape[x] * shape[t] for x in others], dtype=np.float64)
    share = float(epsilon) * np.sqrt(cells) / np.sqrt(cells).sum() if others else cells
    useful = max(float(rows), 0.0) * share / (m * cells) if others else cells
    columns = tuple(x for x, u in zip(others, useful) if u >= theta)
    return StarPlan(t, columns, PureDP(epsilon=float(epsilon)), m, float(rows), float(theta),
                    None if names is None else tuple(names))


def star_specs(plan: StarPlan, d: int) -> tuple[list[tuple[int, tuple[int, ...]]],
                                                list[tuple[int, ...]]]:
    """``(structure, specs)``: ``T`` first, then each star column given ``T``, then the others;
    the released tables (each star column's ``(X, T)``, each other column's ``(X,)``)."""
    t = plan.target
    rest = [c for c in range(d) if c != t and c not in plan.columns]
    structure = [(t, ())] + [(x, (t,)) for x in plan.columns] + [(c, ()) for c in rest]
    specs = [(x, t) for x in plan.columns] + [(c,) for c in rest]
    return structure, specs


def measure_star(tables: dict[tuple[int, ...], np.ndarray], shape: Sequence[int],
                 names: Sequence[str], plan: StarPlan, rs: RandomSource
                 ) -> tuple[tuple[tuple[int, tuple[int, ...]], ...], tuple[NoisyMarginal, ...]]:
    """The star's released tables (discrete Laplace, ``ε_i ∝ √cells_i`` of ``plan.budget``,
    L1 Δ = m each: sequential composition gives ``plan.budget``) and its structure."""
    structure, specs = star_specs(plan, len(shape))
    exact = [_family_table(tables, s) for s in specs]
    budgets = split_marginal_budget(plan.budget, [t.size for t in exact])
    released = noisy_marginals(exact, specs=specs, names=names, budgets=budgets,
                               sensitivity=float(plan.max_contributions), rs=rs.child("star"))
    return tuple((x, tuple(p)) for x, p in structure), released
