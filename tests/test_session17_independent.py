"""``--method independent`` fits its released 1-way tables with Norm-Sub and samples balanced (H91).

Unit: the fit (one inverse-variance common total, each table Norm-Sub'd to it), the systematic
quotas split over shards (shard sizes sum to the DP count, every cell within one row of
``N·p``). Pipeline: ``SampleSynthetic`` on a fixed demo seed gives the shards' rows and exact
margins (DirectRunner; the multi-processing pair is slow). Audit: D vs D − 1 with the same draws,
the released tables differ by the removed record only and the model is a function of them.
"""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import GlobalWindow

from beamsynth.schemas.schema import EncodedBatch, load_schema
from beamsynth.transforms.budget import PureDP
from beamsynth.transforms.consistency import norm_sub
from beamsynth.transforms.measure import DPMarginals, NoisyMarginal
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.synthesis import (
    DPIndependentMarginals,
    IndependentModel,
    SampleSynthetic,
    shard_plan,
)

SCHEMA = load_schema({
    "name": "small",
    "columns": [
        {"name": "a", "type": "categorical", "domain": {"kind": "categorical",
                                                        "values": ["p", "q", "r", "s", "t"]}},
        {"name": "b", "type": "categorical", "domain": {"kind": "categorical",
                                                        "values": ["x", "y", "z"]}},
    ],
})
VALUES = [np.array([40, 9, -3, 2, -1]), np.array([30, -2, 25])]


def _marginals(values=VALUES, scales=(2.0, 2.0)) -> list[NoisyMarginal]:
    return [NoisyMarginal(columns=(j,), names=(SCHEMA.names[j],), shape=(v.size,), values=v,
                          scale=s, budget=PureDP(epsilon=1.0))
            for j, (v, s) in enumerate(zip(values, scales))]


def _counts(codes: np.ndarray) -> list[np.ndarray]:
    return [np.bincount(codes[:, j], minlength=s) for j, s in enumerate(SCHEMA.shape)]


# -- unit: the fit -------------------------------------------------------------------------------
def test_fit_is_norm_sub_to_the_inverse_variance_total():
    ms = _marginals(scales=(1.0, 3.0))
    w = np.array([1 / (m.variance * m.values.size) for m in ms])
    total = float((w * np.array([47.0, 53.0])).sum() / w.sum())
    got = IndependentModel(ms, SCHEMA.shape).probabilities
    for p, v in zip(got, VALUES):
        np.testing.assert_allclose(p, norm_sub(v, total) / total)
    # the release before: negatives clipped, positive noise kept
    old = IndependentModel(ms, SCHEMA.shape, fit="clip").probabilities
    np.testing.assert_allclose(old[0], np.clip(VALUES[0], 0, None) / 51)
    assert got[0][3] < old[0][3]
    # a table Norm-Sub leaves empty is uniform, as before
    ms = _marginals(values=[np.array([-4, -1, -2, -3, -1]), np.array([30, -2, 25])])
    p = IndependentModel(ms, SCHEMA.shape).probabilities
    np.testing.assert_allclose(p[0], np.full(5, 0.2))
    assert p[1].sum() == pytest.approx(1.0)


@pytest.mark.parametrize(("keyword", "value"), [("fit", "mean"), ("sampling", "stratified")])
def test_unknown_modes_are_refused(keyword, value):
    with pytest.raises(ValueError, match=f"{keyword} \\('{value}'\\) must be one of"):
        IndependentModel(_marginals(), SCHEMA.shape, **{keyword: value})
    with pytest.raises(ValueError, match=f"{keyword} \\('{value}'\\) must be one of"):
        DPIndependentMarginals(schema=SCHEMA, budget=PureDP(epsilon=1.0), **{keyword: value})


