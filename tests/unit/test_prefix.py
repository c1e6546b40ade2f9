"""Prefix algorithms: accounting vs the paper's theorems, Center, stable discounts, counting."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beamsynth.schemas.keys import SpatialKeyCodec, TextKeyCodec, prefix_bytes
from beamsynth.transforms import prefix as P
from beamsynth.transforms import prefix_accounting, prefix_decode
from beamsynth.transforms.budget import PrivacyAccountant, PureDP
from beamsynth.transforms.noise import RandomSource, discrete_laplace_cdf

# -- accounting against the theorems ------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("depth", [4, 21])
def test_basic_accounting_is_corollary_2_plus_second_pass(k, depth):
    a = P.basic_accounting(epsilon=2.0, max_depth=depth, max_contributions=k, final_fraction=0.25)
    assert a.levels == depth
    # Corollary 2: depth B at ε_level each, plus the re-measurement ε_final
    assert depth * a.epsilon_level + a.epsilon_final == pytest.approx(2.0)
    assert a.epsilon == pytest.approx(2.0)
    assert a.scale == pytest.approx(k / a.epsilon_level)  # sensitivity k per level
    assert a.final_scale == pytest.approx(k / a.epsilon_final)


@pytest.mark.parametrize("k", [1, 4])
def test_improved_accounting_theorem3_calibration_is_the_papers(k):
    a = P.improved_accounting(epsilon=1.0, max_contributions=k, fanout=39, calibration="theorem3")
    eps0 = 1.0 / (2 * k)
    assert a.scale == pytest.approx(1 / eps0)
    assert a.discount >= a.threshold + math.log(2) / eps0  # t >= b + ln2/ε₀
    assert a.epsilon == pytest.approx(2 * k * eps0) == pytest.approx(1.0)  # 2ε₀ per record, × k


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("epsilon", [0.1, 1.0, 10.0])
def test_improved_accounting_tight_fits_the_budget_and_beats_the_paper(k, epsilon):
    a = P.improved_accounting(epsilon=epsilon, max_contributions=k, fanout=39, depth=21)
    old = P.improved_accounting(epsilon=epsilon, max_contributions=k, fanout=39, calibration="theorem3")
    per_record = P.improved_privacy_loss(a.epsilon_level, a.threshold, a.discount)
    assert a.epsilon == epsilon and a.loss == pytest.approx(k * per_record) and a.loss <= epsilon + 1e-12
    assert a.scale == pytest.approx(1 / a.epsilon_level)
    # less noise, and fewer records removed per split, than the paper's split of the same budget
    assert a.scale < old.scale and a.discount < old.discount and a.threshold <= old.threshold
    # the threshold keeps noise-only children rare: (fanout - 1)·P(Z ≥ b) ≤ 1/2
    assert 38 * (1 - discrete_laplace_cdf(a.threshold - 1, a.scale)) <= prefix_accounting.SPURIOUS_RATE + 1e-12
    # depth-free guarantee: any declared depth spends within the budget
    for max_length in (3, 60):
        acct = PrivacyAccountant(total=PureDP(epsilon=epsilon))
        P.DPImprovedPrefixHistogram(codec=TextKeyCodec(column="q", max_length=max_length),
                                    budget=PureDP(epsilon=epsilon), max_contributions=k, accountant=acct)
        assert acct.spent_epsilon == pytest.approx(epsilon)


def test_improved_privacy_loss_is_the_papers_bound_read_tightly():
    # the paper's parameters: ε₀ + Σ_j h(jt) < 2ε₀ (Theorem 3's bound is loose)
    a = P.improved_accounting(epsilon=1.0, fanout=39, calibration="theorem3")
    loss = P.improved_privacy_loss(a.epsilon_level, a.threshold, a.discount)
    assert a.epsilon_level < loss < 2 * a.epsilon_level
    # t < b: the path terms at jt < b cost ε₀ each
    assert P.improved_privacy_loss(0.5, 10, 5) > 0.5 * 2
    with pytest.raises(ValueError, match=r"discount \(0\) must be >= 1"):
        P.improved_privacy_loss(0.5, 10, 0)
    with pytest.raises(ValueError, match=r"calibration \('x'\) must be one of"):
        P.improved_accounting(epsilon=1.0, calibration="x")


_ALPHABET, _LENGTH = "ab", 3


def _exact_worst_log_ratio(first: dict, second: dict, eps0: float, b: int, t: int) -> float:
    """max over every released tree of log P[tree | first] / P[tree | second] (skip discount).

    Exact: the probability of a tree is a product over its nodes (split: P(count + Z ≥ b);
    leaf: the probability of its released value, every value below b; terminal nodes: any
    value), so the maximum over trees is a recursion over nodes choosing split or leaf.
    """
    def log_surv(m):  # log P(Z >= m)
        return math.log(1 - discrete_laplace_cdf(m - 1, 1 / eps0))

    def raw(data, node):
        if node.endswith("$"):
            return data.get(node[:-1], 0)
        return sum(c for s, c in data.items() if s.startswith(node))

    def best(node, ea, oa, eb, ob):
        if node.endswith("$"):
            return eps0 * abs(ea - eb)  # terminal: the released value, any integer
        kids = [node + ch for ch in _ALPHABET] * (len(node) < _LENGTH) + [node + "$"]
        ra = np.array([[raw(first, k) for k in kids]])
        rb = np.array([[raw(second, k) for k in kids]])
        rem_a = P.allocate_discount(ra, np.array([oa]), t, "skip", None)[0]
        rem_b = P.allocate_discount(rb, np.array([ob]), t, "skip", None)[0]
        split = 0.0 if node == "" else log_surv(b - ea) - log_surv(b - eb)
        for i, k in enumerate(kids):
            split += best(k, int(ra[0, i] - rem_a[i]), int(rem_a[i]), int(rb[0, i] - rem_b[i]), int(rem_b[i]))
        if node == "":
            return split  # the root always splits
        leaf = max(eps0 * (abs(y - eb) - abs(y - ea)) for y in range(min(ea, eb, b) - 5, b))
        return max(leaf, split)

    return best("", 0, 0, 0, 0)


@pytest.mark.parametrize("eps0, b, t", [(0.92, 5, 6), (0.7, 4, 4), (0.5, 15, 17)])
def test_improved_privacy_loss_is_attained_and_never_exceeded_on_small_trees(eps0, b, t):
    """Every released tree of neighbouring inputs (one record added or removed), exactly."""
    claim = P.improved_privacy_loss(eps0, b, t)
    rng = np.random.default_rng(7)
    strings = ["", "a", "b", "aa", "ab", "ba", "bb", "aab", "aba", "bab", "bbb"]
    worst = 0.0
    for _ in range(60):
        data = {str(s): int(rng.integers(0, 4 * t)) for s in rng.choice(strings, size=rng.integers(1, 5))}
        other = dict(data)
        extra = str(rng.choice(strings))
        other[extra] = other.get(extra, 0) + 1
        worst = max(worst, _exact_worst_log_ratio(data, other, eps0, b, t),
                    _exact_worst_log_ratio(other, data, eps0, b, t))
    assert worst <= claim + 1e-9
    assert worst >= claim - 0.05  # the bound is (nearly) attained: the claim is not loose


def test_direct_accounting_is_maxdepth_over_epsilon_per_level():
    a = P.direct_accounting(epsilon=1.0, max_depth=20, max_contributions=2)
    assert a.scale == pytest.approx(2 * 21 / 1.0)  # paper's R = maxdepth/ε, + root count, × k
    assert a.epsilon == pytest.approx(1.0)


def _log_ratio_sum(eps0: float, b: float, t: float, steps: int = 4000) -> float:
    """Worst case of the product in eq. (3) for 'add a record': Σ log p(x+1)/p(x) along a path
    whose counts grow by t per level from 0 (discrete Laplace continuation probabilities)."""
    scale = 1 / eps0

    def p(x):  # P(x + Z >= b) for integer x, b
        return 1.0 - discrete_laplace_cdf(np.ceil(b) - x - 1, scale)

    xs = np.arange(0, steps) * t
    return float(np.sum(np.log(p(xs + 1)) - np.log(p(xs))))


@pytest.mark.parametrize("epsilon, k", [(0.1, 1), (1.0, 1), (1.0, 3), (10.0, 1)])
@pytest.mark.parametrize("calibration", ["tight", "theorem3"])
def test_theorem_3_bound_holds_for_the_discrete_noise_and_fails_without_discount(epsilon, k, calibration):
    a = P.improved_accounting(epsilon=epsilon, max_contributions=k, fanout=39, calibration=calibration)
    eps0 = a.epsilon_level
    # internal path nodes (add case) cost at most the per-record budget, whatever the depth
    assert _log_ratio_sum(eps0, a.threshold, a.discount) <= epsilon / k + 1e-9
    # the leaf term (remove case) costs at most ε₀: one step of the discrete Laplace cdf
    scale = 1 / eps0
    xs = np.arange(-50, int(a.threshold) + 50)
    leaf = (discrete_laplace_cdf(a.threshold - xs, scale) / discrete_laplace_cdf(a.threshold - xs - 1, scale))
    assert np.log(leaf).max() <= eps0 + 1e-9
    # with a smaller discount the path cost grows with depth: the check above can fail
    if a.threshold > 1:
        assert _log_ratio_sum(eps0, a.threshold, 1.0, steps=int(a.threshold) * 4) > epsilon / k
    if calibration == "tight" and a.discount > a.threshold:  # the smallest discount that fits
        assert P.improved_privacy_loss(eps0, a.threshold, a.discount - 1) > epsilon / k


@pytest.mark.parametrize("bad, message", [
    ({"epsilon": 0}, r"epsilon \(0\) must be finite and > 0"),
    ({"epsilon": 1, "max_depth": 0}, r"max_depth \(0\) must be finite and > 0"),
    ({"epsilon": 1, "max_depth": 3, "final_fraction": 1.5}, r"final_fraction \(1.5\) must be in \(0, 1\)"),
])
def test_accounting_validation(bad, message):
    with pytest.raises(ValueError, match=message):
        P.basic_accounting(**{"max_depth": 3, **bad})


# -- Center (Figures 4 and 14) ------------------------------------------------------------------------
def _center_reference(count, sub, start):
    """The paper's Figure 14 loop, literally."""
    sub = [min(count, max(0, s)) for s in sub]
    total = sum(sub)
    direction = 1 if count > total else -1
    i = start
    while count != total:
        j = i % len(sub)
        if (direction == 1 and sub[j] < count) or (direction == -1 and sub[j] > 0):
            sub[j] += direction
            total += direction
        i += 1
    return sub


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 60), st.lists(st.integers(-30, 80), min_size=1, max_size=9), st.integers(0, 20))
def test_center_matches_the_paper_exact_total_never_negative(count, sub, start):
    got = P.center(np.array([count]), np.array([sub]), start=np.array([start % len(sub)]))[0]
    assert got.sum() == count
    assert (got >= 0).all()
    assert got.tolist() == _center_reference(count, sub, start % len(sub))


