"""Seventeenth session (H88, issue 18): ``refine_target_picks="auto"``, a floor of target pairs.

With a declared target, ``auto`` sets ``RefinePlan.target_floor = min(TARGET_FLOOR, pairs)``: a
refinement pick is drawn among the target's not-yet-measured pairs only when the picks left are
just enough to bring the target's measured pairs up to the floor (at most the candidate pairs
that hold the target). Picks that the score gives the target anyway count, so where they reach
the floor the release is ``refine_target_picks=0``'s; explicit ``0``/``N`` keep H85's meaning
(none / the first ``N`` picks). Same score, Δ, ε per pick, tables and noise: the same spends.
docs/privbayes.md "Seventeenth session: a rule for the target's picks (issue 18, H88)". Every
test runs in well under 5 s.
"""

from __future__ import annotations

import argparse

import pytest

from beamsynth.pipelines.methods.options import check_options, option_actions
from beamsynth.pipelines.methods.privbayes import PrivBayesMethod
from beamsynth.pipelines.methods.wording import Vocabulary
from beamsynth.transforms import refine
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant, PureDP
from beamsynth.transforms.privbayes import plan_privbayes
from beamsynth.transforms.privbayes_plan import gaussian_plan

# H85's synthetic data (TARGET: a minority label independent of everything, so the score picks
# its pairs last), network and refinement call
from tests.test_session16_target_picks import TARGET, _data, _measure


def _plan(picks, pairs: int = 8, eps: float = 50.0):
    return refine.plan_refinement(PureDP(epsilon=eps), pairs=pairs, rounds=2, groups=4,
                                  pool_rows=5000, target=TARGET, target_picks=picks)


def _picks(codes, plan, seed: int = 0) -> list[tuple[int, int]]:
    return [t.columns for t in _measure(codes, plan, seed=seed).tables]


def test_auto_forces_only_the_last_picks_the_floor_needs():
    codes = _data()
    assert refine.TARGET_FLOOR == 5 and _plan("auto").target_floor == 5
    assert _plan("auto", pairs=3).target_floor == 3 and _plan("auto").target_picks == 0
    before, auto = _picks(codes, _plan(0)), _picks(codes, _plan("auto"))
    assert sum(TARGET in p for p in before) == 2 and before[6:] == [(0, 4), (2, 4)]
    # 4 candidate pairs hold the target (< the floor of 5): the last 4 picks are all of them,
    # the first 4 are r = 0's (same draws, same candidates)
    assert auto[:4] == before[:4] and all(TARGET in p for p in auto[4:]) and len(auto) == 8
    first = _picks(codes, _plan(4))  # H85's explicit N: the first N picks
    assert all(TARGET in p for p in first[:4]) and first[:4] != auto[:4]


def test_a_floor_the_score_meets_leaves_the_release_unchanged(monkeypatch):
    codes = _data()
    monkeypatch.setattr(refine, "TARGET_FLOOR", 1)  # r = 0 picks (0, 4) before the last pick
    plan = _plan("auto")
    assert plan.target_floor == 1 and _picks(codes, plan) == _picks(codes, _plan(0))


def test_spends_are_identical_and_the_details_name_the_floor():
    def spends(plan):
        acc = PrivacyAccountant(total=PureDP(epsilon=100.0))
        refine.spend_refinement(acc, plan, "privbayes.refine")
        return acc.spends

    zero, auto = spends(_plan(0)), spends(_plan("auto"))
    assert [(s.step, s.budget) for s in zero] == [(s.step, s.budget) for s in auto]
    assert [{k: v for k, v in s.details.items() if k != "target_floor"} for s in auto] == \
        [s.details for s in zero]
    assert all(s.details["target_floor"] == 5 for s in auto)
    assert _plan("auto").details()["target_floor"] == 5 and "target_floor" not in _plan(0).details()


def test_the_plan_carries_the_floor_through_every_path():
    eps = PureDP(epsilon=2.0)
    shape = (6, 4, 3, 5, 2, 4)
    names = [f"c{i}" for i in range(6)]
    plain = plan_privbayes(shape, eps, degree=1, names=names, refine_pairs=6)
    auto = plan_privbayes(shape, eps, degree=1, names=names, refine_pairs=6, target=4,
                          refine_target_picks="auto")
    assert auto.refine.target == 4 and auto.refine.target_floor == 5
    assert auto.refine.target_picks == 0 and plain.refine.target_floor == 0
    assert plan_privbayes(shape, eps, degree=1, names=names, refine_pairs=6,
                          refine_target_picks="auto") == plain  # no target: nothing changes
    explicit = plan_privbayes(shape, eps, degree=1, names=names, refine_pairs=6, target=4,
                              refine_target_picks=2)
    assert explicit.refine.target_picks == 2 and explicit.refine.target_floor == 0
    for bad in ("bogus", -1, 1.5, True):
        with pytest.raises(ValueError, match="refine_target_picks"):
            plan_privbayes(shape, eps, refine_target_picks=bad)
    delta = ApproxDP(epsilon=2.0, delta=1e-9)
    gauss = gaussian_plan(plan_privbayes(shape, delta, degree=1, names=names, refine_pairs=6,
                                         target=4, refine_target_picks="auto"),
                          delta, pairs=4, rounds=2, groups=4)
    assert gauss.refine.target == 4 and gauss.refine.target_floor == 4  # min(5, 4 pairs)
    resized = auto.refine.target_fields(3)
    assert resized == {"target": 4, "target_floor": 3}


