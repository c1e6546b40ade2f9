"""Session 10 audit (H24): the accounting of the least-audited paths, checked by computation.

* zCDP / discrete Gaussian mode (``noise="gaussian"``): the ρ → (ε, δ) conversion recomputed
  independently (Canonne, Kamath & Steinke 2020, Cor. 13, dense grid over α); every noise and
  selection call of one measurement recorded and its zCDP cost summed (ε-DP → ε²/2, Bun & Steinke
  2016 Prop. 1.4; discrete Gaussian of L2 sensitivity m → m²/(2σ²), CKS Thm. 4) against the ρ the
  (ε − ε_c, δ) spend covers (the DP size count's call against its own (ε_c, 0) spend, the
  pure-DP forest's calls against ε − ε_c: basic composition, H37); the discrete Gaussian
  sampler's tails.
* Plausible deniability: Theorem 1 composed over the public bound C on Poisson(rows) invocations,
  ``(C·ε_u, C·δ_u + δ_tail)``, recomputed (C from a log-space Poisson tail).
* Release ledger: nights compose on the source, a failed night is refunded and reruns once, and
  the ledger's spends are the manifests' step for step.
* One API job with every public mechanism: each spends what it was asked, once; the written
  manifest states the accountant.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import json
import math
from pathlib import Path

import apache_beam as beam
import numpy as np
import pytest
from scipy import optimize

import beamsynth.transforms.noise as noise
from beamsynth.transforms import measure as measure_mod
from beamsynth.transforms import privbayes_measure as pbm
from beamsynth.transforms import privbayes_sizing as pbz
from beamsynth.transforms import privbayes_structure as pbs
from beamsynth.transforms import refine as refine_mod
from beamsynth.transforms.budget import ApproxDP, zcdp_delta, zcdp_rho
from beamsynth.transforms.measure import count_marginals
from beamsynth.transforms.noise import RandomSource, discrete_gaussian
from beamsynth.transforms.privbayes import (
    INDIF_SENSITIVITY,
    candidate_families,
    gaussian_plan,
    measure_privbayes,
    plan_privbayes,
)

pytestmark = pytest.mark.audit

ADULT_SHAPE = (14, 9, 14, 16, 16, 7, 15, 6, 5, 2, 12, 10, 14, 42, 2)


# -- 1. zCDP ---------------------------------------------------------------------------------------
def _cks_log_delta(rho: float, eps: float) -> float:
    """log δ of CKS 2020 Cor. 13, ``min_α (α−1)(αρ−ε) − log(α−1) + α·log(1 − 1/α)``, on a dense
    grid of log(α − 1) over [1e-6, 1e6], refined by scipy's bounded search around the grid's best
    (independent of budget.zcdp_delta's golden-section search)."""
    def log_delta(u):  # u = log(α − 1)
        am1 = np.exp(u)
        a = 1.0 + am1
        return am1 * (a * rho - eps) - u + a * np.log1p(-1.0 / a)

    grid = np.linspace(math.log(1e-6), math.log(1e6), 200_001)
    i = int(np.argmin(log_delta(grid)))
    best = optimize.minimize_scalar(log_delta, bounds=(grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]),
                                    method="bounded", options={"xatol": 1e-12})
    return float(min(best.fun, log_delta(grid[i])))


@pytest.mark.parametrize(("eps", "delta"), [(1.0, 1e-9), (1.0, 1e-6), (0.5, 1e-6), (2.0, 1e-9),
                                            (0.1, 1e-5), (5.0, 1e-10), (10.0, 1e-6), (0.01, 1e-6)])
