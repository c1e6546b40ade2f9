"""A requested synthetic row count has a declared ceiling (lead, nineteenth session).

H100's red team found ``rows=10**20`` (or ``2**63``) taken by the API and a release config: the
sampling shards (50,000 rows each) are planned when the pipeline is built, so such a job tried to
plan ~2·10¹⁵ shards. ``check_rows`` now refuses more than ``MAX_ROWS`` (10¹⁰) with the setting in
the caller's words, before any spend; 10¹⁰ itself still builds."""

from __future__ import annotations

import pytest

import beamsynth as bs
from beamsynth.transforms.budget import MAX_ROWS, check_rows


def test_the_ceiling_is_inclusive() -> None:
    assert check_rows(MAX_ROWS) == MAX_ROWS
    with pytest.raises(ValueError, match=r"^rows=10000000001: at most 10,000,000,000 synthetic rows"):
        check_rows(MAX_ROWS + 1)


@pytest.mark.parametrize("rows", [10**20, 2**63])
def test_api_refuses_a_huge_row_count_when_built(rows: int) -> None:
    with pytest.raises(ValueError, match=f"rows={rows}: at most 10,000,000,000 synthetic rows per release"):
        bs.IndependentSynthesis(epsilon=1.0, rows=rows)


@pytest.mark.parametrize(("caller", "shown"), [("cli", "--rows 100000000000"),
                                                ("yaml", "rows: 100000000000")])
def test_cli_and_yaml_refuse_it_in_their_words(caller: str, shown: str) -> None:
    from beamsynth.pipelines.methods.synthesize import SynthesisConfig, plan_synthesis
    from beamsynth.pipelines.methods.wording import Vocabulary

    cfg = SynthesisConfig(input="in.csv", schema=bs.load_schema("adult"), output="out.csv",
                          epsilon=1.0, rows=10**11)
    with pytest.raises(ValueError, match=f"^{shown}: at most 10,000,000,000"):
        plan_synthesis(cfg, vocabulary=Vocabulary(caller))