@pytest.mark.parametrize("caller", ["api", "yaml"])
def test_every_front_end_takes_auto_and_whole_numbers(caller):
    action = option_actions(PrivBayesMethod)["refine_target_picks"]
    assert action.type("auto") == "auto" and action.type("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match="auto or a whole number"):
        action.type("five")
    for good, read in (("auto", "auto"), (0, 0), (5, 5), (5.0, 5)):
        assert check_options(PrivBayesMethod, {"refine_target_picks": good},
                             Vocabulary(caller))["refine_target_picks"] == read
    for bad in (-1, 1.5, "5", True, "Auto"):
        with pytest.raises(ValueError, match="refine_target_picks.*whole number or auto|"
                                             "refine_target_picks.*>= 0"):
            check_options(PrivBayesMethod, {"refine_target_picks": bad}, Vocabulary(caller))


@pytest.mark.audit
def test_neighbours_with_the_same_draws_are_offered_the_same_candidates(monkeypatch):
    """D vs D − 1 (one record removed), same per-run draws, ``auto``: every pick whose earlier
    (released) picks are equal is offered the same number of candidates (the restriction is a
    function of declared values and earlier picks only) and the forced picks come last."""
    offered: list[list[int]] = []
    orig = refine.permute_and_flip

    def spy(rs, scores, *, epsilon, sensitivity):
        offered[-1].append(len(scores))
        return orig(rs, scores, epsilon=epsilon, sensitivity=sensitivity)

    monkeypatch.setattr(refine, "permute_and_flip", spy)
    restricted = 0
    for seed in range(6):
        codes = _data(seed=seed)
        picks = []
        for data in (codes, codes[1:]):
            offered.append([])
            picks.append(_picks(data, _plan("auto", eps=2.0), seed=seed))
        (a, b), (na, nb) = picks, offered[-2:]
        for j in range(len(a)):
            assert na[j] == nb[j]  # same offer while the released picks so far are equal
            if a[j] != b[j]:
                break
        left = [10 - j for j in range(8)]  # every not-yet-measured pair
        restricted += sum(n < full for n, full in zip(na, left))
        assert all(n == full for n, full in zip(na[:4], left[:4]))  # the first picks: all pairs
    assert restricted > 0


@pytest.mark.parametrize("caller, words", [
    ("cli", "--pb-refine-target-picks 3 changes nothing: no target is declared"),
    ("api", "options={'refine_target_picks': 3} changes nothing: no target is declared"),
    ("yaml", "options: {refine_target_picks: 3} changes nothing: no target is declared"),
], ids=["cli", "api", "yaml"])
def test_target_picks_without_a_target_is_said(caplog, caller, words):
    """H86's open item: refine_target_picks without a declared target (the bundled adult schema
    declares none) built silently and ran as 0. Now said when built, in the caller's words; with
    a target, or at 0, nothing is said."""
    import beamsynth as bs
    from beamsynth.pipelines.methods.synthesize import SynthesisConfig, plan_synthesis

    def plan(**options):
        cfg = SynthesisConfig(input="in.csv", schema=bs.load_schema("adult"), output="o.csv",
                              epsilon=1.0, method="privbayes", options=options)
        return plan_synthesis(cfg, vocabulary=None if caller == "cli" else Vocabulary(caller))

    with caplog.at_level("WARNING", logger="beamsynth.pipelines.methods.privbayes"):
        plan(refine_target_picks=3)
    assert any(r.getMessage().startswith(words) for r in caplog.records), \
        [r.getMessage() for r in caplog.records]
    caplog.clear()
    with caplog.at_level("WARNING", logger="beamsynth.pipelines.methods.privbayes"):
        plan(refine_target_picks=3, target="income")
        plan(refine_target_picks=0)
    assert not any("refine_target_picks" in r.getMessage() or "target-picks" in r.getMessage()
                   for r in caplog.records), [r.getMessage() for r in caplog.records]
