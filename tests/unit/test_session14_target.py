"""A declared target in a k ≥ 1 PrivBayes network (issue 18, H58): the network is rooted at the
target and each column may take it as a parent beside its up to k chosen parents (the candidate
families hold the ``(X, T, P)`` triples), from declared facts only; no target: plans, families and
draws unchanged."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import numpy as np
import pytest

from beamsynth.transforms import privbayes_plan as pbp
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant, PureDP
from beamsynth.transforms.measure import count_marginals
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.privbayes import (
    candidate_families,
    choose_structure,
    gaussian_plan,
    measure_privbayes,
    plan_privbayes,
    spend_privbayes,
)

SHAPE = (6, 5, 4, 7, 3, 5, 2)  # the last column is the target
T = len(SHAPE) - 1


def _codes(n: int, seed: int = 0) -> np.ndarray:
    """Every column predicts T a little (T = a noisy vote of the columns), c1 follows c0."""
    rng = np.random.default_rng(seed)
    codes = np.stack([rng.integers(0, c, n) for c in SHAPE], axis=1)
    codes[:, 1] = codes[:, 0] % SHAPE[1]
    vote = sum((codes[:, c] * 2 >= SHAPE[c]).astype(int) for c in range(T))
    codes[:, T] = np.where(rng.random(n) < 0.8, (vote * 2 >= T).astype(int), rng.integers(0, 2, n))
    return codes


def _counts(shape, fams, codes):
    return [c.reshape([shape[i] for i in f]) for c, f in zip(count_marginals(codes, fams, shape), fams)]


def test_families_hold_every_triple_with_the_target():
    fams = candidate_families(len(SHAPE), 1, shape=SHAPE, max_family_cells=10**6, target=T)
    for x, p in itertools.permutations(range(T), 2):
        assert any({x, p, T} <= set(f) for f in fams), (x, p)
    for a, b in itertools.combinations(range(len(SHAPE)), 2):  # every pair (the refinement's)
        assert any({a, b} <= set(f) for f in fams), (a, b)
    # no target (or degree 0): the label-free list, unchanged
    assert candidate_families(len(SHAPE), 1, shape=SHAPE, max_family_cells=10**6) == list(
        itertools.combinations(range(len(SHAPE)), 2))
    assert candidate_families(len(SHAPE), 0, shape=SHAPE, max_family_cells=10**6, target=T) == [
        (c,) for c in range(len(SHAPE))]
    # a triple over the cell limit is not counted; its pairs still are
    small = candidate_families(len(SHAPE), 1, shape=SHAPE, max_family_cells=60, target=T)
    assert all(math.prod(SHAPE[c] for c in f) <= 60 for f in small)
    assert (0, 3, T) not in small and any({0, 3} <= set(f) for f in small)


@pytest.mark.parametrize("required", [False, True])
def test_the_target_is_the_root_and_a_parent(required):
    codes = _codes(20_000)
    fams = candidate_families(len(SHAPE), 1, shape=SHAPE, max_family_cells=10**6, target=T)
    tables = {tuple(f): t for f, t in zip(fams, _counts(SHAPE, fams, codes))}
    structure = choose_structure(tables, SHAPE, degree=1, epsilon=5.0, sensitivity=4.0,
                                 noise_scale=0.5, rs=RandomSource(seed=1), target=T,
                                 target_required=required)
    assert structure[0] == (T, ())
    assert sorted(x for x, _ in structure) == list(range(len(SHAPE)))
    for _, ps in structure[1:]:
        assert len([p for p in ps if p != T]) <= 1 and list(ps) == sorted(ps)
    with_t = [x for x, ps in structure if T in ps]
    if required:
        assert len(with_t) == T
    else:  # strong dependence and a small penalty: the target pays off for most columns
        assert len(with_t) >= T - 2, structure


def test_no_target_structure_is_unchanged():
    codes = _codes(5_000)
    fams = candidate_families(len(SHAPE), 1, shape=SHAPE, max_family_cells=10**6)
    tables = {tuple(f): t for f, t in zip(fams, _counts(SHAPE, fams, codes))}
    kw = dict(degree=1, epsilon=1.0, sensitivity=4.0, noise_scale=2.0)
    a = choose_structure(tables, SHAPE, rs=RandomSource(seed=2), **kw)
    b = choose_structure(tables, SHAPE, rs=RandomSource(seed=2), target=None, **kw)
    assert a == b


@pytest.mark.parametrize("rows", [None, 200_000])
@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
@pytest.mark.parametrize("mode", ["optional", "required"])
def test_plan_keeps_the_target_for_the_network(monkeypatch, rows, noise, mode):
    monkeypatch.setattr(pbp, "TARGET_PARENT", mode)
    budget = ApproxDP(epsilon=2.0, delta=1e-9 if noise == "gaussian" else 0.0)

    def plan(target):
        p = plan_privbayes(SHAPE, budget, sizing="auto", rows=rows, target=target,
                           names=[f"c{i}" for i in range(len(SHAPE))])
        return gaussian_plan(p, budget) if noise == "gaussian" else p

    with_t, without = plan(T), plan(None)
    assert with_t.degree >= 1 and with_t.parent_target == T and without.parent_target is None
    assert with_t.target_required == (mode == "required")
    assert "tree-augmented" in with_t.details()["target"]["use"]
    # the spends are the network's, target or not
    spends = []
    for p in (with_t, without):
        acc = PrivacyAccountant(total=budget)
        spend_privbayes(acc, p)
        spends.append([(s.step, s.budget.epsilon, s.budget.delta) for s in acc.spends])
    assert spends[0] == spends[1]
    monkeypatch.setattr(pbp, "TARGET_PARENT", "off")  # the default: the label-free network
    off = plan(T)
    assert off.parent_target is None and (off.target is None) == (rows is not None)
    assert rows is not None or "does not use it" in off.details()["target"]["use"]
    monkeypatch.setattr(pbp, "TARGET_PARENT", "sometimes")
    with pytest.raises(ValueError, match="'sometimes'"):
        plan(T)


@pytest.mark.parametrize("mode", ["optional", "required"])
def test_measurement_uses_the_target_and_spends_the_plan(monkeypatch, mode):
    monkeypatch.setattr(pbp, "TARGET_PARENT", mode)
    budget = PureDP(epsilon=2.0)
    plan = plan_privbayes(SHAPE, budget, sizing="auto", rows=None, target=T, degree=1,
                          refine_pairs=0)  # no refinement: the test stays fast
    fams = candidate_families(len(SHAPE), plan.degree, shape=SHAPE,
                              max_family_cells=plan.max_family_cells, target=plan.parent_target)
    out = measure_privbayes(_counts(SHAPE, fams, _codes(30_000)), fams, shape=SHAPE,
                            names=[f"c{i}" for i in range(len(SHAPE))], plan=plan,
                            rs=RandomSource(seed=4))
    assert out.sizing["degree"] == 1 and out.structure[0] == (T, ())
    assert sum(T in ps for _, ps in out.structure) == (T if mode == "required" else
                                                        sum(T in ps for _, ps in out.structure))
    assert sum(T in ps for _, ps in out.structure) >= 1
    assert {m.columns for m in out.marginals} >= {(x, *ps) for x, ps in out.structure if ps}
    assert math.isclose(sum(m.budget.epsilon for m in out.marginals),
                        plan.marginal_budget.epsilon, rel_tol=1e-9)
    # families counted without the triples (an old caller): the label-free network, no error
    plain = candidate_families(len(SHAPE), plan.degree, shape=SHAPE,
                               max_family_cells=plan.max_family_cells)
    old = measure_privbayes(_counts(SHAPE, plain, _codes(30_000)), plain, shape=SHAPE,
                            names=[f"c{i}" for i in range(len(SHAPE))], plan=plan,
                            rs=RandomSource(seed=4))
    assert all(len(ps) <= 1 for _, ps in old.structure)


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_spend_details_name_the_target_parent(monkeypatch, noise):
    monkeypatch.setattr(pbp, "TARGET_PARENT", "required")
    budget = ApproxDP(epsilon=2.0, delta=1e-9 if noise == "gaussian" else 0.0)
    plan = plan_privbayes(SHAPE, budget, sizing="auto", target=T,
                          names=[f"c{i}" for i in range(len(SHAPE))])
    if noise == "gaussian":
        plan = gaussian_plan(plan, budget)
    acc = PrivacyAccountant(total=budget)
    spend_privbayes(acc, plan)
    spends = {s["step"]: s for s in acc.to_dict()["spends"]}
    d = (spends["privbayes.structure"]["details"] if noise == "laplace"
         else spends["privbayes.zcdp"]["details"]["parts"]["structure"])
    assert d["target_parent"]["column"] == f"c{T}" and d["target_parent"]["mode"] == "required"
    monkeypatch.setattr(pbp, "TARGET_PARENT", "off")
    acc = PrivacyAccountant(total=budget)
    plan = plan_privbayes(SHAPE, budget, sizing="auto", target=T)
    spend_privbayes(acc, gaussian_plan(plan, budget) if noise == "gaussian" else plan)
    assert "target_parent" not in json.dumps(acc.to_dict())


def test_useful_mode_gates_the_target_on_the_triples_usefulness(monkeypatch):
    """``"useful"``: the target a parent of every column where rows·ε_m/(m·Σ_X |X|·|T|·c̄) ≥ θ_T
    (from the DP count here), else the label-free network (the target not the root)."""
    monkeypatch.setattr(pbp, "TARGET_PARENT", "useful")
    plan = plan_privbayes(SHAPE, PureDP(epsilon=2.0), sizing="auto", rows=None, target=T,
                          degree=1, refine_pairs=0)
    cbar = sum(SHAPE[:T]) / T
    want = 30_000 * plan.marginal_budget.epsilon / sum(s * SHAPE[T] * cbar for s in SHAPE[:T])
    assert pbp.target_parent_usefulness(30_000, plan) == pytest.approx(want)
    fams = candidate_families(len(SHAPE), plan.degree, shape=SHAPE,
                              max_family_cells=plan.max_family_cells, target=plan.parent_target)
    counts = _counts(SHAPE, fams, _codes(30_000))
    outs = {}
    for theta in (0.0, 1e9):
        at = dataclasses.replace(plan, target_parent_theta=theta)  # θ_T is the plan's (H65)
        outs[theta] = measure_privbayes(counts, fams, shape=SHAPE, names=[f"c{i}" for i in range(7)],
                                        plan=at, rs=RandomSource(seed=4))
    assert sum(T in ps for _, ps in outs[0.0].structure) == T  # every column: required
    assert outs[0.0].sizing["target_parent_usefulness"] > 0
    # below θ_T: the label-free network, the draws of TARGET_PARENT "off" (same counts)
    monkeypatch.setattr(pbp, "TARGET_PARENT", "off")
    plain = candidate_families(len(SHAPE), plan.degree, shape=SHAPE,
                               max_family_cells=plan.max_family_cells)
    off = measure_privbayes(_counts(SHAPE, plain, _codes(30_000)), plain, shape=SHAPE,
                            names=[f"c{i}" for i in range(7)], plan=plan, rs=RandomSource(seed=4))
    assert outs[1e9].structure == off.structure and all(len(ps) <= 1 for _, ps in off.structure)
    assert all(np.array_equal(a.values, b.values) for a, b in zip(outs[1e9].marginals, off.marginals))
