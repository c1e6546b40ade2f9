"""The DP row count and the synthesis helpers: validation at build time."""

import pytest

from beamsynth.transforms.budget import PureDP
from beamsynth.transforms.synthesis import DPCount


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "2"])
def test_dp_count_rejects_a_bad_contribution_bound_at_build_time(bad):
    # int(2.5) used to give sensitivity 2 silently; 0 failed only inside a worker
    with pytest.raises(ValueError, match=r"max_contributions \(.*\) must be an int >= 1"):
        DPCount(budget=PureDP(epsilon=1.0), max_contributions=bad)


def test_dp_count_accepts_a_positive_int():
    DPCount(budget=PureDP(epsilon=1.0), max_contributions=3)
