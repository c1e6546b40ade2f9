"""SBHG on the DirectRunner: structural zeros, seeded reproducibility, the CLI and its δ check."""

import json
from pathlib import Path

import apache_beam as beam
import numpy as np
import pandas as pd
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import BeamAssertException, assert_that

from beamsynth.pipelines.cli.main import main
from beamsynth.pipelines.methods.synthesize import SynthesisConfig, run_synthesis
from beamsynth.schemas.schema import EncodedBatch, load_schema
from beamsynth.transforms.budget import ApproxDP, PureDP
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.sbhg import DPHashedConditionals

SHAPE = (10, 10, 6, 12, 9, 8, 5, 7, 11, 4, 6, 9)  # 1.2e10 cells, 20,000 rows: sparse


def _forbidden_data(n=20_000, seed=0):
    """Sparse 12-column data with structural zeros: b ∈ {a, a+1}, d // 2 == c, f == e % 8 ..."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 10, n)
    b = (a + rng.integers(0, 2, n)) % 10
    c = rng.integers(0, 6, n)
    d = 2 * c + rng.integers(0, 2, n)
    e = rng.integers(0, 9, n)
    f = e % 8
    rest = np.column_stack([rng.integers(0, s, n) for s in SHAPE[6:]])
    return np.column_stack([a, b, c, d, e, f, rest]).astype(np.int64)


def _violations(codes):
    """Fraction of rows breaking any of the data's structural zeros."""
    bad = ((codes[:, 1] - codes[:, 0]) % 10 > 1) | (codes[:, 3] // 2 != codes[:, 2]) | \
        (codes[:, 5] != codes[:, 4] % 8)
    return float(bad.mean())


def _opts():
    return PipelineOptions(["--runner=DirectRunner"])


def test_sbhg_preserves_structural_zeros_on_sparse_data():
    codes = _forbidden_data()
    # the check can fail: columns sampled independently break the zeros most of the time
    rng = np.random.default_rng(1)
    independent = np.column_stack([rng.choice(codes[:, j], 5000) for j in range(codes.shape[1])])
    assert _violations(independent) > 0.5

    def check(models):
        (model,) = models
        sample = model.sample_codes(5000, RandomSource(seed=9))
        if sample.shape != (5000, len(SHAPE)) or _violations(sample) != 0.0:
            raise BeamAssertException(f"violations {_violations(sample)} in {sample.shape}")
        if not {0, 1} & set(model.parents[1]) or 2 not in model.parents[3] + model.parents[2] + (3,):
            raise BeamAssertException(f"unexpected parents {model.parents}")

    with BeamTestPipeline(options=_opts()) as p:
        batches = p | beam.Create([EncodedBatch(codes[i:i + 4000]) for i in range(0, len(codes), 4000)])
        # EncodedBatch
        models = batches | DPHashedConditionals(
            shape=SHAPE, selection_budget=PureDP(epsilon=2.0),
            conditional_budget=ApproxDP(epsilon=8.0, delta=1e-6), top_r=2, seed=5)
        assert_that(models, check)


def _schema_and_csv(tmp_path, n=3000):
    codes = _forbidden_data(n, seed=2)[:, :6]
    names = list("abcdef")
    schema = {"columns": [
        {"name": nm, "type": "categorical",
         "domain": {"kind": "categorical", "values": [f"v{i}" for i in range(SHAPE[j])]}}
        for j, nm in enumerate(names)]}
    df = pd.DataFrame({nm: [f"v{v}" for v in codes[:, j]] for j, nm in enumerate(names)})
    path = tmp_path / "in.csv"
    df.to_csv(path, index=False)
    spath = tmp_path / "schema.json"
    spath.write_text(json.dumps(schema))
    return path, spath


@pytest.mark.slow  # two full SBHG runs (~13 s); SBHG redraws are audited in tests/audit/test_redraws.py
def test_synthesize_sbhg_same_seed_same_output(tmp_path):
    path, spath = _schema_and_csv(tmp_path)
    outs = []
    for i, seed in enumerate((7, 7, 8)):
        out = tmp_path / f"out{i}.csv"
        cfg = SynthesisConfig(input=str(path), schema=load_schema(str(spath)), output=str(out),
                              epsilon=4.0, delta=1e-6, method="sbhg", rows=500, seed=seed,
                              options={"top_r": 2, "burn_in": 10, "thin": 2})
        manifest = run_synthesis(cfg, _opts())
        outs.append(out.read_text())
    assert outs[0] == outs[1] and outs[0] != outs[2]
    syn = pd.read_csv(tmp_path / "out0.csv")
    assert len(syn) == 500 and list(syn.columns) == list("abcdef")
    spends = {s["step"]: s for s in manifest["release"]["budget"]["spends"]}
    assert set(spends) == {"sbhg.hash_selection", "sbhg.conditionals"}
    assert spends["sbhg.conditionals"]["delta"] == 1e-6
    assert spends["sbhg.conditionals"]["details"]["threshold"] >= 1


def test_cli_sbhg_runs_and_requires_delta(tmp_path, capsys):
    path, spath = _schema_and_csv(tmp_path, n=1000)
    out = tmp_path / "syn.csv"
    base = ["synthesize", str(path), "--schema", str(spath), "--epsilon", "3", "--output", str(out),
            "--method", "sbhg", "--seed", "1", "--quiet"]
    assert main(base) == 2
    assert "--method sbhg needs delta > 0" in capsys.readouterr().err
    assert not out.exists()
    assert main(base + ["--delta", "1e-6", "--top-r", "1", "--burn-in", "5", "--thin", "1"]) == 0
    syn = pd.read_csv(out)
    assert list(syn.columns) == list("abcdef") and len(syn) > 0
    details = json.loads(Path(f"{out}.manifest.json").read_text())["release"]
    assert {s["step"] for s in details["budget"]["spends"]} >= {"sbhg.hash_selection", "sbhg.conditionals"}
