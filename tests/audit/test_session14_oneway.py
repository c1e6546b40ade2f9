"""Fourteenth session, H59 (issue 18): the pure-ε network's tables split ε by
``split_network_budget`` (toward the tables that carry the columns' 1-way margins) instead of
∝ √cells. Audited from the draws themselves (``test_session12_accounting.record_draws``): Adult's
declared shape, ε = 1, DP count, m = 1 and 2, the network branch; Laplace plan: every draw pure,
the network tables' discrete Laplace draws (L1 Δ = m each) cost ``Σ m/b_i`` = the marginal spend,
and everything sums to ε − ε_c exactly; zCDP plan (δ = 1e-9): untouched by the split, its draws
fit ``privbayes.zcdp``. Broken variant caught: the split's ε scaled up by 2% (the 1-way gain
bought with budget)."""

from __future__ import annotations

import pytest

from beamsynth.transforms import privbayes_sizing as sizing
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.privbayes import (
    gaussian_plan,
    measure_privbayes,
    plan_privbayes,
    spend_privbayes,
)
from tests.audit import test_session12_accounting as s12

pytestmark = pytest.mark.audit

ROWS = 30_000  # above the band at ε = 1 on Adult's shape: the k = 1 network


def _plan(noise_mode: str, m: int):
    budget = ApproxDP(epsilon=s12.EPS, delta=s12.DELTA if noise_mode == "gaussian" else 0.0)
    # the refinement is not what is audited here (its draws are: session 12), so none
    plan = plan_privbayes(s12.SHAPE, budget, sizing="auto", max_contributions=m, degree=1,
                          refine_pairs=0)
    if noise_mode == "gaussian":
        plan = gaussian_plan(plan, budget)
    acc = PrivacyAccountant(total=budget)
    spend_privbayes(acc, plan)
    return plan, {s["step"]: s for s in acc.to_dict()["spends"]}, acc


def _run(plan, monkeypatch):
    calls = s12.record_draws(monkeypatch)
    fams, counts = s12._counts(plan, s12._codes(ROWS, 0))
    out = measure_privbayes(counts, fams, shape=s12.SHAPE,
                            names=[f"c{i}" for i in range(len(s12.SHAPE))], plan=plan,
                            rs=RandomSource(seed=7))
    return out, calls


@pytest.mark.parametrize("m", [1, 2])
def test_laplace_network_split_draws_sum_to_the_spend(monkeypatch, m: int) -> None:
    monkeypatch.setattr(sizing, "NETWORK_SPLIT_TABLE_WEIGHT", 1.0)
    plan, spends, acc = _plan("laplace", m)
    out, calls = _run(plan, monkeypatch)
    assert out.sizing["degree"] == 1, out.sizing
    tables = [c for c in calls if c["kind"] == "discrete_laplace" and "marginals" in c["labels"]
              and "refine" not in c["labels"]]
    assert len(tables) == len(out.marginals)
    assert sum(m / c["param"] for c in tables) == pytest.approx(
        spends["privbayes.marginals"]["epsilon"], rel=1e-9)
    # the split moved ε off √cells (else this audits nothing new)
    sq = sizing.split_marginal_budget(plan.marginal_budget, [t.values.size for t in out.marginals])
    assert max(abs(m / c["param"] - b.epsilon) for c, b in zip(tables, sq)) > 1e-4
    count = spends["privbayes.size_count"]
    v = s12.verdict(calls, m=m, count=count,
                    rest={"epsilon": acc.spent_epsilon - count["epsilon"], "delta": 0.0})
    assert v["ok"] and v["gaussian"] == 0, v
    assert v["pure"] == pytest.approx(s12.EPS - count["epsilon"], rel=1e-9)


def test_broken_split_that_overspends_is_caught(monkeypatch) -> None:
    monkeypatch.setattr(sizing, "NETWORK_SPLIT_TABLE_WEIGHT", 1.0)
    from beamsynth.transforms import privbayes_measure as pbm

    real = pbm.split_network_budget
    monkeypatch.setattr(pbm, "split_network_budget", lambda b, specs, shape, **kw: [
        type(x)(epsilon=1.02 * x.epsilon) for x in real(b, specs, shape, **kw)])
    plan, spends, acc = _plan("laplace", 1)
    out, calls = _run(plan, monkeypatch)
    count = spends["privbayes.size_count"]
    v = s12.verdict(calls, m=1, count=count,
                    rest={"epsilon": acc.spent_epsilon - count["epsilon"], "delta": 0.0})
    assert not v["ok"], v


@pytest.mark.parametrize("m", [1, 2])
def test_zcdp_network_is_untouched_and_fits_rho(monkeypatch, m: int) -> None:
    plan, spends, _ = _plan("gaussian", m)
    monkeypatch.setattr(sizing, "NETWORK_SPLIT_TABLE_WEIGHT", 1.0)
    out, calls = _run(plan, monkeypatch)
    calls = list(calls)  # this run's draws (the recorder keeps appending)
    monkeypatch.setattr(sizing, "NETWORK_SPLIT_TABLE_WEIGHT", None)
    before, _ = _run(plan, monkeypatch)
    assert out.sizing["degree"] == 1, out.sizing
    assert [t.scale for t in out.marginals] == [t.scale for t in before.marginals]
    v = s12.verdict(calls, m=m, count=spends["privbayes.size_count"], rest=spends["privbayes.zcdp"])
    assert v["ok"] and v["gaussian"] > 0, v
