"""Companion of benchmarks/correlated.py: run a peer synthesizer inside its own virtualenv.

Runs with the peer's interpreter (it imports neither beamsynth nor Beam)::

    /tmp/peer-ds/bin/python benchmarks/peers_correlated.py datasynthesizer IN.csv OUT.csv --epsilon 1 --seed 0
    /tmp/peer-mst/bin/python benchmarks/peers_correlated.py mst IN.csv OUT.csv --epsilon 1 --seed 0

``IN.csv`` holds the training rows as **declared cell codes** (written by correlated.py with the
beamsynth schema, numeric columns already in their declared bins), so every peer sees every column
as categorical over the same cells. ``OUT.csv`` gets the same number of synthetic rows (codes) and
``OUT.json`` the wall time of fit + sample.

MST's default sampler in mbi 1.1.0 (``MarkovRandomField.synthetic_data(method="round")``) assigns
each column by systematic sampling over the rows of a parent group **in row order** (stable
argsort, no random permutation), so two columns drawn from overlapping groups become monotone in
the same row order: siblings in the tree get a spurious near-deterministic dependence (Adult,
ε = 1: fnlwgt × occupation TVD 0.66, mean TVD2 0.127, worse than independent marginals' 0.084).
Resampling the output rows does not undo that. The MST runs here therefore use mbi's own
``method="sample"`` (i.i.d. ancestral sampling from the fitted model); everything else is
smartnoise's MST unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np
import pandas as pd


def run_datasynthesizer(df: pd.DataFrame, epsilon: float, seed: int, degree: int) -> pd.DataFrame:
    """DataSynthesizer correlated attribute mode (GreedyBayes + noisy conditionals)."""
    from DataSynthesizer.DataDescriber import DataDescriber
    from DataSynthesizer.DataGenerator import DataGenerator
    from DataSynthesizer.lib.utils import set_random_seed

    set_random_seed(seed)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "in.csv")
        desc = os.path.join(tmp, "description.json")
        df.astype(str).to_csv(src, index=False)
        describer = DataDescriber(category_threshold=10**9)
        describer.describe_dataset_in_correlated_attribute_mode(
            dataset_file=src,
            epsilon=epsilon,
            k=degree,
            attribute_to_is_categorical={c: True for c in df.columns},
            attribute_to_is_candidate_key={c: False for c in df.columns},
            seed=seed,
        )
        describer.save_dataset_description_to_file(desc)
        gen = DataGenerator()
        gen.generate_dataset_in_correlated_attribute_mode(len(df), desc, seed=seed)
        out = gen.synthetic_dataset
    return out[df.columns]


def run_mst(df: pd.DataFrame, epsilon: float, seed: int) -> pd.DataFrame:
    """smartnoise-synth MST (all columns categorical; δ = 1e-9)."""
    import mbi.markov_random_field as mrf
    from snsynth import Synthesizer

    round_sampler = mrf.MarkovRandomField.synthetic_data
    if not getattr(round_sampler, "_iid_patch", False):
        def iid_sampler(self, rows=None, method="sample"):  # see the module docstring
            return round_sampler(self, rows, method="sample")
        iid_sampler._iid_patch = True
        mrf.MarkovRandomField.synthetic_data = iid_sampler
    np.random.seed(seed)
    synth = Synthesizer.create("mst", epsilon=epsilon, delta=1e-9)
    out = synth.fit_sample(df.astype(str), categorical_columns=list(df.columns),
                           preprocessor_eps=0.0)
    return pd.DataFrame(out, columns=df.columns)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("peer", choices=["datasynthesizer", "mst"])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--epsilon", type=float, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--degree", type=int, default=2, help="DataSynthesizer k (parents)")
    a = ap.parse_args()
    df = pd.read_csv(a.input, dtype=str, keep_default_na=False)
    t0 = time.perf_counter()
    if a.peer == "datasynthesizer":
        out = run_datasynthesizer(df, a.epsilon, a.seed, a.degree)
    else:
        out = run_mst(df, a.epsilon, a.seed)
    seconds = time.perf_counter() - t0
    out.to_csv(a.output, index=False)
    with open(os.path.splitext(a.output)[0] + ".json", "w") as fh:
        json.dump({"peer": a.peer, "epsilon": a.epsilon, "seed": a.seed, "seconds": seconds,
                   "rows": int(len(out))}, fh)
    print(f"{a.peer} eps={a.epsilon} seed={a.seed}: {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
