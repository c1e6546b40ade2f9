"""``pb_noise`` of ``--method privbayes`` / ``bs.PrivBayes`` / ``bs.Synthesize`` (H29,
docs/privbayes.md "Twelfth session"): the default is ``auto`` since H53 (``laplace``: pure ε; a
method δ > 0 is unused and the manifest says so); ``auto`` is discrete Gaussian tables under zCDP when the
method's δ > 0 and Laplace when δ = 0. Build-time checks (no data read)."""

import pytest

from beamsynth.pipelines.methods.synthesize import SynthesisConfig, plan_synthesis
from beamsynth.schemas.schema import load_schema
from beamsynth.transforms.privbayes import DPPrivBayes
from beamsynth.transforms.privbayes_plan import NOISE_MODES, resolve_noise

LAPLACE_STEPS = ["privbayes.structure", "privbayes.marginals", "privbayes.refine.selection",
                 "privbayes.refine.marginals"]


def test_resolve_noise():
    assert resolve_noise("auto", 0.0)[0] == "laplace"
    assert resolve_noise("auto", 1e-9)[0] == "gaussian"
    noise, why = resolve_noise("laplace", 1e-9)
    assert noise == "laplace" and "not used" in why
    assert resolve_noise("laplace", 0.0) == ("laplace", "laplace")
    assert resolve_noise("gaussian", 1e-9)[0] == "gaussian"
    assert set(NOISE_MODES) == {"auto", "laplace", "gaussian"}
    with pytest.raises(ValueError, match="noise"):
        resolve_noise("normal", 1e-9)


def _plan(delta, **options):
    cfg = SynthesisConfig(input="unused.csv", schema=load_schema("adult"), output="unused.out.csv",
                          epsilon=1.0, delta=delta, method="privbayes", rows=100, seed=3,
                          options={"input_rows": 32_561, **options})
    plan = plan_synthesis(cfg)
    return [s.step for s in plan.accountant.spends], plan.method.details()["privbayes"], plan


def test_default_is_auto():
    # H53: the default is auto (gaussian on Adult's 15 columns with δ > 0, laplace at δ = 0)
    steps, details, plan = _plan(1e-9)
    assert steps == ["privbayes.zcdp"] and plan.accountant.spent_delta == pytest.approx(1e-9)
    assert (details["noise_mode"]["option"], details["noise_mode"]["chosen"]) == ("auto", "gaussian")
    steps, details, _ = _plan(0.0)
    assert steps == LAPLACE_STEPS and details["noise_mode"]["chosen"] == "laplace"
    steps, details, plan = _plan(1e-9, pb_noise="laplace")  # explicit laplace: δ not used
    assert steps == LAPLACE_STEPS and plan.accountant.spent_delta == 0.0
    assert "δ = 1e-09 is not used" in details["noise_mode"]["why"]


def test_auto_follows_delta():
    steps, details, plan = _plan(0.0, pb_noise="auto")
    assert steps == LAPLACE_STEPS and details["noise_mode"]["chosen"] == "laplace"
    steps, details, plan = _plan(1e-9, pb_noise="auto")
    assert steps == ["privbayes.zcdp"] and plan.accountant.spent_delta == pytest.approx(1e-9)
    assert details["noise_mode"]["chosen"] == "gaussian" and "δ = 1e-09 > 0" in details["noise_mode"]["why"]
    assert details["refine"]["pairs"] == 40 and details["refine"]["groups"] == 8  # Gaussian defaults
    steps, details, _ = _plan(1e-9, pb_noise="gaussian")
    assert steps == ["privbayes.zcdp"] and details["noise_mode"]["option"] == "gaussian"
    with pytest.raises(ValueError, match="delta"):
        _plan(0.0, pb_noise="gaussian")


def test_small_input_forest_says_delta_is_unused():
    """auto with δ > 0 where the public row count gives the small-input forest: that model is
    pure ε-DP (gaussian_plan returns it as is), and the manifest says so."""
    cfg = SynthesisConfig(input="unused.csv", schema=load_schema("adult"), output="u.csv",
                          epsilon=1.0, delta=1e-9, method="privbayes", rows=100, seed=3,
                          options={"input_rows": 1_000, "pb_noise": "auto"})
    plan = plan_synthesis(cfg)
    mode = plan.method.details()["privbayes"]["noise_mode"]
    assert mode["chosen"] == "laplace" and "forest" in mode["why"]
    assert plan.accountant.spent_delta == 0.0


def test_transform_accepts_auto():
    from beamsynth.transforms.budget import ApproxDP

    budget = ApproxDP(epsilon=1.0, delta=1e-9)
    schema = load_schema("adult")
    assert DPPrivBayes(schema=schema, budget=budget).plan.zcdp is None
    assert DPPrivBayes(schema=schema, budget=budget, noise="auto").plan.zcdp is not None


def test_auto_without_input_rows_spends_count_and_zcdp():
    """H37: pb_noise auto with δ > 0 and no public row count (the CLI's DP-count path): the
    spends privbayes.size_count (ε_c, 0) then privbayes.zcdp (ε − ε_c, δ), adding up to the
    method's (1, 1e-9); noise_mode says so (fails with the count inside the zCDP spend)."""
    cfg = SynthesisConfig(input="unused.csv", schema=load_schema("adult"), output="u.csv",
                          epsilon=1.0, delta=1e-9, method="privbayes", rows=100, seed=3,
                          options={"pb_noise": "auto"})
    plan = plan_synthesis(cfg)
    spends = [(s.step, s.budget.epsilon, s.budget.delta) for s in plan.accountant.spends]
    assert spends == [("privbayes.size_count", pytest.approx(0.02), 0.0),
                      ("privbayes.zcdp", pytest.approx(0.98), 1e-9)]
    why = plan.method.details()["privbayes"]["noise_mode"]["why"]
    assert "basic composition" in why and "privbayes.size_count" in why
