"""PrivBayes in Beam pipelines: TestPipeline + assert_that, seeded determinism, CLI manifest."""

from __future__ import annotations

import json
from pathlib import Path

import apache_beam as beam
import numpy as np
import pandas as pd
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that

from beamsynth.pipelines.quality import encode_frame
from beamsynth.pipelines.synthesize import SynthesisConfig, run_synthesis
from beamsynth.schemas.schema import EncodedBatch, load_schema
from beamsynth.transforms.budget import PrivacyAccountant, PureDP
from beamsynth.transforms.privbayes import DPPrivBayes, PrivBayesModel, PrivBayesSynthesizer

ADULT = Path(__file__).resolve().parents[3] / "shared" / "data" / "adult" / "adult.csv"
needs_adult = pytest.mark.skipif(not ADULT.exists(), reason=f"{ADULT} (../shared/data) is absent")
SCHEMA = load_schema("adult")


def _options():
    return PipelineOptions(["--runner=DirectRunner"])


def _sample_codes(rows: int = 3000) -> np.ndarray:
    df = pd.read_csv(ADULT, dtype=str, keep_default_na=False, nrows=rows)
    return encode_frame(SCHEMA, df)[0]


def _batches(codes):
    return [EncodedBatch(part) for part in np.array_split(codes, 4)]


@needs_adult
def test_synthesizer_emits_valid_codes_and_spends_budget():
    codes = _sample_codes()
    acc = PrivacyAccountant(total=PureDP(epsilon=1.0))
    shape = np.asarray(SCHEMA.shape)

    def check(tables):
        total = sum(t.num_rows for t in tables)
        assert total == 700, total
        frame = pd.concat([t.to_pandas() for t in tables])
        enc, dropped = encode_frame(SCHEMA, frame)
        assert dropped == 0 and enc.shape == (700, len(shape))
        assert np.all(enc >= 0) and np.all(enc < shape)

    with BeamTestPipeline(options=_options()) as p:
        out = (p | beam.Create(_batches(codes))
               | PrivBayesSynthesizer(schema=SCHEMA, budget=PureDP(epsilon=1.0), rows=700, seed=11,
                                      shard_rows=300, accountant=acc))
        assert_that(out | beam.combiners.ToList(), lambda got: check(got[0]))
    assert [s.step for s in acc.spends] == ["privbayes.structure", "privbayes.marginals"]
    assert acc.spent_epsilon == pytest.approx(1.0)


@needs_adult
def test_model_is_a_privbayes_network_over_every_column():
    codes = _sample_codes()

    def check(models):
        (m,) = models
        assert isinstance(m, PrivBayesModel)
        assert sorted(x for x, _ in m.structure) == list(range(len(SCHEMA.columns)))
        assert all(len(ps) <= 2 for _, ps in m.structure)

    with BeamTestPipeline(options=_options()) as p:
        models = p | beam.Create(_batches(codes)) | DPPrivBayes(
            schema=SCHEMA, budget=PureDP(epsilon=1.0), seed=5)
        assert_that(models, check)


@needs_adult
def test_cli_path_is_seeded_and_manifest_lists_spends(tmp_path):
    df = pd.read_csv(ADULT, dtype=str, keep_default_na=False, nrows=2000)
    src = tmp_path / "in.csv"
    df[SCHEMA.names].to_csv(src, index=False)
    outs = []
    for run in ("a", "b"):
        out = tmp_path / f"out_{run}.csv"
        cfg = SynthesisConfig(input=str(src), schema=SCHEMA, output=str(out), epsilon=1.0,
                              method="privbayes", seed=21, options={"degree": 2})
        manifest = run_synthesis(cfg, _options())
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    text = json.dumps(manifest)
    for step in ("row_count", "privbayes.structure", "privbayes.marginals"):
        assert step in text
    other = tmp_path / "out_c.csv"
    run_synthesis(SynthesisConfig(input=str(src), schema=SCHEMA, output=str(other), epsilon=1.0,
                                  method="privbayes", seed=22), _options())
    assert other.read_bytes() != outs[0]


def test_sampling_mode_is_validated_when_the_pipeline_is_built():
    with pytest.raises(ValueError, match=r"sampling \('stratified'\)"):
        DPPrivBayes(schema=SCHEMA, budget=PureDP(epsilon=1.0), sampling="stratified")


@needs_adult
def test_cli_sampling_option_reaches_the_model(tmp_path):
    df = pd.read_csv(ADULT, dtype=str, keep_default_na=False, nrows=1000)
    src = tmp_path / "in.csv"
    df[SCHEMA.names].to_csv(src, index=False)
    outs = {}
    for mode in ("balanced", "iid"):
        out = tmp_path / f"out_{mode}.csv"
        run_synthesis(SynthesisConfig(input=str(src), schema=SCHEMA, output=str(out), epsilon=1.0,
                                      method="privbayes", seed=23, rows=500,
                                      options={"sampling": mode}), _options())
        outs[mode] = pd.read_csv(out, dtype=str, keep_default_na=False)
    # same seed → same released tables and structure; only the sampling differs
    assert len(outs["balanced"]) == len(outs["iid"]) == 500
    assert not outs["balanced"].equals(outs["iid"])
