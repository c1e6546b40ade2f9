"""The ``plausible`` synthesize method: option validation, budget spend and Theorem 1 report."""

from __future__ import annotations

import math
import re

import pytest
from scipy.stats import poisson

from beamsynth.pipelines.methods.plausible import TAIL_DELTA_FRACTION
from beamsynth.pipelines.methods.synthesize import SynthesisConfig, plan_synthesis
from beamsynth.schemas.schema import load_schema
from beamsynth.transforms.budget import BudgetExceededError
from beamsynth.transforms.plausible import (
    candidate_bound,
    candidate_release_cost,
    theorem1_guarantee,
)

GENEROUS = {"epsilon": 2000.0, "delta": 1e-6}  # covers 1000 rows at k=50, γ=4, ε0=1 (needs ≈ 1343)


def _plan(rows=1000, epsilon=GENEROUS["epsilon"], delta=GENEROUS["delta"], max_contributions=1,
          privacy_id=None, **options):
    cfg = SynthesisConfig(input="unused.csv", schema=load_schema("adult"), output="/tmp/unused.csv",
                          epsilon=epsilon, delta=delta, method="plausible", rows=rows, options=options,
                          max_contributions=max_contributions, privacy_id=privacy_id)
    return plan_synthesis(cfg)


def _model_epsilon(spends) -> float:
    return sum(s.budget.epsilon for step, s in spends.items() if step.startswith("plausible.model"))


@pytest.mark.parametrize("generator", ["privbayes", "cfs"])
def test_plan_spends_model_and_candidates_within_the_total(generator):
    plan = _plan(k=50, gamma=4.0, epsilon0=1.0, omega=9, generator=generator)
    spends = {s.step: s for s in plan.accountant.spends}
    if generator == "cfs":
        assert set(spends) == {"plausible.model", "plausible.candidates"}
    else:  # PrivBayes's own accounting under the plausible.model prefix
        assert {"plausible.model.structure", "plausible.model.marginals", "plausible.candidates"} <= set(spends)
        assert all(step.startswith("plausible.model.") for step in set(spends) - {"plausible.candidates"})
    assert _model_epsilon(spends) == pytest.approx(0.1 * 2000.0)  # pd_model_fraction
    assert plan.method.details()["model"]["generator"] == generator
    total_e = sum(s.budget.epsilon for s in plan.accountant.spends)
    total_d = sum(s.budget.delta for s in plan.accountant.spends)
    assert total_e <= 2000.0 and total_d <= 1e-6
    assert plan.accountant.spent_epsilon == pytest.approx(total_e)


def test_candidate_spend_is_theorem1_times_the_public_bound():
    plan = _plan(k=50, gamma=4.0, epsilon0=1.0, omega=9)
    cand = {s.step: s for s in plan.accountant.spends}["plausible.candidates"]
    eps1, delta1 = theorem1_guarantee(k=50, gamma=4.0, epsilon0=1.0, t=25)
    tail = TAIL_DELTA_FRACTION * 1e-6
    c = candidate_bound(1000, tail)
    assert poisson.sf(c, 1000) <= tail < poisson.sf(c - 1, 1000)  # the smallest such C
    assert cand.budget.epsilon == pytest.approx(c * eps1)
    assert cand.budget.delta == pytest.approx(c * delta1 + tail)
    d = cand.details
    assert d["C"] == c and d["tail_delta"] == tail and d["per_invocation"]["t"] == 25
    assert 1100 < c < 1250
    charged = plan.method.details()["release_guarantee"]["charged"]
    assert charged["epsilon"] == cand.budget.epsilon and charged["C"] == c


def test_group_privacy_for_several_contributions():
    cost = candidate_release_cost(rows=100, k=50, gamma=4.0, epsilon0=1.0, t=25, tail_delta=1e-9,
                                  max_contributions=3)
    eps1, delta1 = theorem1_guarantee(k=50, gamma=4.0, epsilon0=1.0, t=25)
    assert cost["epsilon"] == pytest.approx(cost["C"] * 3 * eps1)
    assert cost["delta"] == pytest.approx(cost["C"] * 3 * math.exp(2 * eps1) * delta1 + 1e-9)
    plan = _plan(rows=100, max_contributions=3, privacy_id="person_id", k=50, gamma=4.0, epsilon0=1.0)
    cand = {s.step: s for s in plan.accountant.spends}["plausible.candidates"]
    assert cand.budget.epsilon == pytest.approx(candidate_release_cost(
        rows=100, k=50, gamma=4.0, epsilon0=1.0, t=25, tail_delta=TAIL_DELTA_FRACTION * 1e-6,
        max_contributions=3)["epsilon"])


