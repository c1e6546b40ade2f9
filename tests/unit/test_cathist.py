"""Exact arithmetic of CatHist: τ, tail law, binomial trials, label exclusion, counting, validation."""

import math
from fractions import Fraction

import numpy as np
import pytest

from beamsynth.schemas.domains import CategoricalDomain, IntegerDomain, ProductDomain
from beamsynth.schemas.schema import EncodedBatch
from beamsynth.transforms import cathist
from beamsynth.transforms.cathist import (
    ValueCountsCombineFn,
    achieved_tolerance,
    count_values,
    histogram_table,
    log_tail,
    merge_value_counts,
    plan_cathist,
    release_histogram,
    sample_column,
    threshold_for_tolerance,
)
from beamsynth.transforms.noise import RandomSource


def _exact_tail(t: int, q: Fraction) -> Fraction:
    """P(Z >= t) summed from the pmf (1-q)/(1+q) q^|z| (truncated far in the tail)."""
    return sum(((1 - q) / (1 + q)) * q**z for z in range(t, t + 400))


def test_log_tail_matches_summed_pmf():
    q = Fraction(1, 3)
    for t in (1, 2, 5, 9):
        assert math.exp(log_tail(t, math.log(1 / 3))) == pytest.approx(float(_exact_tail(t, q)), rel=1e-12)


@pytest.mark.parametrize("eps,rho,n", [(1.0, 0.5, 50), (0.1, 0.1, 104334**2), (0.01, 0.9, 171_000),
                                       (1.0, 1e-12, 10**12), (2.0, 1 - 1e-9, 10**12), (5.0, 0.3, 3)])
def test_tau_is_smallest_integer_meeting_tolerance(eps, rho, n):
    plan = plan_cathist(epsilon=eps, tolerance=rho, domain_size=n)
    assert plan.tau >= 1
    assert plan.achieved_tolerance >= rho
    if plan.tau > 1:
        assert achieved_tolerance(plan.tau - 1, plan.log_q, n) < rho


def test_tau_matches_paper_formula_shape():
    # continuous paper: τ = -(1/ε) ln(2(1-ρ^(1/n))); discrete: ⌈(ln(1-ρ^(1/n)) + ln(1+q)) / ln q⌉
    eps, rho, n = 0.1, 0.5, 104334**2
    plan = plan_cathist(epsilon=eps, tolerance=rho, domain_size=n)
    q = math.exp(-eps)
    direct = math.ceil((math.log(-math.expm1(math.log(rho) / n)) + math.log1p(q)) / math.log(q))
    assert plan.tau == direct
    paper = -(1 / eps) * math.log(2 * (-math.expm1(math.log(rho) / n)))
    assert abs(plan.tau - paper) < 10  # same order: the two laws differ only near the origin


def test_tau_small_domain_by_hand():
    # n=50, ε=1, ρ=0.5: p_max = 1-0.5^(1/50) ≈ 0.01377; q^t/(1+q) ≤ p_max first at t=4
    plan = plan_cathist(epsilon=1.0, tolerance=0.5, domain_size=50)
    assert plan.tau == 4
    q = math.exp(-1)
    assert plan.tail_probability == pytest.approx(q**4 / (1 + q))
    assert plan.achieved_tolerance == pytest.approx((1 - q**4 / (1 + q)) ** 50)


def test_sensitivity_scales_noise():
    plan = plan_cathist(epsilon=1.0, tolerance=0.5, domain_size=1000, max_contributions=4)
    assert plan.scale == pytest.approx(4.0)
    assert plan.q == pytest.approx(math.exp(-0.25))


def test_threshold_stable_near_zero_and_one():
    lq = -1.0
    t_lo = threshold_for_tolerance(log_q=lq, tolerance=1e-300, n=10**12)
    t_hi = threshold_for_tolerance(log_q=lq, tolerance=1 - 1e-15, n=10**12)
    assert 1 <= t_lo < t_hi < 100


@pytest.mark.parametrize("bad", [0, 1, -0.1, 1.5, float("nan")])
def test_tolerance_outside_unit_interval_rejected(bad):
    with pytest.raises(ValueError, match=r"tolerance ρ \(.*\) must be in the open interval \(0, 1\)"):
        plan_cathist(epsilon=1.0, tolerance=bad, domain_size=10)


@pytest.mark.parametrize("bad", [0, -1.0, float("inf")])
def test_nonpositive_epsilon_rejected(bad):
    with pytest.raises(ValueError, match=r"epsilon \(.*\) must be a finite number > 0"):
        plan_cathist(epsilon=bad, tolerance=0.5, domain_size=10)


def test_other_validation_messages():
    with pytest.raises(TypeError, match="tolerance must be a number"):
        plan_cathist(epsilon=1.0, tolerance="0.5", domain_size=10)
    with pytest.raises(ValueError, match=r"domain_size \(0\) must be an int >= 1"):
        plan_cathist(epsilon=1.0, tolerance=0.5, domain_size=0)
    with pytest.raises(ValueError, match=r"max_contributions \(0\)"):
        plan_cathist(epsilon=1.0, tolerance=0.5, domain_size=10, max_contributions=0)


