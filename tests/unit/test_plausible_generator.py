"""The pluggable seed-based generator (Section 3.2): ``Pr{y = M(d)}`` exact on tiny networks by
enumeration, the fitted network's tables, and the PrivBayes model as a generator."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from beamsynth.transforms import plausible as P
from beamsynth.transforms import plausible_filter
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.privbayes import PrivBayesModel

SHAPE = (2, 3, 2, 3)
# a DAG whose topological order is not the column order: 2 → 0 → 1, (0, 2) → 3
PARENTS = ((2,), (0,), (), (0, 2))
ORDER = (2, 0, 1, 3)


def _tables(seed: int = 0) -> list[np.ndarray]:
    rs = RandomSource(seed=seed)
    out = []
    for i, ps in enumerate(PARENTS):
        rows = int(np.prod([SHAPE[p] for p in ps])) if ps else 1
        t = 0.05 + rs.child(i).uniform(rows * SHAPE[i]).reshape(rows, SHAPE[i])
        out.append(t / t.sum(axis=1, keepdims=True))
    return out


def _generator(omega: int) -> P.NetworkGenerator:
    return P.NetworkGenerator(structure=P.PlausibleStructure(parents=PARENTS, order=ORDER), shape=SHAPE,
                              conditionals=_tables(), omega=omega)


def _law_by_enumeration(d: tuple[int, ...], omega: int) -> dict[tuple[int, ...], float]:
    """The output law of the resampling procedure applied literally to seed ``d``: copy the first
    ``m − ω`` attributes of the order, then draw each later one from its table given the current
    values of its parents (every branch enumerated, probabilities multiplied)."""
    tables = _tables()
    law: dict[tuple[int, ...], float] = {}

    def step(y: list[int], p: float, rest: tuple[int, ...]) -> None:
        if not rest:
            law[tuple(y)] = law.get(tuple(y), 0.0) + p
            return
        i = rest[0]
        cfg = 0
        for q in PARENTS[i]:  # ravel_multi_index by hand (row-major)
            cfg = cfg * SHAPE[q] + y[q]
        for v in range(SHAPE[i]):
            z = list(y)
            z[i] = v
            step(z, p * tables[i][cfg, v], rest[1:])

    step(list(d), 1.0, ORDER[len(SHAPE) - omega:])
    return law


@pytest.mark.parametrize("omega", [1, 2, 3, 4])
def test_log_prob_is_the_exact_law_of_the_resampling(omega):
    gen = _generator(omega)
    cells = np.array(list(itertools.product(*[range(s) for s in SHAPE])), dtype=np.int64)
    got = np.exp(gen.log_prob(cells, cells))  # [y, d]
    for b, d in enumerate(cells.tolist()):
        law = _law_by_enumeration(tuple(d), omega)
        want = np.array([law.get(tuple(y), 0.0) for y in cells.tolist()])
        np.testing.assert_allclose(got[:, b], want, rtol=1e-12, atol=0)
        assert want.sum() == pytest.approx(1.0)
    assert gen.copied_columns() == tuple(sorted(ORDER[:len(SHAPE) - omega]))


def test_generate_follows_the_law_and_reports_its_own_probability():
    gen = _generator(3)
    d = (1, 2, 0, 1)
    y, logp = gen.generate(np.tile(np.array(d), (40_000, 1)), RandomSource(seed=3))
    np.testing.assert_allclose(logp, gen.log_prob(y, np.array([d]))[:, 0], rtol=1e-12)
    law = _law_by_enumeration(d, 3)
    keys, counts = np.unique(y, axis=0, return_counts=True)
    freq = {tuple(k): c / len(y) for k, c in zip(keys.tolist(), counts)}
    assert set(freq) <= {k for k, p in law.items() if p > 0}
    # seeded: deterministic; the largest deviation of 36 cells at n = 40,000 is ~0.005 (3 SD ≈ 0.007)
    assert max(abs(freq.get(k, 0.0) - p) for k, p in law.items()) < 0.01


@pytest.mark.parametrize("gamma", [1.5, 4.0])
def test_fast_count_equals_the_generic_count(gamma):
    """``Pr{y = M(d)} = 1[y_C = d_C]·q(y)``: the grouped count is the γ-interval count."""
    gen = _generator(2)
    rs = RandomSource(seed=5)
    seeds = np.stack([rs.child(i).integers(s, 600) for i, s in enumerate(SHAPE)], axis=1)
    y, own = gen.generate(seeds[rs.child("pick").integers(600, 300)], rs.child("gen"))
    cols = gen.copied_columns()
    uk, cnt = plausible_filter._unique_counts(P.group_keys(seeds, cols, SHAPE), np.ones(600, np.int64))
    fast = plausible_filter.lookup_counts(uk, cnt, P.group_keys(y, cols, SHAPE))
    generic = P.count_plausible_generic(own, gen.log_prob(y, seeds), gamma)
    np.testing.assert_array_equal(fast, generic)
    assert fast.min() >= 1  # the seed itself is plausible


def test_the_cfs_network_keeps_its_draws():
    """PlausibleBayesNet now shares the resampling code: the same seeded candidates as the
    paper's network computed by hand from its conditionals (nothing else changed)."""
    counts = [np.arange(1, 1 + SHAPE[i] * (int(np.prod([SHAPE[p] for p in ps])) if ps else SHAPE[i]))
              .reshape(-1, SHAPE[i]) for i, ps in enumerate(PARENTS)]
    net = P.PlausibleBayesNet(structure=P.PlausibleStructure(parents=PARENTS, order=ORDER), shape=SHAPE,
                              counts=counts, noise_scale=1.0, alpha=1.0, omega=2, key=b"k" * 32)
    seeds = np.array([[0, 1, 1, 2], [1, 0, 0, 0]] * 5)
    y, logp = net.generate(seeds, RandomSource(seed=1))
    rs = RandomSource(seed=1)
    want = seeds.copy()
    for i in net.resampled_columns():
        probs = net.conditional_rows(i, net.config_index(i, want))
        cdf = np.cumsum(probs, axis=1)
        u = rs.child("resample", i).uniform(len(want)) * cdf[:, -1]
        want[:, i] = np.minimum((cdf < u[:, None]).sum(axis=1), SHAPE[i] - 1)
    np.testing.assert_array_equal(y, want)
    np.testing.assert_allclose(logp, net.log_q(y))


