"""Fifteenth session (H67): red team of the fourteenth session's mechanism code, by recorded draws
and neighbour pairs (docs/audits.md "Fifteenth session: mechanism red team (H67)").

1. PrivBayes' target-parent gate (``auto`` = ``"useful"``, H58 3008513/5a9c316/e34e622, H65
   3823a87/638c245, lead 2512043): ``u = n̂·ε_m/(m·Σ_X |X|·|T|·c̄) ≥ θ_T = 20``. At the gate's
   edge (n̂ just below / at it) D and D − 1 given the same n̂ and seed make the same choice with
   identical draws (kind, labels, scale or ε, size), through the measuring DoFn and the CLI; each
   branch draws exactly its spends (d − 1 permute-and-flip steps at Δ = 4m, one table per column
   at Δ = m: Σ ε = ε − ε_c, or Σ ρ = ρ under zCDP); a variant whose gate reads the exact n is
   caught. Public ``--input-rows``: decided when built (the families are pairs or triples from
   declared values only). Windows choosing different modes in one step each fit the one spend.
2. ``split_network_budget`` (H59 0661a83, lead 21dc32f's 2⁻²⁰ grid): called with the planned
   table ε, the released structure's tables and the declared shape only (never under zCDP); every
   share positive; the shares add up to the table ε (to the last bits: see the docs section).
3. Plausible deniability under declared windows (never audited before): through the API, every
   window draws its own Test-2 thresholds (one per tested candidate, scale 1/ε₀) and Poisson
   invocations (Σ λ·|D_S(w)| = rows), the model's draws within ``plausible.model.*`` per window;
   D vs D + 1 record in one window changes nothing in the others.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant, PureDP
from beamsynth.transforms.measure import count_marginals
from beamsynth.transforms.privbayes import (
    candidate_families,
    gaussian_plan,
    plan_privbayes,
    spend_privbayes,
)
from tests.audit import test_session12_accounting as s12
from tests.audit.test_session14_mechanisms import _cells, _cli, _window_of, record_all

pytestmark = pytest.mark.audit

# seven binary columns, the last the declared target: the gate's edge at a few hundred records
BIN7 = {"name": "bin7", "target": "y", "columns": [
    *({"name": f"x{i}", "type": "categorical",
       "domain": {"kind": "categorical", "values": ["a", "b"]}} for i in range(6)),
    {"name": "y", "type": "categorical", "domain": {"kind": "categorical", "values": ["n", "p"]}}]}
SHAPE = (2,) * 7
NAMES = [c["name"] for c in BIN7["columns"]]
T = 6
EPS = 3.0
# n̂ where u reaches θ_T = 20 (ε = 3, DP count; measured from the plan): below it the label-free
# network, from it the target a parent of every column
EDGE = {("laplace", 1): 484, ("laplace", 2): 968, ("gaussian", 1): 794, ("gaussian", 2): 1588}
PUBLIC_EDGE = 475  # the same with public rows (Laplace, m = 1: no size count, so a larger ε_m)


def _plan(noise: str, m: int, rows: int | None = None):
    budget = ApproxDP(epsilon=EPS, delta=s12.DELTA if noise == "gaussian" else 0.0)
    plan = plan_privbayes(SHAPE, budget, sizing="auto", rows=rows, max_contributions=m, target=T,
                          names=NAMES, target_parent="auto")
    if noise == "gaussian":
        plan = gaussian_plan(plan, budget)
    acc = PrivacyAccountant(total=budget)
    spend_privbayes(acc, plan)
    return plan, {s["step"]: s for s in acc.to_dict()["spends"]}, acc


def _codes(n: int, seed: int = 0) -> np.ndarray:
    """``n`` records over BIN7: y follows x0 and x1 (so the target's triples carry signal)."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 2, (n, 7))
    codes[:, 6] = (codes[:, 0] & codes[:, 1]) ^ (rng.random(n) < 0.1)
    return codes


def _counts(families, codes):
    return [c.reshape([SHAPE[i] for i in f])
            for c, f in zip(count_marginals(codes, families, SHAPE), families)]


def _exact_gate(plan, exact: list[int]):
    """A broken plan whose target-parent gate reads the exact record count ``exact[0]`` instead
    of the DP count (the breach the coupling must catch)."""
    real = type(plan).target_parent_gate
    broken = type("ExactGatePlan", (type(plan),), {
        "target_parent_gate": lambda self, rows: real(self, exact[0])})
    return broken(**{f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)})


def _fix_size_count(monkeypatch, rows_hat: int, n: int) -> None:
    """The PrivBayes size count's noise set to ``rows_hat − n`` (n records seen): n̂ = rows_hat
    whatever the side of the neighbour pair; every other discrete Laplace draw as drawn."""
    from beamsynth.transforms import privbayes_measure as pbm

    real = pbm.discrete_laplace

    def fixed(rs, scale, size):
        if rs.labels and rs.labels[-1] == "size_count":
            return np.asarray([rows_hat - n])
        return real(rs, scale, size)

    monkeypatch.setattr(pbm, "discrete_laplace", fixed)