def test_epsilon_one_for_1000_rows_raises_with_what_would_fit():
    with pytest.raises(BudgetExceededError, match=r"need a total ε ≥ 1[34]\d\d\.\d+.*at most --rows 0 fits"):
        _plan(epsilon=1.0, delta=1e-6, k=50, gamma=4.0, epsilon0=1.0)
    with pytest.raises(BudgetExceededError, match=r"pass --delta"):
        _plan(epsilon=5000.0, delta=0.0, k=50, gamma=4.0, epsilon0=1.0)


def test_suggested_parameters_fit():
    with pytest.raises(BudgetExceededError) as exc:
        _plan(epsilon=1000.0, delta=1e-6, k=50, gamma=4.0, epsilon0=1.0)
    m = re.search(r"fit with k=(\d+), t=(\d+), γ=4, ε0=([\d.e-]+)", str(exc.value))
    assert m, str(exc.value)
    k, t, e0 = int(m.group(1)), int(m.group(2)), float(m.group(3))
    _plan(epsilon=1000.0, delta=1e-6, k=k, gamma=4.0, epsilon0=e0 * (1 - 1e-3), plausible_t=t)


def test_plausible_needs_public_rows():
    with pytest.raises(ValueError, match=r"needs a public --rows"):
        _plan(rows=None)


def test_plan_reports_theorem1():
    plan = _plan(k=50, gamma=4.0, epsilon0=1.0, omega=9)
    det = plan.method.details()
    g = det["release_guarantee"]["per_record"]
    assert g["epsilon"] == pytest.approx(1 + math.log(1 + 4 / 25)) and g["delta"] == pytest.approx(math.exp(-25))
    assert det["omega"] == 9 and det["test"] == "randomized"
    composed = plan.method.release_guarantee(100)["composed"]
    assert composed["epsilon"] == pytest.approx(100 * g["epsilon"])


def test_deterministic_test_is_refused_without_the_flag():
    with pytest.raises(ValueError, match=r"no differential privacy.*--allow-non-dp"):
        _plan(plausible_test="deterministic")


@pytest.mark.parametrize("generator", ["privbayes", "cfs"])
def test_deterministic_test_with_the_flag_claims_no_dp(generator):
    plan = _plan(epsilon=1.0, delta=0.0, plausible_test="deterministic", allow_non_dp=True, generator=generator)
    det = plan.method.details()
    assert det["release_guarantee"]["differential_privacy"] is False
    assert det["differential_privacy"] is False and "NOT DIFFERENTIALLY PRIVATE" in det["WARNING"]
    assert plan.method.non_dp_warning.startswith("NOT DIFFERENTIALLY PRIVATE")
    spends = plan.accountant.spends
    assert all(s.step.startswith("plausible.model") for s in spends)  # no DP claim for the records
    assert sum(s.budget.epsilon for s in spends) == pytest.approx(1.0)
    if generator == "cfs":
        assert "NOT DIFFERENTIALLY PRIVATE" in spends[0].mechanism  # what the ledger's entry says


def test_privbayes_generator_sizes_from_the_public_input_rows():
    """--input-rows scales to the model split (0.2 + 0.5 of the privbayes default 0.3/0.2/0.5; cfs
    keeps the paper's 0.5/0.2/0.3) and replaces the DP count."""
    with_rows = {s.step for s in _plan(generator="privbayes", input_rows=32_000).accountant.spends}
    without = {s.step for s in _plan(generator="privbayes").accountant.spends}
    assert "plausible.model.size_count" in without and "plausible.model.size_count" not in with_rows
    plan = _plan(generator="privbayes", input_rows=32_000)
    assert plan.method.fractions == (0.3, 0.2, 0.5)
    assert plan.method.model_rows == 22_400
    assert plan.method.details()["model"]["privbayes"]["sizing"]["rows"] == 22_400
    assert _plan(generator="cfs").method.fractions == (0.5, 0.2, 0.3)
    explicit = _plan(generator="privbayes", input_rows=32_000, plausible_split="0.5,0.2,0.3")
    assert explicit.method.fractions == (0.5, 0.2, 0.3) and explicit.method.model_rows == 16_000


