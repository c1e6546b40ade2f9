"""SBHG: MI-score sensitivity, SBA threshold/δ arithmetic, hashing, sparse counts, Gibbs rejection."""

import itertools
import math
from collections import Counter

import numpy as np
import pytest
from sklearn.metrics import mutual_info_score

from beamsynth.pipelines.methods.sbhg import SBHGMethod
from beamsynth.schemas.schema import load_schema
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant, PureDP
from beamsynth.transforms.noise import RandomSource, discrete_laplace_cdf
from beamsynth.transforms.sbhg import (
    DPHashedConditionals,
    ReleasedConditionals,
    SBHGModel,
    SparseCountsCombineFn,
    capped_xlogx,
    hash_keys,
    hashed_counts,
    mi_score,
    mi_score_sensitivity,
    sba_delta,
    sba_release,
    sba_threshold,
    select_hash_features,
)


# -- MI score -------------------------------------------------------------------------------------
def test_mi_score_is_count_weighted_mutual_information():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 3, 500)
    y = (x + rng.integers(0, 2, 500)) % 4
    table = np.zeros((3, 4), dtype=np.int64)
    np.add.at(table, (x, y), 1)
    assert mi_score(table) == pytest.approx(500 * mutual_info_score(x, y), rel=1e-9)


def test_capped_xlogx_is_linear_above_cap():
    c = np.array([0, 1, 4, 5, 6, 100])
    g = capped_xlogx(c, 5)
    assert g[0] == 0 and g[1] == 0 and g[2] == pytest.approx(4 * math.log(4))
    assert g[4] - g[3] == pytest.approx(math.log(5) + 1)
    assert g[5] - g[4] == pytest.approx(94 * (math.log(5) + 1))


def _brute_max_change(cap, shapes=((2, 2), (2, 3), (3, 3)), max_count=3):
    """Largest |score(D + one record) - score(D)| over all small tables."""
    worst = 0.0
    for shape in shapes:
        cells = shape[0] * shape[1]
        for flat in itertools.product(range(max_count + 1), repeat=cells):
            t = np.array(flat).reshape(shape)
            base = mi_score(t, cap)
            for i in range(cells):
                t2 = t.copy().ravel()
                t2[i] += 1
                worst = max(worst, abs(mi_score(t2.reshape(shape), cap) - base))
    return worst


@pytest.mark.parametrize("cap", [2, 3, 10**7])
def test_mi_score_add_remove_sensitivity_brute_force(cap):
    worst = _brute_max_change(cap, shapes=((2, 2), (2, 3)), max_count=2)
    assert worst <= mi_score_sensitivity(cap=cap) + 1e-9


def test_mi_score_sensitivity_bound_is_attained_and_scales_with_k():
    cap = 5
    t = np.array([[cap + 3, 0], [0, 0]])  # everything in one cell; add a record at the other corner
    t2 = t.copy()
    t2[1, 1] += 1
    assert mi_score(t2, cap) - mi_score(t, cap) == pytest.approx(math.log(cap) + 1)
    assert mi_score_sensitivity(cap=cap, max_contributions=3) == pytest.approx(3 * (math.log(cap) + 1))


@pytest.mark.parametrize("kw, msg", [
    ({"cap": 1}, "cap (1) must be an int >= 2"),
    ({"max_contributions": 0}, "max_contributions (0) must be an int >= 1"),
])
def test_mi_score_sensitivity_validates(kw, msg):
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        mi_score_sensitivity(**kw)


def test_selection_prefers_strongly_dependent_feature():
    rng = np.random.default_rng(1)
    n = 5000
    a = rng.integers(0, 4, n)
    codes = np.column_stack([a, a, rng.integers(0, 4, n), rng.integers(0, 4, n)])
    tables = {}
    for i, j in itertools.combinations(range(4), 2):
        t = np.zeros((4, 4), dtype=np.int64)
        np.add.at(t, (codes[:, i], codes[:, j]), 1)
        tables[(i, j)] = t
    parents = select_hash_features(tables, num_features=4, top_r=1, epsilon_each=1.0,
                                   sensitivity=mi_score_sensitivity(), cap=10**7,
                                   rs=RandomSource(seed=3))
    assert parents[0] == (1,) and parents[1] == (0,)
    assert all(len(p) == 1 and j not in p for j, p in enumerate(parents))


