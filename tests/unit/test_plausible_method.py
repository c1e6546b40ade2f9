"""The ``plausible`` synthesize method: option validation, budget spend and Theorem 1 report."""

from __future__ import annotations

import math

import pytest

from beamsynth.pipelines.synthesize import SynthesisConfig, plan_synthesis
from beamsynth.schemas.schema import load_schema


def _plan(rows=1000, **options):
    cfg = SynthesisConfig(input="unused.csv", schema=load_schema("adult"), output="/tmp/unused.csv",
                          epsilon=1.0, method="plausible", rows=rows, options=options)
    return plan_synthesis(cfg)


def test_plan_spends_the_model_budget_and_reports_theorem1():
    plan = _plan(k=50, gamma=4.0, epsilon0=1.0, omega=9)
    spends = {s.step: s for s in plan.accountant.spends}
    assert spends["plausible.model"].budget.epsilon == pytest.approx(1.0)
    det = plan.method.details()
    g = det["release_guarantee"]["per_record"]
    assert g["epsilon"] == pytest.approx(1 + math.log(1 + 4 / 25)) and g["delta"] == pytest.approx(math.exp(-25))
    assert det["omega"] == 9 and det["test"] == "randomized"
    composed = plan.method.release_guarantee(100)["composed"]
    assert composed["epsilon"] == pytest.approx(100 * g["epsilon"])


def test_deterministic_test_claims_no_dp():
    det = _plan(plausible_test="deterministic").method.details()
    assert det["release_guarantee"]["differential_privacy"] is None


@pytest.mark.parametrize("opts,msg", [
    ({"k": 0}, r"k \(0\) must be an int >= 1"),
    ({"gamma": 1.0}, r"gamma \(1.0\) must be a finite number > 1"),
    ({"epsilon0": 0.0}, r"epsilon0 \(0.0\) must be a finite number > 0"),
    ({"omega": 16}, r"omega \(16\) must be in \[1, 15\]"),
    ({"k": 10, "plausible_t": 10}, r"plausible_t \(10\) must be in \[1, k-1\] with k \(10\) >= 2"),
    ({"k": 10, "max_plausible": 5}, r"max_plausible \(5\) must be an int >= 10"),
    ({"plausible_split": "0.5,0.5"}, r"plausible_split \('0.5,0.5'\) must be three numbers > 0"),
    ({"plausible_test": "fuzzy"}, r"plausible_test \('fuzzy'\) must be 'randomized' or 'deterministic'"),
])
def test_option_validation_messages(opts, msg):
    with pytest.raises(ValueError, match=msg):
        _plan(**opts)
