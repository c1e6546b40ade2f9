"""Sixteenth session (H78): every run-time choice of the mechanisms decided once, in the plan.

1. The A/B switches ``privbayes_model.ONE_WAY_ESTIMATE`` and ``refine.RAKE_END_ON_MARGINS`` were
   module globals read inside the measuring step, the Fit step and the refined model's sampling,
   on the workers: a launcher that flipped one got its bytes in process (``direct``) and the
   module default's on ``direct-multi`` / Dask (fresh processes). They are read when the plan is
   built (``PrivBayesPlan.one_way_estimate``, ``RefinePlan.rake_end_on_margins``) and travel in
   it; ``split_network_budget`` and ``fit_privbayes`` no longer fall back to a module global.
2. The target-parent gate is one function, ``PrivBayesPlan.target_parent_at``, which
   ``DPPrivBayes``' counted families and the measuring step both call.

docs/privbayes.md "Sixteenth session: choices in the plan, decided once (H78)". Each test fails
on the code before it; all run in well under 5 s.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from beamsynth.transforms import privbayes_model as pmod
from beamsynth.transforms import refine
from beamsynth.transforms.budget import PureDP
from beamsynth.transforms.measure import count_marginals
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.privbayes import fit_privbayes, measure_privbayes, plan_privbayes
from beamsynth.transforms.privbayes_plan import PrivBayesPlan
from beamsynth.transforms.privbayes_structure import candidate_families, family_specs

SHAPE = (6, 4, 3, 5, 2, 4)
NAMES = [f"c{i}" for i in range(len(SHAPE))]
# (module, switch, the launcher's value): each changes the released model's rows
SWITCHES = [(pmod, "ONE_WAY_ESTIMATE", "first"), (refine, "RAKE_END_ON_MARGINS", False)]


def _codes(n: int = 4_000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c0 = rng.integers(0, 6, n)
    c1 = (c0 + rng.integers(0, 2, n)) % 4
    c2 = (c1 + rng.integers(0, 2, n)) % 3
    c3 = (c0 * 2 + rng.integers(0, 3, n)) % 5
    c4 = ((c3 > 2) ^ (rng.random(n) < 0.1)).astype(np.int64)
    c5 = (c4 * 2 + c2 + rng.integers(0, 2, n)) % 4
    return np.stack([c0, c1, c2, c3, c4, c5], axis=1).astype(np.int64)


def _plan():
    """A refined pure-ε network (k = 1, 4 coarse pairs in 2 rounds), built in the launcher."""
    plan = plan_privbayes(SHAPE, PureDP(epsilon=3.0), degree=1, names=NAMES, refine_pairs=4,
                          refine_rounds=2, refine_groups=3)
    assert plan.refine is not None and plan.refine.pairs == 4
    return plan


def _worker(plan, codes: np.ndarray) -> str:
    """What the workers run from a shipped plan: measuring step, Fit step, sampling (sha256 of
    the sampled codes)."""
    fams = plan.counted_families(SHAPE)
    counts = [c.reshape([SHAPE[i] for i in f]) for c, f in zip(count_marginals(codes, fams, SHAPE), fams)]
    m = measure_privbayes(counts, fams, shape=SHAPE, names=NAMES, plan=plan, rs=RandomSource(seed=1))
    model = fit_privbayes(m, SHAPE, NAMES, **plan.fit_choices())
    return hashlib.sha256(model.sample_codes(600, RandomSource(seed=2)).tobytes()).hexdigest()


@pytest.mark.parametrize(("module", "switch", "value"), SWITCHES)
def test_a_switch_flipped_in_the_launcher_only_gives_the_launchers_bytes(monkeypatch, module,
                                                                         switch, value):
    """The launcher flips the switch and builds the plan; a worker unpickles it in a module whose
    switch is the default: it measures, fits and samples what the launcher would (the bytes of a
    run with the switch flipped everywhere), not the default's. Before: the worker read its
    module (ONE_WAY_ESTIMATE in the pool network and the fit, RAKE_END_ON_MARGINS in every
    raking), so direct (in process) and direct-multi/Dask (fresh processes) differed."""
    codes = _codes()
    default = _worker(_plan(), codes)
    monkeypatch.setattr(module, switch, value)  # the launcher
    launcher = _worker(_plan(), codes)  # the switch flipped everywhere (one process)
    assert launcher != default  # the switch matters here, so the test can fail
    shipped = pickle.dumps(_plan())  # what the DoFns carry
    monkeypatch.undo()  # a worker's fresh module
    assert getattr(module, switch) != value
    assert _worker(pickle.loads(shipped), codes) == launcher


@pytest.mark.slow  # 5-7 s at load 5 (a fresh interpreter); the default run keeps
# test_a_switch_flipped_in_the_launcher_only_gives_the_launchers_bytes (same check, in process)
def test_a_pickled_plan_read_in_a_fresh_process_gives_the_launchers_bytes(monkeypatch, tmp_path):
    """Both switches flipped in the launcher; the plan pickled and run in a fresh interpreter
    (what a direct-multi or Dask worker is): same sampled bytes as the launcher's. Measured
    with the CLI (Adult, ε = 1, 2,000 rows, seed 3, both switches flipped in a launcher script):
    before, direct f7eb77d3… and direct-multi 182eed05… (the default's bytes); now both
    f7eb77d3…; the default unchanged, 182eed05…."""
    codes = _codes()
    for module, switch, value in SWITCHES:
        monkeypatch.setattr(module, switch, value)
    launcher = _worker(_plan(), codes)
    (tmp_path / "job.pkl").write_bytes(pickle.dumps((_plan(), codes)))
    script = ("import pickle, sys\n"
              "from tests.test_session16_plan import _worker\n"
              "plan, codes = pickle.loads(open(sys.argv[1], 'rb').read())\n"
              "print(_worker(plan, codes))\n")
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "job.pkl")],
                         capture_output=True, text=True, timeout=120, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.split()[-1] == launcher


def test_the_fit_step_gets_every_choice_from_the_plan(monkeypatch):
    """DPPrivBayes' Fit step (a worker) is given the plan's choices: the launcher's flipped
    switches arrive although the worker's modules say the defaults. The fitted RefinedModel
    carries the raking choice to the sampling workers."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    from beamsynth.schemas.schema import EncodedBatch, load_schema
    from beamsynth.transforms import privbayes_beam as pbb

    schema = load_schema("adult")
    for module, switch, value in SWITCHES:
        monkeypatch.setattr(module, switch, value)  # the launcher
    step = pbb.DPPrivBayes(schema=schema, budget=PureDP(epsilon=1.0), seed=5)
    assert step.plan.one_way_estimate == "first" and not step.plan.refine.rake_end_on_margins
    monkeypatch.undo()  # a worker's fresh modules
    monkeypatch.setattr(pbb, "fit_privbayes", lambda m, *a, **kw: (
        kw["one_way_estimate"], kw["rake_end_on_margins"], kw["refine_margins"]))
    codes = np.random.default_rng(0).integers(0, 2, (300, len(schema.shape)))
    with beam.Pipeline() as p:
        out = p | beam.Create([EncodedBatch(codes)]) | step
        assert_that(out, equal_to([("first", False, "alive")]))
    network = pmod.PrivBayesModel(SHAPE, [(c, ()) for c in range(len(SHAPE))],
                                  [np.full((1, s), 1.0 / s) for s in SHAPE])
    target = refine.RakeTarget((0, 1), (np.arange(6), np.arange(4)), np.full((6, 4), 1 / 24))
    model = refine.RefinedModel(network, [target], end_on_margins=False)
    assert pickle.loads(pickle.dumps(model)).end_on_margins is False


def test_no_function_falls_back_to_a_module_switch(monkeypatch):
    """``split_network_budget(table_weight=...)`` and ``fit_privbayes`` take what they are
    given: a module switch flipped after the plan was built (a worker's module) changes nothing
    (before: ``table_weight=None`` read ``NETWORK_SPLIT_TABLE_WEIGHT``, ``refine_margins=None``
    read ``DEFAULT_REFINE_MARGINS``). A switch outside its modes is refused when the plan is
    built."""
    from beamsynth.transforms import privbayes_sizing as sizing

    specs, shape = [(0, 1), (2, 1), (1,)], (21, 3, 100)
    want = sizing.split_network_budget(PureDP(epsilon=1.3), specs, shape)
    monkeypatch.setattr(sizing, "NETWORK_SPLIT_TABLE_WEIGHT", None)
    assert sizing.split_network_budget(PureDP(epsilon=1.3), specs, shape) == want
    assert sizing.split_network_budget(PureDP(epsilon=1.3), specs, shape, table_weight=1.0) == want
    monkeypatch.undo()
    codes = _codes()
    plan = _plan()
    before = _worker(plan, codes)
    monkeypatch.setattr(pmod, "DEFAULT_REFINE_MARGINS", "off")
    monkeypatch.setattr(pmod, "ONE_WAY_ESTIMATE", "first")
    monkeypatch.setattr(refine, "RAKE_END_ON_MARGINS", False)
    assert _worker(plan, codes) == before
    monkeypatch.setattr(pmod, "ONE_WAY_ESTIMATE", "median")
    with pytest.raises(ValueError, match=r"ONE_WAY_ESTIMATE \('median'\) must be one of"):
        _plan()


@pytest.mark.parametrize("share", [0.0, 0.35])
def test_the_zcdp_one_way_share_is_the_plans(monkeypatch, share):
    """``privbayes_sizing.GAUSSIAN_ONE_WAY_SHARE`` (documented: 0 restores the release before the
    explicit 1-way tables) was read by the measuring step from its own module (an imported copy
    no launcher could reach, so a flip applied to the spend details only): now read into
    ``ZCDPPlan.one_way_share`` by ``gaussian_plan``. A worker whose module says 0.2 releases
    the launcher's split: no 1-way tables at 0, 0.35 of the tables' ρ on them at 0.35."""
    from beamsynth.transforms import privbayes_sizing as sizing
    from beamsynth.transforms.budget import ApproxDP
    from beamsynth.transforms.privbayes import gaussian_plan

    budget = ApproxDP(epsilon=3.0, delta=1e-6)
    monkeypatch.setattr(sizing, "GAUSSIAN_ONE_WAY_SHARE", share)  # the launcher
    plan = gaussian_plan(plan_privbayes(SHAPE, budget, degree=1, names=NAMES, refine_pairs=0),
                         budget)
    assert plan.zcdp.one_way_share == share
    monkeypatch.undo()  # a worker's fresh module (0.2)
    fams = plan.counted_families(SHAPE)
    counts = [c.reshape([SHAPE[i] for i in f])
              for c, f in zip(count_marginals(_codes(), fams, SHAPE), fams)]
    out = measure_privbayes(counts, fams, shape=SHAPE, names=NAMES, plan=pickle.loads(
        pickle.dumps(plan)), rs=RandomSource(seed=1))
    families = {tuple(f) for f in family_specs(out.structure)}
    ones = [t for t in out.marginals if tuple(t.columns) not in families]
    rho = sum(t.meta["rho"] for t in out.marginals)
    assert rho == pytest.approx(plan.zcdp.marginal_rho, rel=1e-12)
    assert sum(t.meta["rho"] for t in ones) == pytest.approx(share * rho, rel=1e-12)
    assert (len(ones) == 0) == (share == 0)


# == 2. the target-parent gate: one function =======================================================
BIN7 = {"name": "bin7", "target": "y", "columns": [
    *({"name": f"x{i}", "type": "categorical",
       "domain": {"kind": "categorical", "values": ["a", "b"]}} for i in range(6)),
    {"name": "y", "type": "categorical", "domain": {"kind": "categorical", "values": ["n", "p"]}}]}
B_SHAPE, T = (2,) * 7, 6


def _bin7(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 2, (n, 7))
    codes[:, 6] = (codes[:, 0] & codes[:, 1]) ^ (rng.random(n) < 0.1)
    return codes


def _measure(plan, codes, families=None):
    fams = plan.counted_families(B_SHAPE) if families is None else families
    counts = [c.reshape([B_SHAPE[i] for i in f])
              for c, f in zip(count_marginals(codes, fams, B_SHAPE), fams)]
    return measure_privbayes(counts, fams, shape=B_SHAPE, names=[f"c{i}" for i in range(7)],
                             plan=plan, rs=RandomSource(seed=4))


def test_both_places_ask_the_one_gate(monkeypatch):
    """A gate that says "off" whatever the rows (patched on PrivBayesPlan.target_parent_at):
    DPPrivBayes counts the label-free families and the measuring step (public rows, and the DP
    count, which it passes) runs the label-free network. Before, each place read
    target_parent_gate itself, so the patch was ignored in both."""
    from beamsynth.schemas.schema import load_schema
    from beamsynth.transforms.privbayes_beam import DPPrivBayes

    schema = load_schema(BIN7)
    build = lambda rows: DPPrivBayes(schema=schema, budget=PureDP(epsilon=3.0),  # noqa: E731
                                     sizing="auto", rows=rows, target="y", seed=1, refine_pairs=0)
    open_gate = build(100_000)
    plain = candidate_families(7, open_gate.plan.degree, shape=B_SHAPE,
                               max_family_cells=open_gate.plan.max_family_cells)
    assert open_gate._families != plain  # the real gate is open there: the target's triples
    seen = []

    def closed(self, rows_hat=None):
        seen.append(rows_hat)
        return None, 123.0

    dp_count = build(None).plan  # sized from the DP count: the gate decided per window
    with_target = candidate_families(7, dp_count.degree, shape=B_SHAPE, target=T,
                                     max_family_cells=dp_count.max_family_cells)
    label_free = _measure(dataclasses.replace(dp_count, target_parent="off"), _bin7(20_000))
    monkeypatch.setattr(PrivBayesPlan, "target_parent_at", closed)
    assert build(100_000)._families == plain
    out = _measure(dp_count, _bin7(20_000), families=with_target)
    assert seen[-1] == out.sizing["rows_hat"] and out.sizing["target_parent"] == "off"
    assert out.sizing["target_parent_usefulness"] == 123.0
    assert out.structure == label_free.structure  # the label-free network, its draws


@pytest.mark.audit
@pytest.mark.parametrize("side", ["open", "closed"])
def test_public_rows_at_the_gate_edge_decide_alike_for_neighbours(side):
    """Public rows one below / at the gate's edge (u = θ_T): D and D − 1 (one record removed)
    get the same families and the same decision in both places (the target a parent of every
    column, or of none); the decision is the plan's, from declared values only."""
    plans = {r: plan_privbayes(B_SHAPE, PureDP(epsilon=3.0), sizing="auto", rows=r, target=T,
                               refine_pairs=0) for r in range(300, 420)}
    edge = min(r for r, p in plans.items() if p.target_parent_gate(r)[0])
    assert not plans[edge - 1].target_parent_gate(edge - 1)[0]
    plan = plans[edge if side == "open" else edge - 1]
    codes = _bin7(edge)
    assert plan.target_parent_at()[0] == (T if side == "open" else None)
    for data in (codes, codes[:-1]):
        out = _measure(plan, data)
        if side == "open":  # the target a parent of every other column
            assert sum(T in ps for _, ps in out.structure) == T
        else:  # the label-free network with the draws of "off"
            off = _measure(dataclasses.replace(plan, target_parent="off"), data)
            assert out.structure == off.structure
