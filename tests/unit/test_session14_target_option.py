"""The declared target at k ≥ 1 as a user option carried in the plan (issue 18, H65).

``--target-parent {auto,off,optional,required}`` / ``options={'target_parent': ...}`` is decided
when the pipeline is built and travels in :class:`PrivBayesPlan` (``target_parent``, θ_T), never
read from a module global in the measurement step: a worker of a multi-process runner gets the
pickled plan and a fresh module. Bad values are refused in the caller's words; the manifest says
which mode ran and why."""

from __future__ import annotations

import dataclasses
import math
import pickle

import apache_beam as beam
import numpy as np
import pytest

import beamsynth as bs
from beamsynth.pipelines.cli.main import main
from beamsynth.transforms import privbayes_plan as pbp
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant, PureDP
from beamsynth.transforms.measure import count_marginals
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.privbayes import (
    candidate_families,
    gaussian_plan,
    measure_privbayes,
    plan_privbayes,
    spend_privbayes,
)
from tests.unit.test_session14_target import SHAPE, T, _codes  # the target is the last column

NAMES = [f"c{i}" for i in range(len(SHAPE))]


def _counts(plan, n: int = 20_000):
    fams = candidate_families(len(SHAPE), plan.degree, shape=SHAPE,
                              max_family_cells=plan.max_family_cells, target=plan.parent_target)
    counts = count_marginals(_codes(n), fams, SHAPE)
    return [c.reshape([SHAPE[i] for i in f]) for c, f in zip(counts, fams)], fams


def _plan(option, **kw):
    kw = {"sizing": "auto", "rows": None, "target": T, "degree": 1, "refine_pairs": 0, **kw}
    return plan_privbayes(SHAPE, PureDP(epsilon=2.0), names=NAMES, target_parent=option, **kw)


def test_the_plan_carries_the_mode_to_a_worker(monkeypatch):
    """Planned "required" in the launcher; a worker unpickles the plan in a module whose default
    says otherwise ("off" here, a fresh module's "auto" there): it measures the planned mode
    (the target a parent of every column, as the spend details say). Before H65 the measurement
    read the module global and ran the label-free network."""
    plan = _plan("required")
    assert plan.target_parent == "required" and plan.parent_target == T
    counts, fams = _counts(plan)
    shipped = pickle.dumps(plan)  # what a DoFn carries to direct-multi / Dask workers
    monkeypatch.setattr(pbp, "TARGET_PARENT", "off")  # the worker's module default
    monkeypatch.setattr(pbp, "TARGET_PARENT_THETA", 1e9)
    worker = pickle.loads(shipped)
    assert (worker.target_parent, worker.target_parent_theta) == ("required", 20.0)
    out = measure_privbayes(counts, fams, shape=SHAPE, names=NAMES, plan=worker,
                            rs=RandomSource(seed=4))
    assert out.structure[0] == (T, ()) and sum(T in ps for _, ps in out.structure) == T
    # auto: θ_T travels too (the worker's θ_T = 1e9 above would close the gate)
    auto = dataclasses.replace(_plan("auto", rows=None), target_parent_theta=0.0)
    out = measure_privbayes(counts, fams, shape=SHAPE, names=NAMES,
                            plan=pickle.loads(pickle.dumps(auto)), rs=RandomSource(seed=4))
    assert out.sizing["target_parent"] == "required"


def test_auto_is_useful_at_theta_in_the_plan():
    """auto = "useful" with θ_T = TARGET_PARENT_THETA (20) fixed in the plan; the gate is the
    plan's θ: above it the target is a parent of every column, below it the label-free
    network with the draws of "off" (same counts)."""
    plan = _plan("auto")
    assert (plan.target_parent, plan.target_parent_option) == ("useful", "auto")
    assert plan.target_parent_theta == pbp.TARGET_PARENT_THETA == 20.0
    counts, fams = _counts(plan)
    u = pbp.target_parent_usefulness(20_000, plan)
    assert plan.target_parent_gate(20_000) == (u >= 20.0, u)
    outs = {}
    for theta in (u * 0.99, u * 1.01):  # just below / above the DP count's u (n̂ ≈ 20,000)
        at = dataclasses.replace(plan, target_parent_theta=theta)
        outs[theta] = measure_privbayes(counts, fams, shape=SHAPE, names=NAMES, plan=at,
                                        rs=RandomSource(seed=4))
    on, off = outs[u * 0.99].sizing, outs[u * 1.01].sizing
    if on["target_parent"] == "off":  # the DP count fell below u: both off (rare; not here)
        pytest.skip(f"n̂ = {on['rows_hat']} below the planned rows")
    assert on["target_parent"] == "required" and off["target_parent"] == "off"
    assert math.isclose(on["target_parent_usefulness"], off["target_parent_usefulness"])
    plain = _plan("off")
    assert plain.parent_target is None
    counts_off, fams_off = _counts(plain)
    ref = measure_privbayes(counts_off, fams_off, shape=SHAPE, names=NAMES, plan=plain,
                            rs=RandomSource(seed=4))
    assert outs[u * 1.01].structure == ref.structure
    assert all(np.array_equal(a.values, b.values)
               for a, b in zip(outs[u * 1.01].marginals, ref.marginals))


def test_auto_never_lowers_the_degree():
    """The triples over max_candidate_cells: auto runs the label-free network at the same degree
    (with a note), where "required" lowers the degree (H58's rule for an explicit choice)."""
    cells = sum(math.prod(SHAPE[c] for c in f) for f in candidate_families(
        len(SHAPE), 1, shape=SHAPE, max_family_cells=10**6))
    auto = _plan("auto", max_candidate_cells=cells)
    assert auto.degree == 1 and auto.target_parent == "off" and auto.parent_target is None
    assert "exceed max_candidate_cells" in auto.details()["target"]["target_parent"]["why"]
    assert _plan("required", max_candidate_cells=cells).degree == 0