# -- SBA arithmetic ----------------------------------------------------------------------------------
def _brute_sba_delta(t, scale, k):
    """max over every multiset of new-cell counts (each ≥ 1, sum ≤ k) of Σ P(Z ≥ t - c)."""
    best = 0.0
    for m in range(1, k + 1):
        for parts in itertools.combinations_with_replacement(range(1, k + 1), m):
            if sum(parts) <= k:
                p_new = sum(1.0 - float(discrete_laplace_cdf(t - c - 1, scale)) for c in parts)
                best = max(best, p_new)
    return best


@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("scale", [0.5, 2.0, 7.0])
def test_sba_delta_equals_brute_force_worst_case(k, scale):
    for t in (k, k + 3, k + 10, k + 40):
        assert sba_delta(t, scale, k) == pytest.approx(_brute_sba_delta(t, scale, k), rel=1e-9)


@pytest.mark.parametrize("eps, delta, k", [(1.0, 1e-6, 1), (0.1, 1e-5, 1), (0.5, 1e-9, 3), (2.0, 0.01, 2)])
def test_sba_threshold_is_the_smallest_safe_integer(eps, delta, k):
    scale, t = sba_threshold(epsilon=eps, delta=delta, max_contributions=k)
    assert scale == pytest.approx(k / eps)
    assert sba_delta(t, scale, k) <= delta
    assert t == k or sba_delta(t - 1, scale, k) > delta


def test_sba_threshold_k1_closed_form_and_paper_conversion():
    eps, delta = 1.0, 1e-6
    scale, t = sba_threshold(epsilon=eps, delta=delta)
    q = math.exp(-1 / scale)
    assert scale == 1.0  # add/remove: sensitivity 1, half the paper's replace-one b = 2/ε
    assert t == 1 + math.ceil(scale * math.log(1 / ((1 + q) * delta)))
    # the paper's replace-one threshold 1 + (2/ε)·ln(2/δ) is about twice as high
    assert t < 1 + (2 / eps) * math.log(2 / delta) < 2.2 * t
    assert sba_delta(15, 1.0, 1) == pytest.approx(math.exp(-14) / (1 + q))


@pytest.mark.parametrize("kw, msg", [
    ({"epsilon": 1.0, "delta": 0.0}, r"delta \(0.0\) must be in \(0, 1\): SBA needs δ > 0"),
    ({"epsilon": 0.0, "delta": 1e-6}, r"epsilon \(0.0\) must be a finite number > 0"),
    ({"epsilon": 1.0, "delta": 1e-6, "max_contributions": 0}, r"max_contributions \(0\) must be >= 1"),
])
def test_sba_threshold_validates(kw, msg):
    with pytest.raises(ValueError, match=msg):
        sba_threshold(**kw)


def test_sba_release_keeps_exactly_noisy_cells_above_threshold():
    keys = np.arange(1000, dtype=np.int64) * 7
    counts = np.full(1000, 12, dtype=np.int64)
    k, z = sba_release(keys, counts, scale=2.0, threshold=12, rs=RandomSource(seed=5))
    assert np.all(z >= 12) and np.all(np.isin(k, keys))
    assert 400 < k.size < 700  # P(Z ≥ 0) = 1/(1+q) ≈ 0.62


# -- hashing and sparse counts -----------------------------------------------------------------------
def test_hash_keys_match_ravel_multi_index():
    rng = np.random.default_rng(2)
    shape = (3, 5, 7, 2)
    codes = np.column_stack([rng.integers(0, s, 100) for s in shape])
    assert np.array_equal(hash_keys(codes, (1, 3), shape),
                          np.ravel_multi_index((codes[:, 1], codes[:, 3]), (5, 2)))
    assert np.array_equal(hash_keys(codes, (), shape), np.zeros(100, dtype=np.int64))


