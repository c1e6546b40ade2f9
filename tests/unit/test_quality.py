"""Unit tests for beamsynth.pipelines.releases.quality (exact arithmetic on tiny tables)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from beamsynth.pipelines.releases.quality import (
    as_codes,
    encode_frame,
    marginal_table,
    marginal_tvds,
    ml_efficacy,
    quality_report,
    random_marginals,
    tvd,
)
from beamsynth.schemas.schema import load_schema

SCHEMA = load_schema(
    {
        "name": "tiny",
        "columns": [
            {"name": "a", "type": "categorical", "domain": {"kind": "categorical", "values": ["x", "y"]}},
            {"name": "b", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 9,
                                                        "edges": [0, 5, 10]}},
            {"name": "c", "type": "categorical", "domain": {"kind": "categorical", "values": ["p", "q", "r"]},
             "nullable": True},
        ],
    }
)


def test_tvd_exact_values():
    assert tvd([1, 0], [0, 1]) == 1.0
    assert tvd([1, 1], [2, 2]) == 0.0
    assert tvd([3, 1], [1, 1]) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="differ in size"):
        tvd([1, 2], [1, 2, 3])


def test_marginal_table_covers_declared_cells():
    codes = np.array([[0, 1, 3], [1, 0, 0], [1, 1, 3]])
    t = marginal_table(codes, SCHEMA.shape, (0, 2))
    assert t.shape == (2 * 4,)
    assert t.sum() == pytest.approx(1.0)
    assert t[np.ravel_multi_index((1, 3), (2, 4))] == pytest.approx(1 / 3)
    assert np.allclose(marginal_table(np.empty((0, 3), int), SCHEMA.shape, (0,)), [0.5, 0.5])


def test_encode_frame_bins_and_drops_out_of_domain():
    frame = pd.DataFrame({"a": ["x", "y", "z"], "b": [3, "7", 4], "c": ["p", "", "r"]})
    codes, dropped = encode_frame(SCHEMA, frame)
    assert dropped == 1
    assert codes.tolist() == [[0, 0, 0], [1, 1, 3]]


def test_as_codes_rejects_out_of_range():
    with pytest.raises(ValueError, match="outside the declared cells"):
        as_codes(SCHEMA, np.array([[0, 2, 0]]))
    with pytest.raises(ValueError, match="shape"):
        as_codes(SCHEMA, np.zeros((2, 2), dtype=int))


def test_random_marginals_seeded_and_distinct():
    a = random_marginals(14, 3, 100, seed=3)
    assert a == random_marginals(14, 3, 100, seed=3)
    assert a != random_marginals(14, 3, 100, seed=4)
    assert len(set(a)) == 100 and all(len(s) == 3 and list(s) == sorted(s) for s in a)
    assert random_marginals(4, 3, 100) == list(itertools.combinations(range(4), 3))
    assert len(random_marginals(14, 3, 100)) == 100 <= math.comb(14, 3)


def test_quality_report_identical_and_shifted():
    rng = np.random.default_rng(0)
    real = np.column_stack([rng.integers(0, 2, 500), rng.integers(0, 2, 500), rng.integers(0, 4, 500)])
    same = quality_report(SCHEMA, real, real.copy(), n_three_way=5)
    assert same.tvd1 == same.tvd2 == same.tvd3 == 0.0
    shifted = real.copy()
    shifted[:, 0] = 1 - shifted[:, 0]  # swaps a's cells: 1-way a TVD = |p0 - p1|
    rep = quality_report(SCHEMA, real, shifted, n_three_way=1)
    p0 = np.mean(real[:, 0] == 0)
    assert rep.per_marginal[(0,)] == pytest.approx(abs(2 * p0 - 1))
    assert rep.per_marginal[(1,)] == 0.0
    assert rep.tvd1 == pytest.approx(abs(2 * p0 - 1) / 3)
    assert marginal_tvds(real, shifted, SCHEMA.shape, [(1, 2)]) == [0.0]


@pytest.mark.slow  # fits sklearn models (~20 s on 2 cores)
def test_ml_efficacy_learns_a_deterministic_rule():
    pytest.importorskip("sklearn")
    rng = np.random.default_rng(1)
    b = rng.integers(0, 2, 400)
    c = rng.integers(0, 3, 400)
    codes = np.column_stack([b, b, c])  # a == b's bin: perfectly predictable
    out = ml_efficacy(SCHEMA, codes, codes, target="a")
    assert out["accuracy"] == 1.0 and out["auc"] == 1.0
    flat = codes.copy()
    flat[:, 0] = 0
    const = ml_efficacy(SCHEMA, flat, codes, target="a")
    assert const["auc"] == 0.5
    assert const["accuracy"] == pytest.approx(np.mean(codes[:, 0] == 0))
    with pytest.raises(ValueError, match="2 declared values"):
        ml_efficacy(SCHEMA, codes, codes, target="c")