@pytest.mark.parametrize("bad", ["sometimes", "useful ", "", None, 1])
def test_plan_refuses_bad_values_echoing_them(bad):
    if bad is None:  # None = the module default (auto), valid
        assert _plan(bad).target_parent == "useful"
        return
    with pytest.raises(ValueError, match=r"target_parent \(" + repr(bad).replace("(", r"\(")
                       + r"\) must be one of auto, off, optional, required"):
        _plan(bad)


def test_api_and_cli_refuse_bad_values_in_their_words(tmp_path, capsys):
    job = bs.PrivacyJob(epsilon=1.0)
    schema = bs.load_schema({"name": "t", "columns": [
        {"name": f"x{i}", "type": "categorical",
         "domain": {"kind": "categorical", "values": ["a", "b", "c"]}} for i in range(4)]})
    p = beam.Pipeline()
    private = p | beam.Create([{f"x{i}": "a" for i in range(4)}]) | job.private(schema)
    with pytest.raises(ValueError, match=r"options=\{'target_parent': 'sometimes'\}:? must be one "
                       r"of auto, off, optional, required"):
        private | bs.PrivBayes(epsilon=1.0, rows=10, options={"target": "x3",
                                                              "target_parent": "sometimes"})
    assert job.accountant.spent_epsilon == 0
    from beamsynth.pipelines.yaml_transforms import Synthesize  # Beam YAML: the same options

    with pytest.raises(ValueError, match=r"options: \{target_parent: 'TAN'\}:? must be one of auto, "
                       r"off, optional, required"):  # its YAML key (H70), not --target-parent
        Synthesize(schema={"name": "t", "columns": [
            {"name": f"x{i}", "type": "categorical",
             "domain": {"kind": "categorical", "values": ["a", "b"]}} for i in range(3)]},
            epsilon=1.0, method="privbayes", rows=10, options={"target_parent": "TAN"})
    src = tmp_path / "in.csv"
    src.write_text("x0,x1,x2,x3\na,b,c,a\n")
    with pytest.raises(SystemExit) as exc:
        main(["synthesize", str(src), "--schema", "adult", "--epsilon", "1", "--method",
              "privbayes", "--target-parent", "sometimes", "--output", str(tmp_path / "o.csv")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--target-parent: invalid choice: 'sometimes'" in err and "auto" in err


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_manifest_says_which_mode_ran_and_why(noise):
    budget = ApproxDP(epsilon=2.0, delta=1e-9 if noise == "gaussian" else 0.0)

    def plan(option, rows):
        p = plan_privbayes(SHAPE, budget, sizing="auto", rows=rows, target=T, names=NAMES,
                           target_parent=option)
        return gaussian_plan(p, budget) if noise == "gaussian" else p

    # public rows: the gate is decided from them, u and the side in the plan's details
    for rows in (2_000, 2_000_000):
        d = plan("auto", rows).details()["target"]["target_parent"]
        u = d["usefulness"]
        assert d["option"] == "auto" and d["mode"] == "useful" and d["theta"] == 20.0
        assert d["ran"] == ("required" if u >= 20 else "off")
        assert f"θ_T = 20, else 'off'; u = {u:.3g} at the public {rows:,} rows" in d["why"]
    assert plan("auto", 2_000).details()["target"]["target_parent"]["ran"] == "off"
    assert plan("auto", 2_000_000).details()["target"]["target_parent"]["ran"] == "required"
    # the DP count: decided per window, the counters' windows in sizing
    d = plan("auto", None).details()["target"]["target_parent"]
    assert d["ran"].startswith("decided per window from the DP count")
    assert plan("off", None).details()["target"]["target_parent"] == {
        "option": "off", "mode": "off", "ran": "off",
        "why": "off: the label-free network (the target not a parent)"}
    d = plan("required", None).details()["target"]["target_parent"]
    assert d["ran"] == "required" and "tree-augmented" in d["why"]
    # the spend details name the option and the mode that was spent for
    acc = PrivacyAccountant(total=budget)
    spend_privbayes(acc, plan("required", None))
    spends = {s["step"]: s for s in acc.to_dict()["spends"]}
    det = (spends["privbayes.structure"]["details"] if noise == "laplace"
           else spends["privbayes.zcdp"]["details"]["parts"]["structure"])
    assert det["target_parent"]["mode"] == "required" and det["target_parent"]["option"] == "required"
    # no target: nothing of it in the plan's details
    assert "target" not in plan_privbayes(SHAPE, budget, sizing="auto", names=NAMES).details()


def test_public_rows_that_close_the_gate_count_no_target_triples() -> None:
    """With public rows the "useful" gate is decided when built: where it is closed (Adult's
    shape, 30,000 rows, u < 1) the step counts the label-free pairs only, not the (X, T, P)
    triples it would never use; `required` still counts them (lead review)."""
    from beamsynth.schemas.schema import load_schema
    from beamsynth.transforms.privbayes import DPPrivBayes

    adult = load_schema("adult")
    sizes = {}
    for mode in ("auto", "required"):
        step = DPPrivBayes(schema=adult, budget=ApproxDP(epsilon=1.0, delta=0), sizing="auto",
                           rows=30000, target="income", target_parent=mode, seed=1)
        assert step.plan.parent_target is not None
        sizes[mode] = {len(f) for f in step._families}
    assert sizes == {"auto": {2}, "required": {3}}
