"""Audits of issue 15, weakenings 4 and 5: released file order, ledger windows, public metadata.

Order: a released file's row order must carry nothing of the private input order. For
``plausible`` (the one method that emits records per seed) the same multiset of input records in
two orders — sorted by a latent value ``z`` (order A) and round-robin over ``z`` (order B) — goes
through the real ``run_synthesis`` pipeline with a fixed seed. Two checks:

* structural: the file equals :func:`~beamsynth.transforms.plausible.ordered_release` of its own
  multiset (the order is a function of the released rows and the run's randomness alone), for
  ``D`` in order A and ``D`` plus one record in order B;
* statistical: the share of adjacent rows with the same ``z`` is the same under A and B (measured
  0.052 / 0.052). The unshuffled emission of before (the broken variant: candidates written per
  seed, in seed-batch order) measured 0.965 under A and 0.625 under B.

The model-sampling methods (``independent``, ``privbayes``, ``sbhg``) draw from a released model in
(window, shard) order: permuting the input gives a byte-identical file under a fixed seed.

Ledger: see the second half of this file.
"""

from __future__ import annotations

from pathlib import Path

import apache_beam as beam
import numpy as np
import pandas as pd
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

import beamsynth.pipelines.plausible as plausible_pipeline
from beamsynth.pipelines.synthesize import SynthesisConfig, run_synthesis
from beamsynth.schemas.schema import load_schema
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.plausible import ordered_release

pytestmark = pytest.mark.audit

OPTIONS = PipelineOptions(["--runner=DirectRunner", "--direct_num_workers=1"])
LEVELS = 40  # values of the latent z (every column has this domain)
PER_LEVEL = 40  # records per z value
SEED = 11
ORDER_SCHEMA = load_schema({
    "name": "order-audit",
    "columns": [{"name": c, "type": "categorical",
                 "domain": {"kind": "categorical", "values": [f"v{i:02d}" for i in range(LEVELS)]}}
                for c in ("a", "b", "c")],
})
PLAUSIBLE = {"k": 10, "gamma": 4.0, "epsilon0": 5.0, "omega": 1, "plausible_t": 1}


def _records() -> list[tuple[int, int, int]]:
    """``PER_LEVEL`` records (z, z, z) per z, one column in ten replaced by a random value."""
    rs = RandomSource(seed=5)
    z = np.repeat(np.arange(LEVELS), PER_LEVEL)
    codes = np.stack([z, z, z], axis=1)
    swap = rs.child("swap").uniform(codes.shape) < 0.1
    codes[swap] = rs.child("value").integers(LEVELS, int(swap.sum()))
    return [tuple(r) for r in codes.tolist()]


def _z(row) -> int:
    return int(np.bincount(row, minlength=LEVELS).argmax())


def _order_a(records):  # sorted by z (the input's natural order)
    return sorted(records, key=lambda r: (_z(r), r))


def _order_b(records):  # round-robin over z: consecutive records have different z
    rank: dict[int, int] = {}
    keyed = []
    for r in _order_a(records):
        rank[_z(r)] = rank.get(_z(r), -1) + 1
        keyed.append(((rank[_z(r)], _z(r)), r))
    return [r for _, r in sorted(keyed)]


def _write(path: Path, records) -> Path:
    path.write_text("a,b,c\n" + "".join(",".join(f"v{v:02d}" for v in r) + "\n" for r in records),
                    encoding="utf-8")
    return path


def _plausible(tmp_path: Path, name: str, records) -> np.ndarray:
    src = _write(tmp_path / f"{name}.csv", records)
    out = tmp_path / f"{name}.out.csv"
    run_synthesis(SynthesisConfig(input=str(src), schema=ORDER_SCHEMA, output=str(out), epsilon=1e5,
                                  delta=1e-6, method="plausible", rows=len(records), seed=SEED,
                                  options=dict(PLAUSIBLE), block_rows=200), OPTIONS)
    df = pd.read_csv(out, dtype=str)
    return np.stack([df[c].str[1:].astype(int).to_numpy() for c in "abc"], axis=1)


def _same_z_share(codes: np.ndarray) -> float:
    """Share of adjacent rows whose latent z (the mode of the row) is the same."""
    z = np.array([_z(r) for r in codes])
    return float(np.mean(z[1:] == z[:-1]))


def _as_ordered_release(codes: np.ndarray) -> np.ndarray:
    parts = ordered_release(codes, shape=ORDER_SCHEMA.shape, shards=16, seed=SEED)
    return np.concatenate([rows for _, rows in parts], axis=0)


class _SeedOrder(beam.PTransform):
    """The broken variant: released batches written as the privacy test emits them (per seed)."""

    def __init__(self, **_kw) -> None:
        super().__init__()

    def expand(self, released):
        return released | "AsEmitted" >> beam.Map(lambda b: ("", b))


def test_plausible_file_order_is_a_function_of_the_released_rows(tmp_path):
    records = _records()
    a = _plausible(tmp_path, "a", _order_a(records))
    b = _plausible(tmp_path, "b", [(7, 7, 7)] + _order_b(records))  # other order, D + one record
    for got in (a, b):
        assert len(got) > 500
        np.testing.assert_array_equal(got, _as_ordered_release(got))
    # measured (1259 and 1293 rows): 0.052 and 0.052; each share has SD ≈ 0.006, so a false
    # failure needs a > 10 SD gap. The broken variant below measured 0.965 and 0.625.
    share_a, share_b = _same_z_share(a), _same_z_share(b)
    assert abs(share_a - share_b) < 0.1, (share_a, share_b)


def test_audit_catches_the_per_seed_emission(tmp_path, monkeypatch):
    monkeypatch.setattr(plausible_pipeline, "OrderReleased", _SeedOrder)
    records = _records()
    a = _plausible(tmp_path, "a", _order_a(records))
    b = _plausible(tmp_path, "b", [(7, 7, 7)] + _order_b(records))
    share_a, share_b = _same_z_share(a), _same_z_share(b)
    assert share_a - share_b > 0.2, (share_a, share_b)  # the order mirrors the input order
    assert not np.array_equal(a, _as_ordered_release(a))


@pytest.mark.parametrize("method", ["independent", pytest.param("privbayes", marks=pytest.mark.slow),
                                    pytest.param("sbhg", marks=pytest.mark.slow)])
def test_model_sampling_methods_write_the_same_file_for_any_input_order(tmp_path, method):
    records = _records()
    files = []
    for name, order in (("a", _order_a(records)), ("b", _order_b(records))):
        src = _write(tmp_path / f"{name}.csv", order)
        out = tmp_path / f"{method}-{name}.csv"
        run_synthesis(SynthesisConfig(input=str(src), schema=ORDER_SCHEMA, output=str(out),
                                      epsilon=1.0, delta=1e-6, method=method, rows=300, seed=SEED,
                                      block_rows=200), OPTIONS)
        files.append(out.read_bytes())
    assert files[0] == files[1] and files[0].count(b"\n") == 301
