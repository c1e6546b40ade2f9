"""Session 12 review (H39) of H37's zCDP PrivBayes accounting (a20087a), by computation.

H37's claim: without a public row count, the DP size count is pure ``ε_c``-DP (spend
``privbayes.size_count``, ``(ε_c, 0)``), and every model the count selects in the measurement step
is ``(ε − ε_c, δ)``-DP (spend ``privbayes.zcdp``): the network at ``ρ' = zcdp_rho(ε − ε_c, δ)``,
the run-time forest with pure ``ε − ε_c``, or discrete Gaussian 1-way tables at ``ρ'``; adaptive
basic composition (Dwork & Roth 2014 Thm. 3.16) then gives ``(ε, δ)``.

Checked here independently of the project's accounting code: one measurement per branch is run
with every privacy draw recorded from the draw itself (discrete Laplace scale, discrete Gaussian σ,
permute-and-flip ε and Δ, and the draw's randomness labels), in every beamsynth module that draws;
the size count is the draw labelled ``size_count``. The verdict:

* the count: one discrete Laplace draw of L1 sensitivity ``m`` whose ``m/b`` is at most the ε of
  the accountant's ``privbayes.size_count`` spend, whose δ is 0;
* the rest fits the accountant's ``privbayes.zcdp`` spend ``(ε', δ)``: either every draw is pure
  (no Gaussian) and ``Σ ε_i ≤ ε'`` (sequential composition), or ``Σ ρ_i`` (ε-DP ⇒ ε²/2-zCDP, Bun
  & Steinke 2016 Prop. 1.4; discrete Gaussian of L2 sensitivity m ⇒ m²/(2σ²), Canonne, Kamath &
  Steinke 2020 Thm. 4) converts to ``(ε', δ'')`` with ``δ'' ≤ δ`` by CKS 2020 Cor. 13, minimized
  here on a dense grid over α (not budget.zcdp_delta);
* the two spends add up to the method's ``(ε, δ)``.

Branches: network, forest, Gaussian 1-way tables (DP count; m = 1, 2), the network and the
build-time forest with a public row count (no count), the network → forest band (H53: a θ-useful
``k = 1`` network below ``NETWORK_FOREST_THETA`` gives way to the pure forest from the DP count as
with public rows), and three declared windows of different
sizes in one measurement step (each window its own count and branch). Broken variants that must be
caught: the forest given ε instead of ε − ε_c, the 1-way tables given zcdp_rho(ε, δ), the network's
ρ from ε. Finally a two-night ``beamsynth release`` of ``pb_noise: gaussian``: the ledger, release
and manifest totals.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pytest
from apache_beam.transforms.window import IntervalWindow

import beamsynth.transforms.noise as noise
from beamsynth.pipelines.cli.main import main
from beamsynth.transforms import privbayes_measure as pbm
from beamsynth.transforms import privbayes_plan as pbp
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant, zcdp_rho
from beamsynth.transforms.measure import count_marginals, window_labels
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.privbayes import (
    INDIF_SENSITIVITY,
    candidate_families,
    gaussian_plan,
    measure_privbayes,
    plan_privbayes,
    spend_privbayes,
)
from beamsynth.transforms.privbayes_measure import PrivBayesMeasureFn

pytestmark = pytest.mark.audit

SHAPE = (14, 9, 14, 16, 16, 7, 15, 6, 5, 2, 12, 10, 14, 42, 2)  # Adult's declared cells
EPS, DELTA = 1.0, 1e-9
ROOT = Path(__file__).resolve().parents[2]
ADULT = ROOT / "examples" / "data" / "adult" / "adult.csv"
needs_adult = pytest.mark.skipif(not ADULT.exists(), reason="examples/data/adult/adult.csv absent")


# -- the independent verdict -----------------------------------------------------------------------
def cks_delta(rho: float, eps: float) -> float:
    """δ of ρ-zCDP at ε by Canonne, Kamath & Steinke 2020 Cor. 13,
    ``min_{α>1} exp((α−1)(αρ−ε)) / (α−1) · (1 − 1/α)^α``, on a dense log grid of α − 1 then a
    finer grid around the best point (any α gives a valid δ, so this is an upper bound)."""
    def log_delta(am1: np.ndarray) -> np.ndarray:
        a = 1.0 + am1
        return am1 * (a * rho - eps) - np.log(am1) + a * np.log1p(-1.0 / a)

    grid = np.geomspace(1e-6, 1e7, 400_001)
    i = int(np.argmin(log_delta(grid)))
    fine = np.linspace(grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)], 20_001)
    return float(math.exp(min(log_delta(fine).min(), log_delta(grid[i:i + 1])[0])))


_DRAWS = ("discrete_laplace", "discrete_gaussian", "permute_and_flip", "exponential_mechanism")


def record_draws(monkeypatch) -> list[dict]:
    """Replace every privacy draw that a beamsynth module (other than noise itself, whose
    samplers call each other) imported from ``noise`` with a recorder of its parameters and the
    randomness labels of the draw."""
    calls: list[dict] = []

    def recorder(kind, fn):
        if kind in ("permute_and_flip", "exponential_mechanism"):
            def rec(rs, scores, *, epsilon, sensitivity, **kw):
                calls.append({"kind": kind, "epsilon": epsilon, "sensitivity": sensitivity,
                              "labels": rs.labels})
                return fn(rs, scores, epsilon=epsilon, sensitivity=sensitivity, **kw)
        else:
            def rec(rs, param, size):
                calls.append({"kind": kind, "param": float(param), "size": size,
                              "labels": rs.labels})
                return fn(rs, param, size)
        return rec

    originals = {k: getattr(noise, k) for k in _DRAWS}
    for name, mod in list(sys.modules.items()):
        if not name.startswith("beamsynth.") or mod is noise or mod is None:
            continue
        for kind, fn in originals.items():
            for attr, value in list(vars(mod).items()):
                if value is fn:
                    monkeypatch.setattr(mod, attr, recorder(kind, fn))
    return calls


def verdict(calls: list[dict], *, m: int, count: dict | None, rest: dict) -> dict:
    """Whether the recorded draws fit the spends (module docstring). ``count``/``rest``: the
    accountant's spends ``{"epsilon", "delta"}`` (``count`` None: no size count planned)."""
    counted = [c for c in calls if c["labels"] and c["labels"][-1] == "size_count"]
    others = [c for c in calls if c not in counted]
    out = {"count_ok": True, "pure": 0.0, "rho": 0.0, "gaussian": 0}
    if count is None:
        out["count_ok"] = not counted
    else:
        out["count_ok"] = (len(counted) == 1 and counted[0]["kind"] == "discrete_laplace"
                           and count["delta"] == 0.0
                           and m / counted[0]["param"] <= count["epsilon"] * (1 + 1e-12))
    for c in others:
        if c["kind"] in ("permute_and_flip", "exponential_mechanism"):
            assert c["sensitivity"] in (INDIF_SENSITIVITY * m, m), c  # the documented Δ
            e = c["epsilon"]
            out["pure"] += e
            out["rho"] += e * e / 2
        elif c["kind"] == "discrete_laplace":  # counts of L1 sensitivity m: (m/b)-DP
            e = m / c["param"]
            out["pure"] += e
            out["rho"] += e * e / 2
        else:  # discrete Gaussian of L2 sensitivity m
            out["gaussian"] += 1
            out["pure"] = math.inf
            out["rho"] += m * m / (2 * c["param"] ** 2)
    out["pure_ok"] = out["pure"] <= rest["epsilon"] * (1 + 1e-9)
    out["zcdp_delta"] = cks_delta(out["rho"], rest["epsilon"])
    out["zcdp_ok"] = out["zcdp_delta"] <= rest["delta"] * (1 + 1e-6)
    out["ok"] = out["count_ok"] and (out["pure_ok"] or out["zcdp_ok"])
    return out


