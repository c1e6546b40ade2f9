"""SBHG's hash size from n·ε (issue 18): fewer hash features, or independent 1-way marginals,
when a public row count is too small for the hashed tables; decided at build time."""

import pytest

from beamsynth.pipelines.methods.sbhg import SBHGMethod
from beamsynth.schemas.schema import load_schema
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant
from beamsynth.transforms.privbayes import SIZING_THETA
from beamsynth.transforms.sbhg import DPHashedConditionals, choose_hash_size
from beamsynth.transforms.synthesis import DPIndependentMarginals

ADULT = load_schema("adult")


def test_hash_size_needs_mean_cell_counts_above_the_sba_threshold():
    # (4, 4, 4): r = 1 tables have 16 cells; 3,200 rows are θ-useful at ε = 1 (3200/48 >= θ)
    assert choose_hash_size(3200, 1.0, (4, 4, 4), top_r=1, min_cell_count=200) == 1
    assert choose_hash_size(3200, 1.0, (4, 4, 4), top_r=1, min_cell_count=201) == 0


def test_hash_size_follows_n_epsilon():
    # shape (4, 4, 4): r hash features give tables of 4^(r+1) cells; d = 3
    assert choose_hash_size(48 * SIZING_THETA * 1.001, 1.0, (4, 4, 4), top_r=2) == 1
    assert choose_hash_size(48 * SIZING_THETA * 0.999, 1.0, (4, 4, 4), top_r=2) == 0
    assert choose_hash_size(192 * SIZING_THETA * 1.001, 1.0, (4, 4, 4), top_r=2) == 2
    assert choose_hash_size(10**9, 1.0, (4, 4, 4), top_r=1) == 1
    sizes = [choose_hash_size(n, 1.0, ADULT.shape, top_r=2) for n in (1000, 5000, 20000, 10**6)]
    assert sizes == [0, 1, 1, 2]


def _method(rows, **options):
    acc = PrivacyAccountant(total=ApproxDP(epsilon=1.0, delta=1e-6))
    m = SBHGMethod(schema=ADULT, accountant=acc, budget=ApproxDP(epsilon=1.0, delta=1e-6),
                   max_contributions=1, seed=1, options={"input_rows": rows, "rows": 50, **options})
    return m, [s.step for s in acc.spends], acc


def test_small_public_rows_fall_back_to_independent_marginals_with_the_whole_epsilon():
    m, steps, acc = _method(1000)
    assert isinstance(m.transform, DPIndependentMarginals)
    assert steps == ["sbhg.fallback_independent"] and acc.spent_epsilon == pytest.approx(1.0)
    details = m.details()["sbhg"]
    assert details["model"].startswith("independent") and details["sizing"]["top_r_chosen"] == 0


def test_larger_rows_keep_sbhg_with_the_supported_hash_size():
    m, steps, _ = _method(32000)  # Adult's size: mean count 32000/g² ≈ 360 ≥ SBA threshold 299
    assert isinstance(m.transform, DPHashedConditionals) and m.transform.details()["top_r"] == 1
    assert m.details()["sbhg"]["sizing"]["sba_threshold"] == 299
    assert isinstance(_method(5000)[0].transform, DPIndependentMarginals)  # θ-useful, below SBA
    assert steps == ["sbhg.hash_selection", "sbhg.conditionals"]
    assert m.details()["sbhg"]["sizing"]["top_r_requested"] == 2
    off, _, _ = _method(1000, sbhg_sizing="off")  # the old behaviour on request; no rows: unchanged
    assert isinstance(off.transform, DPHashedConditionals) and off.details()["sbhg"]["sizing"] is None
    assert _method(None)[0].details()["sbhg"]["sizing"] is None
