"""The ``independent`` synthesizer releases open columns with CatHist and the rest densely."""

import csv
import json

import numpy as np
import pytest

from beamsynth.pipelines.methods.registry import IndependentMethod
from beamsynth.pipelines.methods.synthesize import SynthesisConfig, run_synthesis
from beamsynth.schemas.schema import load_schema
from beamsynth.transforms.budget import PrivacyAccountant, PureDP
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.synthesis import IndependentModel

WORDS = [f"w{i}" for i in range(3000)]


def _schema(tmp_path, tolerance=0.5):
    words = tmp_path / "words.txt"
    words.write_text("\n".join(WORDS) + "\n")
    return load_schema({
        "name": "people",
        "columns": [
            {"name": "sex", "type": "categorical",
             "domain": {"kind": "categorical", "values": ["F", "M"]}},
            {"name": "job", "type": "categorical", "open": {"tolerance": tolerance},
             "domain": {"kind": "product", "separator": " ",
                        "parts": [{"kind": "categorical", "values_file": str(words)},
                                  {"kind": "categorical", "values_file": str(words)}]}},
        ],
    })


def test_open_column_spends_cathist_with_tau_rho_n(tmp_path):
    schema = _schema(tmp_path)
    acct = PrivacyAccountant(total=PureDP(epsilon=2.0))
    IndependentMethod(schema=schema, accountant=acct, budget=PureDP(epsilon=2.0),
                      max_contributions=1, seed=None, options={})
    spends = {s.step: s for s in acct.spends}
    assert set(spends) == {"independent.marginals", "independent.cathist.job"}
    assert spends["independent.marginals"].budget.epsilon == pytest.approx(1.0)
    d = spends["independent.cathist.job"].details
    assert d["domain_size"] == 3000**2 and d["tolerance"] == 0.5 and d["tau"] >= 1
    assert acct.spent_epsilon == pytest.approx(2.0)


def test_closed_schema_keeps_the_single_dense_spend():
    schema = load_schema("adult")
    acct = PrivacyAccountant(total=PureDP(epsilon=1.0))
    IndependentMethod(schema=schema, accountant=acct, budget=PureDP(epsilon=1.0),
                      max_contributions=1, seed=None, options={})
    assert [s.step for s in acct.spends] == ["independent.marginals"]
    assert acct.spends[0].details["tables"] == len(schema.columns)


def test_sparse_model_samples_released_cells_only():
    model = IndependentModel([], (10**10,), sparse={0: (np.array([7, 10**9]), np.array([30, 10]))})
    codes = model.sample_codes(2000, RandomSource(seed=1))
    assert set(codes[:, 0].tolist()) == {7, 10**9}
    empty = IndependentModel([], (10**10,), sparse={0: (np.zeros(0, np.int64), np.zeros(0))})
    assert empty.sample_codes(5, RandomSource(seed=2)).shape == (5, 1)


def test_synthesize_with_open_column_end_to_end(tmp_path):
    schema = _schema(tmp_path, tolerance=0.9)
    data = tmp_path / "in.csv"
    rows = [("F", "w1 w2")] * 700 + [("M", "w3 w4")] * 300 + [("M", "nope")] * 3
    with data.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["sex", "job"])
        w.writerows(rows)
    out = tmp_path / "out.csv"
    manifest = run_synthesis(SynthesisConfig(input=str(data), schema=schema, output=str(out),
                                             epsilon=4.0, rows=2000, seed=7))
    with out.open() as fh:
        got = list(csv.DictReader(fh))
    assert len(got) == 2000
    jobs = {r["job"] for r in got}
    assert {"w1 w2", "w3 w4"} <= jobs  # large counts always survive at ε=2 per column
    assert all(len(j.split(" ")) == 2 for j in jobs)
    steps = [s["step"] for s in manifest["release"]["budget"]["spends"]]
    assert "independent.cathist.job" in steps
    rejected = (tmp_path / "out.csv.rejected.jsonl").read_text().splitlines()
    assert len(rejected) == 3 and "outside the declared" in json.loads(rejected[0])["reason"]


def test_schema_with_only_open_columns(tmp_path):
    schema = _schema(tmp_path, tolerance=0.5).select(["job"])
    data = tmp_path / "in.csv"
    data.write_text("job\n" + "w5 w6\n" * 500)
    out = tmp_path / "only_open.csv"
    manifest = run_synthesis(SynthesisConfig(input=str(data), schema=schema, output=str(out),
                                             epsilon=1.0, rows=300, seed=8))
    with out.open() as fh:
        got = [r["job"] for r in csv.DictReader(fh)]
    assert len(got) == 300 and got.count("w5 w6") > 150
    steps = [s["step"] for s in manifest["release"]["budget"]["spends"]]
    assert steps == ["independent.cathist.job"]


def test_huge_closed_column_is_refused_at_build_time_not_mid_run():
    # a dense table of 26^8 ≈ 2e11 cells used to be allocated after the data was read
    # (MemoryError mid-run); such a column must be declared open (CatHist) instead
    schema = load_schema({"name": "t", "columns": [
        {"name": "code", "type": "string",
         "domain": {"kind": "string", "alphabet": "abcdefghijklmnopqrstuvwxyz", "max_length": 8}}]})
    acct = PrivacyAccountant(total=PureDP(epsilon=1.0))
    with pytest.raises(ValueError, match=r"column 'code' .* declare it open"):
        IndependentMethod(schema=schema, accountant=acct, budget=PureDP(epsilon=1.0),
                          max_contributions=1, seed=None, options={})
    assert acct.spends == ()