def test_rho_to_epsilon_delta_conversion_recomputed(eps, delta):
    """ρ = zcdp_rho(ε, δ) implies (ε, δ) by CKS Cor. 13 recomputed here, is within 1e-6 of the
    largest such ρ, and is at least Bun & Steinke's Prop. 1.3 ρ (the looser valid bound)."""
    rho = zcdp_rho(eps, delta)
    assert _cks_log_delta(rho, eps) <= math.log(delta) + 1e-9
    assert _cks_log_delta(rho * (1 + 1e-6), eps) > math.log(delta) - 1e-3  # not far from tight
    assert zcdp_delta(rho, eps) <= delta * (1 + 1e-12)
    ln = math.log(1 / delta)
    assert rho >= (math.sqrt(ln + eps) - math.sqrt(ln)) ** 2


def _instrumented_measure(monkeypatch, n: int, m: int, rows: int | None, eps: float = 1.0,
                          delta: float = 1e-9, seed: int = 0):
    """One PrivBayes ``noise="gaussian"`` measurement on synthetic Adult-shaped codes with every
    selection and noise call recorded as (kind, ε or σ or scale, sensitivity)."""
    calls: list[tuple] = []

    def pf(rs, scores, *, epsilon, sensitivity):
        calls.append(("pf", epsilon, sensitivity))
        return noise.permute_and_flip(rs, scores, epsilon=epsilon, sensitivity=sensitivity)

    def dg(rs, sigma, size):
        calls.append(("dg", sigma))
        return noise.discrete_gaussian(rs, sigma, size)

    def dl(rs, scale, size):
        calls.append(("dl", scale))
        return noise.discrete_laplace(rs, scale, size)

    for mod in (pbs, pbz, refine_mod):
        monkeypatch.setattr(mod, "permute_and_flip", pf)
    for mod in (refine_mod, measure_mod):
        monkeypatch.setattr(mod, "discrete_gaussian", dg)
    for mod in (refine_mod, measure_mod, pbm):
        monkeypatch.setattr(mod, "discrete_laplace", dl)
    budget = ApproxDP(epsilon=eps, delta=delta)
    plan = gaussian_plan(plan_privbayes(ADULT_SHAPE, budget, sizing="auto", rows=rows,
                                        max_contributions=m), budget)
    if plan.refine is not None:  # the pool is post-processing (no call reads its size): 20,000 rows
        plan = dataclasses.replace(plan, refine=dataclasses.replace(plan.refine, pool_rows=20_000))
    rng = np.random.default_rng(seed)
    codes = np.stack([rng.integers(0, c, n) for c in ADULT_SHAPE], axis=1)
    codes[:, 1] = codes[:, 0] % ADULT_SHAPE[1]  # two strong pairs, so edges/families get chosen
    codes[:, 3] = codes[:, 2] % ADULT_SHAPE[3]
    fams = candidate_families(len(ADULT_SHAPE), plan.degree, shape=ADULT_SHAPE,
                              max_family_cells=plan.max_family_cells)
    counts = [c.reshape([ADULT_SHAPE[i] for i in f])
              for c, f in zip(count_marginals(codes, fams, ADULT_SHAPE), fams)]
    out = measure_privbayes(counts, fams, shape=ADULT_SHAPE,
                            names=[f"c{i}" for i in range(len(ADULT_SHAPE))], plan=plan,
                            rs=RandomSource(seed=seed))
    return plan, out, calls


