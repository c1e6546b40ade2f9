"""`beamsynth synthesize` end to end on the DirectRunner (issue 2's 'done means')."""

import json
from pathlib import Path

import pandas as pd
import pytest

from beamsynth.pipelines.cli.main import main
from beamsynth.pipelines.io import read as bio
from beamsynth.pipelines.io.manifest import SECURE_NOTE
from beamsynth.pipelines.io.records import EMPTY_INPUT_REFUSED
from beamsynth.pipelines.methods.synthesize import SynthesisConfig, run_synthesis
from beamsynth.schemas.schema import load_schema
from beamsynth.transforms.budget import BudgetExceededError

ADULT = Path(__file__).resolve().parents[2] / "examples" / "data" / "adult" / "adult.csv"


@pytest.fixture(scope="module")
def adult_sample(tmp_path_factory):
    """3,000 Adult rows without the split column (as a data owner would have them)."""
    df = pd.read_csv(ADULT, dtype=str, keep_default_na=False).drop(columns=["split"]).head(3000)
    path = tmp_path_factory.mktemp("adult") / "adult.csv"
    df.to_csv(path, index=False)
    return path


def _run(args):
    assert main(args + ["--quiet"]) == 0


def _manifest(out):
    return json.loads(Path(f"{out}.manifest.json").read_text())


def test_adult_default_rows_domain_and_manifest(adult_sample, tmp_path):
    out = tmp_path / "out.csv"
    _run(["synthesize", str(adult_sample), "--schema", "adult", "--epsilon", "1", "--output", str(out)])
    syn = pd.read_csv(out, dtype=str, keep_default_na=False)
    schema = load_schema("adult")
    assert list(syn.columns) == schema.names
    m = _manifest(out)
    rel = m["release"]
    assert rel["budget"]["spent"]["epsilon"] == pytest.approx(1.0)
    assert [s["step"] for s in rel["budget"]["spends"]] == ["row_count", "independent.marginals"]
    assert rel["randomness"] == SECURE_NOTE and rel["seed"] is None
    assert rel["rows_out"] == len(syn)
    assert abs(len(syn) - 3000) < 400  # DP estimate with ε=0.05: scale 20
    batch, bad = schema.encode_columns({c: syn[c] for c in schema.names}, len(syn))
    assert bad == [] and len(batch) == len(syn)  # every value inside the declared domain
    assert m["operational"]["rows_read"] == 3000 and m["operational"]["rows_rejected"] == 0


def test_same_seed_identical_and_no_seed_differs(adult_sample, tmp_path):
    outs = [tmp_path / f"o{i}.csv" for i in range(4)]
    base = ["synthesize", str(adult_sample), "--schema", "adult", "--epsilon", "1", "--rows", "500"]
    _run(base + ["--output", str(outs[0]), "--seed", "7"])
    _run(base + ["--output", str(outs[1]), "--seed", "7"])
    _run(base + ["--output", str(outs[2])])
    _run(base + ["--output", str(outs[3])])
    assert outs[0].read_bytes() == outs[1].read_bytes()
    assert outs[2].read_bytes() != outs[3].read_bytes()
    assert _manifest(outs[0])["release"]["randomness"] == "seeded: not for release"


def test_malformed_csv_rows_all_accounted(tmp_path):
    lines = ADULT.read_text().splitlines()[:201]
    header, rows = lines[0], lines[1:]
    rows[10] = rows[10] + ",extra,fields"
    rows[20] = rows[20].replace("Private", "Pirate", 1) if "Private" in rows[20] else "x,Pirate" + rows[20][1:]
    rows[30] = "not,a,row"
    rows[40] = "200" + rows[40][rows[40].index(","):]  # age outside the declared range
    path = tmp_path / "bad.csv"
    path.write_text("\n".join([header] + rows) + "\n", encoding="utf-8")
    out = tmp_path / "out.csv"
    _run(["synthesize", str(path), "--schema", "adult", "--epsilon", "1", "--rows", "100",
          "--output", str(out), "--seed", "1"])
    op = _manifest(out)["operational"]
    assert op["rows_read"] == 200 and op["rows_rejected"] == 4 and op["rows_used"] == 196
    rejected = [json.loads(x) for x in Path(f"{out}.rejected.jsonl").read_text().splitlines()]
    assert sorted(r["row"] for r in rejected) == [11, 21, 31, 41]
    assert all(r["reason"] and r["source"] == str(path) for r in rejected)


def test_overspend_fails_before_reading_data(adult_sample, tmp_path, monkeypatch):
    def explode(*a, **k):
        raise AssertionError("data was read")

    monkeypatch.setattr(bio, "iter_raw_blocks", explode)
    cfg = SynthesisConfig(input=str(adult_sample), schema=load_schema("adult"),
                          output=str(tmp_path / "o.csv"), epsilon=1.0, count_epsilon=1.5)
    with pytest.raises(BudgetExceededError, match="step 'row_count' asks for ε=1.5"):
        run_synthesis(cfg)
    assert not (tmp_path / "o.csv").exists()


def test_cli_reports_errors_cleanly(tmp_path, capsys):
    assert main(["synthesize", "nope.csv", "--schema", "adult", "--epsilon", "1", "--rows", "0",
                 "--output", str(tmp_path / "o.csv")]) == 2
    assert "--rows 0: the row count must be a whole number >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # a flag out of range: refused while parsing (H101)
        main(["synthesize", "nope.csv", "--schema", "adult", "--epsilon", "0",
              "--output", str(tmp_path / "o.csv")])
    assert exc.value.code == 2
    assert "argument --epsilon: '0' is not a finite number > 0" in capsys.readouterr().err


def test_privacy_id_bounds_contributions(tmp_path):
    df = pd.read_csv(ADULT, dtype=str, keep_default_na=False).drop(columns=["split"]).head(600)
    df.insert(0, "person", [f"p{i % 50}" for i in range(len(df))])  # 12 rows per person
    path = tmp_path / "pid.csv"
    df.to_csv(path, index=False)
    out = tmp_path / "o.csv"
    _run(["synthesize", str(path), "--schema", "adult", "--epsilon", "1", "--rows", "100",
          "--privacy-id", "person", "--max-contributions", "2", "--output", str(out), "--seed", "3"])
    rel, op = _manifest(out)["release"], _manifest(out)["operational"]
    # "used" counts rows after the bound: 50 persons × 2 of their 12 rows (issue 19, item 4)
    assert (op["rows_read"], op["rows_rejected"], op["rows_dropped_by_bound"], op["rows_used"]) == (600, 0, 500, 100)
    assert rel["privacy_unit"] == {"privacy_id": "person", "max_contributions": 2, "ids": "exact",
                                   "neighbouring": "add/remove one privacy unit",
                                   "empty_input": EMPTY_INPUT_REFUSED}
    assert rel["budget"]["spends"][0]["details"]["sensitivity_per_table"] == 2
    assert "person" not in pd.read_csv(out).columns


def test_independent_with_delta_spends_pure_epsilon(adult_sample, tmp_path):
    out = tmp_path / "o.csv"
    _run(["synthesize", str(adult_sample), "--schema", "adult", "--epsilon", "1", "--delta", "1e-6",
          "--rows", "50", "--output", str(out), "--seed", "2"])
    budget = _manifest(out)["release"]["budget"]
    assert budget["total"] == {"epsilon": 1.0, "delta": 1e-6}
    assert budget["spent"]["epsilon"] == pytest.approx(1.0) and budget["spent"]["delta"] == 0.0
