"""``--pb-noise gaussian`` through the CLI (issue 18): one (ε, δ) spend ``privbayes.zcdp`` whose
ρ parts add up to the budget's ρ, Gaussian tables in the release details; δ = 0 exits 2."""

import json
from pathlib import Path

import pandas as pd
import pytest

from beamsynth.pipelines.cli.main import main
from beamsynth.transforms.budget import zcdp_rho

ADULT = Path(__file__).resolve().parents[2] / "examples" / "data" / "adult" / "adult.csv"


@pytest.fixture(scope="module")
def adult_small(tmp_path_factory):
    df = pd.read_csv(ADULT, dtype=str, keep_default_na=False).drop(columns=["split"]).head(1500)
    path = tmp_path_factory.mktemp("adult") / "adult.csv"
    df.to_csv(path, index=False)
    return path


def test_gaussian_cli_spends_one_zcdp_budget(adult_small, tmp_path):
    out = tmp_path / "g.csv"
    # --input-rows is a public size claim: large enough that the network (not a fallback) runs
    assert main(["synthesize", str(adult_small), "--schema", "adult", "--epsilon", "1",
                 "--delta", "1e-9", "--method", "privbayes", "--pb-noise", "gaussian",
                 "--rows", "500", "--input-rows", "40000", "--seed", "3",
                 "--output", str(out)]) == 0
    m = json.loads(Path(str(out) + ".manifest.json").read_text())
    (spend,) = m["release"]["budget"]["spends"]
    assert spend["step"] == "privbayes.zcdp"
    assert (spend["epsilon"], spend["delta"]) == (1.0, 1e-9)
    z = spend["details"]
    assert z["rho"] == pytest.approx(zcdp_rho(1.0, 1e-9))
    assert sum(p["rho"] for p in z["parts"].values()) == pytest.approx(z["rho"])
    assert z["parts"]["refine.marginals"]["tables"] == 40
    assert len(pd.read_csv(out)) == 500


def test_gaussian_cli_without_delta_exits_2(adult_small, tmp_path, capsys):
    assert main(["synthesize", str(adult_small), "--schema", "adult", "--epsilon", "1",
                 "--method", "privbayes", "--pb-noise", "gaussian",
                 "--output", str(tmp_path / "g.csv")]) == 2
    assert "needs delta > 0" in capsys.readouterr().err
