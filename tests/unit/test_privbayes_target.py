"""PrivBayes' declared prediction target (issue 18, H41): the small-input star, its choice from
public values, its exact spends in both noise modes, and the schema key."""

from __future__ import annotations

import math

import numpy as np
import pytest

from beamsynth.schemas.schema import SchemaError, load_schema
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant, PureDP
from beamsynth.transforms.measure import count_marginals
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.privbayes import DPPrivBayes, candidate_families, measure_privbayes
from beamsynth.transforms.privbayes_star import STAR_THETA, plan_star, resolve_target

SIZES = [4, 11, 5, 11, 15, 5, 5, 4, 5, 3, 4, 4, 11, 3, 3, 4, 4, 2, 2, 2, 2]  # German credit


def _schema(target=None):
    cols = [{"name": f"c{i}", "type": "categorical",
             "domain": {"kind": "categorical", "values": [str(v) for v in range(s)]}}
            for i, s in enumerate(SIZES)]
    spec = {"name": "g", "columns": cols}
    if target is not None:
        spec["target"] = target
    return load_schema(spec)


def test_star_columns_follow_the_public_rule():
    # usefulness n·ε_X/(m·c_X) with ε_X ∝ √c_X over every X × T table; T = the last column (2)
    t, rows, eps = len(SIZES) - 1, 800, 1.0
    cells = [s * 2 for s in SIZES[:-1]]
    root = sum(math.sqrt(c) for c in cells)
    want = tuple(x for x, c in enumerate(cells) if rows * eps * math.sqrt(c) / root / c >= STAR_THETA)
    plan = plan_star(rows, eps, SIZES, t)
    assert plan.columns == want and 0 < len(want) < len(cells)
    assert SIZES.index(11) not in plan.columns  # 22-cell tables are not θ-useful at 800 rows
    assert plan.budget.epsilon == eps
    # monotone in n·ε, empty when nothing is useful, everything at large n
    assert set(plan_star(400, eps, SIZES, t).columns) < set(want)
    assert plan_star(50, eps, SIZES, t).columns == ()
    assert len(plan_star(10_000, eps, SIZES, t).columns) == len(cells)
    assert plan_star(800, eps, SIZES, t, max_contributions=2).columns == plan_star(400, eps, SIZES, t).columns


def test_resolve_target_echoes_the_bad_value():
    assert resolve_target(None, ["a", "b"]) is None
    assert resolve_target("b", ["a", "b"]) == 1
    with pytest.raises(ValueError, match="'z'.*declared"):
        resolve_target("z", ["a", "b"])
    with pytest.raises(TypeError, match="3"):
        resolve_target(3, ["a", "b"])


def _spends(acc):
    return {s.step: (s.budget.epsilon, s.budget.delta) for s in acc.spends}


@pytest.mark.parametrize("rows", [800, None])
@pytest.mark.parametrize("noise,delta", [("laplace", 0.0), ("gaussian", 1e-9)])
def test_exact_spends(rows, noise, delta):
    acc = PrivacyAccountant(total=ApproxDP(epsilon=1.0, delta=delta))
    pb = DPPrivBayes(schema=_schema(), budget=ApproxDP(epsilon=1.0, delta=delta), sizing="auto",
                     rows=rows, noise=noise, target="c20", accountant=acc, seed=1)
    spends = _spends(acc)
    assert math.isclose(sum(e for e, _ in spends.values()), 1.0, rel_tol=1e-12)
    if rows is not None:  # public rows: the star is the plan, pure ε in both modes, one spend
        assert pb.plan.star is not None and pb.plan.zcdp is None
        assert spends == {"privbayes.marginals": (1.0, 0.0)}
    else:  # the DP count: (ε_c, 0) then the planned network's spends
        assert pb.plan.target == 20 and pb.plan.star is None
        assert spends["privbayes.size_count"] == (pytest.approx(0.02), 0.0)
    # the measurement spends exactly the model's ε on the star's tables
    rng = np.random.default_rng(0)
    codes = np.stack([rng.integers(0, s, 800) for s in SIZES], axis=1)
    shape = tuple(SIZES)
    fams = candidate_families(len(shape), pb.plan.degree, shape=shape,
                              max_family_cells=pb.plan.max_family_cells)
    counts = [t.reshape([shape[c] for c in f]) for t, f in zip(count_marginals(codes, fams, shape), fams)]
    m = measure_privbayes(counts, fams, shape=shape, names=_schema().names, plan=pb.plan,
                          rs=RandomSource(seed=3))
    model_eps = 1.0 if rows is not None else 1.0 - 0.02
    assert math.isclose(sum(t.budget.epsilon for t in m.marginals), model_eps, rel_tol=1e-9)
    assert all(t.sensitivity == 1.0 and t.budget.delta == 0 for t in m.marginals)
    assert m.structure[0] == (20, ())
    star = [x for x, ps in m.structure if ps == (20,)]
    assert star and {t.columns for t in m.marginals} == (
        {(x, 20) for x in star} | {(c,) for c in range(20) if c not in star})
    if rows is None:
        assert m.sizing["degree"] == 0 and m.sizing["star_columns"] == len(star)


def test_without_target_nothing_changes():
    for rows in (800, None):
        a = DPPrivBayes(schema=_schema(), budget=PureDP(epsilon=1.0), sizing="auto", rows=rows)
        b = DPPrivBayes(schema=_schema(), budget=PureDP(epsilon=1.0), sizing="auto", rows=rows,
                        target=None)
        assert a.plan == b.plan and a.plan.target is None and a.plan.star is None
    # a large input keeps its network: the target is not used there
    big = DPPrivBayes(schema=_schema(), budget=PureDP(epsilon=1.0), sizing="auto", rows=10**6,
                      target="c20")
    assert big.plan.star is None and big.plan.degree >= 1
    with pytest.raises(ValueError, match="sizing='auto'"):
        DPPrivBayes(schema=_schema(), budget=PureDP(epsilon=1.0), target="c20")


def test_schema_target_key():
    assert _schema("c20").target == "c20"
    assert _schema().to_spec() == {k: v for k, v in _schema("c20").to_spec().items() if k != "target"}
    assert "target" not in _schema().to_spec()
    with pytest.raises(SchemaError, match="'income'"):
        _schema("income")
    assert _schema("c20").select(["c0", "c1"]).target is None
