"""Speed: CatHist over n ≈ 10^10 word pairs vs the plain noisy histogram of the same column.

Data: 1,000,000 rows of one column ``pair``, drawn from 1,000 English word pairs with Zipf(1.1)
weights (seeded; written once to a temporary CSV). Both pipelines read the same file with
``ReadRecords`` on the DirectRunner and spend ε = 1:

* baseline: the plain noisy histogram — the 1,000 pairs declared as a categorical domain,
  measured with ``DPMarginals`` (discrete Laplace on every declared cell);
* CatHist: the column declared over all 104,334² ≈ 1.09·10^10 word pairs (``ProductDomain``),
  released with ``DPCategoricalHistogram`` (ρ = 0.5).

Also times the Beam-free cores on pre-encoded codes (count + noise vs count + CatHist release)
so the cost of the out-of-data simulation is visible on its own. Goal: CatHist within 2× of the
baseline. Prints seconds and ratios measured in the same run (best of ``--repeat``).

Run: ``nice -n 10 python benchmarks/cathist_speed.py [--rows 1000000] [--repeat 2]``.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from pathlib import Path

import apache_beam as beam
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions

from beamsynth.pipelines.io.read import ReadRecords
from beamsynth.schemas.domains import CategoricalDomain, ProductDomain
from beamsynth.schemas.schema import Column, Schema
from beamsynth.transforms.budget import PureDP
from beamsynth.transforms.cathist import (
    DPCategoricalHistogram,
    count_values,
    plan_cathist,
    release_histogram,
)
from beamsynth.transforms.measure import DPMarginals, count_marginals, noisy_marginals
from beamsynth.transforms.noise import RandomSource

ROOT = Path(__file__).resolve().parents[1]
WORDS = ROOT.parent / "shared" / "data" / "text" / "dict_words_american_english.txt"
DISTINCT = 1_000


def make_data(path: Path, rows: int, words: CategoricalDomain) -> list[str]:
    """Write ``rows`` Zipf-distributed word pairs to ``path``; returns the 1,000 pairs used."""
    gen = RandomSource(seed=20261122).numpy_generator()
    idx = gen.choice(words.size, size=(DISTINCT, 2), replace=False)
    pairs = sorted({f"{words.decode(int(a))} {words.decode(int(b))}" for a, b in idx})
    weights = 1.0 / np.arange(1, len(pairs) + 1) ** 1.1
    draw = gen.choice(len(pairs), size=rows, p=weights / weights.sum())
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["pair"])
        w.writerows([pairs[i]] for i in draw.tolist())
    return pairs


def _pipeline_seconds(path: Path, column: Column, measure: beam.PTransform) -> float:
    schema = Schema(name="bench", columns=(column,))
    start = time.perf_counter()
    with beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"])) as p:
        read = p | "Read" >> ReadRecords(str(path), schema)
        _ = read["batches"] | "Measure" >> measure | "Done" >> beam.Map(lambda _x: None)
    return time.perf_counter() - start


def _core_seconds(codes: np.ndarray, fn) -> float:
    start = time.perf_counter()
    fn(codes)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    """Build the data, time both pipelines and both cores, print ratios."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args(argv)
    if not WORDS.is_file():
        print(f"skipped: {WORDS} not found", file=sys.stderr)
        return 0
    words = CategoricalDomain.from_file(WORDS)
    pairs_domain = ProductDomain([words, words])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pairs.csv"
        pairs = make_data(path, args.rows, words)
        plain_col = Column(name="pair", type="categorical", domain=CategoricalDomain(pairs))
        open_col = Column(name="pair", type="categorical", domain=pairs_domain, tolerance=0.5)
        budget = PureDP(epsilon=1.0)
        results: dict[str, list[float]] = {"plain": [], "cathist": []}
        for _ in range(args.repeat):
            results["plain"].append(_pipeline_seconds(path, plain_col, DPMarginals(
                specs=[(0,)], shape=(plain_col.cells,), names=["pair"], budgets=[budget])))
            results["cathist"].append(_pipeline_seconds(path, open_col, DPCategoricalHistogram(
                domain=pairs_domain, budget=budget, tolerance=0.5)))
        plan = plan_cathist(epsilon=1.0, tolerance=0.5, domain_size=pairs_domain.size)
        gen = RandomSource(seed=1).numpy_generator()
        open_codes = pairs_domain.encode_many([pairs[i] for i in gen.integers(0, len(pairs), 10)])
        codes = np.asarray(open_codes)[gen.integers(0, 10, args.rows)]
        plain_codes = gen.integers(0, len(pairs), args.rows).reshape(-1, 1)
        rs = RandomSource()

        def plain_core(c):
            tables = count_marginals(c, [(0,)], (len(pairs),))
            noisy_marginals(tables, specs=[(0,)], names=["pair"], budgets=[budget],
                            sensitivity=1.0, rs=rs)

        def cathist_core(c):
            cells, counts = count_values(c)
            release_histogram(cells, counts, plan=plan, domain=pairs_domain, rs=rs)

        core = {"plain": min(_core_seconds(plain_codes, plain_core) for _ in range(3)),
                "cathist": min(_core_seconds(codes, cathist_core) for _ in range(3))}
    best = {k: min(v) for k, v in results.items()}
    print(f"rows: {args.rows:,}; CatHist domain n = {pairs_domain.size:,} (ε = 1, ρ = 0.5, "
          f"τ = {plan.tau}); plain histogram over the {len(pairs):,} declared pairs")
    print(f"pipeline (read CSV + encode + measure, DirectRunner, best of {args.repeat}):")
    print(f"  plain noisy histogram  {best['plain']:8.2f} s")
    print(f"  CatHist                {best['cathist']:8.2f} s   ratio {best['cathist'] / best['plain']:.2f}x"
          "  (goal <= 2x)")
    print("core only (count + noise on in-memory codes, best of 3):")
    print(f"  plain noisy histogram  {core['plain'] * 1e3:8.1f} ms")
    print(f"  CatHist                {core['cathist'] * 1e3:8.1f} ms   ratio "
          f"{core['cathist'] / core['plain']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