def test_center_respects_invalid_children_and_many_rows():
    rs = RandomSource(seed=4)
    counts = rs.integers(200, 500)
    sub = rs.integers(300, 500 * 5).reshape(500, 5) - 100
    valid = np.ones((500, 5), bool)
    valid[::3, 1:] = False
    out = P.center(counts, sub, valid, start=rs.integers(5, 500))
    assert (out.sum(axis=1) == counts).all() and (out >= 0).all()
    assert (out[~valid] == 0).all()


# -- stable discounts (Appendix A) --------------------------------------------------------------------
def _loop_remove(s, r, start=0):
    s = list(s)
    rem = [0] * len(s)
    i = start
    while r > 0:
        j = i % len(s)
        if s[j] - rem[j] > 0:
            rem[j] += 1
            r -= 1
        i += 1
    return rem


def _loop_progressive(s, r):
    """Remove from the currently largest child (a rule whose deferred form is NOT stable)."""
    s = np.asarray(s)
    out = np.zeros_like(s)
    for row in range(s.shape[0]):
        for _ in range(int(r[row])):
            out[row, int(np.argmax(s[row] - out[row]))] += 1
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=8), st.integers(0, 400), st.integers(0, 7))
def test_round_robin_and_skip_match_loops(s, r, start):
    r = min(r, sum(s))
    start %= len(s)
    got = P.round_robin_remove(np.array([s]), np.array([r]), np.array([start]))[0]
    assert got.tolist() == _loop_remove(s, r, start)
    skip = P.allocate_discount(np.array([s]), np.array([r - min(r, 1)]), min(r, 1), "skip", None)[0]
    flat = [i for i, c in enumerate(s) for _ in range(c)][:r]  # the first r records in key order
    assert skip.tolist() == np.bincount(flat, minlength=len(s)).tolist()