def test_hashed_counts_match_brute_force_and_merge_across_shards():
    rng = np.random.default_rng(3)
    shape = (4, 3, 5)
    codes = np.column_stack([rng.integers(0, s, 300) for s in shape])
    parents = ((1, 2), (0,), ())
    whole = hashed_counts(codes, parents, shape)
    for j, pa in enumerate(parents):
        brute = Counter(tuple(int(r[c]) for c in pa) + (int(r[j]),) for r in codes)
        keys, counts = whole[j]
        assert counts.sum() == 300 and len(brute) == keys.size and np.all(counts > 0)
        for key, cnt in zip(keys, counts):
            h, x = divmod(int(key), shape[j])
            vals = np.unravel_index(h, tuple(shape[c] for c in pa)) if pa else ()
            assert brute[tuple(int(v) for v in vals) + (x,)] == cnt
    fn = SparseCountsCombineFn(3)
    shards = [fn.add_input(fn.create_accumulator(), hashed_counts(codes[s], parents, shape))
              for s in (slice(0, 100), slice(100, 250), slice(250, 300))]
    merged = fn.extract_output(fn.merge_accumulators([shards[0], fn.create_accumulator(),
                                                      fn.merge_accumulators(shards[1:])]))
    for (k1, c1), (k2, c2) in zip(merged, whole):
        assert np.array_equal(k1, k2) and np.array_equal(c1, c2)
    empty = fn.extract_output(fn.merge_accumulators([None]))
    assert len(empty) == 3 and all(k.size == 0 for k, _ in empty)


# -- Gibbs rejection rule (Remark 3.3) ----------------------------------------------------------------
def _model(cells_a, cells_b, support_check):
    """Two binary features, each hashed on the other. cells: {(h, x): noisy count}."""
    def arr(cells):
        keys = np.array([h * 2 + x for (h, x) in cells], dtype=np.int64)
        return keys, np.array(list(cells.values()), dtype=np.int64)
    rel = ReleasedConditionals((2, 2), ((1,), (0,)), (arr(cells_a), arr(cells_b)), 1.0, 5,
                               ApproxDP(epsilon=1.0, delta=1e-6))
    return SBHGModel(rel, burn_in=0, thin=1, chain_length=1, init_sweeps=0,
                     support_check=support_check)


@pytest.mark.parametrize("support_check", ["hash", "cell"])
def test_proposal_onto_unreleased_hash_is_rejected(support_check):
    # A | B=0 proposes A ∈ {0, 1}; B's conditional exists only for A=0, so A=1 must be rejected.
    model = _model({(0, 0): 10, (0, 1): 10}, {(0, 0): 10}, support_check)
    x = np.zeros((500, 2), dtype=np.int64)
    valid = model.valid_matrix(x)
    assert valid.all()
    model.sweep(x, valid, RandomSource(seed=1))
    assert np.all(x == 0) and valid.all()


def test_cell_rule_also_rejects_zero_mass_for_the_other_feature():
    # B | A=1 exists but only with B=1: the proposal A=1 while B=0 passes the paper's hash rule
    # and is rejected by the cell rule (structural zero (A=1, B=0)).
    cells_a = {(0, 0): 10, (0, 1): 10, (1, 1): 10}
    cells_b = {(0, 0): 10, (1, 1): 10}
    for rule, expect_moves in (("hash", True), ("cell", False)):
        model = _model(cells_a, cells_b, rule)
        x = np.zeros((500, 2), dtype=np.int64)
        valid = model.valid_matrix(x)
        model.update_feature(0, x, valid, RandomSource(seed=2))
        moved = (x[:, 0] == 1) & (x[:, 1] == 0)
        assert moved.any() == expect_moves, rule


def test_proposal_accepted_when_the_hash_is_released():
    model = _model({(0, 0): 10, (0, 1): 10}, {(0, 0): 10, (1, 0): 10}, "cell")
    x = np.zeros((2000, 2), dtype=np.int64)
    model.sweep(x, model.valid_matrix(x), RandomSource(seed=3))
    assert 0.4 < x[:, 0].mean() < 0.6 and np.all(x[:, 1] == 0)


def test_sample_codes_only_emits_supported_records_and_is_seeded():
    model = _model({(0, 0): 10, (1, 1): 10}, {(0, 0): 10, (1, 1): 30}, "cell")
    s = model.sample_codes(1000, RandomSource(seed=4))
    assert s.shape == (1000, 2) and np.all(s[:, 0] == s[:, 1])
    assert np.array_equal(s, model.sample_codes(1000, RandomSource(seed=4)))
    assert model.describe()["unsupported"] == 0