def test_fitted_tables_are_the_weighted_frequencies_with_the_prior():
    rs = RandomSource(seed=2)
    n = 5000
    a = rs.child("a").integers(2, n)
    b = np.where(rs.child("flip").uniform(n) < 0.1, 1 - a, a)  # b follows a
    c = rs.child("c").integers(3, n)  # independent of both
    pool = np.stack([a, b, c], axis=1)
    w = 0.5 + rs.child("w").uniform(n)
    gen = P.fit_network_generator(pool, w, shape=(2, 2, 3), omega=2, order=(0, 1, 2), prior_rows=2.0)
    assert gen.structure.parents == ((), (0,), ())  # b's parent is a; c gets none (BIC)
    ws = w * n / w.sum()
    joint = np.zeros((2, 2))
    np.add.at(joint, (a, b), ws)
    marg = joint.sum(axis=0) / joint.sum()
    want = (joint + 2.0 * marg) / (joint.sum(axis=1, keepdims=True) + 2.0)
    np.testing.assert_allclose(gen.conditional(1), want, rtol=1e-6)
    assert gen.copied_columns() == (0,) and gen.resampled_columns() == (1, 2)


@pytest.mark.parametrize("kw,msg", [
    ({"omega": 0}, r"omega \(0\) must be an int in \[1, 4\]"),
    ({"order": (0, 1, 2, 3)}, r"order \(0, 1, 2, 3\) is not topological: column 0 has parents \(2,\)"),
    ({"bad_shape": True}, r"conditional of column 0 has shape \(3, 2\), expected \(2, 2\)"),
])
def test_network_generator_validation(kw, msg):
    tables = _tables()
    if kw.get("bad_shape"):
        tables[0] = np.full((3, 2), 0.5)
    with pytest.raises(ValueError, match=msg):
        P.NetworkGenerator(structure=P.PlausibleStructure(parents=PARENTS, order=kw.get("order", ORDER)),
                           shape=SHAPE, conditionals=tables, omega=kw.get("omega", 2))