def test_binomial_trials_are_n_minus_active(monkeypatch):
    seen = {}

    def fake_binomial(rs, n, p):
        seen["n"], seen["p"] = n, p
        return 0

    monkeypatch.setattr(cathist, "binomial", fake_binomial)
    dom = IntegerDomain(low=0, high=99)
    plan = plan_cathist(epsilon=1.0, tolerance=0.5, domain_size=100)
    release_histogram(np.array([3, 10, 42]), np.array([5, 1, 9]), plan=plan, domain=dom,
                      rs=RandomSource(seed=1))
    assert seen["n"] == 97
    assert seen["p"] == pytest.approx(plan.tail_probability)


def test_random_labels_exclude_present_values_and_weights_above_tau(monkeypatch):
    # force every present value below τ: whatever is released must then be a random bin
    monkeypatch.setattr(cathist, "discrete_laplace", lambda rs, scale, size: np.full(size, -10**6))
    dom = IntegerDomain(low=0, high=29)
    plan = plan_cathist(epsilon=0.3, tolerance=0.01, domain_size=30)  # many random bins
    present = np.arange(0, 30, 2)
    counts = np.full(present.size, 100, dtype=np.int64)
    released = 0
    for s in range(200):
        rel = release_histogram(present, counts, plan=plan, domain=dom, rs=RandomSource(seed=s))
        assert np.all(rel.counts >= plan.tau)
        assert np.all(np.diff(rel.cells) > 0)  # sorted, distinct
        assert not set(rel.cells.tolist()) & set(present.tolist())
        released += len(rel)
    assert released > 0


def test_empty_input_still_releases_random_bins_sometimes():
    dom = IntegerDomain(low=0, high=49)
    plan = plan_cathist(epsilon=1.0, tolerance=0.5, domain_size=50)
    sizes = [len(release_histogram(np.zeros(0, np.int64), np.zeros(0, np.int64), plan=plan,
                                   domain=dom, rs=RandomSource(seed=s))) for s in range(300)]
    assert 0 in sizes and max(sizes) >= 1


def test_release_rejects_bad_cells():
    dom = IntegerDomain(low=0, high=9)
    plan = plan_cathist(epsilon=1.0, tolerance=0.5, domain_size=10)
    with pytest.raises(ValueError, match="cells must lie in"):
        release_histogram(np.array([10]), np.array([1]), plan=plan, domain=dom, rs=RandomSource(seed=0))
    with pytest.raises(ValueError, match="distinct"):
        release_histogram(np.array([1, 1]), np.array([1, 1]), plan=plan, domain=dom, rs=RandomSource(seed=0))
    with pytest.raises(ValueError, match="differs from the plan"):
        release_histogram(np.array([1]), np.array([1]), plan=plan, domain=IntegerDomain(low=0, high=3),
                          rs=RandomSource(seed=0))


def test_seeded_release_is_reproducible_and_large_counts_survive():
    words = CategoricalDomain([f"w{i}" for i in range(1000)])
    dom = ProductDomain([words, words])
    plan = plan_cathist(epsilon=1.0, tolerance=0.5, domain_size=dom.size)
    a = release_histogram(np.array([5, 77]), np.array([1000, 2000]), plan=plan, domain=dom,
                          rs=RandomSource(seed=9))
    b = release_histogram(np.array([5, 77]), np.array([1000, 2000]), plan=plan, domain=dom,
                          rs=RandomSource(seed=9))
    assert np.array_equal(a.cells, b.cells) and np.array_equal(a.counts, b.counts)
    assert {5, 77} <= set(a.cells.tolist())
    table = histogram_table(a, dom.decode_many)
    assert table.column("category")[0].as_py() == dom.decode(77)


def test_count_values_and_combine_fn_merge_across_shards():
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 50, size=(1000, 2))
    fn = ValueCountsCombineFn(1)
    shards = []
    for part in np.array_split(codes, 4):
        acc = fn.create_accumulator()
        for b in np.array_split(part, 3):
            acc = fn.add_input(acc, EncodedBatch(b))
        shards.append(acc)
    cells, counts = fn.extract_output(fn.merge_accumulators(shards))
    want_cells, want_counts = count_values(codes[:, 1])
    assert np.array_equal(cells, want_cells) and np.array_equal(counts, want_counts)
    assert counts.sum() == 1000
    empty = fn.extract_output(fn.create_accumulator())
    assert empty[0].size == 0
    c, n = merge_value_counts([(np.array([1, 3]), np.array([2, 2])), (np.array([3]), np.array([5]))])
    assert c.tolist() == [1, 3] and n.tolist() == [2, 7]


def test_sample_column_follows_released_weights_and_uniform_when_empty():
    plan = plan_cathist(epsilon=1.0, tolerance=0.5, domain_size=100)
    rel = cathist.ReleasedHistogram(np.array([3, 8]), np.array([10, 30]), plan)
    cells = sample_column(rel, 4000, RandomSource(seed=2))
    assert set(cells.tolist()) == {3, 8}
    assert abs((cells == 8).mean() - 0.75) < 0.05
    empty = cathist.ReleasedHistogram(np.zeros(0, np.int64), np.zeros(0, np.int64), plan)
    assert sample_column(empty, 500, RandomSource(seed=3)).max() < 100