@pytest.mark.parametrize("kw, msg", [
    ({"burn_in": -1}, r"burn_in \(-1\) must be an int >= 0"),
    ({"thin": 0}, r"thin \(0\) must be an int >= 1"),
    ({"chain_length": 0}, r"chain_length \(0\) must be an int >= 1"),
    ({"support_check": "x"}, r"support_check \('x'\) must be 'cell' or 'hash'"),
    ({"top_r": -1}, r"top_r \(-1\) must be an int >= 0"),
    ({"conditional_budget": PureDP(epsilon=1.0)}, r"conditional_budget must be an ApproxDP with delta > 0"),
])
def test_dp_hashed_conditionals_validates(kw, msg):
    args = {"shape": (3, 4, 5), "selection_budget": PureDP(epsilon=0.2),
            "conditional_budget": ApproxDP(epsilon=0.8, delta=1e-6), **kw}
    with pytest.raises(ValueError, match=msg):
        DPHashedConditionals(**args)


def test_method_spends_selection_and_conditionals_and_needs_delta():
    schema = load_schema({"columns": [
        {"name": n, "type": "categorical", "domain": {"kind": "categorical", "values": ["a", "b", "c"]}}
        for n in ("x", "y", "z")]})
    cls = SBHGMethod
    acct = PrivacyAccountant(total=ApproxDP(epsilon=1.0, delta=1e-6))
    m = cls(schema=schema, accountant=acct, budget=ApproxDP(epsilon=1.0, delta=1e-6),
            max_contributions=1, seed=None, options={"top_r": 1})
    steps = {s.step: s for s in acct.spends}
    assert steps["sbhg.hash_selection"].budget.epsilon == pytest.approx(0.2)
    assert steps["sbhg.conditionals"].budget.epsilon == pytest.approx(0.8)
    assert steps["sbhg.conditionals"].budget.delta == pytest.approx(1e-6)
    assert steps["sbhg.conditionals"].details["threshold"] == m.transform.threshold
    assert steps["sbhg.hash_selection"].details["draws"] == 3
    with pytest.raises(ValueError, match=r"--method sbhg needs delta > 0"):
        cls(schema=schema, accountant=PrivacyAccountant(total=PureDP(epsilon=1.0)),
            budget=PureDP(epsilon=1.0), max_contributions=1, seed=None, options={})


def test_build_time_size_checks():
    with pytest.raises(ValueError, match=r"2-way tables \[\(0, 1\)\] exceed 2000000 cells"):
        DPHashedConditionals(shape=(2000, 2000, 3), selection_budget=PureDP(epsilon=0.2),
                             conditional_budget=ApproxDP(epsilon=0.8, delta=1e-6), top_r=1)
    with pytest.raises(ValueError, match=r"top_r \(3\) makes hashed tables of up to"):
        DPHashedConditionals(shape=(10**5,) * 4 + (1000,), selection_budget=PureDP(epsilon=0.2),
                             conditional_budget=ApproxDP(epsilon=0.8, delta=1e-6), top_r=3)
    # without hash features no pair table is counted: huge columns are fine
    t = DPHashedConditionals(shape=(10**6, 10**6), selection_budget=None,
                             conditional_budget=ApproxDP(epsilon=1.0, delta=1e-6), top_r=0)
    assert t.details()["em_draws"] == 0 and t.per_feature.epsilon == pytest.approx(0.5)


def test_method_without_hash_features_spends_only_conditionals():
    schema = load_schema({"columns": [
        {"name": "x", "type": "categorical", "domain": {"kind": "categorical", "values": ["a", "b"]}}]})
    acct = PrivacyAccountant(total=ApproxDP(epsilon=1.0, delta=1e-6))
    SBHGMethod(schema=schema, accountant=acct, budget=ApproxDP(epsilon=1.0, delta=1e-6),
               max_contributions=2, seed=None, options={})
    (spend,) = acct.spends
    assert spend.step == "sbhg.conditionals" and spend.budget.epsilon == 1.0
    assert spend.details["scale"] == pytest.approx(2.0)