def _discount_tree(leaf_counts: np.ndarray, t: int, rule) -> np.ndarray:
    """Remaining records per leaf after the implicit discount applied at every internal node."""
    fan, depth = leaf_counts.shape[0], leaf_counts.ndim
    owed = np.zeros(1, np.int64)
    removed = None
    for d in range(depth):
        sub = leaf_counts.reshape((fan ** (d + 1),) + (fan,) * (depth - d - 1))
        child = sub.reshape(fan ** (d + 1), -1).sum(axis=1).reshape(fan ** d, fan)
        if callable(rule):
            removed = rule(child, np.minimum(owed + t, child.sum(axis=1)))
        else:
            removed = P.allocate_discount(child, owed, t, rule, RandomSource(seed=0))
        owed = removed.ravel()
    return leaf_counts.ravel() - removed.ravel()


@pytest.mark.parametrize("rule", ["uniform", "skip"])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_whole_tree_discount_is_stable(rule, data):
    """|T(A) Δ T(B)| <= |A Δ B| = 1 when B adds one record (Appendix A, eq. 9)."""
    fan, depth = 3, 3
    counts = np.array(data.draw(st.lists(st.integers(0, 12), min_size=fan ** depth, max_size=fan ** depth)))
    t = data.draw(st.integers(1, 6))
    where = data.draw(st.integers(0, fan ** depth - 1))
    more = counts.copy()
    more[where] += 1
    a = _discount_tree(counts.reshape((fan,) * depth), t, rule)
    b = _discount_tree(more.reshape((fan,) * depth), t, rule)
    assert (a >= 0).all() and (b >= 0).all()
    assert np.abs(a - b).sum() <= 1