@pytest.mark.parametrize(("n", "m", "rows", "path"), [
    (20_000, 1, None, "network"),  # DP size count, network + refinement
    (30_000, 2, None, "network"),  # two records per unit: Δ = 2 tables, 8 structure (20,000: band)
    (48_842, 1, 48_842, "network"),  # public row count: no size count
    (3_000, 1, None, "forest"),  # run-time fallback: forest of pure-DP tables
    (6_000, 2, None, "forest"),
    (300, 1, None, "forest"),
    (60, 1, None, "independent"),  # run-time fallback: 1-way tables only
    (120, 2, None, "independent"),
])
def test_gaussian_mode_calls_compose_within_the_spent_rho(monkeypatch, n, m, rows, path):
    """The recorded calls against the spends (H37: the DP size count composes by basic
    composition): without public rows the first call is the size count, discrete Laplace of
    scale m/ε_c (the ``privbayes.size_count`` spend, (ε_c, 0)); the rest fit the
    ``privbayes.zcdp`` spend (ε − ε_c, δ): a network or the 1-way tables cost exactly
    ρ = zcdp_rho(ε − ε_c, δ) in zCDP, the forest's pure-DP calls exactly ε − ε_c in ε. Each
    selection's sensitivity is the documented one (structure 4m, refinement picks m)."""
    plan, out, calls = _instrumented_measure(monkeypatch, n, m, rows)
    z = plan.zcdp
    if rows is None:
        count, calls = calls[0], calls[1:]
        assert count[0] == "dl" and m / count[1] == pytest.approx(plan.sizing.count_budget.epsilon)
        assert z.count_epsilon == pytest.approx(plan.sizing.count_budget.epsilon)
    else:
        assert z.count_epsilon == 0.0
    assert z.count_epsilon + z.budget.epsilon == pytest.approx(1.0, rel=1e-12)
    assert z.rho == pytest.approx(zcdp_rho(z.budget.epsilon, z.budget.delta), rel=1e-12)
    cost = eps = 0.0
    for call in calls:
        if call[0] == "pf":
            assert call[2] in (INDIF_SENSITIVITY * m, m)
            cost += call[1] ** 2 / 2
            eps += call[1]
        elif call[0] == "dg":
            cost += m ** 2 / (2 * call[1] ** 2)
            eps = math.inf
        else:  # discrete Laplace of L1 sensitivity m: (m/b)-DP
            cost += (m / call[1]) ** 2 / 2
            eps += m / call[1]
    kinds = collections.Counter(c[0] for c in calls)
    degree = (out.sizing or {}).get("degree", plan.degree)
    assert {"network": degree > 0, "forest": (out.sizing or {}).get("forest_steps", 0) > 0
            and degree == 0, "independent": degree == 0
            and (out.sizing or {}).get("forest_steps") == 0}[path]
    if path == "network":
        pairs = (out.sizing or {}).get("refine_pairs", plan.refine.pairs)  # run-time P (H47)
        assert kinds["pf"] == len(ADULT_SHAPE) - 1 + pairs and kinds["dg"] > pairs
    if path == "forest":  # pure ε: the Laplace plan's forest budget, ε − ε_c, exactly
        assert kinds["dg"] == 0 and eps == pytest.approx(z.budget.epsilon, rel=1e-9)
    else:  # zCDP: exactly the spend's ρ
        assert kinds["dl"] == 0 and cost == pytest.approx(z.rho, rel=1e-9)


def test_discrete_gaussian_tail_is_unbounded(monkeypatch):
    """Rule 4 (unbounded tails): CKS Alg. 3 keeps a discrete Laplace draw Y with probability
    exp(−γ), γ = (|Y| − σ²/t)²/(2σ²). Compared with a 53-bit uniform (U ≥ 2^-54), no Y with
    γ > 54·ln 2 ≈ 37.4 was ever kept: the noise was confined to |Z| < σ²/t + 8.65σ (σ = 59.6, the
    refinement's at Adult ε = 1: |Z| ≤ 575), so ``count + Z`` and ``count + m + Z`` had different
    supports (an unbounded privacy loss, like the geometric's bounded tail fixed in _log_uniform).
    Scripted words: the uniform at its minimum, then an Exp(1) tail draw of 64·ln 2 + 0.29; a
    draw with γ = 50 must be kept (probability e^-50 > 0 in the exact law)."""
    sigma, t = 3.0, 4
    y = int(math.ceil(sigma * sigma / t + sigma * math.sqrt(2 * 50.0)))  # γ ≥ 50
    gamma = (y - sigma * sigma / t) ** 2 / (2 * sigma * sigma)
    assert 50.0 <= gamma < 55.0
    script = collections.deque([0, 0, 1, 1, 0])  # U word, zero-run words (64 zeros, then 1), fine U
    real_words = RandomSource.words

    def words(self, n):
        if self.labels[-2:] == ("dg", 0):
            return np.array([script.popleft() for _ in range(n)], dtype=np.uint64)
        if self.labels[-2:-1] == ("dg",):  # later rounds: U ≈ 1/2
            return np.full(n, 1 << 63, dtype=np.uint64)
        return real_words(self, n)

    def fake_laplace(rs, scale, size):
        return np.full(size, y if rs.labels[-1] == 0 else 0, dtype=np.int64)

    monkeypatch.setattr(RandomSource, "words", words)
    monkeypatch.setattr(noise, "discrete_laplace", fake_laplace)
    assert discrete_gaussian(RandomSource(seed=1).child("x"), sigma, 1).tolist() == [y]


