"""Schema'd rows of released values (transforms/outputs.py): labels, types, order."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from beamsynth.schemas.schema import load_schema
from beamsynth.transforms.budget import PureDP
from beamsynth.transforms.cathist import ReleasedHistogram, plan_cathist
from beamsynth.transforms.measure import NoisyMarginal
from beamsynth.transforms.outputs import (
    arrow_schema,
    histogram_rows,
    marginal_rows,
    marginal_type,
    table_rows,
)

SCHEMA = load_schema({
    "name": "toy",
    "columns": [
        {"name": "sex", "type": "categorical", "domain": {"kind": "categorical", "values": ["F", "M"]}},
        {"name": "age-band", "type": "integer", "nullable": True,
         "domain": {"kind": "integer", "low": 10, "high": 12}},
    ],
})


def test_marginal_rows_cover_every_cell_with_decoded_typed_labels():
    m = NoisyMarginal(columns=(0, 1), names=("sex", "age-band"), shape=(2, 4),
                      values=np.arange(8).reshape(2, 4), scale=1.0, budget=PureDP(epsilon=1.0))
    rows = [r._asdict() for r in marginal_rows(m, SCHEMA)]
    assert rows[:5] == [{"sex": "F", "age_band": 10, "noisy_count": 0},
                        {"sex": "F", "age_band": 11, "noisy_count": 1},
                        {"sex": "F", "age_band": 12, "noisy_count": 2},
                        {"sex": "F", "age_band": None, "noisy_count": 3},
                        {"sex": "M", "age_band": 10, "noisy_count": 4}]
    assert len(rows) == 8
    assert arrow_schema(marginal_type(SCHEMA, ["sex", "age-band"])) == pa.schema([
        pa.field("sex", pa.string(), nullable=False), pa.field("age_band", pa.int64()),
        pa.field("noisy_count", pa.int64(), nullable=False)])


def test_histogram_rows_largest_first_and_records_from_tables():
    plan = plan_cathist(epsilon=1.0, tolerance=0.5, domain_size=4)
    rel = ReleasedHistogram(np.array([0, 1, 3]), np.array([5, 9, 5]), plan)
    col = SCHEMA.column("age-band")
    assert [tuple(r._asdict().values()) for r in histogram_rows(rel, col)] == [
        (11, 9), (10, 5), (None, 5)]
    table = pa.table({"sex": ["M"], "age-band": [None]})
    assert [r._asdict() for r in table_rows(table, SCHEMA)] == [{"sex": "M", "age_band": None}]


def test_arrow_schema_refuses_other_things():
    with pytest.raises(TypeError) as err:
        arrow_schema(3)
    assert str(err.value) == "arrow_schema takes a Schema or a PCollection of beamsynth rows, got int (3)"