def _measure_pair(monkeypatch, plan, codes, rows_hat: int, exact: list[int]) -> list[dict]:
    """D = ``codes`` and D − its last record through the measuring DoFn (PrivBayesMeasureFn, one
    window), both given the DP count ``rows_hat`` (the size count's noise set to rows_hat −
    exact) and the same seed: per side the run-time sizing, released tables' (columns, scale) and
    every draw's (kind, labels, parameters)."""
    from apache_beam.transforms.window import GlobalWindow

    from beamsynth.transforms.privbayes_measure import PrivBayesMeasureFn

    fams = candidate_families(len(SHAPE), plan.degree, shape=SHAPE,
                              max_family_cells=plan.max_family_cells, target=plan.parent_target)
    fn = PrivBayesMeasureFn(families=fams, shape=SHAPE, names=NAMES, plan=plan, seed=4)
    sides = []
    for data in (codes, codes[:-1]):
        exact[0] = len(data)
        _fix_size_count(monkeypatch, rows_hat, len(data))
        calls = s12.record_draws(monkeypatch)
        (out,) = list(fn.process(_counts(fams, data), window=GlobalWindow()))
        sides.append({
            "out": out, "calls": calls,
            "tables": [(tuple(t.columns), float(t.scale)) for t in out.marginals],
            "draws": [(c["kind"], c["labels"], c.get("param", c.get("epsilon")),
                       c.get("sensitivity"), c.get("size")) for c in calls]})
        monkeypatch.undo()
    return sides


def _check_branch_spends(side: dict, plan, spends: dict, acc, noise: str, m: int) -> None:
    """One side's draws against the spends (the size count's noise is set by the pair, so not
    recorded): d − 1 structure steps at Δ = 4m and ε_step, one table per column, all within the
    model spend (exactly)."""
    count = spends["privbayes.size_count"]
    rest = spends.get("privbayes.zcdp") or {"epsilon": acc.spent_epsilon - count["epsilon"],
                                            "delta": 0.0}
    calls = side["calls"]
    v = s12.verdict(calls, m=m, count=None, rest=rest)
    assert v["ok"], v
    steps = [c for c in calls if c["kind"] == "permute_and_flip" and "structure" in c["labels"]]
    assert len(steps) == len(SHAPE) - 1
    assert {(c["epsilon"], c["sensitivity"]) for c in steps} == {(plan.step_epsilon, 4.0 * m)}
    if noise == "laplace":
        assert v["gaussian"] == 0
        assert v["pure"] == pytest.approx(EPS - count["epsilon"], rel=1e-12)
    else:
        assert v["rho"] == pytest.approx(plan.zcdp.spent_rho, rel=1e-9)


@pytest.mark.parametrize(("noise", "m"), [("laplace", 1), ("gaussian", 1), ("laplace", 2),
                                          ("gaussian", 2)])
def test_gate_edge_is_a_function_of_the_dp_count(monkeypatch, noise, m):
    """At the gate's edge (D = EDGE records, D − 1), the same n̂ and seed give the same mode and
    the same draws on both sides: n̂ = EDGE − 1 the label-free network (u just below 20), n̂ =
    EDGE the target a parent of every column; both branches draw exactly their spends. The
    variant whose gate reads the exact n gives 'required' on D and 'off' on D − 1 at n̂ = EDGE −
    1. Measured (Laplace, m = 1): u = 19.969 / 20.010, 6 steps at ε_step = 0.03675, Δ = 4."""
    plan, spends, acc = _plan(noise, m)
    edge = EDGE[(noise, m)]
    assert (plan.target_parent_gate(edge)[0], plan.target_parent_gate(edge - 1)[0]) == (True, False)
    codes = _codes(edge)
    exact = [0]
    for rows_hat, mode in ((edge - 1, "off"), (edge, "required")):
        d, d1 = _measure_pair(monkeypatch, plan, codes, rows_hat, exact)
        assert d["out"].sizing == d1["out"].sizing, (d["out"].sizing, d1["out"].sizing)
        assert d["out"].sizing["target_parent"] == mode and d["out"].sizing["degree"] == 1
        assert d["draws"] == d1["draws"] and d["tables"] == d1["tables"]
        with_t = [x for x, ps in d["out"].structure if T in ps]
        assert len(with_t) == (len(SHAPE) - 1 if mode == "required" else len(with_t))
        if mode == "required":
            assert d["out"].structure[0] == (T, ())
        for side in (d, d1):
            _check_branch_spends(side, plan, spends, acc, noise, m)
    # the audit's own check: a gate on the exact n splits the neighbours at n̂ = EDGE − 1
    d, d1 = _measure_pair(monkeypatch, _exact_gate(plan, exact), codes, edge - 1, exact)
    assert (d["out"].sizing["target_parent"], d1["out"].sizing["target_parent"]) == ("required", "off")
    assert d["draws"] != d1["draws"]