# -- 2. plausible deniability ------------------------------------------------------------------------
def _poisson_sf(c: int, lam: float) -> float:
    """P(Poisson(lam) > c), summed in log space (independent of scipy)."""
    k = c + 1
    lp = -lam + k * math.log(lam) - math.lgamma(k + 1)
    total = 0.0
    while True:
        total += math.exp(lp)
        k += 1
        lp += math.log(lam) - math.log(k)
        if lp < math.log(total) - 50:
            return total


@pytest.mark.parametrize(("rows", "tail"), [(1, 1e-9), (10, 1e-7), (100, 1e-9), (1000, 1e-9),
                                            (3000, 1e-7), (10_000, 1e-9)])
@pytest.mark.parametrize("c", [1, 3])
def test_candidate_release_cost_recomputed(rows, tail, c):
    """(C·ε_u, C·δ_u + δ_tail) with ε_u = c·ε₁, δ_u = c·e^{(c−1)ε₁}·δ₁ (group privacy of Theorem 1,
    ε₁ = ε0 + ln(1 + γ/t), δ₁ = e^{−ε0(k−t)}) and C the smallest integer with
    P(Poisson(rows) > C) ≤ δ_tail, each recomputed here. Measured: rows 3,000, δ_tail 1e-7 gives
    C = 3,289 (tail 9.6e-8; C − 1: 1.06e-7), ε = 3,777.15, δ = 1.457e-7 (docs/plausible.md)."""
    from beamsynth.transforms.plausible_privacy import candidate_release_cost

    k, gamma, eps0, t = 50, 4.0, 1.0, 25
    cost = candidate_release_cost(rows=rows, k=k, gamma=gamma, epsilon0=eps0, t=t,
                                  tail_delta=tail, max_contributions=c)
    big_c = cost["C"]
    assert _poisson_sf(big_c, rows) <= tail < _poisson_sf(big_c - 1, rows)
    eps1, delta1 = eps0 + math.log(1 + gamma / t), math.exp(-eps0 * (k - t))
    assert cost["epsilon"] == pytest.approx(big_c * c * eps1, rel=1e-12)
    assert cost["delta"] == pytest.approx(big_c * c * math.exp((c - 1) * eps1) * delta1 + tail,
                                          rel=1e-12)


# -- 4. one API job, every public mechanism -----------------------------------------------------------
ADULT_CSV = Path(__file__).resolve().parents[2] / "examples" / "data" / "adult" / "adult.csv"


