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

from beamsynth.pipelines.methods.synthesize import SynthesisConfig, run_synthesis
from beamsynth.pipelines.releases.quality import encode_frame
from beamsynth.schemas.schema import EncodedBatch, load_schema
from beamsynth.transforms.budget import PrivacyAccountant, PureDP
from beamsynth.transforms.privbayes import DPPrivBayes, PrivBayesModel, PrivBayesSynthesizer
from beamsynth.transforms.refine import DEFAULT_REFINE_FRACTION, DEFAULT_REFINE_PAIRS, RefinedModel

ADULT = Path(__file__).resolve().parents[2] / "examples" / "data" / "adult" / "adult.csv"  # bundled
needs_adult = pytest.mark.skipif(not ADULT.exists(), reason=f"{ADULT} is absent")
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
    assert [s.step for s in acc.spends] == ["privbayes.structure", "privbayes.marginals",
                                            "privbayes.refine.selection", "privbayes.refine.marginals"]
    assert acc.spent_epsilon == pytest.approx(1.0)


@needs_adult
@pytest.mark.parametrize(("refine_pairs", "max_parents"), [(0, 2), (None, 1)])
def test_model_is_a_privbayes_network_over_every_column(refine_pairs, max_parents):
    """Without refinement (degree 2) the model is the network itself; by default (degree 1) a
    RefinedModel whose ``base`` is the network and whose targets are the released coarse pairs."""
    codes = _sample_codes()
    extra = {} if refine_pairs is None else {"refine_pairs": refine_pairs}

    def check(models):
        (m,) = models
        if refine_pairs == 0:
            assert isinstance(m, PrivBayesModel)
            net = m
        else:
            assert isinstance(m, RefinedModel) and isinstance(m.base, PrivBayesModel)
            # the network's own (x, parents) tables first, then the refinement's coarse pairs
            families = [(x, *ps) for x, ps in m.base.structure if ps]
            assert len(m.targets) == len(families) + DEFAULT_REFINE_PAIRS
            assert [t.columns for t in m.targets[:len(families)]] == families
            net = m.base
        assert sorted(x for x, _ in net.structure) == list(range(len(SCHEMA.columns)))
        assert all(len(ps) <= max_parents for _, ps in net.structure)
        assert any(len(ps) == max_parents for _, ps in net.structure)

    with BeamTestPipeline(options=_options()) as p:
        models = p | beam.Create(_batches(codes)) | DPPrivBayes(
            schema=SCHEMA, budget=PureDP(epsilon=1.0), seed=5, **extra)
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


# -- the refinement (transforms/refine.py) through the CLI and the synthesizer ----------------------
@needs_adult
def test_cli_refine_flag_controls_the_refinement_spends(tmp_path):
    """``--pb-refine-pairs 0``: only the network's two spends; default: four, summing to the
    method's budget (total ε minus the row count)."""
    from beamsynth.pipelines.cli.main import main

    df = pd.read_csv(ADULT, dtype=str, keep_default_na=False, nrows=1000)
    src = tmp_path / "in.csv"
    df[SCHEMA.names].to_csv(src, index=False)
    spends = {}
    for name, extra in (("off", ["--pb-refine-pairs", "0"]), ("default", [])):
        out = tmp_path / f"{name}.csv"
        assert main(["synthesize", str(src), "--schema", "adult", "--method", "privbayes",
                     "--epsilon", "1", "--seed", "4", "--output", str(out), "--quiet",
                     "--pb-sizing", "off", *extra]) == 0  # auto adds privbayes.size_count
        budget = json.loads(Path(f"{out}.manifest.json").read_text())["release"]["budget"]
        assert budget["spent"]["epsilon"] == pytest.approx(1.0)
        spends[name] = {s["step"]: s["epsilon"] for s in budget["spends"]}
        assert len(pd.read_csv(out, dtype=str, keep_default_na=False)) > 0
    assert list(spends["off"]) == ["row_count", "privbayes.structure", "privbayes.marginals"]
    assert list(spends["default"]) == ["row_count", "privbayes.structure", "privbayes.marginals",
                                       "privbayes.refine.selection", "privbayes.refine.marginals"]
    method_eps = 1.0 - spends["default"]["row_count"]
    pb = {k: v for k, v in spends["default"].items() if k.startswith("privbayes.")}
    assert sum(pb.values()) == pytest.approx(method_eps, rel=1e-12)
    refine = pb["privbayes.refine.selection"] + pb["privbayes.refine.marginals"]
    assert refine == pytest.approx(DEFAULT_REFINE_FRACTION * method_eps, rel=1e-12)
    assert pb["privbayes.refine.selection"] == pytest.approx(0.2 * refine, rel=1e-12)


@needs_adult
def test_refined_synthesizer_emits_codes_in_every_domain():
    codes = _sample_codes(2000)
    shape = np.asarray(SCHEMA.shape)
    acc = PrivacyAccountant(total=PureDP(epsilon=2.0))

    def check(tables):
        frame = pd.concat([t.to_pandas() for t in tables])
        enc, dropped = encode_frame(SCHEMA, frame)
        assert dropped == 0 and enc.shape == (900, len(shape))
        assert np.all(enc >= 0) and np.all(enc < shape)
        # every column varies: the raked pool is not collapsed onto a few records
        assert all(len(np.unique(enc[:, j])) > 1 for j in range(len(shape)))

    with BeamTestPipeline(options=_options()) as p:
        out = (p | beam.Create(_batches(codes))
               | PrivBayesSynthesizer(schema=SCHEMA, budget=PureDP(epsilon=2.0), rows=900, seed=3,
                                      shard_rows=400, refine_pairs=6, refine_rounds=2,
                                      accountant=acc))
        assert_that(out | beam.combiners.ToList(), lambda got: check(got[0]))
    refine = [s for s in acc.spends if s.step.startswith("privbayes.refine.")]
    assert [s.details.get("tables", s.details.get("picks")) for s in refine] == [6, 6]
    assert acc.spent_epsilon == pytest.approx(2.0)


@pytest.mark.parametrize("option", ["refine_rounds", "refine_groups", "refine_fraction"])
def test_cli_zero_refine_option_is_refused_when_the_pipeline_is_built(option):
    from beamsynth.pipelines.methods.synthesize import plan_synthesis

    cfg = SynthesisConfig(input="in.csv", schema=SCHEMA, output="out.csv", epsilon=1.0,
                          method="privbayes", rows=10, options={option: 0})
    with pytest.raises(ValueError, match=rf"--pb-{option.replace('_', '-')} 0 must be"):  # its flag
        plan_synthesis(cfg)
