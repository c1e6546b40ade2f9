"""Budget value types and the build-time accountant."""

import pytest

from beamsynth.transforms.budget import (
    ApproxDP,
    BudgetExceededError,
    PrivacyAccountant,
    PureDP,
    as_budget,
)


def test_split_is_proportional_and_sums_to_total():
    parts = PureDP(epsilon=1.0).split({"structure": 0.3, "conditionals": 0.7})
    assert parts["structure"] == PureDP(epsilon=0.3)
    assert parts["conditionals"].epsilon == pytest.approx(0.7)
    assert all(isinstance(p, PureDP) for p in parts.values())


def test_approx_split_keeps_delta_share():
    parts = ApproxDP(epsilon=2.0, delta=1e-6).split({"a": 1, "b": 3})
    assert parts["a"].epsilon == pytest.approx(0.5) and parts["a"].delta == pytest.approx(2.5e-7)


@pytest.mark.parametrize(
    "kwargs,exc,message",
    [
        ({"epsilon": 0}, ValueError, "epsilon (0) must be a finite number > 0"),
        ({"epsilon": -1.0}, ValueError, "epsilon (-1.0) must be a finite number > 0"),
        ({"epsilon": float("inf")}, ValueError, "epsilon (inf) must be a finite number > 0"),
        ({"epsilon": "1"}, TypeError, "epsilon must be a number, got str ('1')"),
        ({"epsilon": True}, TypeError, "epsilon must be a number, got bool (True)"),
        ({"epsilon": 1.0, "delta": 1.0}, ValueError, "delta (1.0) must be in [0, 1)"),
    ],
)
def test_validation_messages_echo_value_and_range(kwargs, exc, message):
    with pytest.raises(exc) as err:
        ApproxDP(**kwargs)
    assert str(err.value) == message


def test_budgets_are_keyword_only_and_frozen():
    with pytest.raises(TypeError):
        PureDP(1.0)  # type: ignore[misc]
    b = PureDP(epsilon=1.0)
    with pytest.raises(AttributeError):
        b.epsilon = 2.0  # type: ignore[misc]


def test_pure_rejects_delta():
    with pytest.raises(ValueError, match="PureDP has delta 0"):
        PureDP(epsilon=1.0, delta=1e-5)


def test_as_budget_picks_type():
    assert isinstance(as_budget(1.0), PureDP)
    assert not isinstance(as_budget(1.0, 1e-6), PureDP)


def test_accountant_records_and_refuses_overspend():
    acct = PrivacyAccountant(total=PureDP(epsilon=1.0))
    acct.spend("a", PureDP(epsilon=0.4), mechanism="m")
    acct.spend("b", PureDP(epsilon=0.6), mechanism="m")  # exactly the total: allowed
    with pytest.raises(BudgetExceededError) as err:
        acct.spend("c", PureDP(epsilon=0.01), mechanism="m")
    msg = str(err.value)
    assert "step 'c' asks for ε=0.01" in msg and "a ε=0.4" in msg and "b ε=0.6" in msg
    assert [s.step for s in acct.spends] == ["a", "b"]
    d = acct.to_dict()
    assert d["spent"]["epsilon"] == pytest.approx(1.0) and len(d["spends"]) == 2


def test_accountant_refuses_delta_overspend():
    acct = PrivacyAccountant(total=ApproxDP(epsilon=1.0, delta=1e-6))
    with pytest.raises(BudgetExceededError):
        acct.spend("x", ApproxDP(epsilon=0.1, delta=2e-6), mechanism="m")


def test_float_roundoff_of_equal_split_fits_exactly():
    acct = PrivacyAccountant(total=PureDP(epsilon=1.0))
    for name, part in PureDP(epsilon=1.0).split({str(i): 1 for i in range(15)}).items():
        acct.spend(name, part, mechanism="m")
    assert acct.spent_epsilon == pytest.approx(1.0)