def _adult_rows(n: int) -> list[dict[str, str]]:
    with open(ADULT_CSV, encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        return [dict(zip(header, r)) for _, r in zip(range(n), reader)]


def _all_mechanisms_job(p, rows, manifest_path):
    """Every public mechanism once under one job; returns (job, {label: (ε, δ, steps)})."""
    import beamsynth as bs

    job = bs.PrivacyJob(epsilon=60.0, delta=1e-5, seed=3)
    keys = {"sexkey": bs.TextKey(column="sex", alphabet="abcdefghijklmnopqrstuvwxyz",
                                 max_length=6, casefold=True)}
    private = p | beam.Create(rows) | job.private(bs.load_schema("adult"), keys=keys)
    asked = {}
    for label, t, eps, delta in [
        ("Count", bs.Count(epsilon=0.05), 0.05, 0.0),
        ("Marginals", bs.Marginals(marginals=[("age", "sex"), ("race", "income")], epsilon=0.25), 0.25, 0.0),
        ("Histogram", bs.Histogram(column="native-country", epsilon=0.3, tolerance=0.001), 0.3, 0.0),
        ("Prefix", bs.PrefixTree(key="sexkey", epsilon=0.2, method="improved"), 0.2, 0.0),
        ("Indep", bs.IndependentSynthesis(epsilon=0.7, rows=100), 0.7, 0.0),
        ("IndepDP", bs.Synthesize(method="independent", epsilon=0.4), 0.4, 0.0),
        ("PB", bs.PrivBayes(epsilon=1.0, rows=100, options={"degree": 1}), 1.0, 0.0),
        ("PBG", bs.PrivBayes(epsilon=1.0, delta=1e-6, rows=100, options={"pb_noise": "gaussian"}), 1.0, 1e-6),
        ("SBHG", bs.SBHG(epsilon=1.0, delta=1e-6, rows=100), 1.0, 1e-6),
        ("PD", bs.PlausibleDeniability(epsilon=40.0, delta=1e-6, rows=10), 40.0, 1e-6),
    ]:
        before = len(job.accountant.spends)
        _ = private | label >> t
        asked[label] = (eps, delta, [s.step for s in job.accountant.spends[before:]])
    p | bs.WriteManifest(job=job, path=manifest_path)
    return job, asked


def test_api_job_spends_each_mechanism_once(tmp_path):
    """Each mechanism's spends sum to what it was asked (plausible: at most, its model share plus
    the candidates' Theorem 1 composition), every spend is under its own step, and the
    accountant's total is their sum. Measured: Count 0.05, Marginals 0.25, Histogram 0.3, Prefix
    0.2, Indep 0.7, IndepDP 0.4 (row_count 0.02 + 0.38), PB 1 (5 steps), PBG 1 / 1e-6 (size count + zCDP
    spend), SBHG 1 / 1e-6, PD 4 + 34.4526 / 1.004e-7; total 43.3526 / 2.1004e-6."""
    from beamsynth.transforms.plausible_privacy import candidate_release_cost

    job, asked = _all_mechanisms_job(beam.Pipeline(), _adult_rows(50), str(tmp_path / "m.json"))
    spends = job.accountant.spends
    assert sorted(s.step for s in spends) == sorted(x for v in asked.values() for x in v[2])
    for label, (eps, delta, steps) in asked.items():
        mine = [s for s in spends if s.step in steps]
        assert mine and all(s.step.split("/")[0] == label for s in mine)
        e, d = math.fsum(s.budget.epsilon for s in mine), math.fsum(s.budget.delta for s in mine)
        if label == "PD":
            cost = candidate_release_cost(rows=10, k=50, gamma=4.0, epsilon0=1.0, t=25,
                                          tail_delta=0.1 * delta)
            model = [s for s in mine if s.step != "PD/plausible.candidates"]
            assert math.fsum(s.budget.epsilon for s in model) == pytest.approx(0.1 * eps)
            assert (e, d) == (pytest.approx(0.1 * eps + cost["epsilon"]), pytest.approx(cost["delta"]))
            assert e <= eps and d <= delta
        else:
            assert (e, d) == (pytest.approx(eps, rel=1e-12), pytest.approx(delta, rel=1e-12))
    assert job.accountant.spent_epsilon == pytest.approx(math.fsum(s.budget.epsilon for s in spends))
    assert job.accountant.spent_delta == pytest.approx(math.fsum(s.budget.delta for s in spends))


@pytest.mark.slow  # runs every mechanism on 1,000 Adult rows (~30 s)
def test_api_job_manifest_states_the_accountant(tmp_path):
    """The written manifest's total, spent and spends are the accountant's (nothing added at
    run time, nothing dropped)."""
    path = str(tmp_path / "manifest.json")
    p = beam.Pipeline()
    job, _ = _all_mechanisms_job(p, _adult_rows(1000), path)
    p.run().wait_until_finish()
    with open(path, encoding="utf-8") as fh:
        budget = json.load(fh)["release"]["budget"]
    acct = job.accountant
    assert budget["total"] == {"epsilon": acct.total.epsilon, "delta": acct.total.delta}
    assert [(s["step"], s["epsilon"], s["delta"]) for s in budget["spends"]] == [
        (s.step, s.budget.epsilon, s.budget.delta) for s in acct.spends]
    assert budget["spent"]["epsilon"] == pytest.approx(math.fsum(s["epsilon"] for s in budget["spends"]))
    assert budget["spent"]["delta"] == pytest.approx(math.fsum(s["delta"] for s in budget["spends"]))


# -- 3. release ledger ---------------------------------------------------------------------------------
RELEASE = """
name: h24
folder: {root}/out/h24-{{date}}
budget: {{epsilon: 3.0, delta: 1.0e-6}}
seed: 5
demo: true
ledger:
  path: {root}/ledger.sqlite
  policies:
    adult: {{epsilon: 5.6, delta: 2.0e-6}}
tables:
  - name: ind
    source: adult
    input: {data}
    schema: adult
    method: independent
    epsilon: 0.5
    columns:
      age: {{}}
      sex: {{}}
      income: {{}}
      native-country: {{mechanism: cathist, epsilon: 0.3, tolerance: 0.001}}
    formats: [csv]
  - name: pbg
    source: adult
    input: {data}
    schema: adult
    method: privbayes
    epsilon: 1.5
    delta: 1.0e-6
    options: {{pb_noise: gaussian}}
    formats: [csv]
  - name: countries
    kind: histogram
    source: adult
    input: {data}
    schema: adult
    column: native-country
    tolerance: 0.001
    epsilon: 0.5
    formats: [csv]
reports: {{private: false, public: false}}
"""


@pytest.mark.slow  # four release runs (~25 s)
def test_release_ledger_matches_the_manifests_once_per_night(tmp_path, monkeypatch):
    """Two nights of a three-table release (independent + a CatHist column, zCDP PrivBayes with δ,
    a CatHist table) on one lifetime policy; night 2 first fails in its last table (aborted:
    refunded, nothing published), then runs once; a rerun and night 3 are refused. For every
    committed night the ledger's spends are the manifests' spends step for step (ε 2.8,
    δ 1e-6 each), and the source's total is their sum over the committed nights."""
    import sqlite3

    import beamsynth.pipelines.releases.release as release_mod
    from beamsynth.pipelines.releases.config import load_release_config
    from beamsynth.pipelines.releases.ledger import LedgerBudgetExceededError, LedgerError

    data = tmp_path / "adult.csv"
    data.write_text("".join(ADULT_CSV.read_text(encoding="utf-8").splitlines(keepends=True)[:601]),
                    encoding="utf-8")
    config = tmp_path / "release.yaml"
    config.write_text(RELEASE.format(root=tmp_path, data=data), encoding="utf-8")

    def run(date):
        return release_mod.run_release(load_release_config(config, date=date))

    run("2026-01-01")
    real = release_mod._run_histogram_table
    monkeypatch.setattr(release_mod, "_run_histogram_table",
                        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("worker lost")))
    with pytest.raises(RuntimeError, match="worker lost"):
        run("2026-01-02")
    monkeypatch.setattr(release_mod, "_run_histogram_table", real)
    run("2026-01-02")
    with pytest.raises(LedgerError, match="already published"):
        run("2026-01-02")
    with pytest.raises(LedgerBudgetExceededError):
        run("2026-01-03")
    with sqlite3.connect(tmp_path / "ledger.sqlite") as con:
        releases = con.execute("SELECT release_id, folder, state FROM releases ORDER BY created").fetchall()
        spends = con.execute("SELECT release_id, step, epsilon, delta FROM spends").fetchall()
    assert [(f.rsplit("/", 1)[-1], s) for _, f, s in releases] == [
        ("h24-2026-01-01", "committed"), ("h24-2026-01-02", "aborted"), ("h24-2026-01-02", "committed")]
    committed = [(rid, folder) for rid, folder, state in releases if state == "committed"]
    total = 0.0
    for rid, folder in committed:
        ledger = sorted((step, e, d) for r, step, e, d in spends if r == rid)
        manifests = []
        for path in sorted(Path(folder, "private").glob("*.manifest.json")):
            table = path.name.split(".manifest.json")[0]
            budget = json.loads(path.read_text(encoding="utf-8"))["release"]["budget"]
            manifests += [(f"{table}.{s['step']}", s["epsilon"], s["delta"]) for s in budget["spends"]]
        assert ledger == sorted(manifests)
        assert math.fsum(e for _, e, _ in ledger) == pytest.approx(2.8)
        assert math.fsum(d for _, _, d in ledger) == pytest.approx(1e-6)
        total += math.fsum(e for _, e, _ in ledger)
    assert total == pytest.approx(5.6)
    assert not list(tmp_path.glob("out/.h24-*"))  # the failed night's temp folder is gone