def test_the_stability_check_catches_deferred_progressive_discounting():
    counts = np.zeros(27, np.int64)
    counts[[8, 17]] = 3
    more = counts.copy()
    more[9] += 1
    a = _discount_tree(counts.reshape(3, 3, 3), 1, _loop_progressive)
    b = _discount_tree(more.reshape(3, 3, 3), 1, _loop_progressive)
    assert np.abs(a - b).sum() == 2  # |T(A) Δ T(B)| = 2 > 1: not a stable discount


def test_discount_leaves_each_child_t_below_its_parent_and_proportional_sums():
    rs = RandomSource(seed=9)
    counts = rs.integers(50, 40 * 6).reshape(40, 6)
    owed = rs.integers(20, 40)
    for rule in P.DISCOUNTS:
        rem = P.allocate_discount(counts, owed, 7, rule, rs.child(rule))
        assert (rem >= 0).all() and (rem <= counts).all()
        assert (rem.sum(axis=1) == np.minimum(owed + 7, counts.sum(axis=1))).all()
        parent_eff = counts.sum(axis=1) - owed
        assert ((counts - rem).max(axis=1) <= np.maximum(parent_eff - 7, 0)).all()
    with pytest.raises(ValueError, match=r"discount rule \('progressive'\) must be one of"):
        P.allocate_discount(counts, owed, 7, "progressive", rs)