@pytest.mark.parametrize("opts,msg", [
    ({"k": 0}, r"--k 0 must be a whole number >= 1"),  # in the CLI's words (H73)
    ({"gamma": 1.0}, r"--gamma 1 must be a number > 1"),
    ({"epsilon0": 0.0}, r"--epsilon0 0 must be a number > 0"),
    ({"omega": 16}, r"--omega 16 must be in \[1, 15\]"),
    ({"k": 10, "plausible_t": 10}, r"--plausible-t 10 must be in \[1, k-1\] with --k 10 >= 2"),
    ({"k": 10, "max_plausible": 5}, r"--max-plausible 5 must be an int >= 10"),
    ({"plausible_split": "0.5,0.5"}, r"--plausible-split 0.5,0.5 must be three numbers > 0"),
    ({"plausible_test": "fuzzy"}, r"--plausible-test fuzzy must be one of randomized, deterministic"),
    ({"pd_model_fraction": 1.0}, r"--pd-model-fraction 1 must be a number in \(0, 1\)"),
    ({"generator": "gan"}, r"--generator gan must be one of privbayes, cfs"),
    ({"input_rows": -1}, r"--input-rows -1 must be a whole number >= 0"),
])
def test_option_validation_messages(opts, msg):
    with pytest.raises(ValueError, match=msg):
        _plan(**opts)


@pytest.mark.parametrize("allow", [False, True])
def test_release_refuses_the_deterministic_test_even_with_the_flag(tmp_path, allow):
    """A ledger-backed release publishes DP outputs only: no finite charge covers Test 1."""
    from beamsynth.pipelines.releases.config import ReleaseConfigError, load_release_config
    from beamsynth.pipelines.releases.release import plan_release

    data = tmp_path / "in.csv"
    data.write_text("age,sex\n30,Male\n", encoding="utf-8")
    options = {"plausible_test": "deterministic", **({"allow_non_dp": True} if allow else {})}
    cfg = load_release_config({
        "name": "t", "folder": str(tmp_path / "rel-{date}"), "budget": {"epsilon": 1.0},
        "ledger": {"path": str(tmp_path / "l.sqlite"), "policies": {"src": {"epsilon": 5.0}}},
        "tables": [{"name": "a", "source": "src", "input": str(data), "schema": "adult", "epsilon": 0.6,
                    "method": "plausible", "rows": 100, "options": options}],
        "reports": {"private": False, "public": False},
    }, date="2026-01-01")
    msg = "NOT DIFFERENTIALLY PRIVATE.*ledger can charge no finite" if allow else "--allow-non-dp"
    with pytest.raises(ReleaseConfigError, match=msg):
        plan_release(cfg)


def test_release_ledger_is_charged_the_candidate_release(tmp_path):
    from beamsynth.pipelines.releases.config import load_release_config
    from beamsynth.pipelines.releases.release import plan_release

    data = tmp_path / "in.csv"
    data.write_text("age,sex\n30,Male\n", encoding="utf-8")
    cfg = load_release_config({
        "name": "t", "folder": str(tmp_path / "rel-{date}"), "budget": {"epsilon": 2000.0, "delta": 1e-6},
        "ledger": {"path": str(tmp_path / "l.sqlite"), "policies": {"src": {"epsilon": 5000.0, "delta": 1e-5}}},
        "tables": [{"name": "a", "source": "src", "input": str(data), "schema": "adult", "epsilon": 2000.0,
                    "delta": 1e-6, "method": "plausible", "rows": 1000, "options": {"k": 50}}],
        "reports": {"private": False, "public": False},
    }, date="2026-01-01")
    spends = {s.step: s for s in plan_release(cfg).spends}
    eps1, _ = theorem1_guarantee(k=50, gamma=4.0, epsilon0=1.0, t=25)
    assert "a.plausible.candidates" in spends and "a.plausible.model.marginals" in spends
    assert all(step.startswith(("a.plausible.model.", "a.plausible.candidates")) for step in spends)
    assert spends["a.plausible.candidates"].epsilon > 1000 * eps1  # not the old 1.0
    assert sum(s.epsilon for s in spends.values()) <= 2000.0
