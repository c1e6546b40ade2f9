"""Fifteenth session (issue 18, H69): every released table's information about a column's margin.

``combine_coarse_margins`` folds the refinement's released coarse pairs into each column's 1-way
estimate (inverse-variance group totals, post-processing); ``choose_structure``'s
``one_way_penalty`` prices a family's expected 1-way noise (declared sizes, public scale).
docs/privbayes.md "Fifteenth session: TVD1 by combining each margin's sources (issue 18, H69)".
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from beamsynth.transforms import privbayes_model as pmod
from beamsynth.transforms.budget import ApproxDP
from beamsynth.transforms.measure import NoisyMarginal
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.privbayes_model import combine_coarse_margins
from beamsynth.transforms.privbayes_structure import choose_structure, one_way_noise
from beamsynth.transforms.refine import RakeTarget


def _table(columns, values, scale, groups=None):
    values = np.asarray(values, dtype=np.int64)
    return NoisyMarginal(columns=tuple(columns), names=tuple(f"c{c}" for c in columns),
                         shape=tuple(values.shape), values=values, scale=scale,
                         budget=ApproxDP(epsilon=1.0, delta=0.0),
                         meta={} if groups is None else {"coarse": True, "groups": groups})


def test_group_totals_are_the_inverse_variance_mean_and_the_profile_is_kept() -> None:
    # network: column 0 (4 cells) only in an X×P table of 4×2 cells at scale 2
    net = _table((0, 1), [[10, 10], [20, 20], [5, 5], [5, 5]], 2.0)
    one_way = {0: np.array([20.0, 40.0, 10.0, 10.0]), 1: np.array([40.0, 40.0])}
    # refinement: column 0 in 2 groups ({0, 1}, {2, 3}) against column 1's 2 cells, scale 3
    groups = [[0, 0, 1, 1], [0, 1]]
    ref = _table((0, 1), [[40, 30], [20, 10]], 3.0, groups)
    out = combine_coarse_margins(one_way, [net], [ref])
    w = 4 / (net.variance * 8)  # per-cell precision of the network's sum (4 of 8 cells)
    u = 1 / (ref.variance * 4 / 2)  # per-group precision of the coarse sum (2 of 4 cells)
    m, z = np.array([60.0, 20.0]), np.array([70.0, 30.0])
    t = ((w / 2) * m + u * z) / (w / 2 + u)
    np.testing.assert_allclose(out[0], [20 * t[0] / 60, 40 * t[0] / 60, 10 * t[1] / 20, 10 * t[1] / 20])
    # column 1 (2 cells, its own grouping): each cell combined
    w1 = 2 / (net.variance * 8)
    t1 = (w1 * np.array([40.0, 40.0]) + u * np.array([60.0, 40.0])) / (w1 + u)
    np.testing.assert_allclose(out[1], t1)
    # the inputs are not changed
    np.testing.assert_array_equal(one_way[0], [20.0, 40.0, 10.0, 10.0])


def test_precise_coarse_sums_win_noisy_ones_do_not_and_empty_groups_are_spread() -> None:
    net = _table((0,), [1, 1, 0, 0], 5.0)
    one_way = {0: np.array([3.0, 1.0, 0.0, 0.0])}
    groups = [[0, 0, 1, 1], [0]]
    sharp = combine_coarse_margins(one_way, [net], [_table((0, 1), [[50], [50]], 1e-3, groups)])
    np.testing.assert_allclose(sharp[0], [37.5, 12.5, 25.0, 25.0], rtol=1e-6)
    vague = combine_coarse_margins(one_way, [net], [_table((0, 1), [[50], [50]], 1e6, groups)])
    np.testing.assert_allclose(vague[0], one_way[0], atol=1e-6)
    # a negative combined total is clipped at 0
    neg = combine_coarse_margins(one_way, [net], [_table((0, 1), [[-90], [0]], 1e-3, groups)])
    assert neg[0].min() >= 0 and neg[0][:2].sum() == 0


def test_no_coarse_tables_no_change_and_non_pairs_ignored() -> None:
    net = _table((0, 1), [[3, 1], [2, 2]], 1.0)
    one_way = {0: np.array([4.0, 4.0]), 1: np.array([5.0, 3.0])}
    for coarse in ([], [_table((0,), [4, 4], 1.0, [[0, 1]])], [_table((0, 1), [[1, 2], [3, 4]], 1.0)]):
        out = combine_coarse_margins(one_way, [net], coarse)
        for c in one_way:
            np.testing.assert_array_equal(out[c], one_way[c])


def test_coarse_targets_are_refitted_to_the_combined_margins() -> None:
    target = RakeTarget((0, 1), (np.array([0, 0, 1]), np.array([0, 1])),
                        np.array([[0.4, 0.1], [0.1, 0.4]]))
    out = pmod._target_on_margins(target, {0: np.array([1.0, 2.0, 1.0]), 1: np.array([1.0, 3.0])})
    np.testing.assert_allclose(out.proportions.sum(axis=1), [0.75, 0.25], atol=1e-8)
    np.testing.assert_allclose(out.proportions.sum(axis=0), [0.25, 0.75], atol=1e-8)
    assert out.columns == target.columns and out.groups is target.groups


def test_one_way_noise_is_child_cells_times_root_parent_cells() -> None:
    shape = (10, 4, 9)
    assert one_way_noise(shape, 0, (), 2.0) == 20.0
    assert one_way_noise(shape, 0, (1,), 2.0) == pytest.approx(10 * 2 * 2.0)
    assert one_way_noise(shape, 0, (1, 2), 0.5) == pytest.approx(10 * 6 * 0.5)


def _structure_tables():
    rng = np.random.default_rng(0)
    n = 4000
    a = rng.integers(0, 2, n)
    wide = np.where(rng.random(n) < 0.6, a * 20 + rng.integers(0, 20, n), rng.integers(0, 40, n))
    codes = np.stack([a, wide], axis=1)
    joint = np.zeros((2, 40))
    np.add.at(joint, (codes[:, 0], codes[:, 1]), 1)
    return {(0, 1): joint}, (2, 40)


def test_one_way_penalty_zero_is_the_old_score_and_a_large_one_drops_a_wide_childs_parent() -> None:
    tables, shape = _structure_tables()
    kw = dict(degree=1, epsilon=50.0, sensitivity=4.0, noise_scale=2.0, root=0)
    old = choose_structure(tables, shape, rs=RandomSource(seed=1), **kw)
    assert choose_structure(tables, shape, rs=RandomSource(seed=1), one_way_penalty=0.0, **kw) == old
    assert old == [(0, ()), (1, (0,))]
    # InDif 2,385 counts, cells penalty 80·2; the parent adds (40·√2 − 40)·2 ≈ 33 of 1-way noise
    # per unit of the penalty: beyond (2,385 − 160 + 80)/33 ≈ 70 the parent costs more than it gains
    big = choose_structure(tables, shape, rs=RandomSource(seed=1), one_way_penalty=200.0, **kw)
    assert big == [(0, ()), (1, ())]
    assert math.isfinite(one_way_noise(shape, 1, (0,), 2.0))


def _pure_measurement(seed: int = 3):
    from beamsynth.transforms.privbayes import plan_privbayes
    from tests.unit.test_privbayes_one_way import _codes, _measure

    shape = (6, 3, 9, 2, 12, 4)
    plan = plan_privbayes(shape, ApproxDP(epsilon=2.0, delta=0.0), degree=1, refine_pairs=4,
                          refine_rounds=2)
    m, _ = _measure(shape, plan, _codes(shape, 3000, seed), seed)
    assert m.refinement is not None and m.refinement.tables
    return m, shape


def test_refine_margins_off_is_the_old_fit_and_whole_moves_only_whole_columns() -> None:
    m, shape = _pure_measurement()
    off = pmod.fit_privbayes(m, shape, refine_margins="off")
    base, targets = pmod._fit_network(m, shape, None, pmod.DEFAULT_SHRINK, "iid")
    assert len(off.targets) == len(targets) + len(m.refinement.targets)
    for a, b in zip(off.targets[len(targets):], m.refinement.targets):
        assert a is b
    for x, _ in base.structure:
        np.testing.assert_array_equal(off.base.conditional(x), base.conditional(x))
    kept_whole = {c for t in m.refinement.tables for c, g in zip(t.columns, t.meta["groups"])
                  if max(g) + 1 == shape[c]}
    in_pairs = {c for t in m.refinement.tables for c in t.columns}
    assert kept_whole and in_pairs - kept_whole  # 5 groups: columns of <= 5 cells are whole
    old_way = pmod._fit_network_margins(m, shape, None, pmod.DEFAULT_SHRINK, "iid")[2]
    for mode, moves in (("whole", kept_whole), ("all", in_pairs)):
        new_way = pmod._fit_network_margins(m, shape, None, pmod.DEFAULT_SHRINK, "iid",
                                            m.refinement.tables, whole_only=mode == "whole")[2]
        moved = {c for c in old_way if not np.allclose(old_way[c], new_way[c])}
        assert moved == moves, mode
    whole = pmod.fit_privbayes(m, shape, refine_margins="whole")
    assert len(whole.targets) == len(off.targets)
    assert not all(np.array_equal(a.proportions, b.proportions)
                   for a, b in zip(whole.targets[len(targets):], m.refinement.targets))
    with pytest.raises(ValueError, match="refine_margins"):
        pmod.fit_privbayes(m, shape, refine_margins="coarse")


def test_zcdp_refinement_is_not_used_so_gaussian_fits_are_unchanged() -> None:
    from tests.unit.test_privbayes_one_way import _codes, _measure, _zcdp_plan

    shape = (6, 3, 9, 2, 12, 4)
    m, _ = _measure(shape, _zcdp_plan(shape), _codes(shape, 3000, 5), 5)
    assert m.refinement is not None and m.refinement.tables[0].noise == "discrete Gaussian"
    off = pmod.fit_privbayes(m, shape, refine_margins="off")
    on = pmod.fit_privbayes(m, shape, refine_margins="all")
    for a, b in zip(off.targets, on.targets):
        np.testing.assert_array_equal(a.proportions, b.proportions)
    for x in range(len(shape)):
        np.testing.assert_array_equal(off.base.conditional(x), on.base.conditional(x))


def test_alive_weights_count_only_the_cells_norm_sub_kept() -> None:
    a = _table((0, 1), [[0, 0, 0, 0], [0, 0, 0, 0]], 2.0)  # shape only: the values are the tables below
    b = _table((0,), [0, 0], 1.0)
    ta = np.array([[6.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0]])  # slice 0: 1 kept cell, slice 1: 4
    tb = np.array([4.0, 12.0])
    est, prec = pmod._one_way_alive([a, b], [ta, tb])
    wa = 1 / (a.variance * np.array([1.0, 4.0]))
    wb = 1 / (b.variance * np.array([1.0, 1.0]))
    np.testing.assert_allclose(prec[0], wa + wb)
    np.testing.assert_allclose(est[0], (wa * [6.0, 10.0] + wb * [4.0, 12.0]) / (wa + wb))
    np.testing.assert_allclose(est[1], ta.sum(axis=0))  # one holder: its sums
    # per-cell precisions feed the group variances of combine_coarse_margins
    groups = [[0, 1], [0]]
    sharp = combine_coarse_margins(est, [a, b], [_table((0, 2), [[3], [9]], 1e-3, groups)],
                                   precision=prec)
    np.testing.assert_allclose(sharp[0], [3.0, 9.0], rtol=1e-4)



def test_the_fit_mode_is_the_plans_not_the_workers_default(monkeypatch) -> None:
    """``refine_margins`` (default ``"alive"`` since the lead adopted H69's mode) is read from
    ``privbayes_model.DEFAULT_REFINE_MARGINS`` when the plan is built and travels in the plan to
    the Fit step: a launcher that sets ``"off"`` (the release before H69) gets ``"off"`` on a
    worker whose fresh module says ``"alive"`` (as ``split_table_weight``, H67). The spend
    details name it. Fails when DPPrivBayes' Fit step reads the module default."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    from beamsynth.schemas.schema import EncodedBatch, load_schema
    from beamsynth.transforms import privbayes_beam as pbb
    from beamsynth.transforms.budget import PrivacyAccountant, PureDP

    assert pmod.DEFAULT_REFINE_MARGINS == "alive"
    schema = load_schema("adult")
    monkeypatch.setattr(pmod, "DEFAULT_REFINE_MARGINS", "off")  # the launcher
    acc = PrivacyAccountant(total=ApproxDP(epsilon=1.0, delta=0.0))
    step = pbb.DPPrivBayes(schema=schema, budget=PureDP(epsilon=1.0), seed=5, accountant=acc)
    assert step.plan.refine_margins == "off"
    spends = {s["step"]: s for s in acc.to_dict()["spends"]}
    assert spends["privbayes.marginals"]["details"]["fit_refine_margins"] == "off"
    monkeypatch.setattr(pmod, "DEFAULT_REFINE_MARGINS", "alive")  # a worker's fresh module
    monkeypatch.setattr(pbb, "fit_privbayes", lambda m, *a, **kw: kw.get("refine_margins"))
    codes = np.random.default_rng(0).integers(0, 2, (300, len(schema.shape)))
    with beam.Pipeline() as p:  # the Fit step's output is the mode it was given
        out = p | beam.Create([EncodedBatch(codes)]) | step
        assert_that(out, equal_to(["off"]))
