"""Seed 000's experiment: CatHist fidelity on Adult over English words and word pairs.

Columns and declared domains (nothing read off the data):

* ``sex`` over all English words: the codebook values (``adult.names``) ∪ the 104,334 words of
  ``dict_words_american_english.txt`` (n = 104,335: ``Male`` is already a word);
* ``workclass`` and ``marital-status`` over all English word pairs: codebook ∪ words²
  (n ≈ 1.09·10^10).

The codebook values are added to the word domains because most Adult categories are not English
words (``Female``, ``Self-emp-not-inc``, ``Never-married`` ...): over words alone they would be
out of domain and rejected. The paper does not say how it handled this; it reports
n = 1.71·10^5 words and 2.94·10^10 pairs (a larger word list).

For every ε ∈ {0.01, 0.1, 1} and ρ ∈ {0.1, 0.3, 0.5, 0.7, 0.9}: 100 CatHist releases (seeded
streams: a benchmark, not a release), fidelity
``F = P_true(C_true ∩ C_out) · P_out(C_true ∩ C_out)`` averaged. Prints the table (rows: column
and ε; columns: ρ) with τ, plus the mean number of released categories from outside the data.

Run: ``nice -n 10 python benchmarks/cathist_fidelity.py [--runs 100] [--seed 0] [--split train]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from beamsynth.schemas.domains import CategoricalDomain, ProductDomain, UnionDomain
from beamsynth.schemas.schema import load_schema
from beamsynth.transforms.cathist import count_values, plan_cathist, release_histogram
from beamsynth.transforms.noise import RandomSource

ROOT = Path(__file__).resolve().parents[1]
ADULT = ROOT / "examples" / "data" / "adult" / "adult.csv"
WORDS = ROOT.parent / "shared" / "data" / "text" / "dict_words_american_english.txt"
EPSILONS = (0.01, 0.1, 1.0)
TOLERANCES = (0.1, 0.3, 0.5, 0.7, 0.9)
COLUMNS = {"sex": "words", "workclass": "pairs", "marital-status": "pairs"}


def fidelity(true_cells: np.ndarray, true_counts: np.ndarray, out_cells: np.ndarray,
             out_counts: np.ndarray) -> float:
    """Seed 000's F: product of the true and released distributions' mass on shared categories."""
    if out_cells.size == 0 or true_cells.size == 0:
        return 0.0
    shared_true = np.isin(true_cells, out_cells)
    shared_out = np.isin(out_cells, true_cells)
    p_true = true_counts[shared_true].sum() / true_counts.sum()
    p_out = out_counts[shared_out].sum() / out_counts.sum()
    return float(p_true * p_out)


PAPER_WORDS = 171_476  # the paper's word count: n = 1.71e5 words, 2.94e10 pairs


def declared_domains(paper_sizes: bool = False) -> dict[str, UnionDomain]:
    """Codebook ∪ words (sex) and codebook ∪ word pairs (workclass, marital-status).

    ``paper_sizes`` pads the word list with placeholder tokens to the paper's 171,476 words so
    that n matches the paper (1.71e5 words, 2.94e10 pairs); padding is declared, not data.
    """
    words = CategoricalDomain.from_file(WORDS)
    if paper_sizes:
        pad = [f"~pad{i:06d}" for i in range(PAPER_WORDS - words.size)]
        words = CategoricalDomain(words.values + pad, source=f"{WORDS} + {len(pad)} placeholders")
    pairs = ProductDomain([words, words])
    schema = load_schema("adult")
    out = {}
    for col, kind in COLUMNS.items():
        codebook = schema.column(col).domain
        out[col] = UnionDomain(CategoricalDomain(codebook.values), words if kind == "words" else pairs)
    return out


def run(runs: int, seed: int, split: str = "all", paper_sizes: bool = False) -> list[dict]:
    """All cells of the experiment; returns one dict per (column, ε, ρ).

    ``split``: ``all`` (48,842 rows) or ``train`` (the 32,561 rows of UCI ``adult.data``, which
    the paper most likely used).
    """
    data = pd.read_csv(ADULT, dtype=str, keep_default_na=False)
    if split != "all":
        data = data[data["split"] == split]
    rows = []
    for col, dom in declared_domains(paper_sizes).items():
        codes = dom.encode_many(data[col])
        cells, counts = count_values(codes[codes >= 0])
        for eps in EPSILONS:
            for rho in TOLERANCES:
                plan = plan_cathist(epsilon=eps, tolerance=rho, domain_size=dom.size)
                base = RandomSource(seed=seed).child("fidelity", col, eps, rho)
                fs, outside = [], []
                for r in range(runs):
                    rel = release_histogram(cells, counts, plan=plan, domain=dom, rs=base.child(r))
                    fs.append(fidelity(cells, counts, rel.cells, rel.counts))
                    outside.append(int((~np.isin(rel.cells, cells)).sum()))
                rows.append({"column": col, "n": dom.size, "epsilon": eps, "rho": rho,
                             "tau": plan.tau, "F": float(np.mean(fs)), "F_sd": float(np.std(fs)),
                             "random_bins": float(np.mean(outside))})
    return rows


def print_table(rows: list[dict]) -> None:
    """Mean F per (column, ε) × ρ, with τ in brackets."""
    print(f"{'column':<15}{'n':>13}{'ε':>6} | " + " | ".join(f"ρ={r:<12g}" for r in TOLERANCES))
    for col in COLUMNS:
        for eps in EPSILONS:
            cells = [r for r in rows if r["column"] == col and r["epsilon"] == eps]
            line = " | ".join(f"{c['F']:.3f} (τ={c['tau']:<5d})" for c in cells)
            print(f"{col:<15}{cells[0]['n']:>13.3g}{eps:>6g} | {line}")
    print("\nmean number of released categories from outside the data:")
    for col in COLUMNS:
        for eps in EPSILONS:
            cells = [r for r in rows if r["column"] == col and r["epsilon"] == eps]
            print(f"{col:<15}{eps:>6g} | " + " | ".join(f"{c['random_bins']:<14.2f}" for c in cells))


def main(argv: list[str] | None = None) -> int:
    """Run the experiment and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--split", choices=("all", "train", "test"), default="all",
                    help="Adult rows to use (train = the paper's 32,561 rows of adult.data)")
    ap.add_argument("--paper-sizes", action="store_true",
                    help="pad the word list to the paper's 171,476 words (n = 1.71e5 / 2.94e10)")
    args = ap.parse_args(argv)
    for path in (ADULT, WORDS):
        if not path.is_file():
            print(f"skipped: {path} not found", file=sys.stderr)
            return 0
    start = time.time()
    rows = run(args.runs, args.seed, args.split, args.paper_sizes)
    print(f"Adult rows: {args.split}; domain sizes: {'paper' if args.paper_sizes else 'wamerican'}")
    print_table(rows)
    print(f"\n{args.runs} runs per cell, {time.time() - start:.1f} s (seeded: not for release)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