def _bin7_csv(path: Path, codes: np.ndarray) -> Path:
    values = [c["domain"]["values"] for c in BIN7["columns"]]
    lines = [",".join(NAMES)] + [",".join(values[j][v] for j, v in enumerate(r)) for r in codes]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _cli_pair(monkeypatch, tmp_path: Path, codes: np.ndarray, args: list[str],
              rows_hat: int | None) -> list[dict]:
    """CLI ``synthesize --method privbayes --target y`` on D = ``codes`` and D − its last record
    (seed 3), the size count's noise set so that both see n̂ = ``rows_hat`` (None: no DP count):
    per side every recorded draw (kind, labels, parameters) and the manifest."""

    schema = tmp_path / "bin7.yaml"
    schema.write_text(json.dumps(BIN7), encoding="utf-8")
    sides = []
    for name, data in (("d", codes), ("d1", codes[:-1])):
        if rows_hat is not None:
            _fix_size_count(monkeypatch, rows_hat, len(data))
        calls = record_all(monkeypatch)
        src = _bin7_csv(tmp_path / f"{name}.csv", data)
        out = tmp_path / f"{name}.out.csv"
        _cli(["synthesize", str(src), "--schema", str(schema), "--method", "privbayes",
              "--target", "y", "--rows", "200", "--output", str(out), "--seed", "3", *args])
        monkeypatch.undo()
        manifest = json.loads(out.with_name(out.name + ".manifest.json").read_text())
        sides.append({"manifest": manifest, "draws": [
            (c["kind"], c["labels"], float(c.get("param", c.get("epsilon", 0.0))),
             c.get("sensitivity"), c.get("size")) for c in calls]})
    return sides


def _privbayes_details(manifest: dict) -> dict:
    return manifest["release"]["details"]["method"]["privbayes"]


@pytest.mark.slow  # four CLI runs on the DirectRunner (about 15 s CPU)
def test_cli_gate_edge_couples_neighbours(monkeypatch, tmp_path):
    """Through the CLI (CSV → encode → CountCandidates → ChooseAndMeasure → sampling →
    manifest), Laplace, m = 1, ε = 3: D = 484 records and D − 1 given n̂ = 483 both run the
    label-free network (manifest sizing.chosen_target_parent_windows {'off': 1}), given n̂ = 484
    both the target-parented one ({'required': 1}), with identical draws; with public
    --input-rows 475 / 474 (u = 20.04 / 19.997) the gate is decided when built, the same on both
    sides."""
    edge = EDGE[("laplace", 1)]
    codes = _codes(edge)
    for rows_hat, mode in ((edge - 1, "off"), (edge, "required")):
        d, d1 = _cli_pair(monkeypatch, tmp_path, codes, ["--epsilon", str(EPS)], rows_hat)
        assert d["draws"] == d1["draws"] and d["draws"]
        for side in (d, d1):
            details = _privbayes_details(side["manifest"])
            assert details["sizing"]["chosen_target_parent_windows"] == {mode: 1}, details["sizing"]
    for rows, mode in ((PUBLIC_EDGE - 1, "off"), (PUBLIC_EDGE, "required")):
        d, d1 = _cli_pair(monkeypatch, tmp_path, codes,
                          ["--epsilon", str(EPS), "--input-rows", str(rows)], None)
        assert d["draws"] == d1["draws"] and d["draws"]
        for side in (d, d1):
            target = _privbayes_details(side["manifest"])["target"]["target_parent"]
            assert target["ran"] == mode, target


@pytest.mark.parametrize(("noise", "m"), [("laplace", 1), ("gaussian", 1), ("laplace", 2),
                                          ("gaussian", 2)])