def _codes(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    codes = np.stack([rng.integers(0, c, n) for c in SHAPE], axis=1)
    codes[:, 1] = codes[:, 0] % SHAPE[1]  # strong pairs, so a forest or network has edges to pick
    codes[:, 3] = codes[:, 2] % SHAPE[3]
    return codes


def _plan_and_spends(m: int, rows: int | None):
    budget = ApproxDP(epsilon=EPS, delta=DELTA)
    plan = gaussian_plan(plan_privbayes(SHAPE, budget, sizing="auto", rows=rows,
                                        max_contributions=m), budget)
    # the refinement's pool is post-processing of released tables (no draw reads its size): the
    # 20,000-row floor instead of up to 200,000 rows, for speed (the same draws are recorded)
    if plan.refine is not None:
        plan = dataclasses.replace(plan, refine=dataclasses.replace(plan.refine, pool_rows=20_000))
    acc = PrivacyAccountant(total=budget)
    spend_privbayes(acc, plan)
    spends = {s["step"]: s for s in acc.to_dict()["spends"]}
    return plan, spends, acc


def _counts(plan, codes):
    fams = candidate_families(len(SHAPE), plan.degree, shape=SHAPE,
                              max_family_cells=plan.max_family_cells)
    counts = [c.reshape([SHAPE[i] for i in f])
              for c, f in zip(count_marginals(codes, fams, SHAPE), fams)]
    return fams, counts


def _branch(plan, out) -> str:
    if out.sizing is None:  # public rows: the build-time plan
        return "forest" if plan.forest is not None else (
            "network" if plan.degree > 0 else "independent")
    if out.sizing["degree"] > 0:
        return "network"
    return "forest" if "forest_edges" in out.sizing else "independent"


def audit_branch(monkeypatch, *, n: int, m: int, rows: int | None, seed: int = 0):
    plan, spends, acc = _plan_and_spends(m, rows)
    calls = record_draws(monkeypatch)
    fams, counts = _counts(plan, _codes(n, seed))
    out = measure_privbayes(counts, fams, shape=SHAPE, names=[f"c{i}" for i in range(len(SHAPE))],
                            plan=plan, rs=RandomSource(seed=seed))
    rest = spends.get("privbayes.zcdp")
    if rest is None:  # a build-time small-input plan: pure spends only (sequential composition)
        rest = {"epsilon": acc.spent_epsilon - spends.get("privbayes.size_count", {}).get("epsilon", 0.0),
                "delta": acc.spent_delta}
    return plan, spends, acc, _branch(plan, out), verdict(
        calls, m=m, count=spends.get("privbayes.size_count"), rest=rest)


# -- 1. every branch, DP count or public rows -------------------------------------------------------
@pytest.mark.parametrize(("n", "m", "rows", "branch"), [
    (20_000, 1, None, "network"),
    (30_000, 2, None, "network"),
    (14_000, 1, None, "network"),  # H47: the refinement cut to 28 pairs, 12 pairs' ρ on the tables
    (8_000, 1, None, "forest"),  # H53: the band (θ-useful k = 1 below 9) from the DP count ...
    (20_000, 2, None, "forest"),  # ... at m = 2 (usefulness 7.5)
    (8_000, 1, 8_000, "forest"),  # ... and with public rows: the build-time forest, pure spends
    (300, 1, None, "forest"),
    (6_000, 2, None, "forest"),
    (60, 1, None, "independent"),
    (120, 2, None, "independent"),
    (48_842, 1, 48_842, "network"),  # public row count: no size count
    (300, 1, 300, "forest"),  # public row count: the build-time forest (pure Laplace spends)
    (60, 1, 60, "independent"),  # public row count: Gaussian 1-way tables planned at build time
])
def test_every_branch_fits_its_spends(monkeypatch, n, m, rows, branch):
    """Measured (ε = 1, δ = 1e-9, ε_c = 0.02): the network's and the 1-way tables' draws cost
    ρ/ρ' = 1.000000 of ρ' = zcdp_rho(0.98, 1e-9) (δ'' = 1.0e-9), m = 1 and 2, with public rows
    ρ(1, 1e-9) likewise; the run-time forest's pure draws Σε = 0.9800 = ε − ε_c (its zCDP cost
    would be 2.37 ρ' at m = 1, 1.86 ρ' at m = 2: the forest is accounted pure, as documented); the
    build-time forest Σε = 1.0000 of its pure spends. H53's band forests (n = 8,000 m = 1,
    20,000 m = 2 from the DP count; 8,000 public rows): the same pure sums."""
    plan, spends, acc, got, v = audit_branch(monkeypatch, n=n, m=m, rows=rows)
    assert got == branch
    assert (acc.spent_epsilon, acc.spent_delta) == pytest.approx(
        (EPS, 0.0 if plan.zcdp is None else DELTA))  # a build-time forest is pure
    if rows is None:
        c, z = spends["privbayes.size_count"], spends["privbayes.zcdp"]
        assert c["delta"] == 0.0 and c["epsilon"] + z["epsilon"] == pytest.approx(EPS, rel=1e-12)
        assert z["delta"] == DELTA
    else:
        assert "privbayes.size_count" not in spends
    assert v["ok"], v
    rest = spends.get("privbayes.zcdp", {"epsilon": EPS, "delta": 0.0})
    if branch == "forest":  # pure, and the whole ε − ε_c is used (the draws were all recorded)
        assert v["gaussian"] == 0 and v["pure"] == pytest.approx(rest["epsilon"], rel=1e-9)
    else:
        assert v["zcdp_ok"] and v["gaussian"] > 0
        assert v["rho"] == pytest.approx(zcdp_rho(rest["epsilon"], rest["delta"]), rel=1e-9)


# -- 2. broken variants ------------------------------------------------------------------------------
def _forest_given_eps(monkeypatch, plan):
    from beamsynth.transforms import privbayes_sizing as pbs  # the measurement's forest (H49)

    real = pbs.plan_forest
    monkeypatch.setattr(pbs, "plan_forest", lambda rows, eps, *a, **k: real(
        rows, eps + plan.zcdp.count_epsilon, *a, **k))


def _tables_given_rho_of_eps(monkeypatch, plan):
    real = pbm._release_tables

    def broken(exact, specs, names, budgets, p, rs, rho):
        if rho is not None and rho == p.zcdp.spent_rho:  # the 1-way fallback's call
            rho = zcdp_rho(EPS, DELTA)
        return real(exact, specs, names, budgets, p, rs, rho)
    monkeypatch.setattr(pbm, "_release_tables", broken)


def _dropped_rho_given_twice(monkeypatch, plan):
    real = pbm.gaussian_refine_rho  # the cut refinement counted as free: all its ρ to the tables
    monkeypatch.setattr(pbm, "gaussian_refine_rho",
                        lambda r: real(r) if r == plan.refine else 0.0)


@pytest.mark.parametrize(("variant", "n"), [("forest given ε", 300), ("forest given ε", 8_000),
                                            ("1-way tables at ρ(ε)", 60),
                                            ("network ρ from ε", 20_000),
                                            ("cut refinement's ρ kept and given", 14_000)])
def test_broken_variants_are_caught(monkeypatch, variant, n):
    """Measured: forest given ε: Σε = 1.0000 > 0.98 (zCDP 2.47 ρ'); 1-way tables at ρ(ε) and the
    network's ρ from ε: ρ/ρ' = 1.0395, δ'' = 1.96e-9 > 1e-9; H47's cut refinement (19 of 40
    pairs at n = 8,000; 28 at 14,000 since H53's band took 8,000) whose kept pairs' ρ also goes
    to the tables: over ρ'. The band's run-time forest (n = 8,000, H53) given ε: caught too."""
    if variant == "network ρ from ε":
        real = pbp.zcdp_rho
        eps_c = plan_privbayes(SHAPE, ApproxDP(epsilon=EPS, delta=DELTA), sizing="auto",
                               max_contributions=1).sizing.count_budget.epsilon
        monkeypatch.setattr(pbp, "zcdp_rho", lambda e, d: real(e + eps_c, d))
    plan, *_ = _plan_and_spends(1, None)
    if variant == "forest given ε":
        _forest_given_eps(monkeypatch, plan)
    elif variant == "1-way tables at ρ(ε)":
        _tables_given_rho_of_eps(monkeypatch, plan)
    elif variant == "cut refinement's ρ kept and given":
        _dropped_rho_given_twice(monkeypatch, plan)
    *_, v = audit_branch(monkeypatch, n=n, m=1, rows=None)
    assert not v["ok"], v


@pytest.mark.parametrize("n", [1_000, 20_000])
def test_auto_on_a_narrow_schema_is_the_pure_plan(monkeypatch, n):
    """H47: ``pb_noise="auto"`` with δ > 0 on 6 declared columns (PUMS' shape) resolves to
    laplace when the pipeline is built; the plan's spends are pure (spent δ = 0) and every draw
    of the measurement (DP count, network or forest) is pure, Σε within the spends."""
    shape = (13, 2, 17, 7, 11, 2)
    budget = ApproxDP(epsilon=2.0, delta=DELTA)
    assert pbp.resolve_noise("auto", DELTA, n_columns=len(shape), epsilon=2.0)[0] == "laplace"
    plan = plan_privbayes(shape, budget, sizing="auto", max_contributions=1)
    acc = PrivacyAccountant(total=budget)
    spend_privbayes(acc, plan)
    spends = {s["step"]: s for s in acc.to_dict()["spends"]}
    assert acc.spent_delta == 0.0 and "privbayes.zcdp" not in spends
    calls = record_draws(monkeypatch)
    rng = np.random.default_rng(1)
    codes = np.stack([rng.integers(0, c, n) for c in shape], axis=1)
    codes[:, 2] = codes[:, 0] % shape[2]
    fams = candidate_families(len(shape), plan.degree, shape=shape,
                              max_family_cells=plan.max_family_cells)
    counts = [c.reshape([shape[i] for i in f])
              for c, f in zip(count_marginals(codes, fams, shape), fams)]
    measure_privbayes(counts, fams, shape=shape, names=[f"c{i}" for i in range(len(shape))],
                      plan=plan, rs=RandomSource(seed=0))
    count = spends["privbayes.size_count"]
    v = verdict(calls, m=1, count=count,
                rest={"epsilon": acc.spent_epsilon - count["epsilon"], "delta": 0.0})
    assert v["ok"] and v["pure_ok"] and v["gaussian"] == 0, v


# -- 3. declared windows: each window its own count and branch ---------------------------------------
def test_each_window_has_its_own_count_and_branch(monkeypatch):
    """One measurement step over three declared windows of 20,000, 300 and 60 records: per window
    (draws grouped by the window's randomness labels) one size count and a branch that fits the
    spends; the three branches differ."""
    plan, spends, _ = _plan_and_spends(1, None)
    calls = record_draws(monkeypatch)
    fams, _ = _counts(plan, _codes(1, 0))
    fn = PrivBayesMeasureFn(families=fams, shape=SHAPE, names=[f"c{i}" for i in range(len(SHAPE))],
                            plan=plan, seed=11)
    branches = []
    for i, n in enumerate((20_000, 300, 60)):
        window = IntervalWindow(i * 3600, (i + 1) * 3600)
        _, counts = _counts(plan, _codes(n, i))
        (out,) = list(fn.process(counts, window=window))
        branches.append(_branch(plan, out))
        mine = [c for c in calls if c["labels"][1:1 + len(window_labels(window))]
                == window_labels(window)]
        v = verdict(mine, m=1, count=spends["privbayes.size_count"], rest=spends["privbayes.zcdp"])
        assert v["ok"], (n, v)
    assert branches == ["network", "forest", "independent"]
    assert len([c for c in calls if c["labels"][-1] == "size_count"]) == 3


# -- 4. CLI release: ledger, release.json and manifest totals -----------------------------------------
_RELEASE = """
name: nightly
folder: {root}/rel/nightly-{{date}}
budget: {{epsilon: 1.0, delta: 1e-9}}
ledger: {{path: {root}/ledger.sqlite, policies: {{adult: {{epsilon: 10, delta: 1e-6}}}}}}
seed: 3
demo: true
tables:
  - name: adult
    input: {data}
    schema: adult
    epsilon: 1.0
    delta: 1e-9
    method: privbayes
    options: {{pb_noise: gaussian}}
    columns: [age, workclass, education, sex, race, income]
    formats: [csv]
reports: {{private: false, public: false}}
"""


@needs_adult
def test_release_ledger_and_manifest_totals(tmp_path):
    """Two nights of a privbayes pb_noise gaussian table (300 Adult rows, no public row count):
    each manifest lists size_count (ε_c, 0) and zcdp (ε − ε_c, 1e-9) among its spends, adding up
    (with the row count) to the night's (1, 1e-9); release.json says the same; the ledger holds
    2 × (1, 1e-9) on the source."""
    lines = ADULT.read_text(encoding="utf-8").splitlines()
    data = tmp_path / "adult.csv"
    data.write_text("\n".join(lines[:301]) + "\n", encoding="utf-8")
    cfg = tmp_path / "release.yaml"
    cfg.write_text(_RELEASE.format(root=tmp_path, data=data), encoding="utf-8")
    for date in ("2026-03-01", "2026-03-02"):
        assert main(["--quiet", "release", str(cfg), "--date", date]) == 0
        folder = tmp_path / "rel" / f"nightly-{date}"
        release = json.loads((folder / "release.json").read_text())
        manifest = json.loads((folder / "private" / "adult.manifest.json").read_text())
        budget = manifest["release"]["budget"]
        steps = {s["step"]: s for s in budget["spends"]}
        eps_c = steps["privbayes.size_count"]["epsilon"]
        assert steps["privbayes.size_count"]["delta"] == 0.0
        assert (steps["privbayes.zcdp"]["epsilon"], steps["privbayes.zcdp"]["delta"]) == \
            pytest.approx((1.0 - eps_c - steps.get("row_count", {"epsilon": 0})["epsilon"], 1e-9))
        assert sum(s["epsilon"] for s in budget["spends"]) == pytest.approx(1.0, rel=1e-12)
        assert sum(s["delta"] for s in budget["spends"]) == pytest.approx(1e-9, rel=1e-12)
        assert (release["spent"]["epsilon"], release["spent"]["delta"]) == pytest.approx((1.0, 1e-9))
    con = sqlite3.connect(tmp_path / "ledger.sqlite")
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        assert "spends" in tables, tables
        eps, delta = con.execute("SELECT SUM(epsilon), SUM(delta) FROM spends").fetchone()
    finally:
        con.close()
    assert (eps, delta) == pytest.approx((2.0, 2e-9), rel=1e-9)