def test_privbayes_model_as_generator_copies_small_domains_and_resamples_in_network_order():
    shape = (4, 2, 3)
    # network: 1 → 0 → 2 (sampling order), strong dependences
    cond1 = np.array([[0.3, 0.7]])
    cond0 = np.array([[0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7]])
    cond2 = np.array([[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8], [0.1, 0.8, 0.1]])
    model = PrivBayesModel(shape, [(1, ()), (0, (1,)), (2, (0,))], [cond1, cond0, cond2], sampling="iid")
    assert P.copy_first_order(shape) == (1, 2, 0)
    gen = P.privbayes_generator(model, omega=2, rs=RandomSource(seed=4), pool_rows=60_000)
    assert gen.copied_columns() == (1,)  # the smallest declared domain
    assert gen.resampled_columns() == (0, 2)  # the network's order
    assert gen.structure.parents[0] == (1,) and gen.structure.parents[2] == (0,)
    np.testing.assert_allclose(gen.conditional(0), cond0, atol=0.02)
    np.testing.assert_allclose(gen.conditional(2), cond2, atol=0.02)
    with pytest.raises(ValueError, match=r"omega \(4\) must be an int in \[1, 3\]"):
        P.privbayes_generator(model, omega=4, rs=RandomSource(seed=4))


def test_large_domains_are_inverted_per_configuration_with_the_same_draws():
    """A 300-cell column takes the binary-search path: the same values as the row-by-row
    comparison ``#{cdf < u·total}``, and the fitted table respects the cell cap."""
    shape = (3, 300)
    rs = RandomSource(seed=8)
    cond0 = np.array([[0.2, 0.3, 0.5]])
    cond1 = 0.01 + rs.child("t").uniform(3 * 300).reshape(3, 300)
    for r in range(3):  # configuration r puts most of its mass on cells [100r, 100r + 100)
        cond1[r, 100 * r:100 * r + 100] += 1.0
    cond1 /= cond1.sum(axis=1, keepdims=True)
    gen = P.NetworkGenerator(structure=P.PlausibleStructure(parents=((), (0,)), order=(0, 1)), shape=shape,
                             conditionals=[cond0, cond1], omega=1)
    seeds = np.stack([rs.child("s").integers(3, 5000), np.zeros(5000, np.int64)], axis=1)
    y, logp = gen.generate(seeds, RandomSource(seed=9))
    u = RandomSource(seed=9).child("resample", 1).uniform(5000)
    cdf = np.cumsum(cond1, axis=1)[seeds[:, 0]]
    want = np.minimum((cdf < (u * cdf[:, -1])[:, None]).sum(axis=1), 299)
    np.testing.assert_array_equal(y[:, 1], want)
    np.testing.assert_allclose(logp, np.log(cond1[seeds[:, 0], want]))
    pool = gen.sample_codes(20_000, RandomSource(seed=10))
    assert P.choose_parents(pool, np.ones(len(pool)), shape=shape, column=1, candidates=[0], max_parents=1,
                            max_configs=10) == (0,)
    assert P.choose_parents(pool, np.ones(len(pool)), shape=shape, column=1, candidates=[0], max_parents=1,
                            max_configs=10, max_cells=899) == ()  # 3 × 300 cells > 899
