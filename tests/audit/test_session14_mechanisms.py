"""Session 14 (H56): red team of the thirteenth session's PrivBayes planning, and the draw-recording
audit extended from the basic prefix method to the other mechanisms, through their public entry
points.

1. PrivBayes' network → forest band (H49 b43da64, H53 0e205b4/e955c63) and the run-time choices
   made from the DP count. Coupling at the band's upper edge (Adult's shape, ε = 1, the DP count
   decides forest vs network at n̂ = 11,954 for m = 1, 23,907 for m = 2): D and D − 1 (one record
   removed) given the same n̂ and seed must choose the same branch with the same draws (kind,
   scale or ε, size, labels); a deliberately broken variant whose band is chosen on the exact n
   is caught. Windows that choose different branches (band forest, network, small-input forest)
   in one measurement step, Laplace and zCDP, m = 1 and 2: every window's recorded draws within
   its spends (Σ m/b = ε − ε_c for the pure branches; Σ ρ = ρ' for the zCDP network). ``auto``'s
   choice is a function of the declared width, ε and δ only (its signature takes nothing else).
2. Draw recording (every privacy draw recorded from the draw itself, with its scale and
   randomness labels, in every beamsynth module that draws), through the CLI on the DirectRunner:

   * prefix trees, ``improved`` and ``direct``, text and spatial keys, m = 1 and 3: direct's
     costliest record path (root + non-terminal levels + its terminal cell, Σ m/b) equals the
     spend; improved draws one scale 1/ε₀ on every level and its per-record loss, recomputed here
     from the discrete Laplace law (ε₀ + Σ_j h(j·t), seed 003 §3 Theorem 3, tight reading),
     times m, is within the spend;
   * CatHist (seed 000 §3 Algorithm 1, discrete): one noised draw over the active bins at
     m/b = ε, the empty bins' survivor count Binomial(n_declared − a, P(Z ≥ τ)) with the tail of
     the same scale, their values τ + Geometric(q = e^{−1/b}); m = 1 and 5, a word list and its
     pairs (250,000 declared cells);
   * SBHG (seed 002 Remark 3.2, Algorithm 1): p·R exponential-mechanism draws summing to the
     selection spend with the documented sensitivity, p SBA draws at m/b = ε_c/p each, and the δ
     of the threshold used, recomputed from the discrete Laplace tail, summing to ≤ δ; the
     independent fallback at a small public n;
   * plausible deniability (seed 001 Theorem 1): the PrivBayes generator's draws pure and summing
     to the model spend, one Test-2 threshold draw of scale 1/ε₀ per candidate, the Poisson
     invocations with Σ λ = rows (public), and (C·ε₁, C·δ₁ + δ_tail) recomputed with C from scipy.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

import beamsynth.transforms.noise as noise

pytestmark = pytest.mark.audit

ROOT = Path(__file__).resolve().parents[2]
ADULT = ROOT / "examples" / "data" / "adult" / "adult.csv"
WORDS = ROOT / "examples" / "data" / "text" / "words_sample.txt"
needs_adult = pytest.mark.skipif(not ADULT.exists(), reason="examples/data/adult/adult.csv absent")

KINDS = ("discrete_laplace", "discrete_gaussian", "permute_and_flip", "exponential_mechanism",
         "laplace_internal", "binomial", "geometric", "poisson", "hypergeometric")


# -- the recorder ----------------------------------------------------------------------------------
def record_all(monkeypatch) -> list[dict]:
    """Replace every randomness primitive of ``noise`` that a beamsynth module imported with a
    recorder of its parameters (the draw's own arguments, not the accountant's) and of the draw's
    randomness labels. Keys: ``kind``, ``labels``, and the primitive's parameters by name
    (``scale``, ``sigma``, ``epsilon``, ``sensitivity``, ``n``, ``p``, ``q``, ``lam``, ``size``);
    ``param`` is the noise parameter of a Laplace/Gaussian draw (test_session12's verdict)."""
    import beamsynth.pipelines.cli.main  # noqa: F401  (every drawing module imported first)
    import beamsynth.transforms.cathist  # noqa: F401
    import beamsynth.transforms.plausible  # noqa: F401
    import beamsynth.transforms.prefix  # noqa: F401
    import beamsynth.transforms.privbayes  # noqa: F401
    import beamsynth.transforms.sbhg  # noqa: F401

    calls: list[dict] = []

    def wrap(kind, fn):
        sig = inspect.signature(fn)

        def rec(*args, **kwargs):
            bound = sig.bind(*args, **kwargs).arguments
            rs = bound["rs"]
            entry = {"kind": kind, "labels": tuple(rs.labels), "stream": (
                ("seed", rs.seed) if rs.seeded else ("secret", rs.run_secret.stream_key(()).hex()))}
            for name, value in bound.items():
                if name in ("rs", "scores", "good", "bad", "bounds", "probs"):
                    continue
                entry[name] = value if np.ndim(value) == 0 or name == "size" else np.asarray(value)
            if kind in ("discrete_laplace", "discrete_gaussian", "laplace_internal"):
                entry["param"] = float(args[1] if len(args) > 1 else
                                       bound.get("scale", bound.get("sigma")))
            calls.append(entry)
            return fn(*args, **kwargs)
        return rec

    for kind in KINDS:
        orig = getattr(noise, kind)
        recorder = wrap(kind, orig)
        for name, mod in list(sys.modules.items()):
            if not name.startswith("beamsynth.") or mod is noise or mod is None:
                continue
            for attr, value in list(vars(mod).items()):
                if value is orig:
                    monkeypatch.setattr(mod, attr, recorder)
    return calls


def _cells(size) -> int:
    return int(np.prod(size)) if size is not None else 1


def _spends(manifest: dict) -> dict[str, dict]:
    return {s["step"]: s for s in manifest["release"]["budget"]["spends"]}


def _dlap_tail(m: int, scale: float) -> float:
    """P(Z ≥ m) of the discrete Laplace law P(Z = z) ∝ exp(−|z|/scale), any integer m (written
    from the law here, not taken from the project)."""
    q = math.exp(-1.0 / scale)
    if m >= 1:
        return q ** m / (1 + q)
    return 1.0 - q ** (1 - m) / (1 + q)


# == 1. PrivBayes: the band from the DP count ======================================================
EDGE = {1: 11_954, 2: 23_907}  # n̂ where the DP count turns the band's forest into the network


def _pb_plan(noise_mode: str, m: int):
    from tests.audit import test_session12_accounting as s12

    budget = s12.ApproxDP(epsilon=s12.EPS, delta=s12.DELTA if noise_mode == "gaussian" else 0.0)
    plan = s12.plan_privbayes(s12.SHAPE, budget, sizing="auto", max_contributions=m)
    if noise_mode == "gaussian":
        plan = s12.gaussian_plan(plan, budget)
    if plan.refine is not None:  # the pool is post-processing (no draw reads its size): 20,000 rows
        plan = dataclasses.replace(plan, refine=dataclasses.replace(plan.refine, pool_rows=20_000))
    acc = s12.PrivacyAccountant(total=budget)
    s12.spend_privbayes(acc, plan)
    return plan, {s["step"]: s for s in acc.to_dict()["spends"]}, acc


def _exact_sizing(plan, exact: list[int]):
    """A broken plan whose run-time choices read the exact record count ``exact[0]`` instead of
    the DP count (the breach this audit must catch)."""
    real = plan.sizing
    sizing = dataclasses.replace(real)
    object.__setattr__(sizing, "degree", lambda rows_hat: real.degree(exact[0]))
    object.__setattr__(sizing, "small_forest", lambda rows_hat, eps: real.small_forest(exact[0], eps))
    return dataclasses.replace(plan, sizing=sizing)


def _coupled_runs(monkeypatch, plan, codes, rows_hat: int, exact: list[int]) -> list[dict]:
    """D = ``codes`` and D − its last record, both given the DP count ``rows_hat`` (the size
    count's noise set to ``rows_hat − exact``) and the same seed: per side the measurement's
    sizing, released tables' (columns, scale) and every draw's (kind, labels, parameters)."""
    from beamsynth.transforms import privbayes_measure as pbm
    from tests.audit import test_session12_accounting as s12
    from tests.audit import test_session13_redteam as rt

    real = pbm.discrete_laplace
    sides = []
    for data in (codes, codes[:-1]):
        exact[0] = n_exact = len(data)

        def fixed(rs, scale, size, _n=n_exact):
            if rs.labels and rs.labels[-1] == "size_count":
                return np.asarray([rows_hat - _n])
            return real(rs, scale, size)

        monkeypatch.setattr(pbm, "discrete_laplace", fixed)
        calls = s12.record_draws(monkeypatch)
        out, _ = rt._measure(plan, data, rs_seed=4)
        sides.append({
            "sizing": out.sizing,
            "tables": [(tuple(t.columns), float(t.scale)) for t in out.marginals],
            "draws": [(c["kind"], c["labels"], c.get("param", c.get("epsilon")), c.get("size"))
                      for c in calls]})
        monkeypatch.undo()
    return sides


@pytest.mark.parametrize(("noise_mode", "m"), [
    ("laplace", 1), pytest.param("gaussian", 1, marks=pytest.mark.slow),
    pytest.param("laplace", 2, marks=pytest.mark.slow),
    pytest.param("gaussian", 2, marks=pytest.mark.slow)])
def test_band_edge_choice_is_a_function_of_the_dp_count(monkeypatch, noise_mode, m):
    """At the band's upper edge (exact D = EDGE[m] records, D − 1 = one fewer), the same n̂ and
    seed give the same branch and the same draws on both sides: n̂ = EDGE − 1 the band's forest,
    n̂ = EDGE the k = 1 network (zCDP: discrete Gaussian tables). Measured: forest 1-way + edge
    tables from 12 permute-and-flip steps; network 14 structure steps. The variant whose band is
    chosen on the exact n gives the network on D and the forest on D − 1 at n̂ = EDGE − 1."""
    from tests.audit import test_session12_accounting as s12

    plan, _, _ = _pb_plan(noise_mode, m)
    n = EDGE[m]
    assert plan.sizing.degree(n) == 1 and plan.sizing.degree(n - 1) == 0  # the edge (public)
    codes = s12._codes(n, 0)
    exact = [0]
    for rows_hat, branch in ((n - 1, "forest"), (n, "network")):
        d, d1 = _coupled_runs(monkeypatch, plan, codes, rows_hat, exact)
        assert d["sizing"] == d1["sizing"], (d["sizing"], d1["sizing"])
        assert ("forest_steps" in d["sizing"]) == (branch == "forest"), d["sizing"]
        assert d["draws"] == d1["draws"]  # same draws: kinds, labels, scales, sizes
        assert [s for _, s in d["tables"]] == [s for _, s in d1["tables"]]
    broken = _exact_sizing(plan, exact)
    d, d1 = _coupled_runs(monkeypatch, broken, codes, n - 1, exact)
    assert d["sizing"]["degree"] == 1 and d1["sizing"]["degree"] == 0  # caught: the exact n decided
    assert d["draws"] != d1["draws"]


@pytest.mark.parametrize(("noise_mode", "m"), [
    ("laplace", 1), ("gaussian", 1), pytest.param("laplace", 2, marks=pytest.mark.slow),
    pytest.param("gaussian", 2, marks=pytest.mark.slow)])
def test_windows_choosing_different_branches_fit_their_spends(monkeypatch, noise_mode, m):
    """One PrivBayesMeasureFn over three declared windows whose DP counts choose the band's forest
    (EDGE/2 records), the k = 1 network (EDGE + 3,000) and the small-input forest (300): each
    window's draws (grouped by its labels) hold one size count within ``privbayes.size_count``
    and the rest within the model spend: the forests pure Σ m/b = ε − ε_c = 0.98 exactly, the
    zCDP network Σ ρ = ρ' exactly (δ'' ≤ δ by CKS Cor. 13), the Laplace network Σ = 0.98."""
    from apache_beam.transforms.window import IntervalWindow

    from beamsynth.transforms.budget import zcdp_rho
    from beamsynth.transforms.measure import window_labels
    from beamsynth.transforms.privbayes_measure import PrivBayesMeasureFn
    from tests.audit import test_session12_accounting as s12

    plan, spends, acc = _pb_plan(noise_mode, m)
    count = spends["privbayes.size_count"]
    rest = spends.get("privbayes.zcdp") or {"epsilon": acc.spent_epsilon - count["epsilon"],
                                            "delta": 0.0}
    calls = s12.record_draws(monkeypatch)
    fams, _ = s12._counts(plan, s12._codes(1, 0))
    fn = PrivBayesMeasureFn(families=fams, shape=s12.SHAPE,
                            names=[f"c{i}" for i in range(len(s12.SHAPE))], plan=plan, seed=9)
    branches = []
    for i, n in enumerate((EDGE[m] // 2, EDGE[m] + 3_000, 300)):
        window = IntervalWindow(i * 3600, (i + 1) * 3600)
        _, counts = s12._counts(plan, s12._codes(n, i))
        (out,) = list(fn.process(counts, window=window))
        branch = s12._branch(plan, out)
        branches.append(branch)
        mine = [c for c in calls if c["labels"][1:1 + len(window_labels(window))]
                == window_labels(window)]
        v = s12.verdict(mine, m=m, count=count, rest=rest)
        assert v["ok"], (n, v)
        if branch == "forest" or noise_mode == "laplace":
            assert v["gaussian"] == 0 and v["pure"] == pytest.approx(rest["epsilon"], rel=1e-9)
        else:
            assert v["rho"] == pytest.approx(zcdp_rho(rest["epsilon"], rest["delta"]), rel=1e-9)
    assert branches == ["forest", "network", "forest"], branches


def test_auto_noise_reads_public_values_only():
    """``resolve_noise`` (the ``auto`` gate) takes the mode, δ, the declared column count and ε:
    no data, no row count; the method and the transform call it when built. Its answer at the
    bundled Adult width: gaussian with δ > 0, laplace at δ = 0, laplace on 6 columns."""
    from beamsynth.transforms.privbayes_plan import resolve_noise

    assert list(inspect.signature(resolve_noise).parameters) == [
        "noise", "delta", "n_columns", "epsilon"]
    assert resolve_noise("auto", 1e-9, n_columns=15, epsilon=1.0)[0] == "gaussian"
    assert resolve_noise("auto", 0.0, n_columns=15, epsilon=1.0)[0] == "laplace"
    assert resolve_noise("auto", 1e-9, n_columns=6, epsilon=1.0)[0] == "laplace"


# == 2. draw recording through the CLI ==============================================================
def _cli(args: list[str]) -> None:
    from beamsynth.pipelines.cli.main import main

    assert main(["--quiet", *args]) == 0


def _prefix_input(tmp_path: Path, kind: str) -> list[str]:
    """600 records of 200 people (3 each): text keys of up to 4 letters or points in the unit
    square; the CLI arguments naming the key."""
    rng = np.random.default_rng(5)
    if kind == "text":
        vocab = ["tea", "ten", "to", "a", "abba", "t", "", "team", "b", "bat"]
        p = np.array([30, 20, 15, 10, 5, 5, 5, 4, 3, 3], float)
        keys = rng.choice(vocab, 600, p=p / p.sum())
        path = tmp_path / "keys.csv"
        path.write_text("pid,query\n" + "".join(f"u{i // 3},{k}\n" for i, k in enumerate(keys)),
                        encoding="utf-8")
        return [str(path), "--kind", "text", "--column", "query", "--max-length", "4"]
    pts = np.clip(rng.normal(0.3, 0.1, (600, 2)), 0, 1)
    path = tmp_path / "pts.csv"
    path.write_text("pid,x,y\n" + "".join(f"u{i // 3},{a:.5f},{b:.5f}\n" for i, (a, b) in enumerate(pts)),
                    encoding="utf-8")
    return [str(path), "--kind", "spatial", "--columns", "x,y", "--box", "0,1;0,1", "--depth", "4"]


def _prefix_run(monkeypatch, tmp_path: Path, kind: str, method: str, m: int, eps: float):
    calls = record_all(monkeypatch)
    out = tmp_path / "out.csv"
    unit = ["--privacy-id", "pid", "--max-contributions", str(m)] if m > 1 else []
    _cli(["prefixes", *_prefix_input(tmp_path, kind), "--method", method, "--epsilon", str(eps),
          "--output", str(out), "--seed", "3", *unit])
    manifest = json.loads(out.with_name("out.csv.manifest.json").read_text())
    return calls, manifest


def direct_path_costs(calls: list[dict], m: int) -> list[float]:
    """Direct synthesis (seed 003 §4): Σ m/b along every path a record can take — the root, the
    non-terminal cells of the levels above, then its terminal cell (end of key, or full depth) or
    a non-terminal cell of the last level. Each level must draw its ``level`` and ``terminal``
    streams once and the root once (otherwise the path cost is not what was drawn)."""
    draws: dict[tuple, float] = {}
    for c in calls:
        if c["kind"] != "discrete_laplace":
            continue
        key = (int(c["labels"][2]), c["labels"][-1])
        assert key not in draws, ("a stream drawn twice", key)
        draws[key] = m / c["param"]
    levels = 1 + max(d for d, _ in draws)
    assert set(draws) == {(0, "root")} | {(d, w) for d in range(levels) for w in ("level", "terminal")}
    root = draws[(0, "root")]
    above = np.cumsum([0.0] + [draws[(d, "level")] for d in range(levels)])
    return [root + above[d] + draws[(d, "terminal")] for d in range(levels)] + [root + above[levels]]


def improved_record_loss(eps0: float, threshold: float, discount: int) -> float:
    """Worst-case loss of one record for the improved histogram (seed 003 §3, Theorem 3 with the
    tight reading of its proof): ε₀ + Σ_{j≥1} ln(p(jt + 1)/p(jt)), ``p(x) = P(x + Z ≥ b)``,
    ``b = ⌈threshold⌉``, written from the discrete Laplace law (not the project's function)."""
    b, total, j = int(math.ceil(threshold)), eps0, 1
    scale = 1.0 / eps0
    while True:
        x = j * discount
        term = math.log(_dlap_tail(b - x - 1, scale)) - math.log(_dlap_tail(b - x, scale))
        total += term
        if x > b and term < 1e-15:
            return total
        j += 1


@pytest.mark.parametrize(("kind", "m"), [("text", 1), ("text", 3), ("spatial", 1),
                                         pytest.param("spatial", 3, marks=pytest.mark.slow)])
def test_prefix_direct_draws_cost_the_spend_on_every_path(monkeypatch, tmp_path, kind, m):
    """CLI ``prefixes --method direct`` (ε = 2): every record path's recorded Σ m/b is within the
    spend and the costliest uses it exactly. Measured (text, m = 1): root b = 3 (1/3), level
    b = 3, terminal b = 0.6, 0.75, 1, 1.5, 3 at depths 1-5: every path 2.000."""
    calls, manifest = _prefix_run(monkeypatch, tmp_path, kind, "direct", m, 2.0)
    spent = _spends(manifest)["prefixes/direct"]
    assert spent["epsilon"] == pytest.approx(2.0) and spent["delta"] == 0.0
    costs = direct_path_costs(calls, m)
    assert max(costs) <= spent["epsilon"] * (1 + 1e-9), costs
    assert max(costs) == pytest.approx(spent["epsilon"], rel=1e-9)
    if kind == "text":  # terminal budget: every path ending early uses the whole ε too
        assert costs == pytest.approx([spent["epsilon"]] * len(costs), rel=1e-9)


@pytest.mark.parametrize(("kind", "m"), [("text", 1), ("text", 3), ("spatial", 1),
                                         pytest.param("spatial", 3, marks=pytest.mark.slow)])
def test_prefix_improved_draws_fit_theorem3(monkeypatch, tmp_path, kind, m):
    """CLI ``prefixes --method improved`` (ε = 2): every level draws one stream at the same scale
    1/ε₀, the threshold and discount the steps used are the manifest's, and m times the per-record
    loss recomputed from the law (improved_record_loss) is within the spend (measured text m = 1:
    ε₀ = 1.86, b = 3, t = 3, loss 1.984 of 2)."""
    from beamsynth.transforms import prefix_levels as pl

    used, discounts = [], []
    real, real_discount = pl.improved_step, pl.allocate_discount

    def spy(*a, **kw):
        used.append((kw["acct"].scale, kw["acct"].threshold, kw["acct"].discount))
        return real(*a, **kw)

    def spy_discount(counts, carry, discount, rule, rs):  # the discount the level subtracts
        discounts.append(int(discount))
        return real_discount(counts, carry, discount, rule, rs)

    monkeypatch.setattr(pl, "improved_step", spy)
    monkeypatch.setattr(pl, "allocate_discount", spy_discount)
    calls, manifest = _prefix_run(monkeypatch, tmp_path, kind, "improved", m, 2.0)
    spent = _spends(manifest)["prefixes/improved"]
    assert spent["epsilon"] == pytest.approx(2.0) and spent["delta"] == 0.0
    levels = [c for c in calls if c["kind"] == "discrete_laplace"]
    assert [c["labels"][2] for c in levels] == list(range(len(levels)))  # one stream per level
    assert all(c["labels"][-1] == "level" for c in levels)
    scales = {c["param"] for c in levels}
    assert len(scales) == 1 and len(set(used)) == 1 and used[0][0] == scales.pop()
    scale, threshold, discount = used[0]
    assert set(discounts) == {discount}
    acct = spent["details"]
    assert (acct["scale"], acct["threshold"], acct["discount"]) == (scale, threshold, discount)
    loss = m * improved_record_loss(1.0 / scale, threshold, discount)
    assert loss <= spent["epsilon"] * (1 + 1e-9), loss
    assert loss == pytest.approx(acct["loss"], rel=1e-9)


@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("domain", ["words", "pairs"])
def test_cathist_draws_are_the_declared_domain_at_the_spend(monkeypatch, tmp_path, domain, m):
    """CLI ``histogram`` over 500 declared words (or their 250,000 pairs), ε = 1, tolerance 0.5:
    one discrete Laplace draw over the a active bins with m/b = ε (the whole spend), one
    Binomial(n − a, p) with n the declared size and p = P(Z ≥ τ) of the same law (recomputed
    here), the survivors' values τ + Geometric(q = e^{−1/b}); nothing else drawn with a scale."""
    words = [f"w{i}" for i in range(500)]
    wfile = tmp_path / "words.txt"
    wfile.write_text("\n".join(words) + "\n", encoding="utf-8")
    values = (["w1"] * 300 + ["w2"] * 120 + ["w3"] * 7 + ["w9"]) if domain == "words" else (
        ["w1 w2"] * 300 + ["w2 w3"] * 120 + ["w3 w3"] * 7 + ["w9 w1"])
    data = tmp_path / "in.csv"
    data.write_text("pid,name\n" + "".join(f"p{i // 5},{v}\n" for i, v in enumerate(values)),
                    encoding="utf-8")
    calls = record_all(monkeypatch)
    out = tmp_path / "hist.csv"
    unit = ["--privacy-id", "pid", "--max-contributions", str(m)] if m > 1 else []
    _cli(["histogram", str(data), "--column", "name",
          "--domain", str(wfile) if domain == "words" else f"pairs:{wfile}", "--epsilon", "1",
          "--tolerance", "0.5", "--output", str(out), "--seed", "3", *unit])
    manifest = json.loads((tmp_path / "hist.csv.manifest.json").read_text())
    details = manifest["release"]["details"]
    n_declared = 500 if domain == "words" else 500 ** 2
    assert details["domain_size"] == n_declared
    spent = manifest["release"]["budget"]["spent"]
    assert (spent["epsilon"], spent["delta"]) == (1.0, 0.0)
    kinds = sorted(c["kind"] for c in calls)
    assert kinds == ["binomial", "discrete_laplace", "geometric"], kinds
    (lap,) = [c for c in calls if c["kind"] == "discrete_laplace"]
    (binom,) = [c for c in calls if c["kind"] == "binomial"]
    (geo,) = [c for c in calls if c["kind"] == "geometric"]
    active = _cells(lap["size"])
    assert active == len(set(values))  # the distinct in-domain values present (after the bound)
    assert m / lap["param"] == pytest.approx(spent["epsilon"], rel=1e-12)
    tau = int(details["tau"])
    assert binom["n"] == n_declared - active
    assert binom["p"] == pytest.approx(_dlap_tail(tau, lap["param"]), rel=1e-9)
    assert geo["q"] == pytest.approx(math.exp(-1.0 / lap["param"]), rel=1e-12)


def _adult_input(tmp_path: Path, n: int, m: int) -> tuple[Path, list[str]]:
    """The first ``n`` Adult records (a ``pid`` column of ``m`` records per person when m > 1)
    and the CLI arguments of the unit."""
    lines = ADULT.read_text(encoding="utf-8").splitlines()[:n + 1]
    path = tmp_path / "adult.csv"
    if m > 1:
        lines = ["pid," + lines[0]] + [f"p{i // m},{x}" for i, x in enumerate(lines[1:])]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, (["--privacy-id", "pid", "--max-contributions", str(m)] if m > 1 else [])


def _synthesize(monkeypatch, tmp_path: Path, method: str, m: int, n: int, *extra: str):
    data, unit = _adult_input(tmp_path, n, m)
    calls = record_all(monkeypatch)
    out = tmp_path / "out.csv"
    _cli(["synthesize", str(data), "--schema", "adult", "--method", method, "--output", str(out),
          "--seed", "3", *unit, *extra])
    return calls, json.loads((tmp_path / "out.csv.manifest.json").read_text())


@needs_adult
@pytest.mark.parametrize("m", [1, 2])
def test_sbhg_draws_fit_selection_and_sba_spends(monkeypatch, tmp_path, m):
    """CLI ``synthesize --method sbhg`` (ε = 1, δ = 1e-6, 1,000 Adult records, 200 rows out):
    p·R = 30 exponential-mechanism draws of Δ = m·(ln C + 1) whose ε sum to sbhg.hash_selection
    (0.2), p = 15 SBA draws at m/b = 0.8/15 summing to sbhg.conditionals, and Σ_j δ_j of the
    threshold the release used, δ_j = max(P(Z ≥ t − m), m·P(Z ≥ t − 1)) from the law (the SBA
    proof converted to add/remove, sbhg.sba_delta), within δ. Measured m = 1: t = 299, b = 18.75."""
    from beamsynth.transforms import sbhg

    used = []
    real = sbhg.sba_release

    def spy(keys, counts, *, scale, threshold, rs):
        used.append((scale, threshold, tuple(rs.labels)))
        return real(keys, counts, scale=scale, threshold=threshold, rs=rs)

    monkeypatch.setattr(sbhg, "sba_release", spy)
    calls, manifest = _synthesize(monkeypatch, tmp_path, "sbhg", m, 1000, "--epsilon", "1",
                                  "--delta", "1e-6", "--rows", "200", "--burn-in", "5")
    spends = _spends(manifest)
    sel, cond = spends["sbhg.hash_selection"], spends["sbhg.conditionals"]
    assert set(spends) == {"sbhg.hash_selection", "sbhg.conditionals"}
    em = [c for c in calls if c["kind"] == "exponential_mechanism"]
    sba = [c for c in calls if c["kind"] == "discrete_laplace"]
    assert len(calls) == len(em) + len(sba)  # nothing else drawn
    p = len(sba)
    assert p == 15 and len(em) == p * 2  # R = 2
    cap = sel["details"]["mi_count_cap"]
    assert all(c["sensitivity"] == pytest.approx(m * (math.log(cap) + 1), rel=1e-12) for c in em)
    assert sum(c["epsilon"] for c in em) == pytest.approx(sel["epsilon"], rel=1e-9)
    assert sel["delta"] == 0.0
    assert sum(m / c["param"] for c in sba) == pytest.approx(cond["epsilon"], rel=1e-9)
    assert len(used) == p and {s for s, _, _ in used} == {c["param"] for c in sba}
    delta = sum(max(_dlap_tail(t - m, s), m * _dlap_tail(t - 1, s)) for s, t, _ in used)
    assert delta <= cond["delta"] * (1 + 1e-9), delta
    assert manifest["release"]["budget"]["spent"]["epsilon"] == pytest.approx(1.0)


@needs_adult
def test_sbhg_fallback_draws_fit_its_spend(monkeypatch, tmp_path):
    """A public ``--input-rows 100`` too small for a hash: SBHG falls back to independent 1-way
    tables with the whole ε (pure; δ unspent): the 15 tables' Σ m/b = 1.0."""
    calls, manifest = _synthesize(monkeypatch, tmp_path, "sbhg", 1, 100, "--epsilon", "1",
                                  "--delta", "1e-6", "--rows", "50", "--input-rows", "100")
    spends = _spends(manifest)
    assert set(spends) == {"sbhg.fallback_independent"}
    lap = [c for c in calls if c["kind"] == "discrete_laplace"]
    assert len(lap) == len(calls) == 15
    assert sum(1 / c["param"] for c in lap) == pytest.approx(1.0, rel=1e-9)
    assert manifest["release"]["budget"]["spent"]["delta"] == 0.0


@needs_adult
@pytest.mark.parametrize("m", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_plausible_draws_fit_model_and_test_spends(monkeypatch, tmp_path, m):
    """CLI ``synthesize --method plausible`` (PrivBayes generator, ε = 5000, δ = 1e-6, public
    --rows 200, k = 50, γ = 4, ε0 = 1): the generator's draws are pure and sum (Σ m/b + Σ ε of
    permute-and-flip) to the plausible.model.* spends; the Poisson invocations have Σ λ·|D_S| =
    rows; one Test-2 threshold draw of scale 1/ε0 per candidate (Theorem 1); and plausible.candidates
    is (C·ε₁·m, C·δ₁' + δ_tail) recomputed here with C from scipy's Poisson tail and group privacy
    δ₁' = m·e^{(m−1)ε₁}·δ₁. Measured m = 1: model 500 (= 0.1·ε), C = 278, candidates 319.26."""
    from scipy.stats import poisson

    calls, manifest = _synthesize(
        monkeypatch, tmp_path, "plausible", m, 1000, "--epsilon", "5000", "--delta", "1e-6",
        "--rows", "200", "--k", "50", "--gamma", "4", "--epsilon0", "1", "--generator", "privbayes")
    spends = _spends(manifest)
    model = [c for c in calls if c["labels"][0] == "privbayes"]
    tests = [c for c in calls if c["labels"][0] == "plausible.test"]
    invocations = [c for c in calls if c["labels"][0] == "plausible.candidates"]
    assert len(model) + len(tests) + len(invocations) == len(calls)
    assert {c["kind"] for c in model} == {"discrete_laplace", "permute_and_flip"}
    used = sum(m / c["param"] if c["kind"] == "discrete_laplace" else c["epsilon"] for c in model)
    planned = sum(s["epsilon"] for k, s in spends.items() if k.startswith("plausible.model"))
    assert all(s["delta"] == 0.0 for k, s in spends.items() if k.startswith("plausible.model"))
    assert used == pytest.approx(planned, rel=1e-9) and planned == pytest.approx(500.0)
    cand = spends["plausible.candidates"]
    inv = cand["details"]["per_invocation"]
    eps0, k, gamma, t = inv["epsilon0"], inv["k"], inv["gamma"], inv["t"]
    assert {c["kind"] for c in invocations} == {"poisson"} and {c["kind"] for c in tests} == {
        "laplace_internal"}
    rows = cand["details"]["rows"]
    assert rows == 200
    # each seed of D_S draws Poisson(rows/|D_S|): the invocations' means add up to rows (public)
    assert len({float(c["lam"]) for c in invocations}) == 1
    assert sum(float(c["lam"]) * _cells(c["size"]) for c in invocations) == pytest.approx(rows)
    assert all(c["param"] == pytest.approx(1.0 / eps0) for c in tests)
    n_tested = sum(_cells(c["size"]) for c in tests)
    assert n_tested == manifest["operational"]["method"]["tested"]
    tail = cand["details"]["tail_delta"]
    big_c = next(c for c in range(rows, 10 * rows) if poisson.sf(c, rows) <= tail)
    eps1, delta1 = eps0 + math.log1p(gamma / t), math.exp(-eps0 * (k - t))
    assert cand["epsilon"] == pytest.approx(big_c * m * eps1, rel=1e-9)
    assert cand["delta"] == pytest.approx(
        big_c * min(1.0, m * math.exp((m - 1) * eps1) * delta1) + tail, rel=1e-9)
    spent = manifest["release"]["budget"]["spent"]
    assert spent["epsilon"] == pytest.approx(planned + cand["epsilon"], rel=1e-12)
    assert spent["delta"] <= 1e-6


@needs_adult
@pytest.mark.parametrize("m", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_plausible_cfs_generator_draws_fit_the_model_spend(monkeypatch, tmp_path, m):
    """The paper's CFS generator (``--generator cfs``, seed 001 §3.3-3.5), model ε = 500 (0.1 of
    5000): on D_T the noisy record count (Δ = m) and the Q = 120 noisy n·H values (continuous
    Laplace, internal: only the structure is released; Δ = m·(log2 N + (N − 1)·log2(N/(N − 1))) per
    value, N = max_records) sum to the model ε; on the disjoint D_P every conditional-count draw
    has one scale b and a record meets one row of each of the p = 15 tables: p·m/b = the model
    ε (parallel composition over the two splits, as the plausible.model spend states)."""
    calls, manifest = _synthesize(
        monkeypatch, tmp_path, "plausible", m, 1000, "--epsilon", "5000", "--delta", "1e-6",
        "--rows", "200", "--k", "50", "--gamma", "4", "--epsilon0", "1", "--generator", "cfs")
    model = _spends(manifest)["plausible.model"]
    eps = model["epsilon"]
    assert eps == pytest.approx(500.0) and model["delta"] == 0.0
    big_n = model["details"]["max_records"]
    (count,) = [c for c in calls if c["labels"][-1] == "count"]
    (ent,) = [c for c in calls if c["labels"][-1] == "entropies"]
    params = [c for c in calls if c["labels"] == ("noise",)]
    others = [c for c in calls if c["labels"][0] not in ("plausible.test", "plausible.candidates")]
    assert len(others) == 2 + len(params)  # nothing else drawn for the model
    delta_f = math.log2(big_n) + (big_n - 1) * math.log2(big_n / (big_n - 1))
    structure = m / count["param"] + m * delta_f * _cells(ent["size"]) / ent["param"]
    assert _cells(ent["size"]) == 15 + 15 * 14 // 2
    assert structure == pytest.approx(eps, rel=1e-6)
    assert len({c["param"] for c in params}) == 1
    assert 15 * m / params[0]["param"] == pytest.approx(eps, rel=1e-9)


def _window_of(labels: tuple) -> tuple | None:
    """The declared window a draw's labels name (``("window", start, end)``), if any."""
    for i, label in enumerate(labels[:-2]):
        if label == "window":
            return tuple(labels[i:i + 3])
    return None


@pytest.mark.slow  # about 4.5 s CPU (Beam pipeline with three mechanisms over three windows)
def test_api_windows_each_window_draws_the_job_budget(monkeypatch):
    """The API over three declared hours (records in hours 1 and 3, none in hour 2), one job of
    ε = 1.5 with m = 2: ``bs.PrefixTree`` direct on a text key (0.5), ``bs.PrefixTree`` improved
    on a spatial key (0.5), ``bs.Histogram`` (CatHist over 1-6 letter strings, 0.5). Per declared
    window, empty included: direct's paths Σ m/b = 0.5, improved's m × loss ≤ 0.5 at one scale,
    CatHist m/b = 0.5 with Binomial(n_declared − a, P(Z ≥ τ)); every stream once."""
    import apache_beam as beam

    import beamsynth as bs
    from beamsynth.transforms import cathist as ch
    from beamsynth.transforms import prefix_levels as pl

    m, hour = 2, 3600
    schema = bs.load_schema({"name": "w", "columns": [
        {"name": "word", "type": "string", "open": {"tolerance": 0.5},
         "domain": {"kind": "string", "alphabet": "abc", "min_length": 1, "max_length": 6}}]})
    keys = {"word": bs.TextKey(column="word", alphabet="abc", max_length=4),
            "at": bs.SpatialKey(columns=["x", "y"], box=[(0.0, 1.0), (0.0, 1.0)], depth=4)}
    rng = np.random.default_rng(2)
    rows = [({"pid": f"u{i // m}", "word": ["ab", "abc", "c", "ba"][i % 4],
              "x": float(rng.uniform(0, 0.5)), "y": float(rng.uniform(0, 1))},
             (0 if i < 120 else 2 * hour) + 30) for i in range(200)]
    plans = []
    real_plan = ch.plan_cathist

    def spy_plan(**kw):
        plans.append(real_plan(**kw))
        return plans[-1]

    monkeypatch.setattr(ch, "plan_cathist", spy_plan)
    used = []
    real_step = pl.improved_step

    def spy_step(*a, **kw):
        used.append((kw["acct"].scale, kw["acct"].threshold, kw["acct"].discount))
        return real_step(*a, **kw)

    monkeypatch.setattr(pl, "improved_step", spy_step)
    calls = record_all(monkeypatch)
    job = bs.PrivacyJob(epsilon=1.5, seed=1, privacy_unit=bs.PrivacyUnit(id_column="pid",
                                                                         max_contributions=m))
    windows = bs.DeclaredWindows(start=0, end=3 * hour, size=hour)
    with beam.Pipeline() as p:
        private = (p | beam.Create(rows) | beam.MapTuple(beam.window.TimestampedValue)
                   | job.private(schema, keys=keys, windows=windows))
        _ = private | "D" >> bs.PrefixTree(key="word", epsilon=0.5, method="direct")
        _ = private | "I" >> bs.PrefixTree(key="at", epsilon=0.5, method="improved")
        _ = private | "H" >> bs.Histogram(column="word", epsilon=0.5)
    assert len(plans) >= 1 and len({(pl.scale, pl.tau, pl.domain_size) for pl in plans}) == 1
    plan = plans[0]
    by_window: dict[tuple, list[dict]] = {}
    for c in calls:
        by_window.setdefault(_window_of(c["labels"]), []).append(c)
    assert len([w for w in by_window if w is not None]) == 3, list(by_window)
    assert None not in by_window  # nothing drawn outside the declared windows
    for w, mine in by_window.items():
        trees = {c["stream"] for c in mine if c["labels"][0] == "Tree"}  # one seed per step
        (direct_stream,) = {c["stream"] for c in mine if c["labels"][-1] == "root"}
        assert len(trees) == 2 and direct_stream in trees
        direct = [c for c in mine if c["stream"] == direct_stream]
        improved = [c for c in mine if c["stream"] in trees - {direct_stream}
                    and c["kind"] == "discrete_laplace"]
        hist = [c for c in mine if c["kind"] in ("binomial", "geometric")
                or (c["kind"] == "discrete_laplace" and c["labels"][-1] == "active")]
        assert max(direct_path_costs(direct, m)) == pytest.approx(0.5, rel=1e-9), w
        assert len({c["param"] for c in improved}) == 1
        assert len(set(used)) == 1  # one accounting for every window and level
        assert len(improved) == 4  # one level stream per depth of the spatial key
        (lap,) = [c for c in hist if c["kind"] == "discrete_laplace"]
        (binom,) = [c for c in hist if c["kind"] == "binomial"]
        assert m / lap["param"] == pytest.approx(0.5, rel=1e-12), w
        assert binom["n"] == plan.domain_size - _cells(lap["size"])
        assert binom["p"] == pytest.approx(_dlap_tail(plan.tau, lap["param"]), rel=1e-9)
        scale, threshold, discount = used[0]
        assert improved[0]["param"] == scale
        assert m * improved_record_loss(1.0 / scale, threshold, discount) <= 0.5 * (1 + 1e-9)
    spends = job.accountant.to_dict()["spends"]
    assert [s["epsilon"] for s in spends] == pytest.approx([0.5, 0.5, 0.5])


@pytest.mark.slow  # a Beam pipeline with Gibbs sampling per declared window
def test_api_windows_sbhg_draws_its_spends_per_window(monkeypatch):
    """``bs.SBHG`` (ε = 1, δ = 1e-6, public rows 50, m = 1) over three declared hours (records in
    hours 1 and 3, none in 2): every window, the empty one included, draws p·R exponential-
    mechanism picks summing to ``sbhg.hash_selection``; the windows with records draw p SBA
    draws summing (m/b) to ``sbhg.conditionals`` (the empty one none: SBA noises the non-empty
    cells only, Algorithm 1); each stream once."""
    import apache_beam as beam

    import beamsynth as bs

    hour = 3600
    schema = bs.load_schema("adult").select(["age", "sex", "race", "income"])
    rng = np.random.default_rng(3)
    rows = [({"age": int(rng.integers(20, 70)), "sex": ["Male", "Female"][i % 2],
              "race": "White", "income": ["<=50K", ">50K"][i % 3 == 0]},
             (0 if i < 150 else 2 * hour) + 10) for i in range(250)]
    calls = record_all(monkeypatch)
    job = bs.PrivacyJob(epsilon=1.0, delta=1e-6, seed=2)
    windows = bs.DeclaredWindows(start=0, end=3 * hour, size=hour)
    with beam.Pipeline() as p:
        private = (p | beam.Create(rows) | beam.MapTuple(beam.window.TimestampedValue)
                   | job.private(schema, windows=windows))
        _ = private | bs.SBHG(epsilon=1.0, delta=1e-6, rows=50)
    spends = {s["step"].split("/")[-1] if "/" in s["step"] else s["step"]: s
              for s in job.accountant.to_dict()["spends"]}
    sel = next(s for k, s in spends.items() if k.endswith("hash_selection"))
    cond = next(s for k, s in spends.items() if k.endswith("conditionals"))
    privacy = [c for c in calls if c["kind"] in ("exponential_mechanism", "discrete_laplace")]
    by_window: dict[tuple, list[dict]] = {}
    for c in privacy:
        by_window.setdefault(_window_of(c["labels"]), []).append(c)
    assert sorted(w is None for w in by_window) == [False] * 3, list(by_window)
    for w, mine in by_window.items():
        em = [c for c in mine if c["kind"] == "exponential_mechanism"]
        sba = [c for c in mine if c["kind"] == "discrete_laplace"]
        empty = w[1] == hour * 10**6  # hour 2: SBA noises non-empty cells only, so none here
        assert len(em) == 4 * 2 and len(sba) == (0 if empty else 4), (w, len(em), len(sba))
        assert sum(c["epsilon"] for c in em) == pytest.approx(sel["epsilon"], rel=1e-9)
        assert sum(1 / c["param"] for c in sba) == pytest.approx(0 if empty else cond["epsilon"],
                                                                  rel=1e-9)
        streams = [(c["stream"], c["labels"]) for c in mine]
        assert len(set(streams)) == len(streams)
