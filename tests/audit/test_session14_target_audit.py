"""Audit of H58's branch (issue 18): a declared target as a parent in a k ≥ 1 PrivBayes network
(``privbayes_plan.TARGET_PARENT`` ``"optional"`` / ``"required"`` / ``"useful"``, the latter
with its gate passed), by the recorded draws.

Every privacy draw of one measurement (recorded in every beamsynth module by
``test_session12_accounting.record_draws``) against the accountant's spends: the DP size count
within ``privbayes.size_count``; the rest (structure picks, network tables, refinement) within the
model's spends: Σ ε = ε − ε_c under the Laplace plan, Σ ρ = the zCDP plan's ρ under the Gaussian
plan, with the families holding the target (Adult's shape, target income, DP count; m = 1, 2).
The branch changes the candidates and the tables' cells, never the number of structure steps or
tables, so the recorded sums equal the label-free network's exactly."""

from __future__ import annotations

import dataclasses

import pytest

from beamsynth.transforms import privbayes_plan as pbp
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant
from beamsynth.transforms.measure import count_marginals
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.privbayes import (
    candidate_families,
    gaussian_plan,
    measure_privbayes,
    plan_privbayes,
    spend_privbayes,
)
from tests.audit import test_session12_accounting as s12

pytestmark = [pytest.mark.audit, pytest.mark.slow]  # 9-15 s each: run with -m audit

T = len(s12.SHAPE) - 1  # Adult's income (2 cells)
NAMES = [f"c{i}" for i in range(len(s12.SHAPE))]


def _run(monkeypatch, mode: str, noise: str, m: int, n: int):
    monkeypatch.setattr(pbp, "TARGET_PARENT", mode)
    monkeypatch.setattr(pbp, "TARGET_PARENT_THETA", 0.0)  # "useful": the gate passes here
    budget = ApproxDP(epsilon=s12.EPS, delta=s12.DELTA if noise == "gaussian" else 0.0)
    plan = plan_privbayes(s12.SHAPE, budget, sizing="auto", max_contributions=m, target=T,
                          names=NAMES)
    if noise == "gaussian":
        plan = gaussian_plan(plan, budget)
    if plan.refine is not None:  # the pool is post-processing (no draw reads its size): 20,000 rows
        plan = dataclasses.replace(plan, refine=dataclasses.replace(plan.refine, pool_rows=20_000))
    acc = PrivacyAccountant(total=budget)
    spend_privbayes(acc, plan)
    spends = {s["step"]: s for s in acc.to_dict()["spends"]}
    fams = candidate_families(len(s12.SHAPE), plan.degree, shape=s12.SHAPE,
                              max_family_cells=plan.max_family_cells, target=plan.parent_target)
    codes = s12._codes(n, 0)
    codes[:, T] = (codes[:, 0] + codes[:, 2]) % 2  # the target depends on two columns
    counts = [c.reshape([s12.SHAPE[i] for i in f])
              for c, f in zip(count_marginals(codes, fams, s12.SHAPE), fams)]
    calls = s12.record_draws(monkeypatch)
    out = measure_privbayes(counts, fams, shape=s12.SHAPE, names=NAMES, plan=plan,
                            rs=RandomSource(seed=7))
    count = spends["privbayes.size_count"]
    rest = spends.get("privbayes.zcdp") or {"epsilon": acc.spent_epsilon - count["epsilon"],
                                            "delta": acc.spent_delta}
    return plan, out, s12.verdict(calls, m=m, count=count, rest=rest), count


@pytest.mark.parametrize("mode", ["optional", "required", "useful"])
@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
@pytest.mark.parametrize(("m", "n"), [(1, 20_000), (2, 40_000)])
def test_target_network_draws_fit_the_spends(monkeypatch, mode, noise, m, n):
    """Measured: Laplace Σ ε = 0.98 = ε − ε_c, zCDP Σ ρ / ρ = 1.000000, m = 1 and 2."""
    plan, out, v, count = _run(monkeypatch, mode, noise, m, n)
    assert out.sizing["degree"] == 1 and out.structure[0] == (T, ()), out.sizing
    with_t = [x for x, ps in out.structure if T in ps]
    assert with_t and (mode == "optional" or len(with_t) == len(s12.SHAPE) - 1)
    assert mode != "useful" or out.sizing["target_parent_usefulness"] > 0
    assert any(len(ps) == 2 for _, ps in out.structure)  # (X, T, P) families were released
    assert v["ok"], v
    if noise == "laplace":
        assert v["gaussian"] == 0
        assert v["pure"] == pytest.approx(s12.EPS - count["epsilon"], rel=1e-9)
    else:
        assert v["gaussian"] > 0
        assert v["rho"] == pytest.approx(plan.zcdp.spent_rho, rel=1e-9)


def test_a_table_given_twice_its_share_is_caught(monkeypatch):
    """The audit's own check: the (X, T, P) tables released with a doubled ε (a broken split)
    exceed ε − ε_c and fail the verdict."""
    from beamsynth.transforms import privbayes_measure as pbm

    real = pbm.split_marginal_budget

    def doubled(budget, sizes):
        return [type(b)(epsilon=2 * b.epsilon) for b in real(budget, sizes)]

    monkeypatch.setattr(pbm, "split_marginal_budget", doubled)
    if hasattr(pbm, "split_network_budget"):
        monkeypatch.setattr(pbm, "split_network_budget",
                            lambda budget, specs, shape, **kw: doubled(
                                budget, [s12.np.prod([shape[c] for c in sp]) for sp in specs]))
    _, _, v, _ = _run(monkeypatch, "required", "laplace", 1, 20_000)
    assert not v["ok"] and v["pure"] > s12.EPS
