"""The small-input forest runs only where its selection resolves a strong pair (issue 18, H35).

German credit (700–1,000 rows) lost to independent marginals with the forest: its affordable pairs
are 4–6 cells, its structure steps near-uniform. ``plan_forest`` now falls back to the √cells
independent model with the whole ε unless ``n̂·δ*·ε_step/(2·4m) ≥ ln(K + 1)``."""

import itertools
import math
from pathlib import Path

import pytest

import beamsynth.transforms
from beamsynth.schemas.schema import load_schema
from beamsynth.transforms.budget import PrivacyAccountant, PureDP
from beamsynth.transforms.privbayes import plan_privbayes, spend_privbayes
from beamsynth.transforms.privbayes_sizing import (
    FOREST_MIN_DEPENDENCE,
    forest_resolves,
    plan_forest,
)
from beamsynth.transforms.privbayes_structure import INDIF_SENSITIVITY

ADULT_SHAPE = (14, 9, 14, 16, 16, 7, 15, 6, 5, 2, 12, 10, 14, 42, 2)
PUMS_SHAPE = (13, 2, 17, 7, 11, 2)  # benchmarks/schemas/pums_small.yaml
GERMAN_SHAPE = (4, 11, 5, 11, 15, 5, 5, 4, 5, 3, 4, 4, 11, 3, 3, 4, 4, 2, 2, 2, 2)
COMPAS_SHAPE = (2, 12, 3, 6, 5, 5, 5, 11, 3, 9, 10, 4, 10, 4, 2)  # benchmarks/schemas/compas.yaml


SCHEMAS = Path(beamsynth.transforms.__file__).resolve().parents[1] / "benchmarks" / "schemas"


def test_declared_shapes_match_the_benchmark_schemas():
    assert load_schema(str(SCHEMAS / "german.yaml")).shape == GERMAN_SHAPE
    assert load_schema(str(SCHEMAS / "compas.yaml")).shape == COMPAS_SHAPE


def test_resolution_rule_and_its_boundary():
    # n̂·δ*·ε_step/(2·4m) ≥ ln(K + 1): K affordable pairs + the 'no edge' candidate
    edge = math.log(6) * 2 * INDIF_SENSITIVITY / (FOREST_MIN_DEPENDENCE * 0.05)  # rows at K = 5
    assert forest_resolves(edge * 1.001, 0.05, 5)
    assert not forest_resolves(edge * 0.999, 0.05, 5)
    assert not forest_resolves(edge * 1.999, 0.05, 5, max_contributions=2)
    assert forest_resolves(edge * 2.001, 0.05, 5, max_contributions=2)
    assert not forest_resolves(edge * 1.001, 0.05, 6)  # more candidates need more rows
    assert not forest_resolves(1e9, 0.0, 5) and not forest_resolves(1e9, 0.05, 0)


@pytest.mark.parametrize("rows", [600, 700, 800, 900, 1000])
@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0])
def test_german_small_inputs_fit_independent_tables(rows, epsilon):
    # affordable pairs of 4–8 cells, r = 1–6 steps: the selection cannot resolve them
    affordable = plan_forest(rows, epsilon, GERMAN_SHAPE, min_dependence=None)
    assert affordable.steps >= 1 and affordable.max_pair_cells <= 8
    plan = plan_forest(rows, epsilon, GERMAN_SHAPE)
    assert plan.steps == 0 and plan.affordable_steps == affordable.steps
    assert plan.one_way_budget.epsilon == pytest.approx(epsilon)
    assert plan.structure_budget is None and plan.pair_budget is None


@pytest.mark.parametrize("shape, rows, epsilon, steps", [
    (ADULT_SHAPE, 1000, 0.5, 1), (ADULT_SHAPE, 1000, 1.0, 2), (ADULT_SHAPE, 1000, 2.0, 3),
    (ADULT_SHAPE, 5000, 0.5, 4), (ADULT_SHAPE, 5000, 1.0, 6),
    (PUMS_SHAPE, 1000, 0.5, 1), (PUMS_SHAPE, 1000, 1.0, 1),
    (COMPAS_SHAPE, 700, 1.0, 2), (COMPAS_SHAPE, 1000, 1.0, 3),
])
def test_the_forest_is_kept_where_it_resolves(shape, rows, epsilon, steps):
    plan = plan_forest(rows, epsilon, shape)
    assert plan.steps == plan.affordable_steps == steps
    k = sum(1 for a, b in itertools.combinations(range(len(shape)), 2)
            if shape[a] * shape[b] <= plan.max_pair_cells)
    assert forest_resolves(rows, plan.step_epsilon, k,
                           score_sensitivity=plan.score_sensitivity)  # "margins": Δ = 1 (H102)


@pytest.mark.parametrize("shape, rows, forest", [(GERMAN_SHAPE, 700, False),
                                                 (ADULT_SHAPE, 1000, True)])
def test_each_branch_spends_exactly_epsilon(shape, rows, forest):
    plan = plan_privbayes(shape, PureDP(epsilon=1.0), sizing="auto", rows=rows)
    acc = PrivacyAccountant(total=PureDP(epsilon=1.0))
    spend_privbayes(acc, plan)
    steps = [s.step for s in acc.spends]
    if forest:
        # the 1-way tables are released before the edges are chosen (H102)
        assert steps == ["privbayes.one_way", "privbayes.structure", "privbayes.marginals"]
    else:
        assert plan.forest is None and plan.degree == 0 and steps == ["privbayes.marginals"]
    assert math.isclose(acc.spent_epsilon, 1.0, rel_tol=1e-9)


def test_run_time_decision_from_the_dp_count_spends_the_whole_planned_epsilon():
    import numpy as np

    from beamsynth.transforms.measure import count_marginals
    from beamsynth.transforms.noise import RandomSource
    from beamsynth.transforms.privbayes import candidate_families, measure_privbayes

    plan = plan_privbayes(GERMAN_SHAPE, PureDP(epsilon=1.0), sizing="auto")  # no public rows
    assert plan.forest is None and plan.degree >= 1  # decided in the measurement step
    rng = np.random.default_rng(3)
    codes = np.stack([rng.integers(0, c, 700) for c in GERMAN_SHAPE], axis=1)
    fams = candidate_families(len(GERMAN_SHAPE), plan.degree, shape=GERMAN_SHAPE,
                              max_family_cells=plan.max_family_cells)
    counts = [t.reshape([GERMAN_SHAPE[c] for c in f])
              for t, f in zip(count_marginals(codes, fams, GERMAN_SHAPE), fams)]
    m = measure_privbayes(counts, fams, shape=GERMAN_SHAPE, names=[f"c{i}" for i in range(21)],
                          plan=plan, rs=RandomSource(seed=1))
    assert m.sizing["degree"] == 0 and m.sizing["forest_steps"] == 0
    assert all(len(t.columns) == 1 for t in m.marginals) and len(m.marginals) == 21
    model_eps = 1.0 - plan.sizing.count_budget.epsilon  # the rest is the size count
    assert sum(t.budget.epsilon for t in m.marginals) == pytest.approx(model_eps)