# -- counting --------------------------------------------------------------------------------------
def test_child_cells_and_sparse_combine_across_shards():
    c = TextKeyCodec(column="q", max_length=4)
    words = ["the", "then", "to", "a", "the", "tie", "x"] * 7
    codes = c.encode_strings(words)
    frontier = c.encode_strings(["t"])[:, :1]  # prefix 't'
    keys = prefix_bytes(frontier, 1)
    fn = P.SparseCountsCombineFn()
    shards = [fn.add_input(fn.create_accumulator(), P.child_cells(codes[i::3], 1, keys, c.fanout))
              for i in range(3)]
    idx, cnt = fn.extract_output(fn.merge_accumulators(shards))
    table = P.dense_counts(1, c.fanout, idx, cnt)
    labels = c.labels(P.children_of(frontier, c.fanout))
    got = {labels[j]: int(v) for j, v in enumerate(table[0]) if v}
    assert got == {"th": 14 + 7, "to": 7, "ti": 7}
    idx0, cnt0 = P.child_cells(codes, 0, None, c.fanout)
    assert cnt0.sum() == len(words)
    e_idx, e_cnt = fn.extract_output(fn.create_accumulator())
    assert e_idx.size == 0 and e_cnt.size == 0


def _run_levels(method, codec, codes, acct, levels, seed=1, rule="uniform"):
    st_ = P.root_state(codec.symbol_dtype)
    rels = []
    for d in range(levels):
        idx, cnt = P.child_cells(codes, d, st_.keys, codec.fanout)
        rs = RandomSource(seed=seed).child(d)
        if method == "basic":
            st_, rel = P.basic_step(st_, idx, cnt, codec, acct=acct, rs=rs, last=d == levels - 1)
        elif method == "improved":
            st_, rel = P.improved_step(st_, idx, cnt, codec, acct=acct, rule=rule, rs=rs)
        else:
            st_, rel = P.direct_step(st_, idx, cnt, codec, acct=acct, rs=rs, last=d == levels - 1)
        rels.append(rel)
    return rels


def _leaves(codec, rels):
    out = {}
    for r in rels:
        for lab, cnt, leaf in zip(codec.labels(r.prefixes), r.counts.tolist(), r.leaf.tolist()):
            if leaf:
                out[lab] = cnt
    return out


def test_methods_recover_frequent_strings_at_large_epsilon():
    c = TextKeyCodec(column="q", max_length=5)
    codes = c.encode_strings(["the"] * 400 + ["then"] * 150 + ["a"] * 300)
    b = _leaves(c, _run_levels("basic", c, codes, P.basic_accounting(
        epsilon=200, max_depth=c.depth, fanout=c.fanout), c.depth))
    assert b["the$"] == 400 and b["then$"] == 150 and b["a$"] == 300
    acct = P.improved_accounting(epsilon=200, fanout=c.fanout)
    imp = _leaves(c, _run_levels("improved", c, codes, acct, c.depth))
    # each split removes t records: 'the$' lost t at 4 splits (root, t, th, the) shared with 'then'
    assert 300 - 2 * acct.discount <= imp["a$"] <= 300
    assert imp["the$"] + imp["then$"] >= 550 - 5 * acct.discount
    d = _leaves(c, _run_levels("direct", c, codes, P.direct_accounting(epsilon=500, max_depth=c.depth), c.depth))
    assert d == {"the$": 400, "then$": 150, "a$": 300}


def test_direct_totals_exact_and_nonnegative_at_small_epsilon():
    c = SpatialKeyCodec(columns=("x", "y"), box=((0, 1), (0, 1)), depth=6)
    pts = RandomSource(seed=3).uniform((2000, 2)) ** 3
    codes = c.encode_points(pts)
    rels = _run_levels("direct", c, codes, P.direct_accounting(epsilon=0.5, max_depth=6), 6)
    root_children = rels[0].counts.sum()
    assert P.synth_sizes(rels) == root_children  # every allocated unit ends in exactly one leaf
    for r in rels:
        assert (r.counts >= 1).all()
    keys, dropped = P.leaves_to_keys(rels[-1], c, RandomSource(seed=1))
    assert dropped == 0 and len(keys["x"]) == int(rels[-1].counts[rels[-1].leaf].sum())