def test_windows_choosing_different_modes_fit_one_spend(monkeypatch, noise, m):
    """One PrivBayesMeasureFn over three declared windows (DP counts, ε = 3): 300 records (the
    gate closed: label-free network), 4,000 (open: the target a parent of every column) and 10
    (k = 0: the small-input model). Per window (draws grouped by their window labels): one size
    count within privbayes.size_count, the rest within the one model spend: Σ ε = ε − ε_c
    exactly (pure branches), Σ ρ = the plan's ρ (zCDP network, or its Gaussian 1-way fallback at
    k = 0); nothing drawn outside the three windows."""
    from apache_beam.transforms.window import IntervalWindow

    from beamsynth.transforms.measure import window_labels
    from beamsynth.transforms.privbayes_measure import PrivBayesMeasureFn

    plan, spends, acc = _plan(noise, m)
    count = spends["privbayes.size_count"]
    rest = spends.get("privbayes.zcdp") or {"epsilon": acc.spent_epsilon - count["epsilon"],
                                            "delta": 0.0}
    fams = candidate_families(len(SHAPE), plan.degree, shape=SHAPE,
                              max_family_cells=plan.max_family_cells, target=plan.parent_target)
    fn = PrivBayesMeasureFn(families=fams, shape=SHAPE, names=NAMES, plan=plan, seed=9)
    calls = s12.record_draws(monkeypatch)
    ran = []
    for i, n in enumerate((300, 4_000, 10)):
        window = IntervalWindow(i * 3600, (i + 1) * 3600)
        (out,) = list(fn.process(_counts(fams, _codes(n, i)), window=window))
        ran.append(out.sizing.get("target_parent", f"k={out.sizing['degree']}"))
        labels = window_labels(window)
        mine = [c for c in calls if c["labels"][1:1 + len(labels)] == labels]
        v = s12.verdict(mine, m=m, count=count, rest=rest)
        assert v["ok"], (n, v)
        if not v["gaussian"]:  # Laplace plan, or a zCDP plan's pure forest/star
            assert v["pure"] == pytest.approx(rest["epsilon"], rel=1e-12)
        else:  # zCDP network, or its 1-way fallback with the whole ρ
            assert noise == "gaussian" and v["rho"] == pytest.approx(plan.zcdp.spent_rho, rel=1e-9)
    assert ran == ["off", "required", "k=0"], ran
    assert len(calls) == sum(len([c for c in calls if c["labels"][1:3] == window_labels(
        IntervalWindow(i * 3600, (i + 1) * 3600))[:2]]) for i in range(3))


# == 2. split_network_budget ========================================================================
@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_split_reads_the_released_structure_and_declared_shape_only(monkeypatch, noise):
    """The split's inputs in the measuring step (recorded by a spy): the planned table ε
    (``plan.marginal_budget``), the released structure's tables (``family_specs``), the
    declared shape and the plan's weight; its signature takes nothing else (no counts, no n). Every share > 0 and the
    shares add up to the table ε (math.fsum; equal here); the network tables' draws cost them
    (m/b = ε_t). Under zCDP it is never called (ρ split ∝ cells^⅔). Two windows (gate closed /
    open), Laplace, m = 1."""
    import inspect

    from apache_beam.transforms.window import IntervalWindow

    from beamsynth.transforms import privbayes_measure as pbm
    from beamsynth.transforms.privbayes_measure import PrivBayesMeasureFn
    from beamsynth.transforms.privbayes_sizing import split_network_budget
    from beamsynth.transforms.privbayes_structure import family_specs

    assert list(inspect.signature(split_network_budget).parameters) == [
        "budget", "specs", "shape", "table_weight"]
    plan, _, _ = _plan(noise, 1)
    seen = []

    def spy(budget, specs, shape, **kw):
        seen.append((budget, [tuple(s) for s in specs], tuple(shape), kw,
                     split_network_budget(budget, specs, shape, **kw)))
        return seen[-1][-1]

    monkeypatch.setattr(pbm, "split_network_budget", spy)
    calls = s12.record_draws(monkeypatch)
    fams = candidate_families(len(SHAPE), plan.degree, shape=SHAPE,
                              max_family_cells=plan.max_family_cells, target=plan.parent_target)
    fn = PrivBayesMeasureFn(families=fams, shape=SHAPE, names=NAMES, plan=plan, seed=2)
    outs = [next(iter(fn.process(_counts(fams, _codes(n, i)),
                                 window=IntervalWindow(i * 3600, (i + 1) * 3600))))
            for i, n in enumerate((300, 4_000))]
    assert [o.sizing["target_parent"] for o in outs] == ["off", "required"]
    if noise == "gaussian":
        assert seen == []
        return
    assert len(seen) == 2
    for out, (budget, specs, shape, kw, shares) in zip(outs, seen):
        assert budget == plan.marginal_budget and shape == SHAPE
        assert kw == {"table_weight": plan.split_table_weight} == {"table_weight": 1.0}
        assert specs == [tuple(s) for s in family_specs(out.structure)]
        eps = [b.epsilon for b in shares]
        assert min(eps) > 0 and math.fsum(eps) == budget.epsilon, (eps, budget)
    table_draws = [c for c in calls if c["kind"] == "discrete_laplace" and "marginals" in c["labels"]
                   and "refine" not in c["labels"]]
    assert sorted(1 / c["param"] for c in table_draws) == pytest.approx(
        sorted(b.epsilon for *_, shares in seen for b in shares), rel=1e-12)


