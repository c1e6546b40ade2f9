"""One-pass marginal measurement throughput vs a plain numpy bincount floor (issue 2).

Resamples the bundled Adult data (encoded with the bundled schema) to N rows, then measures the
same marginal tables two ways in the same run:

* numpy floor: one ``np.bincount`` per table over the whole in-memory code matrix;
* beamsynth: a DirectRunner pipeline whose elements are columnar ``EncodedBatch``es (20k rows),
  counted by ``MarginalCountsCombineFn`` in ``CombineGlobally`` — the measurement engine every
  mechanism uses.

Both sides include generating the resampled rows (numpy indexing) and neither includes loading
and encoding Adult (the pipeline reads the codes from a ``.npy`` file written before timing), so
the ratio compares the counting engines plus Beam's fixed cost per pipeline (~0.2 s, which
dominates at 1M rows). Prints rows/s for each and the ratio (goal: beamsynth ≥ 25% of numpy).

    python benchmarks/marginals.py --rows 1000000 --tables 1way
    python benchmarks/marginals.py --rows 1000000 --tables 2way
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import time
from pathlib import Path

import apache_beam as beam
import numpy as np
import pandas as pd

from beamsynth.runners.presets import options_for
from beamsynth.schemas.schema import EncodedBatch, load_schema
from beamsynth.transforms.measure import MarginalCountsCombineFn, count_marginals

ADULT = Path(__file__).resolve().parents[1] / "examples" / "data" / "adult" / "adult.csv"


def adult_codes() -> np.ndarray:
    schema = load_schema("adult")
    df = pd.read_csv(ADULT, dtype=str, keep_default_na=False)
    batch, bad = schema.encode_columns({c: df[c] for c in schema.names}, len(df))
    assert not bad
    return batch.codes


def resample(codes: np.ndarray, start: int, n: int) -> np.ndarray:
    """Rows ``start..start+n`` of a deterministic i.i.d. resample of ``codes``."""
    idx = np.random.Generator(np.random.PCG64(start)).integers(0, codes.shape[0], n)
    return codes[idx]


def numpy_floor(codes: np.ndarray, rows: int, batch: int, specs, shape) -> tuple[float, list]:
    t = time.perf_counter()
    data = np.concatenate([resample(codes, s, min(batch, rows - s)) for s in range(0, rows, batch)])
    tables = []
    for cols in specs:
        dims = tuple(shape[c] for c in cols)
        flat = data[:, cols[0]] if len(cols) == 1 else np.ravel_multi_index(
            tuple(data[:, c] for c in cols), dims)
        tables.append(np.bincount(flat, minlength=int(np.prod(dims))))
    return time.perf_counter() - t, tables


class _ResampleFn(beam.DoFn):
    """Makes batch ``start`` of the resample; loads the encoded Adult codes (a ``.npy`` file
    written before timing, as the numpy side has them in memory) once per worker in ``setup``
    (capturing the array in a lambda would make Beam pickle and bz2 it once per stage)."""

    def __init__(self, rows: int, batch: int, codes_path: str) -> None:
        self._rows, self._batch, self._path = rows, batch, codes_path

    def setup(self) -> None:
        self._codes = np.load(self._path)

    def process(self, start: int):
        yield EncodedBatch(resample(self._codes, start, min(self._batch, self._rows - start)))


def beam_measure(codes_path: str, rows: int, batch: int, specs, shape, runner_args) -> tuple[float, list]:
    out: list = []
    t = time.perf_counter()
    with beam.Pipeline(options=options_for(runner_args)) as p:
        (
            p
            | beam.Create(list(range(0, rows, batch)))
            | "Resample" >> beam.ParDo(_ResampleFn(rows, batch, codes_path))
            | "Count" >> beam.CombineGlobally(MarginalCountsCombineFn(specs, shape))
            | "Keep" >> beam.Map(out.append)
        )
    return time.perf_counter() - t, list(out[0]) if out else []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=20_000)
    ap.add_argument("--tables", choices=["1way", "2way"], default="1way",
                    help="1way: the 15 one-way tables; 2way: all 15 one-way + 105 two-way tables")
    ap.add_argument("--repeat", type=int, default=3, help="runs per side; the median is reported")
    args, runner_args = ap.parse_known_args()
    schema = load_schema("adult")
    shape = schema.shape
    m = len(shape)
    specs = [(j,) for j in range(m)]
    if args.tables == "2way":
        specs += list(itertools.combinations(range(m), 2))
    codes = adult_codes()
    tmp = tempfile.TemporaryDirectory()
    codes_path = os.path.join(tmp.name, "adult_codes.npy")
    np.save(codes_path, codes)  # untimed, like the numpy side's in-memory codes
    beam_measure(codes_path, args.batch, args.batch, specs, shape, runner_args)  # warm-up
    np_times, bm_times = [], []
    for _ in range(args.repeat):
        tn, ref = numpy_floor(codes, args.rows, args.batch, specs, shape)
        tb, got = beam_measure(codes_path, args.rows, args.batch, specs, shape, runner_args)
        np_times.append(tn)
        bm_times.append(tb)
        for a, b in zip(ref, got):
            assert np.array_equal(a.ravel(), b.ravel()), "beam tables differ from numpy"
    assert count_marginals(codes[:10], specs, shape)[0].sum() == 10
    tn, tb = float(np.median(np_times)), float(np.median(bm_times))
    print(f"rows={args.rows:,} tables={len(specs)} ({args.tables}) batch={args.batch:,} repeat={args.repeat}")
    print(f"numpy bincount floor : {tn:7.3f} s  {args.rows / tn / 1e6:7.2f} M rows/s")
    print(f"beamsynth one pass   : {tb:7.3f} s  {args.rows / tb / 1e6:7.2f} M rows/s  (DirectRunner)")
    print(f"ratio beamsynth/numpy throughput = {tn / tb:.2f}  (goal >= 0.25); tables identical: yes")


if __name__ == "__main__":
    main()