def test_release_table_hides_improved_internal_counts():
    c = TextKeyCodec(column="q", max_length=3)
    codes = c.encode_strings(["ab"] * 100)
    rels = _run_levels("improved", c, codes, P.improved_accounting(epsilon=50, fanout=c.fanout), c.depth)
    table = P.release_to_table(rels[0], c).to_pylist()
    row = next(r for r in table if r["prefix"] == "a")
    assert row["count"] is None and row["leaf"] is False


def test_restore_discount_gives_back_t_per_split_from_released_values_only():
    c = TextKeyCodec(column="q", max_length=3)
    codes = c.encode_strings(["ab"] * 60 + ["c"] * 40)
    acct = P.improved_accounting(epsilon=400, fanout=c.fanout, threshold=5)
    rels = _run_levels("improved", c, codes, acct, c.depth, rule="skip")
    before = _leaves(c, rels)
    t = acct.discount
    assert before == {"ab$": 60 - 3 * t, "c$": 40 - t}  # skip: the root's t comes out of 'a' first
    after = _leaves(c, P.restore_discount(rels, t))
    # root split: t shared by mass; 'a', 'ab' splits: t each to 'ab$'; 'c' split: t to 'c$'
    m = before["ab$"] + before["c$"]
    assert after["ab$"] == round(before["ab$"] * (1 + t / m + 2 * t / before["ab$"]))
    assert after["c$"] == round(before["c$"] * (1 + t / m + t / before["c$"]))
    assert P.restore_discount(rels, 0) == rels


# -- direct: terminal budgets and pruned Center -------------------------------------------------------
def test_direct_terminal_cells_spend_what_the_records_path_leaves():
    a = P.direct_accounting(epsilon=1.0, max_depth=6, fanout=5)
    e = a.epsilon_level
    for d in range(1, 7):
        scale, t_scale, thr, t_thr = P.direct_scales(a, d, 5)
        assert scale == pytest.approx(1 / e) == a.scale
        # a key ending at level d: the root, d - 1 non-terminal cells and its terminal cell
        assert e + (d - 1) * e + 1 / t_scale == pytest.approx(1.0)
        assert t_thr <= thr == a.threshold
    assert 7 * e == pytest.approx(1.0)  # a key running past max_depth: the root and 6 cells
    k3 = P.direct_accounting(epsilon=1.0, max_depth=6, fanout=5, max_contributions=3)
    assert P.direct_scales(k3, 2, 5)[1] == pytest.approx(3 * P.direct_scales(a, 2, 5)[1])
    uniform = P.direct_accounting(epsilon=1.0, max_depth=6, fanout=5, terminal_budget=False)
    assert P.direct_scales(uniform, 2, 5)[1] == uniform.scale
    assert P.direct_scales(P.direct_accounting(epsilon=1.0, max_depth=6, prune=False), 2, 5)[2:] == (None, None)
    with pytest.raises(ValueError, match=r"depth \(7\) must be in \[1, 6\]"):
        P.direct_scales(a, 7, 5)