def test_split_shares_are_positive_and_add_up_on_any_structure():
    """Random structures (3-30 columns, declared cells 1-10⁶, up to 3 parents, ε 10⁻⁶-10⁴):
    every share > 0 (at least one 2⁻²⁰ grid unit) and finite, and the shares add up to the table
    ε to the last bit or one unit in the last place above it (math.fsum; measured on 972 random
    structures of 3-60 columns: 970 exact, 2 one ulp over: ε = 1.75e-4 on cells (2, 200, 2) and 3.07e-3 on (2, 50, 3, 2), the
    last cases below). The pre-H59 √cells split (split_marginal_budget) is over by up to 2 ulps
    in 22% of random cases (20,000 drawn): float rounding, far below the samplers' own."""
    import random

    from beamsynth.transforms.privbayes_sizing import SPLIT_GRID, split_network_budget

    rng = random.Random(1)
    cases = [(0.00017530499895609538, [2, 200, 2], [(0, 1), (2,)]),
             (0.003065078754004007, [2, 50, 3, 2], [(1, 2), (0,), (3,)])]
    for _ in range(12):
        d = rng.randint(3, 30)
        shape = [rng.choice([1, 2, 3, 5, 10, 50, 200, 1000, 10**5, 10**6]) for _ in range(d)]
        order = list(range(d))
        rng.shuffle(order)
        specs = [(x, *rng.sample(order[:i], rng.randint(0, min(3, i))))
                 for i, x in enumerate(order) if i]
        covered = {c for s in specs if len(s) > 1 for c in s}
        specs = [s for s in specs if len(s) > 1] + [(c,) for c in range(d) if c not in covered]
        cases.append((10 ** rng.uniform(-6, 4), shape, specs))
    for eps, shape, specs in cases:
        shares = [b.epsilon for b in split_network_budget(PureDP(epsilon=eps), specs, shape)]
        assert len(shares) == len(specs)
        assert all(math.isfinite(e) and e >= eps / SPLIT_GRID * (1 - 1e-12) for e in shares)
        assert math.fsum(shares) <= math.nextafter(eps, math.inf), (eps, shape, specs)


# == 3. plausible deniability under declared windows ================================================
HOUR = 3600
_RELEASED: list[dict] = []  # the released rows of the last run (in-process DirectRunner)


def _collect(row) -> None:
    _RELEASED.append(row._asdict())


def _plausible_windows(monkeypatch, tmp_path: Path, extra: list[tuple[dict, int]], name: str):
    """``bs.PlausibleDeniability`` (PrivBayes generator, ε = 5000, δ = 1e-6, public rows 60,
    k = 50, γ = 4, ε₀ = 1, seed 2) over three declared hours: 150 records in hour 1, none in
    hour 2, 400 in hour 3, and ``extra`` (record, event time) pairs. Returns every recorded draw,
    the released rows per window and the manifest."""
    import apache_beam as beam

    import beamsynth as bs

    schema = bs.load_schema("adult").select(["age", "sex", "race", "income"])
    rng = np.random.default_rng(3)
    rows = [({"age": int(rng.integers(20, 23)), "sex": ["Male", "Female"][i % 2],
              "race": "White", "income": ["<=50K", ">50K"][i % 3 == 0]},
             (0 if i < 600 else 2 * HOUR) + 10) for i in range(1000)]
    rows += extra
    calls = record_all(monkeypatch)
    job = bs.PrivacyJob(epsilon=5000.0, delta=1e-6, seed=2)
    windows = bs.DeclaredWindows(start=0, end=3 * HOUR, size=HOUR)
    _RELEASED.clear()
    path = tmp_path / f"{name}.manifest.json"
    with beam.Pipeline() as p:
        private = (p | beam.Create(rows) | beam.MapTuple(beam.window.TimestampedValue)
                   | job.private(schema, windows=windows))
        released = private | bs.PlausibleDeniability(
            epsilon=5000.0, delta=1e-6, rows=60,
            options={"k": 50, "gamma": 4.0, "epsilon0": 1.0, "generator": "privbayes"})
        _ = released | beam.Map(_collect)
        _ = p | bs.WriteManifest(job=job, path=str(path))
    monkeypatch.undo()
    per_window: dict[str, list] = {}
    for r in _RELEASED:
        per_window.setdefault(str(r["window_start"]), []).append(tuple(sorted(r.items())))
    return calls, {w: sorted(v) for w, v in per_window.items()}, json.loads(path.read_text())