# -- unit: balanced quotas over shards -----------------------------------------------------------
@pytest.mark.parametrize(("rows", "shard_rows"), [(1, 7), (999, 100), (1000, 1000), (1001, 64)])
def test_shard_quotas_sum_to_the_count_and_margins_are_exact(rows, shard_rows):
    model = IndependentModel(_marginals(), SCHEMA.shape)
    plan = shard_plan(rows, shard_rows)
    common = RandomSource(seed=3).child("common")
    parts = [model.sample_shard(n, RandomSource(seed=3).child("shard", i), shard=i,
                                shards=len(plan), total=rows, common=common) for i, n in plan]
    assert sum(len(p) for p in parts) == rows
    codes = np.vstack(parts)
    for got, p in zip(_counts(codes), model.probabilities):
        assert np.all(np.abs(got - rows * p) < 1 + 1e-9), (got, rows * p)
    for part, (_, n) in zip(parts, plan):  # each shard about n·p too (its own systematic sample)
        for got, p in zip(_counts(part), model.probabilities):
            assert np.all(np.abs(got - n * p) < 2 + 1e-9)


def test_shards_are_recomputed_identically_and_iid_stays_available():
    model = IndependentModel(_marginals(), SCHEMA.shape)
    common = RandomSource(seed=3).child("common")

    def shard(i: int) -> np.ndarray:
        return model.sample_shard(100, RandomSource(seed=3).child("shard", i), shard=i, shards=3,
                                  total=300, common=common)
    np.testing.assert_array_equal(shard(1), shard(1))
    assert not np.array_equal(shard(0), shard(1))
    iid = IndependentModel(_marginals(), SCHEMA.shape, sampling="iid").sample_codes(
        300, RandomSource(seed=3))
    assert any(np.any(np.abs(c - 300 * p) >= 1.5)
               for c, p in zip(_counts(iid), model.probabilities))
    assert model.describe()["sampling"] == "balanced" and model.describe()["fit"] == "norm_sub"


def test_sparse_and_uniform_open_columns_are_balanced_without_densifying():
    model = IndependentModel([], (10**10,), sparse={0: (np.array([7, 10**9]), np.array([30, 10]))})
    codes = model.sample_codes(2000, RandomSource(seed=1))[:, 0]
    assert (codes == 7).sum() == 1500 and (codes == 10**9).sum() == 500
    empty = IndependentModel([], (10**10,), sparse={0: (np.zeros(0, np.int64), np.zeros(0))})
    codes = empty.sample_codes(1000, RandomSource(seed=1))[:, 0]
    assert codes.min() >= 0 and codes.max() < 10**10
    assert np.histogram(codes, bins=10, range=(0, 10**10))[0].tolist() == [100] * 10


# -- pipeline: the sharded sampling step ---------------------------------------------------------
def _expected_rows(model: IndependentModel, rows: int, shard_rows: int) -> list[tuple]:
    """The rows of every planned shard, drawn as a worker does (demo seed 5, global window)."""
    from beamsynth.transforms.synthesis import _sample_shard
    plan = shard_plan(rows, shard_rows)
    want = []
    for i, n in plan:
        t = _sample_shard(SCHEMA, 5, i, n, model, GlobalWindow(), shards=len(plan), total=rows)
        want.extend(zip(*(t.column(c).to_pylist() for c in SCHEMA.names)))
    return want


def _sample_pipeline(options: list[str], want: list[tuple], rows: int = 1000,
                     shard_rows: int = 150) -> None:
    """``SampleSynthetic`` (demo seed 5) releases exactly ``want``, checked with assert_that."""
    model = IndependentModel(_marginals(), SCHEMA.shape)
    with BeamTestPipeline(options=PipelineOptions(options)) as p:
        out = (p | beam.Create([(model, rows)])
               | SampleSynthetic(schema=SCHEMA, seed=5, shard_rows=shard_rows)
               | beam.FlatMap(lambda t: zip(*(t.column(c).to_pylist() for c in SCHEMA.names))))
        assert_that(out, equal_to(want))