def test_prune_and_center_shares_among_survivors_and_drops_prefixes_without_any():
    alloc = np.array([10, 7, 5, 4])
    noisy = np.array([[8, 1, 3], [2, 2, 1], [9, 0, -1], [0, 1, 2]])
    valid = np.ones((4, 3), bool)
    start = np.zeros(4, np.int64)
    whole = np.array([False, False, True, True])
    sub, dropped = P.prune_and_center(alloc, noisy, valid, start, 3, whole)
    assert sub[0, 1] == 0 and sub[0].sum() == 10 and (sub[0, [0, 2]] > 0).all()  # survivors only
    assert (sub[1] == 0).all() and dropped == 7  # a text prefix with no survivor: dropped
    assert sub[2].tolist() == [5, 0, 0]
    assert sub[3].sum() == 4  # a whole key (cell, root) without survivors: the paper's Center
    per_cell = np.array([[3, 3, 10]] * 4)  # a stricter threshold on the last (terminal) column
    sub2, _ = P.prune_and_center(alloc, noisy, valid, start, per_cell, whole)
    assert sub2[0].tolist() == [10, 0, 0]
    plain, none = P.prune_and_center(alloc, noisy, valid, start, None)
    assert none == 0 and (plain == P.center(alloc, noisy, valid, start)).all()


def test_run_in_memory_is_seeded_and_direct_keeps_only_complete_keys():
    c = TextKeyCodec(column="q", max_length=4, alphabet="abc")
    codes = c.encode_strings(["ab"] * 300 + ["abc"] * 200 + ["b"] * 150 + ["c"] * 2)
    tree = P.DPDirectPrefixSynthesis(codec=c, budget=PureDP(epsilon=2.0), seed=5, label="Prefixes")
    rels = tree.run_in_memory(codes)
    again = tree.run_in_memory(codes)  # seeded: the same labelled draws every time
    assert all((x.prefixes == y.prefixes).all() and (x.counts == y.counts).all() for x, y in zip(rels, again))
    keys, dropped = P.synthetic_keys(rels, c, seed=5)
    assert set(keys["q"]) <= {"ab", "abc", "b", "c"}  # complete keys only: no fragment such as 'a'
    assert {"ab", "abc", "b"} <= set(keys["q"])
    assert len(keys["q"]) + dropped == rels[0].counts.sum() + sum(r.dropped for r in rels[:1])


def _rel(codec, depth, items):
    """A hand-made LevelRelease: ``items`` = [(label without '$' mapped by the codec, count, leaf)]."""
    pre = np.array([[codec.eos if ch == "$" else "abc".index(ch) + 1 for ch in lab] for lab, _c, _l in items],
                   dtype=codec.symbol_dtype).reshape(len(items), depth)
    return P.LevelRelease(depth, pre, np.array([c for _l, c, _f in items], np.int64),
                          np.array([f for _l, _c, f in items], bool))


def test_reduce_to_ancestor_puts_unresolved_mass_on_the_nearest_released_keys():
    c = TextKeyCodec(column="q", max_length=3, alphabet="abc")
    rels = [_rel(c, 1, [("a", 10, False), ("b", 5, False), ("c", 2, True)]),  # 'b': no child released
            _rel(c, 2, [("a$", 6, True), ("ab", 4, False)]),
            _rel(c, 3, [("ab$", 3, True), ("abc", 1, True)])]  # 'abc': an allocation of 1 inside a string
    rels[1].dropped = 5  # as direct_step records it
    out, unplaced = P.reduce_to_ancestor(rels, c)
    leaves = _leaves(c, out)
    assert unplaced == 0 and leaves["c"] == 0 and leaves["abc"] == 0
    # 'abc' (1) → the keys below 'ab' (only 'ab$'); 'b' (5) and 'c' (2) → every key, 6 : 3
    assert leaves["ab$"] == 3 + 1 + 2 and leaves["a$"] == 6 + 5
    assert leaves["a$"] + leaves["ab$"] == 17  # the released total (depth-1 allocations)
    assert [r.counts[~r.leaf].tolist() for r in out] == [[10, 5], [4], []]  # internal values kept
    keys, dropped = P.synthetic_keys(rels, c, reduce=True)
    assert sorted(set(keys["q"])) == ["a", "ab"] and len(keys["q"]) == 17 and dropped == 0
    assert P.synthetic_keys(rels, c)[1] == 2 + 5 + 1  # without the pass: dropped
    # no complete key released at all: everything stays dropped
    none, lost = P.reduce_to_ancestor([_rel(c, 1, [("a", 4, True), ("b", 3, True)])], c)
    assert lost == 7 and P.synthetic_keys(none, c)[1] == 7
    # shares are integers, proportional, exact: largest remainder
    assert prefix_decode._spread(np.array([7]), np.array([0, 0, 0]), np.array([1, 1, 1]), 1).tolist() == [3, 2, 2]


