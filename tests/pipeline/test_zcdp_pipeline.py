"""``--pb-noise gaussian`` through the CLI (issue 18): one (ε, δ) spend ``privbayes.zcdp`` whose
ρ parts add up to the budget's ρ, Gaussian tables in the release details; δ = 0 exits 2.
``--pb-noise auto`` (H29): the default's bytes when δ = 0, gaussian's when δ > 0; the default
(laplace) with δ > 0 writes the δ = 0 bytes and says δ is unused; the API's ``bs.PrivBayes``
with ``delta=`` and ``pb_noise="auto"`` spends ``privbayes.zcdp``."""

import hashlib
import json
from pathlib import Path

import apache_beam as beam
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


# -- pb_noise auto (H29) ---------------------------------------------------------------------------
def _run(src, out, *extra):
    # --input-rows: a public size claim large enough that the network (not the forest) runs
    assert main(["synthesize", str(src), "--schema", "adult", "--epsilon", "1", "--method",
                 "privbayes", "--rows", "300", "--input-rows", "40000", "--seed", "3", "--quiet",
                 "--output", str(out), *extra]) == 0
    manifest = json.loads(Path(str(out) + ".manifest.json").read_text())
    return hashlib.sha256(Path(out).read_bytes()).hexdigest(), manifest


@pytest.fixture(scope="module")
def cli_run(adult_small, tmp_path_factory):
    """``_run`` once per distinct option list in this module: the two tests below compare some of
    the same runs (the default and --pb-noise gaussian at δ = 1e-9, the default at δ = 0)."""
    done: dict[tuple[str, ...], tuple[str, dict]] = {}

    def run(*extra: str) -> tuple[str, dict]:
        if extra not in done:
            done[extra] = _run(adult_small, tmp_path_factory.mktemp("cli") / "out.csv", *extra)
        return done[extra]

    return run


@pytest.mark.parametrize("delta,explicit,steps", [
    ("0", [], ["privbayes.structure", "privbayes.marginals", "privbayes.refine.selection",
               "privbayes.refine.marginals"]),
    ("1e-9", ["--pb-noise", "gaussian"], ["privbayes.zcdp"]),
])
def test_cli_auto_is_the_mode_delta_selects(cli_run, delta, explicit, steps):
    auto, m = cli_run("--delta", delta, "--pb-noise", "auto")
    same, _ = cli_run("--delta", delta, *explicit)
    assert auto == same
    assert [s["step"] for s in m["release"]["budget"]["spends"]] == steps
    mode = m["release"]["details"]["method"]["privbayes"]["noise_mode"]
    assert (mode["option"], mode["chosen"]) == ("auto", "gaussian" if explicit else "laplace")


def test_cli_default_is_auto(cli_run):
    # H53: the default --pb-noise is auto; at δ = 0 it writes laplace's bytes, with δ > 0 gaussian's
    plain, m0 = cli_run("--delta", "0")
    lap, _ = cli_run("--delta", "0", "--pb-noise", "laplace")
    assert plain == lap and m0["release"]["budget"]["spent"]["delta"] == 0.0
    wide, m = cli_run("--delta", "1e-9")
    gauss, _ = cli_run("--delta", "1e-9", "--pb-noise", "gaussian")
    assert wide == gauss
    mode = m["release"]["details"]["method"]["privbayes"]["noise_mode"]
    assert (mode["option"], mode["chosen"]) == ("auto", "gaussian")


def test_api_privbayes_with_delta_spends_zcdp():
    import beamsynth as bs

    with open(ADULT, encoding="utf-8") as fh:
        header = fh.readline().strip().split(",")
        rows = [dict(zip(header, line.strip().split(","))) for _, line in zip(range(300), fh)]
    job = bs.PrivacyJob(epsilon=2.0, delta=1e-6, seed=3)
    with beam.Pipeline() as p:
        private = p | beam.Create(rows) | job.private(bs.load_schema("adult"))
        _ = private | "G" >> bs.PrivBayes(epsilon=1.0, delta=1e-6, rows=50,
                                          options={"input_rows": 40_000, "pb_noise": "auto"})
        _ = private | "L" >> bs.PrivBayes(epsilon=1.0, rows=50,
                                          options={"input_rows": 40_000, "pb_noise": "auto"})
        steps = [s.step for s in job.accountant.spends]
    assert any(s.endswith("privbayes.zcdp") for s in steps)
    assert any(s.endswith("privbayes.marginals") for s in steps)


def test_cli_manifest_names_the_run_time_small_input_model(adult_small, tmp_path):
    """auto with δ > 0 and no --input-rows on 300 rows: the DP count chooses the pure-ε forest at
    run time; noise_mode says so (the plan alone said gaussian)."""
    src = tmp_path / "small.csv"
    pd.read_csv(adult_small, dtype=str, keep_default_na=False).head(300).to_csv(src, index=False)
    out = tmp_path / "s.csv"
    assert main(["synthesize", str(src), "--schema", "adult", "--epsilon", "1", "--delta", "1e-9",
                 "--method", "privbayes", "--pb-noise", "auto", "--rows", "100", "--seed", "3",
                 "--quiet", "--output", str(out)]) == 0
    m = json.loads(Path(str(out) + ".manifest.json").read_text())
    details = m["release"]["details"]["method"]["privbayes"]
    assert details["sizing"]["chosen_degree_windows"] == {"0": 1}
    assert "chose the small-input model" in details["noise_mode"]["why"]