def test_sampled_rows_are_the_shards_rows_with_the_model_margins():
    model = IndependentModel(_marginals(), SCHEMA.shape)
    want = _expected_rows(model, 1000, 150)
    codes = np.array([[SCHEMA.columns[j].domain.encode(v) for j, v in enumerate(r)] for r in want])
    for got, p in zip(_counts(codes), model.probabilities):
        assert np.all(np.abs(got - 1000 * p) < 1 + 1e-9)
    _sample_pipeline(["--direct_running_mode=in_memory"], want)


@pytest.mark.slow  # worker processes; test_sampled_rows_are_the_shards_rows_with_... covers the rows
def test_multi_processing_samples_the_same_rows():
    want = _expected_rows(IndependentModel(_marginals(), SCHEMA.shape), 1000, 150)
    _sample_pipeline(["--direct_running_mode=multi_processing", "--direct_num_workers=2"], want)


# -- audit: D vs D − 1 with the same draws ---------------------------------------------------------
def _neighbour_check(_, removed, released_d, released_e, model_d, model_e) -> bool:
    """The released tables differ by the removed record's cells only (the same noise draws) and
    each model is the Norm-Sub fit of exactly its released tables."""
    for j, cell in enumerate(removed):
        diff = released_d[j].values - released_e[j].values
        if diff.tolist() != np.eye(SCHEMA.shape[j], dtype=int)[cell].tolist():
            return False
    for model, released in ((model_d, released_d), (model_e, released_e)):
        fitted = IndependentModel(released, SCHEMA.shape).probabilities
        if model.describe()["fit"] != "norm_sub" or not all(
                np.array_equal(a, b) for a, b in zip(model.probabilities, fitted)):
            return False
    return True


@pytest.mark.audit
def test_neighbours_differ_in_released_tables_only_and_the_fit_reads_only_them():
    """Seed 11, ε 1: D (60 records) and D − 1 through DPMarginals and DPIndependentMarginals in
    one pipeline: the new fit and sampling are post-processing of the same released tables."""
    rng = np.random.default_rng(0)
    codes = np.column_stack([rng.integers(0, s, 60) for s in SCHEMA.shape]).astype(np.int64)
    budgets = list(PureDP(epsilon=1.0).split({"a": 1.0, "b": 1.0}).values())
    with BeamTestPipeline(options=PipelineOptions(["--direct_running_mode=in_memory"])) as p:
        side = []
        for name, rows in (("D", codes), ("Dm1", codes[1:])):
            batches = p | f"Create{name}" >> beam.Create([EncodedBatch(rows, None)])
            side.append(batches | f"Tables{name}" >> DPMarginals(
                specs=[(0,), (1,)], shape=SCHEMA.shape, names=SCHEMA.names, budgets=budgets,
                seed=11))
            side.append(batches | f"Model{name}" >> DPIndependentMarginals(
                schema=SCHEMA, budget=PureDP(epsilon=1.0), seed=11))
        checked = (p | "One" >> beam.Create([0])
                   | beam.Map(_neighbour_check, codes[0].tolist(),
                              *(beam.pvalue.AsSingleton(side[i]) for i in (0, 2, 1, 3))))
        assert_that(checked, equal_to([True]))


# -- the option: i.i.d. kept, named in the manifest ------------------------------------------------
def test_iid_is_an_explicit_option_stated_in_the_method_details():
    from beamsynth.pipelines.methods.registry import IndependentMethod, method_option_names
    from beamsynth.transforms.budget import PrivacyAccountant

    def method(options):
        return IndependentMethod(schema=SCHEMA, accountant=PrivacyAccountant(total=PureDP(epsilon=1.0)),
                                 budget=PureDP(epsilon=1.0), max_contributions=1, seed=None,
                                 options=options)
    assert method_option_names("independent") == {"independent_sampling"}
    assert method({}).details() == {"fit": "norm_sub", "sampling": "balanced"}
    iid = method({"independent_sampling": "iid"})
    assert iid.details() == {"fit": "norm_sub", "sampling": "iid"}
    assert [s.step for s in iid.accountant.spends] == ["independent.marginals"]  # spends unchanged
    with pytest.raises(ValueError, match="must be one of"):
        method({"independent_sampling": "stratified"})