def test_binomial_tails_are_unbounded(monkeypatch):
    """Rule 4 (CatHist draws how many empty declared bins pass its threshold as Binomial(empty
    bins, p), n·p ≈ −ln ρ): inversion of a 53-bit uniform (≤ 1 − 2^-54) never returned a k with
    P(X > k) below ≈ 1.5e-15 (n = 10^6, p = 7e-6: never above 36), a cut that can fall differently
    for neighbouring n. With U at its top end and W = 1 − U = e^-200/2 the draw must be the exact
    quantile, the smallest k with P(X > k) ≤ W (recomputed here with lgamma)."""
    n, p = 10**6, 7e-6
    log_w = -200.0 - math.log(2.0)

    def log_pmf(k):
        return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                + k * math.log(p) + (n - k) * math.log1p(-p))

    def log_sf(k):  # P(X > k), k well above the mean: the terms fall fast
        return float(np.logaddexp.reduce([log_pmf(j) for j in range(k + 1, k + 400)]))

    want = next(k for k in range(int(n * p), n) if log_sf(k) <= log_w)
    assert want > 60
    monkeypatch.setattr(RandomSource, "words", lambda self, m: np.full(m, 2**64 - 1, dtype=np.uint64))
    monkeypatch.setattr(noise, "_log_uniform", lambda rs, size: np.full(size, -200.0))
    assert noise.binomial(RandomSource(seed=1), n, p) == want


def test_poisson_counts_tails_are_unbounded(monkeypatch):
    """Plausible deniability's bound C assumes the Poisson(rows) total of the per-seed
    Poisson(rows/|D_S|) counts; inverting a 53-bit uniform against a float CDF table never gave a
    count beyond the quantile 1 − 2^-54 (λ = 3000/24421: never above 10, P(X > 10) = 2.2e-18).
    With U at its top end and W = e^-200/2 the draw must be the exact quantile."""
    from beamsynth.transforms.plausible_privacy import poisson_counts

    lam = 3000 / 24421
    log_w = -200.0 - math.log(2.0)

    def log_sf(k):
        return float(np.logaddexp.reduce([-lam + j * math.log(lam) - math.lgamma(j + 1)
                                          for j in range(k + 1, k + 400)]))

    want = next(k for k in range(200) if log_sf(k) <= log_w)
    assert want > 40
    monkeypatch.setattr(RandomSource, "words", lambda self, m: np.full(m, 2**64 - 1, dtype=np.uint64))
    monkeypatch.setattr(noise, "_log_uniform", lambda rs, size: np.full(size, -200.0))
    assert poisson_counts(RandomSource(seed=1), lam, 3).tolist() == [want] * 3