@pytest.mark.slow  # two API pipelines with plausible deniability over three windows (~9 s each)
def test_plausible_under_declared_windows(monkeypatch, tmp_path):
    """Per declared window (the empty one included): the PrivBayes generator's draws are pure
    and sum to the plausible.model.* spends; the Poisson invocations have one λ and Σ λ·|D_S(w)|
    = rows (public, per window), none in the empty window; one Test-2 threshold of scale 1/ε₀
    per candidate tested in that window (the manifest's private per-window count); nothing is
    drawn outside the windows; the manifest states the budget and the (C·ε₁, C·δ₁ + δ_tail)
    charge per window. D + 1 record in hour 1: hours 2 and 3 draw and release exactly as on D.
    Measured: 59 / 0 / 61 candidates tested and released, C = 104 per window."""
    calls, released, manifest = _plausible_windows(monkeypatch, tmp_path, [], "d")
    spends = {s["step"].split("/")[-1]: s for s in manifest["release"]["budget"]["spends"]}
    model_eps = sum(s["epsilon"] for k, s in spends.items() if k.startswith("plausible.model"))
    assert model_eps == pytest.approx(500.0)
    eps0 = 1.0
    ops = manifest["operational"]["mechanisms"]["Synthesize[plausible]"]["per_window"]
    tested = {w["window_start"]: w["tested"] for w in ops}
    by_window: dict = {}
    for c in calls:
        by_window.setdefault(_window_of(c["labels"]), []).append(c)
    assert None not in by_window and len(by_window) == 3, list(by_window)
    for w, mine in sorted(by_window.items()):
        model = [c for c in mine if c["labels"][0] == "privbayes"]
        tests = [c for c in mine if c["labels"][0] == "plausible.test"]
        invocations = [c for c in mine if c["labels"][0] == "plausible.candidates"]
        assert len(model) + len(tests) + len(invocations) == len(mine)
        used = sum(1 / c["param"] if c["kind"] == "discrete_laplace" else c["epsilon"]
                   for c in model)
        assert {c["kind"] for c in model} <= {"discrete_laplace", "permute_and_flip"}
        assert used == pytest.approx(model_eps, rel=1e-9), w
        start = sorted(tested)[(w[1] // 10**6) // HOUR]
        if tested[start] == 0:  # the empty hour: no seed, no invocation, no test
            assert w[1] // 10**6 == HOUR and not invocations and not tests
            continue
        assert len({float(c["lam"]) for c in invocations}) == 1
        assert sum(float(c["lam"]) * _cells(c["size"]) for c in invocations) == pytest.approx(60)
        assert {c["kind"] for c in tests} == {"laplace_internal"}
        assert {c["param"] for c in tests} == {1.0 / eps0}
        assert sum(_cells(c["size"]) for c in tests) == tested[start]
    guarantee = manifest["release"]["details"]["windows"]
    assert guarantee["budget"].startswith("per window") and guarantee["windows"] == 3
    per = guarantee["per_window"]
    assert len(per) == 3 and all(
        [x["step"] for x in p["spends"]] == [x["step"] for x in per[0]["spends"]] for p in per)
    assert spends["plausible.candidates"]["details"]["C"] == 104
    # D + 1 record in hour 1: the other hours are untouched (draws and released rows)
    extra = [({"age": 21, "sex": "Female", "race": "White", "income": ">50K"}, 20)]
    calls1, released1, _ = _plausible_windows(monkeypatch, tmp_path, extra, "d1")

    def draws(cs, hour):
        return [(c["kind"], c["labels"], repr({k: v for k, v in c.items()
                                                if k not in ("kind", "labels", "stream")}))
                for c in cs if (_window_of(c["labels"]) or (0, 0))[1] // 10**6 == hour * HOUR]

    for hour in (1, 2):
        assert draws(calls, hour) == draws(calls1, hour) and (hour == 1 or draws(calls, hour))
    starts = sorted(tested)
    assert released.get(starts[2]) == released1.get(starts[2]) and released.get(starts[2])
    assert released.get(starts[1]) is None and released1.get(starts[1]) is None
    assert draws(calls, 0) != draws(calls1, 0)  # hour 1 itself did see the record


# == 1b. the target parent where k + 1 ≥ d (a full-table network) ================================
@pytest.mark.parametrize(("d", "degree", "option", "rows"), [
    (3, 2, "required", None), (3, 2, "auto", None), (4, 3, "required", 100_000),
    (4, 3, "auto", 100_000), (4, 3, "auto", None)])
def test_target_parent_runs_where_the_manifest_says_at_full_degree(d, degree, option, rows):
    """Where k + 1 ≥ d every counted family is the whole table, so the label-free and the
    target's candidate families coincide. The measurement dropped the target there (its check
    looked for families larger than k + 1 columns): the spend details and manifest said
    'required' (target.target_parent.ran, public rows) while a label-free network rooted
    elsewhere ran (d = 4, k = 3: root c2, c1 without the target), and with the DP count no
    window reported a mode. Same spends either way (rule 2: what ran must be what is stated).
    Measured before the fix (privbayes_measure._covers, H67): 4 of 5 cases ran the label-free
    network (the fifth passed by chance: its uniformly drawn root was the target)."""
    from beamsynth.transforms.noise import RandomSource
    from beamsynth.transforms.privbayes import measure_privbayes

    shape, names, target = (2,) * d, [f"c{i}" for i in range(d)], d - 1
    plan = plan_privbayes(shape, ApproxDP(epsilon=50.0, delta=0.0), sizing="auto", rows=rows,
                          degree=degree, refine_pairs=0, target=target, names=names,
                          target_parent=option)
    stated = plan.details()["target"]["target_parent"]
    fams = candidate_families(d, plan.degree, shape=shape, max_family_cells=plan.max_family_cells,
                              target=plan.parent_target)
    codes = np.random.default_rng(0).integers(0, 2, (20_000, d))
    codes[:, target] = codes[:, 0]
    counts = [c.reshape([shape[i] for i in f])
              for c, f in zip(count_marginals(codes, fams, shape), fams)]
    out = measure_privbayes(counts, fams, shape=shape, names=names, plan=plan,
                            rs=RandomSource(seed=1))
    ran = out.sizing.get("target_parent", stated["ran"]) if out.sizing else stated["ran"]
    assert ran == "required", (stated, out.sizing)
    assert out.structure[0] == (target, ())
    assert all(target in ps for _, ps in out.structure[1:]), out.structure


@pytest.mark.slow  # one API pipeline over three declared windows (~6 s)
def test_api_windows_choose_modes_from_their_own_dp_count(monkeypatch, tmp_path):
    """``bs.PrivBayes`` (ε = 3, target y, rows 50, seed 5) over three declared hours of 300 /
    4,000 / 10 records: each window's measurement reads its own DP count (one size count per
    window, labelled with it) and runs off / required / k = 0 (Beam counters
    beamsynth/privbayes_target_parent_{off,required} and privbayes_degree_0 each 1); per window
    the draws fit the job's one set of spends (Σ ε = ε − ε_c). The API manifest's
    target.target_parent.ran named only a CLI manifest's sizing.chosen_target_parent_windows,
    which an API manifest never has; it now names the Beam counters too (H67)."""
    import apache_beam as beam
    from apache_beam.metrics.metric import MetricsFilter

    import beamsynth as bs

    schema = bs.load_schema(BIN7)
    values = [c["domain"]["values"] for c in BIN7["columns"]]
    rows = []
    for hour, n in enumerate((300, 4_000, 10)):
        for r in _codes(n, hour):
            rows.append(({NAMES[j]: values[j][v] for j, v in enumerate(r)}, hour * HOUR + 5))
    calls = s12.record_draws(monkeypatch)
    job = bs.PrivacyJob(epsilon=EPS, seed=5)
    p = beam.Pipeline()
    private = (p | beam.Create(rows) | beam.MapTuple(beam.window.TimestampedValue)
               | job.private(schema, windows=bs.DeclaredWindows(start=0, end=3 * HOUR, size=HOUR)))
    _ = private | bs.PrivBayes(epsilon=EPS, rows=50, options={"target": "y"})
    _ = p | bs.WriteManifest(job=job, path=str(tmp_path / "m.json"))
    result = p.run()
    result.wait_until_finish()
    # the API manifest names where the per-window modes are, and since H72 (bs.WriteManifest
    # reads the step's run-time choices) carries them itself: one off, one required window
    details = json.loads((tmp_path / "m.json").read_text())["release"]["details"]
    privbayes = details["mechanisms"][0]["details"]["privbayes"]
    ran = privbayes["target"]["target_parent"]["ran"]
    assert "beamsynth/privbayes_target_parent_required" in ran, ran
    assert privbayes["sizing"]["chosen_target_parent_windows"] == {"off": 1, "required": 1}, (
        privbayes["sizing"])
    counters = {c.key.metric.name: c.committed for c in result.metrics().query(
        MetricsFilter().with_namespace("beamsynth"))["counters"]}
    assert counters.get("privbayes_target_parent_off") == 1, counters
    assert counters.get("privbayes_target_parent_required") == 1, counters
    assert counters.get("privbayes_degree_0") == 1, counters
    spends = {s["step"].split("/")[-1]: s for s in job.accountant.to_dict()["spends"]}
    count = spends["privbayes.size_count"]
    model = sum(s["epsilon"] for k, s in spends.items() if k != "privbayes.size_count")
    by_window: dict = {}
    for c in calls:
        by_window.setdefault(_window_of(c["labels"]), []).append(c)
    assert None not in by_window and len(by_window) == 3, list(by_window)
    for w, mine in by_window.items():
        v = s12.verdict(mine, m=1, count=count, rest={"epsilon": model, "delta": 0.0})
        assert v["ok"] and v["pure"] == pytest.approx(model, rel=1e-12), (w, v)


@pytest.mark.slow  # two Beam YAML pipelines (~10 s each)
def test_yaml_gate_edge_couples_neighbours(monkeypatch, tmp_path):
    """Beam YAML (ReadFromCsv → BeamsynthSynthesize method privbayes, options {target: y},
    ε = 3, seed 1): D = 484 records and D − 1 both given n̂ = 484 run the target-parented
    network with identical draws, and both manifests state the same mode (the spend details'
    target_parent: mode useful, option auto)."""

    from beamsynth.transforms import privbayes_measure as pbm

    pytest.importorskip("apache_beam.yaml.main")
    from tests.yaml_helpers import provider, run_yaml

    edge = EDGE[("laplace", 1)]
    codes = _codes(edge)
    schema_file = tmp_path / "bin7.json"
    schema_file.write_text(json.dumps(BIN7), encoding="utf-8")
    sides = []
    for name, data in (("d", codes), ("d1", codes[:-1])):
        _fix_size_count(monkeypatch, edge, len(data))
        chosen = []
        real_choose = pbm.choose_structure

        def spy(*a, _chosen=chosen, _real=real_choose, **kw):
            _chosen.append((kw["target"], kw["target_required"]))
            return _real(*a, **kw)

        monkeypatch.setattr(pbm, "choose_structure", spy)
        calls = s12.record_draws(monkeypatch)
        src = _bin7_csv(tmp_path / f"{name}.csv", data)
        manifest = tmp_path / f"{name}.manifest.json"
        run_yaml(tmp_path / f"{name}.yaml", f"""providers:
  - include: {provider()}
pipeline:
  transforms:
    - {{type: ReadFromCsv, name: Read, config: {{path: "{src}"}}}}
    - type: BeamsynthSynthesize
      name: Synth
      input: Read
      config: {{schema: "{schema_file}", epsilon: {EPS}, rows: 20, seed: 1, method: privbayes,
                options: {{target: y}}, manifest: "{manifest}"}}
    - {{type: WriteToJson, input: Synth, config: {{path: "{tmp_path / name}"}}}}
""")
        monkeypatch.undo()
        spends = json.loads(manifest.read_text(encoding="utf-8"))["release"]["budget"]["spends"]
        parented = [s["details"]["target_parent"] for s in spends
                    if "target_parent" in (s.get("details") or {})]
        sides.append({"parented": parented, "chosen": chosen, "draws": [
            (c["kind"], c["labels"], c.get("param", c.get("epsilon")), c.get("size"))
            for c in calls]})
    d, d1 = sides
    assert d["draws"] == d1["draws"] and d["draws"]
    assert d["parented"] == d1["parented"] and d["parented"][0]["mode"] == "useful"
    assert d["chosen"] == d1["chosen"] == [(T, True)]  # the gate opened on both sides
    steps = [x for x in d["draws"] if x[0] == "permute_and_flip" and "structure" in x[1]]
    assert len(steps) == len(SHAPE) - 1


def test_split_weight_is_the_plans_not_the_workers_switch(monkeypatch):
    """``privbayes_sizing.NETWORK_SPLIT_TABLE_WEIGHT`` (H59's documented A/B switch: None = the
    √cells split) was read inside the measuring step, so a launcher that set it (a benchmark,
    a user reproducing the release before H59) got its spend details and the in-process
    DirectRunner's split, while direct-multi / Dask workers (fresh processes) split with the
    module default: CLI Adult 20,000 rows, ε = 1, seed 7, switch None in the launcher: direct
    a2f2d9bd…, direct-multi 69dd9f4a… (= the default's bytes). The plan now carries the weight
    read when it is built (rule 4: a recomputed or remote measurement draws with the planned
    scales) and the spend details name it. Here: the plan built with the switch None, the
    measuring step run with the module back at 1.0 (a worker), must give the √cells split."""
    from beamsynth.transforms import privbayes_sizing as sizing
    from beamsynth.transforms.noise import RandomSource
    from beamsynth.transforms.privbayes import measure_privbayes
    from beamsynth.transforms.privbayes_sizing import split_marginal_budget

    shape = s12.SHAPE
    names = [f"c{i}" for i in range(len(shape))]
    monkeypatch.setattr(sizing, "NETWORK_SPLIT_TABLE_WEIGHT", None)  # the launcher
    plan = plan_privbayes(shape, ApproxDP(epsilon=1.0, delta=0.0), sizing="auto", rows=30_000,
                          degree=1, refine_pairs=0)
    acc = PrivacyAccountant(total=ApproxDP(epsilon=1.0, delta=0.0))
    spend_privbayes(acc, plan)
    marginals = {s["step"]: s for s in acc.to_dict()["spends"]}["privbayes.marginals"]
    assert marginals["details"]["split_table_weight"] is None
    monkeypatch.setattr(sizing, "NETWORK_SPLIT_TABLE_WEIGHT", 1.0)  # a worker's fresh module
    fams, counts = s12._counts(plan, s12._codes(30_000, 0))
    out = measure_privbayes(counts, fams, shape=shape, names=names, plan=plan,
                            rs=RandomSource(seed=3))
    want = split_marginal_budget(plan.marginal_budget, [t.values.size for t in out.marginals])
    assert [t.budget.epsilon for t in out.marginals] == [b.epsilon for b in want]
