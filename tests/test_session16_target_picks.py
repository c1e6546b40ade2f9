"""Sixteenth session (H85, issue 18): a declared target's pairs first in the PrivBayes refinement.

With a declared target and ``refine_target_picks = r`` (CLI ``--pb-refine-target-picks``, API and
Beam YAML ``options: {refine_target_picks: r}``), the refinement's first ``r`` picks are
permute-and-flip over the target's not-yet-measured pairs only (a candidate set fixed by the
declared target and the earlier released picks), the rest as before: same score, Δ, ε per pick,
number of tables and noise, so the same spends. ``r`` is carried in ``RefinePlan`` (read when the
plan is built). docs/privbayes.md "Sixteenth session: the declared target's pairs first (issue 18,
H85)". Every default test runs in well under 5 s.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from beamsynth.pipelines.methods.options import check_options, option_actions
from beamsynth.pipelines.methods.privbayes import PrivBayesMethod
from beamsynth.pipelines.methods.wording import Vocabulary
from beamsynth.transforms import refine
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant, PureDP
from beamsynth.transforms.measure import NoisyMarginal, count_marginals
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.privbayes import PrivBayesMeasurement, fit_privbayes, plan_privbayes
from beamsynth.transforms.privbayes_plan import gaussian_plan

SHAPE = (8, 8, 4, 3, 2)
ORDERED = (True, True, False, False, False)
NAMES = ("a", "b", "c", "d", "y")
TARGET = 4  # a minority label, independent of everything: its pairs' count errors are small


def _data(n: int = 3000, seed: int = 7) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 8, n)
    b = np.clip(a + rng.integers(-1, 2, n), 0, 7)
    y = (rng.random(n) < 0.06).astype(np.int64)
    return np.column_stack([a, b, rng.integers(0, 4, n), rng.integers(0, 3, n), y])


def _pair_counts(codes):
    return lambda a, b: count_marginals(codes, [(a, b)], SHAPE)[0].reshape(SHAPE[a], SHAPE[b])


def _network(codes):
    ones = tuple(NoisyMarginal(columns=(j,), names=(NAMES[j],), shape=(s,),
                               values=np.bincount(codes[:, j], minlength=s), scale=1e-3,
                               budget=PureDP(epsilon=1000.0)) for j, s in enumerate(SHAPE))
    return fit_privbayes(PrivBayesMeasurement(tuple((j, ()) for j in range(len(SHAPE))), ones),
                         SHAPE, NAMES)


def _plan(picks: int, eps: float = 50.0, pairs: int = 4):
    return refine.plan_refinement(PureDP(epsilon=eps), pairs=pairs, rounds=2, groups=4,
                                  pool_rows=5000, target=TARGET if picks else None,
                                  target_picks=picks)


def _measure(codes, plan, seed=0):
    return refine.measure_refinement(_pair_counts(codes), _network(codes), total=float(len(codes)),
                                     ordered=ORDERED, names=NAMES, plan=plan,
                                     rs=RandomSource(seed=seed))


def _spends(plan) -> list[tuple]:
    """(step, budget, details without the target_picks note) of every recorded spend."""
    acc = PrivacyAccountant(total=PureDP(epsilon=100.0))
    refine.spend_refinement(acc, plan, "privbayes.refine")
    return [(s.step, s.budget, {k: v for k, v in s.details.items() if k != "target_picks"})
            for s in acc.spends]


def test_the_first_r_picks_are_the_targets_pairs_and_the_spends_are_identical():
    codes = _data()
    before, after = _measure(codes, _plan(0)), _measure(codes, _plan(2))
    picked = [t.columns for t in before.tables]
    assert picked[0] == (0, 1) and not any(TARGET in p for p in picked[:2])
    got = [t.columns for t in after.tables]
    assert all(TARGET in p for p in got[:2]) and len(got) == len(picked) == 4
    assert (0, 1) in got[2:]  # the later picks as before: the dependence is still found
    # same number of tables, same noise scale and budget per table, same spends
    assert [t.scale for t in before.tables] == [t.scale for t in after.tables]
    assert [t.budget for t in before.tables] == [t.budget for t in after.tables]
    assert _spends(_plan(0)) == _spends(_plan(2)) and len(_spends(_plan(0))) == 2
    assert _plan(2).pick_epsilon == _plan(0).pick_epsilon
    assert _plan(2).details()["target_picks"] == 2 and "target_picks" not in _plan(0).details()


def test_without_a_target_or_with_zero_picks_the_release_is_unchanged():
    codes = _data()
    base = _measure(codes, _plan(0))
    for plan in (refine.plan_refinement(PureDP(epsilon=50.0), pairs=4, rounds=2, groups=4,
                                        pool_rows=5000, target=None, target_picks=5),
                 refine.plan_refinement(PureDP(epsilon=50.0), pairs=4, rounds=2, groups=4,
                                        pool_rows=5000, target=TARGET, target_picks=0)):
        assert plan == _plan(0)
        got = _measure(codes, plan)
        assert [t.columns for t in got.tables] == [t.columns for t in base.tables]
        assert all(np.array_equal(x.values, y.values) for x, y in zip(got.tables, base.tables))


def test_more_picks_than_target_pairs_fall_back_to_all_pairs():
    codes = _data()
    plan = _plan(6, pairs=6)
    assert plan.target_picks == 6
    got = [t.columns for t in _measure(codes, plan).tables]
    assert sum(TARGET in p for p in got) == 4 == len(SHAPE) - 1  # all four, then the others
    assert all(TARGET in p for p in got[:4]) and len(got) == 6


def test_the_plan_carries_r_for_a_declared_target_only():
    eps = PureDP(epsilon=2.0)
    shape = (6, 4, 3, 5, 2, 4)
    names = [f"c{i}" for i in range(6)]
    plain = plan_privbayes(shape, eps, degree=1, names=names, refine_pairs=6)
    with_t = plan_privbayes(shape, eps, degree=1, names=names, refine_pairs=6, target=4,
                            refine_target_picks=5)
    no_t = plan_privbayes(shape, eps, degree=1, names=names, refine_pairs=6,
                          refine_target_picks=5)
    assert no_t == plain and plain.refine.target_picks == 0
    assert with_t.refine.target == 4 and with_t.refine.target_picks == 5
    assert with_t.refine.selection_budget == plain.refine.selection_budget
    assert with_t.refine.measure_budget == plain.refine.measure_budget
    with pytest.raises(ValueError, match=r"refine_target_picks \(-1\)"):
        plan_privbayes(shape, eps, refine_target_picks=-1)
    gauss = gaussian_plan(plan_privbayes(shape, ApproxDP(epsilon=2.0, delta=1e-9), degree=1,
                                         names=names, refine_pairs=6, target=4,
                                         refine_target_picks=5),
                          ApproxDP(epsilon=2.0, delta=1e-9), pairs=6, rounds=3, groups=4)
    assert gauss.refine.target == 4 and gauss.refine.target_picks == 5


@pytest.mark.parametrize("caller", ["api", "yaml"])
def test_every_front_end_reads_and_checks_the_option_alike(caller):
    action = option_actions(PrivBayesMethod)["refine_target_picks"]
    assert "--pb-refine-target-picks" in action.option_strings and action.type("5") == 5
    assert check_options(PrivBayesMethod, {"refine_target_picks": 5.0},
                         Vocabulary(caller))["refine_target_picks"] == 5
    for bad in (-1, 1.5, "5", True):
        with pytest.raises(ValueError, match="refine_target_picks"):
            check_options(PrivBayesMethod, {"refine_target_picks": bad}, Vocabulary(caller))


@pytest.mark.audit
def test_neighbours_with_the_same_draws_are_offered_the_same_candidates_and_pick_alike(
        monkeypatch):
    """D vs D − 1 (one record removed), same per-run draws: the first r picks are offered the
    same candidate set (the target's pairs not yet measured: declared values and earlier
    released picks only) and pick the same pairs."""
    offered: list[list[tuple[int, int]]] = []
    orig = refine.permute_and_flip

    def spy(rs, scores, *, epsilon, sensitivity):
        offered[-1].append(len(scores))
        return orig(rs, scores, epsilon=epsilon, sensitivity=sensitivity)

    monkeypatch.setattr(refine, "permute_and_flip", spy)
    target_pairs = {p for p in itertools.combinations(range(len(SHAPE)), 2) if TARGET in p}
    same = 0
    for seed in range(6):
        codes = _data(seed=seed)
        picks = []
        for data in (codes, codes[1:]):
            offered.append([])
            picks.append([t.columns for t in _measure(data, _plan(3, eps=2.0), seed=seed).tables])
        a, b = picks
        assert offered[-1][:3] == offered[-2][:3] == [4, 3, 2]  # |target pairs| − earlier picks
        assert all(set(p[:3]) <= target_pairs for p in picks)
        same += a[:3] == b[:3]
    assert same == 6
