"""SBHG on UCI Census-Income (KDD): structural zeros, marginal TVD and wall time vs a comparison.

Measured in the same run, on the same input sample and with the same (ε, δ) and seed:

* ``sbhg`` (this issue) and a comparison method: ``privbayes`` when it is registered, else
  ``independent`` (the script prints which one it used);
* a non-private reference: a held-out real sample of the same size (its unseen-combination rate
  is what sampling alone produces).

Metrics (evaluation reads the real data in the clear: benchmark only):

* **unseen-3 fraction**: the share of synthetic records having at least one 3-column
  sub-combination that never occurs in the input data, over ``--triples`` random column triples
  (all 10,660 triples of 41 columns if ``--triples 0``); also the share of (record, triple)
  pairs that are unseen;
* TVD over all 1-way and 2-way marginals and 100 random 3-way marginals
  (:func:`beamsynth.pipelines.releases.quality.quality_report`); L1 = 2·TVD;
* wall time of the whole ``synthesize`` pipeline (read, measure, fit, sample, write);
* as in the paper's §4, on small-dimensional data: the L1 distance between the full real and
  synthetic histograms (and the TVD) on NLTCS (16 binary columns, 21,574 rows).

Input: the UCI train split (199,523 rows; ``--rows N`` takes a random sample of N of them), the
reference: as many rows of the test split. The comparison gets the same ε with δ = 0 (it is
pure ε-DP).

Usage::

    nice -n 10 python benchmarks/sbhg_census.py --epsilons 1,4 --delta 1e-6
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from apache_beam.options.pipeline_options import PipelineOptions

from beamsynth.pipelines.methods.registry import METHODS, _load_optional_methods
from beamsynth.pipelines.methods.synthesize import SynthesisConfig, run_synthesis
from beamsynth.pipelines.releases.quality import as_codes, encode_frame, quality_report
from beamsynth.schemas.schema import load_schema

NLTCS = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "nist2021_encoded" / "nltcs.csv"
DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "census_kdd" / "census_income_kdd.csv.gz"


def unseen_fraction(real: np.ndarray, synth: np.ndarray, shape, triples) -> tuple[float, float]:
    """(share of synthetic rows with ≥ 1 unseen 3-combination, share of unseen (row, triple) pairs)."""
    any_unseen = np.zeros(synth.shape[0], dtype=bool)
    unseen_pairs = 0
    for cols in triples:
        dims = tuple(int(shape[c]) for c in cols)
        rk = np.unique(np.ravel_multi_index(tuple(real[:, c] for c in cols), dims))
        sk = np.ravel_multi_index(tuple(synth[:, c] for c in cols), dims)
        pos = np.minimum(np.searchsorted(rk, sk), rk.size - 1)
        miss = rk[pos] != sk
        any_unseen |= miss
        unseen_pairs += int(miss.sum())
    return float(any_unseen.mean()), unseen_pairs / (synth.shape[0] * len(triples))


def full_histogram_l1(real: np.ndarray, synth: np.ndarray, shape) -> tuple[float, float]:
    """(L1 distance of the full count histograms, TVD of the normalized ones), as in the paper §4."""
    dims = tuple(int(x) for x in shape)
    size = int(np.prod(dims))
    r = np.bincount(np.ravel_multi_index(tuple(real.T), dims), minlength=size).astype(float)
    s = np.bincount(np.ravel_multi_index(tuple(synth.T), dims), minlength=size).astype(float)
    return float(np.abs(r - s).sum()), 0.5 * float(np.abs(r / r.sum() - s / s.sum()).sum())


def small_dimensional(args, comparison: str, tmp: Path) -> None:
    """Full-histogram L1 on NLTCS (16 binary columns, 65,536 cells, 21,574 rows)."""
    if not NLTCS.exists():
        print(f"skipping the small-dimensional run: {NLTCS} is absent")
        return
    header = NLTCS.read_text().splitlines()[0].split(",")
    # declared: every NLTCS column is a binary disability indicator coded 0/1
    schema = load_schema({"name": "nltcs", "columns": [
        {"name": c, "type": "categorical", "domain": {"kind": "categorical", "values": ["0", "1"]}}
        for c in header]})
    frame = pd.read_csv(NLTCS, dtype=str)
    real = as_codes(schema, frame[schema.names])
    n = real.shape[0]
    print(f"nltcs: {n} rows, {len(header)} binary columns, full histogram of {2 ** len(header)} cells")
    boot = real[np.random.default_rng(args.seed).integers(0, n, n)]
    l1, tv = full_histogram_l1(real, boot, schema.shape)
    print(f"reference: a bootstrap resample of the real rows: L1 {l1:.0f}, TVD {tv:.4f}")
    print(f"{'eps':>5} {'method':>12} {'L1':>9} {'TVD':>7} {'seconds':>8}")
    for eps in [float(e) for e in args.epsilons.split(",")]:
        for method in ("sbhg", comparison):
            out = tmp / f"nltcs_{method}_{eps}.csv"
            cfg = SynthesisConfig(input=str(NLTCS), schema=schema, output=str(out), epsilon=eps,
                                  delta=args.delta if method == "sbhg" else 0.0, method=method,
                                  rows=n, seed=args.seed,
                                  options={"top_r": args.top_r} if method == "sbhg" else {})
            t0 = time.time()
            run_synthesis(cfg, PipelineOptions(["--runner=DirectRunner"]))
            secs = time.time() - t0
            syn, _ = encode_frame(schema, pd.read_csv(out, dtype=str, keep_default_na=False))
            l1, tv = full_histogram_l1(real, syn, schema.shape)
            print(f"{eps:>5g} {method:>12} {l1:>9.0f} {tv:>7.4f} {secs:>8.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--rows", type=int, default=0, help="train rows to use (0 = all 199,523)")
    ap.add_argument("--epsilons", default="1,4")
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--triples", type=int, default=500, help="random column triples (0 = all)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--top-r", type=int, default=2)
    ap.add_argument("--skip-census", action="store_true", help="only the small-dimensional run")
    ap.add_argument("--skip-small", action="store_true", help="no NLTCS full-histogram run")
    args = ap.parse_args()

    _load_optional_methods()
    comparison = "privbayes" if "privbayes" in METHODS else "independent"
    if not args.skip_small:
        with tempfile.TemporaryDirectory() as tmp:
            small_dimensional(args, comparison, Path(tmp))
    if args.skip_census:
        return
    schema = load_schema("census_kdd")
    if not Path(args.data).exists():
        print(f"skipping census_kdd: {args.data} is absent")
        return
    full = pd.read_csv(args.data, dtype=str, keep_default_na=False)
    train, test = full[full["split"] == "train"], full[full["split"] == "test"]
    rng = np.random.default_rng(args.seed)
    n = len(train) if args.rows == 0 else min(args.rows, len(train))
    sample = train.iloc[rng.permutation(len(train))[:n]].reset_index(drop=True)
    held_out = test.iloc[rng.permutation(len(test))[: min(n, len(test))]]
    real = as_codes(schema, sample[schema.names])
    shape = schema.shape
    d = len(shape)
    all_triples = list(itertools.combinations(range(d), 3))
    if args.triples and args.triples < len(all_triples):
        pick = rng.choice(len(all_triples), args.triples, replace=False)
        triples = [all_triples[i] for i in sorted(pick)]
    else:
        triples = all_triples
    print(f"census_kdd: {n} input rows of the {len(train)}-row train split ({d} columns), {len(triples)} column triples, "
          f"comparison method: {comparison}" + ("" if comparison == "privbayes" else
                                                 " (privbayes not registered in this checkout)"))
    ho = as_codes(schema, held_out[schema.names])
    u_any, u_pair = unseen_fraction(real, ho, shape, triples)
    print(f"reference: held-out real rows ({ho.shape[0]}): unseen-3 rows {u_any:.4f}, pairs {u_pair:.5f}")

    print(f"{'eps':>5} {'method':>12} {'unseen3_rows':>12} {'unseen3_pairs':>13} {'tvd1':>7} "
          f"{'tvd2':>7} {'tvd3':>7} {'seconds':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "input.csv"
        sample.to_csv(src, index=False)
        for eps in [float(e) for e in args.epsilons.split(",")]:
            results = {}
            for method in ("sbhg", comparison):
                out = Path(tmp) / f"{method}_{eps}.csv"
                opts = {"top_r": args.top_r} if method == "sbhg" else {}
                # the comparison is pure ε-DP (spends no δ); independent refuses a δ > 0 budget
                delta = args.delta if method == "sbhg" else 0.0
                cfg = SynthesisConfig(input=str(src), schema=schema, output=str(out), epsilon=eps,
                                      delta=delta, method=method, rows=n, seed=args.seed,
                                      options=opts)
                t0 = time.time()
                run_synthesis(cfg, PipelineOptions(["--runner=DirectRunner"]))
                secs = time.time() - t0
                syn, _ = encode_frame(schema, pd.read_csv(out, dtype=str, keep_default_na=False))
                u_any, u_pair = unseen_fraction(real, syn, shape, triples)
                q = quality_report(schema, real, syn, n_three_way=100, seed=args.seed)
                results[method] = (u_any, u_pair, secs)
                print(f"{eps:>5g} {method:>12} {u_any:>12.4f} {u_pair:>13.5f} {q.tvd1:>7.4f} "
                      f"{q.tvd2:>7.4f} {q.tvd3:>7.4f} {secs:>8.1f}")
            s, c = results["sbhg"], results[comparison]
            print(f"{eps:>5g} {'ratio':>12} {s[0] / max(c[0], 1e-12):>12.3f} "
                  f"{s[1] / max(c[1], 1e-12):>13.3f} {'':>7} {'':>7} {'':>7} {s[2] / c[2]:>8.2f}"
                  f"   (sbhg / {comparison})")


if __name__ == "__main__":
    main()