def test_direct_with_reduce_writes_the_noisy_total_on_keys_it_already_wrote():
    c = TextKeyCodec(column="q", max_length=6, alphabet="abcdefgh")
    rng = np.random.default_rng(0)
    rare = ["".join(rng.choice(list("abcdefgh"), rng.integers(2, 7))) for _ in range(300)]
    codes = c.encode_strings(["ab", "abc", "bad", "cafe", "h"] * 200 + rare)
    for seed in range(3):
        rels = P.DPDirectPrefixSynthesis(codec=c, budget=PureDP(epsilon=1.0), seed=seed).run_in_memory(codes)
        plain, dropped = P.synthetic_keys(rels, c, seed=seed)
        reduced, lost = P.synthetic_keys(rels, c, seed=seed, reduce=True)
        assert dropped > 0 and lost == 0
        assert len(reduced["q"]) == int(rels[0].counts.sum()) == len(plain["q"]) + dropped
        assert set(reduced["q"]) == set(plain["q"])  # mass moves onto keys already written


def test_spurious_threshold_is_the_smallest_with_half_a_noise_child_per_split():
    for scale, fanout in ((1.09, 39), (22.0, 39), (4.0, 3), (0.1, 2)):
        b = P.spurious_threshold(scale, fanout)
        tail = (fanout - 1) * (1 - discrete_laplace_cdf(np.array([b, b - 1]) - 1, scale))
        assert tail[0] <= prefix_accounting.SPURIOUS_RATE + 1e-12
        assert b == 1 or tail[1] > prefix_accounting.SPURIOUS_RATE
    # closed form: a tiny ε (huge scale) answers at once instead of counting b up from 1
    for scale, fanout in ((1e6, 39), (1e12, 27)):
        b = P.spurious_threshold(scale, fanout)
        assert b == math.ceil(scale * math.log((fanout - 1) / (prefix_accounting.SPURIOUS_RATE * (1 + math.exp(-1 / scale)))))
    c = TextKeyCodec(column="q", max_length=3)
    with pytest.raises(TypeError, match=r"prune \('yes'\) must be True or False"):
        P.DPDirectPrefixSynthesis(codec=c, budget=PureDP(epsilon=1.0), prune="yes")
    assert P.DPDirectPrefixSynthesis(codec=c, budget=PureDP(epsilon=1.0)).accounting.threshold is not None
    sc = SpatialKeyCodec(columns=("x", "y"), box=((0, 1), (0, 1)), depth=3)
    assert P.DPDirectPrefixSynthesis(codec=sc, budget=PureDP(epsilon=1.0)).accounting.threshold is None


def test_tight_calibration_keeps_a_long_key_the_papers_split_discounts_away():
    """A 9-letter key held by 70 units dominates every prefix: each split takes about t from it
    (9 splits + its end-of-string leaf). t = 17 (theorem3, ε = 1) leaves nothing; t = 6 leaves ~10."""
    c = TextKeyCodec(column="q", max_length=9, alphabet="abcdefghijklmnopqrstuvwxyz")
    codes = c.encode_strings(["manhattan"] * 70 + ["paris"] * 40)
    found = {}
    for calibration in ("tight", "theorem3"):
        hits = 0
        for seed in range(6):
            tree = P.DPImprovedPrefixHistogram(codec=c, budget=PureDP(epsilon=1.0), calibration=calibration,
                                               discount="skip", seed=seed, label="Prefixes")
            keys, _ = P.synthetic_keys(tree.run_in_memory(codes), c, seed=seed)
            hits += "manhattan" in set(keys["q"])
        found[calibration] = hits
    assert found["tight"] >= 5 and found["theorem3"] == 0, found
