"""Held-back evaluator's path on the least-used shared data sets (issue 18, H51).

A user with only the docs and the files shipped with each data set: ``beamsynth schema draft``
from the data set's own dictionary (never its rows; the draft is used as drafted, the review
edits below are the only changes), then ``beamsynth synthesize`` (progress on, no ``--rows`` /
``--input-rows``: output size and model size come from DP counts) with ``--method independent``,
``--method privbayes`` (defaults) and ``--method privbayes --pb-noise gaussian --delta 1e-9`` at
each ε, on the default runner; with ``--runners`` one privbayes run (ε = 1, first seed) per
data set on each of those runners, compared byte for byte with the direct output.

Data sets (each split 70/30 at random, ``unseen_rehearsal.split``: train → synthesize,
test → ``correlated.evaluate``: TVD over all 1-way, all 2-way and 100 random 3-way marginals,
GBM accuracy/AUC trained on synthetic, tested on the held-back 30%):

* ``acs_ma``, ``acs_tx``: the NIST Diverse Communities state extracts ``ma2019.csv`` (7,634
  rows) and ``tx2019.csv`` (9,276), not in ../shared/data; ``--sdnist-dir`` holds them, taken
  from the commit ../shared/data/README.md names for the national files::

      git clone https://github.com/usnistgov/SDNist && cd SDNist && for f in \\
        massachusetts/ma2019.csv texas/tx2019.csv; do git show \\
        894ca7a3959792c99e0acbb93f9b9117cfc90c57:BenchmarkData/ACSDataExcerpts/$f \\
        > /tmp/sdnist/$(basename $f); done

  ``acs_national``: ../shared/data/acs_nist_sdnist/national2019.csv (27,253). Schema: draft of
  ``data_dictionary.json`` (sdnist form); target ``DPHY`` (ambulatory difficulty, positive
  ``1``; null rows, under 5 years old, dropped by the evaluator).
* ``pums``: SmartNoise ``PUMS.csv`` (1,000 rows). Its metadata is a SmartNoise YAML (bounds:
  age 0..100, income 0..500000) plus the MST sample's ``pums-domain.json`` (sizes, no income):
  draft cannot read the YAML and the JSON lacks income, so the user writes a CSV codebook from
  the two (``PUMS_CODEBOOK`` below) and drafts that. Target ``married`` (positive ``1``).
* ``nltcs``: ``nltcs.csv`` (21,574 rows, 16 binary columns), draft of ``nltcs-domain.json``;
  target ``traveling`` (positive ``1``).
* ``adult_pgm``: private-pgm's integer-coded Adult (48,842 rows), draft of
  ``adult_pgm_encoded-domain.json``; target ``income>50K`` (positive ``1``).

    nice -n 5 python benchmarks/unseen_shared.py --sdnist-dir /tmp/sdnist --out /tmp/unseen.json
    nice -n 5 python benchmarks/unseen_shared.py --datasets pums --epsilons 1 --seeds 0

The grid runs about 170 CLI subprocesses (~40 min on a loaded 2-core machine); in a checkout
others edit, pin the code measured: the CLI imports ``beamsynth`` from ``$PYTHONPATH`` before the
editable install, so ``git archive HEAD`` laid out as ``pkg/beamsynth`` (= ``api/``) plus
``pkg/beamsynth/{transforms,schemas,pipelines,runners}`` and ``PYTHONPATH=pkg`` runs one commit.

Printed: one JSON line per run, then mean ± standard error over seeds per data set × ε ×
method, flagged ``!`` where privbayes' (defaults) mean TVD exceeds independent's by more than
two standard errors of the difference, or a mean AUC is ≤ 0.5.
"""

from __future__ import annotations

import argparse
import filecmp
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
DATA = HERE.parents[1] / "shared" / "data"
BEAMSYNTH = Path(sys.executable).with_name("beamsynth")
SDNIST_DICT = DATA / "acs_nist_sdnist" / "data_dictionary.json"
# written by the user from PUMS.yaml (age, income bounds) and pums-domain.json (category counts)
PUMS_CODEBOOK = """column,type,values,min,max,description
age,integer,,0,100,PUMS.yaml: int 0..100
sex,categorical,0|1,,,pums-domain.json: 2
educ,categorical,0|1|2|3|4|5|6|7|8|9|10|11|12|13|14|15|16,,,pums-domain.json: 17
race,categorical,0|1|2|3|4|5|6,,,pums-domain.json: 7
income,integer,,0,500000,PUMS.yaml: int 0..500000
married,categorical,0|1,,,pums-domain.json: 2
"""
DATASETS = {
    "acs_ma": {"file": "ma2019.csv", "sdnist": True, "dict": SDNIST_DICT,
               "target": "DPHY", "positive": "1"},
    "acs_tx": {"file": "tx2019.csv", "sdnist": True, "dict": SDNIST_DICT,
               "target": "DPHY", "positive": "1"},
    "acs_national": {"file": DATA / "acs_nist_sdnist" / "national2019.csv", "dict": SDNIST_DICT,
                     "target": "DPHY", "positive": "1"},
    "pums": {"file": DATA / "pums_smartnoise" / "PUMS.csv", "dict": "codebook",
             "target": "married", "positive": "1"},
    "nltcs": {"file": DATA / "nist2021_encoded" / "nltcs.csv",
              "dict": DATA / "nist2021_encoded" / "nltcs-domain.json",
              "target": "traveling", "positive": "1"},
    "adult_pgm": {"file": DATA / "adult" / "adult_pgm_encoded.csv",
                  "dict": DATA / "adult" / "adult_pgm_encoded-domain.json",
                  "target": "income>50K", "positive": "1"},
}
METHODS = {
    "independent": ("independent", []),
    "privbayes": ("privbayes", []),
    "privbayes gaussian": ("privbayes", ["--pb-noise", "gaussian", "--delta", "1e-9"]),
    # not in the default grid: the evaluated label declared as privbayes' target (the star on
    # small inputs), as a user who knows the label would (--methods ...,'privbayes target')
    "privbayes target": ("privbayes", ["--target", "{target}"]),
}


def data_file(name: str, sdnist_dir: str | None) -> Path | None:
    spec = DATASETS[name]
    if spec.get("sdnist"):
        if not sdnist_dir:
            return None
        path = Path(sdnist_dir) / spec["file"]
    else:
        path = Path(spec["file"])
    return path if path.is_file() else None


def draft_schema(name: str, work: Path, log: Path) -> tuple[Path, float]:
    """``beamsynth schema draft`` of the data set's dictionary (the user's first step)."""
    dictionary = DATASETS[name]["dict"]
    if dictionary == "codebook":
        dictionary = work / f"{name}_codebook.csv"
        dictionary.write_text(PUMS_CODEBOOK)
    out = work / f"{name}.yaml"
    cmd = [str(BEAMSYNTH), "schema", "draft", str(dictionary), "--output", str(out),
           "--name", name]
    t0 = time.perf_counter()
    with open(log, "a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, check=True)
    return out, time.perf_counter() - t0


def se(values: pd.Series) -> float:
    return float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")


def run(a: argparse.Namespace) -> list[dict]:
    sys.path.insert(0, str(HERE))
    from correlated import evaluate  # the project's evaluator (TVD1/2/3, GBM accuracy/AUC)
    from unseen_rehearsal import run_cli, sizing_of, split

    from beamsynth.pipelines.releases.quality import encode_frame, ml_efficacy, quality_report
    from beamsynth.schemas.schema import load_schema

    work = Path(a.work_dir or tempfile.mkdtemp(prefix="unseen_shared_"))
    work.mkdir(parents=True, exist_ok=True)
    log = work / "cli.log"
    eps_list = [float(e) for e in a.epsilons.split(",")]
    seeds = [int(s) for s in a.seeds.split(",")]
    methods = a.methods.split(",")
    runners = [r for r in a.runners.split(",") if r and r != "none"]
    rows: list[dict] = []
    for name in a.datasets.split(","):
        spec = DATASETS[name]
        path = data_file(name, a.sdnist_dir)
        if path is None:
            print(f"skipping {name}: {spec['file']} not found (--sdnist-dir; see the module "
                  "docstring)", flush=True)
            continue
        schema_path, draft_secs = draft_schema(name, work, log)
        schema = load_schema(str(schema_path))
        train, test = split(pd.read_csv(path, dtype=str, keep_default_na=False))
        train_csv = str(work / f"{name}_train.csv")
        train.to_csv(train_csv, index=False)
        test_codes, dropped = encode_frame(schema, test)
        train_codes, train_dropped = encode_frame(schema, train)
        real = quality_report(schema, test_codes, train_codes, n_three_way=100, seed=0)
        ref = {"data": name, "n": len(train), "draft_seconds": round(draft_secs, 2),
               "train_rows_outside_schema": train_dropped, "test_rows_outside_schema": dropped,
               "epsilon": None, "method": "real train vs test", "tvd1": real.tvd1,
               "tvd2": real.tvd2, "tvd3": real.tvd3,
               **ml_efficacy(schema, train_codes, test_codes, target=spec["target"],
                             positive=spec["positive"])}
        rows.append(ref)
        print(json.dumps(ref), flush=True)
        jobs = [(e, s, m, "direct") for e in eps_list for s in seeds for m in methods]
        jobs += [(1.0, seeds[0], "privbayes", r) for r in runners]
        for eps, seed, label, runner in jobs:
            method, extra = METHODS[label]
            extra = [x.format(target=spec["target"]) for x in extra] + ([] if runner == "direct" else ["--runner", runner])
            tag = f"{label.replace(' ', '_')}_eps{eps:g}_seed{seed}"
            out = str(work / f"{name}_{tag}{'' if runner == 'direct' else '_' + runner}.csv")
            secs, rc = run_cli(train_csv, schema_path, out, eps, seed, method, extra, log)
            r = {"data": name, "n": len(train), "epsilon": eps, "seed": seed, "method": label,
                 "runner": runner, "exit": rc, "seconds": round(secs, 2)}
            if rc == 0:
                manifest = json.loads(Path(out + ".manifest.json").read_text())
                r["size"] = sizing_of(manifest)
                r["rows_out"] = manifest["release"]["rows_out"]
                r["rejected"] = manifest["operational"]["rows_rejected"]
                if runner != "direct":
                    direct = str(work / f"{name}_{tag}.csv")
                    r["same_bytes_as_direct"] = (Path(direct).is_file()
                                                 and filecmp.cmp(direct, out, shallow=False))
                else:
                    synth = pd.read_csv(out, dtype=str, keep_default_na=False)
                    r.update(evaluate(schema, test_codes, synth, spec["target"], spec["positive"],
                                      seed))
            rows.append(r)
            print(json.dumps(r), flush=True)
    print(f"CLI output: {log}", flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    """Mean ± s.e. over seeds per data set × ε × method; '!' flags privbayes (defaults) worse than
    independent at the same ε by more than 2 s.e. of the difference, or mean AUC ≤ 0.5."""
    df = pd.DataFrame([r for r in rows if r.get("exit", 0) == 0 and r.get("runner") == "direct"])
    if df.empty:
        return
    cols = ["tvd1", "tvd2", "tvd3", "accuracy", "auc", "seconds"]
    keys = ["data", "epsilon", "method"]
    grouped = df.groupby(keys, sort=False)
    mean, err = grouped[cols].mean(), grouped[cols].agg(se)
    lines = []
    for key, row in mean.iterrows():
        data, eps, method = key
        flags = []
        ind = (data, eps, "independent")
        if method == "privbayes" and ind in mean.index:
            for c in ("tvd1", "tvd2", "tvd3"):
                gap = row[c] - mean.loc[ind, c]
                if gap > 2 * float(np.hypot(err.loc[key, c], err.loc[ind, c])):
                    flags.append(f"{c}+{gap:.4f}")
        if row["auc"] <= 0.5:
            flags.append("auc")
        cells = [f"{row[c]:.4f}±{err.loc[key, c]:.4f}" for c in cols[:5]]
        lines.append([data, f"{eps:g}", method, *cells, f"{row['seconds']:.1f}",
                      str(grouped.size()[key]), "!" + ",".join(flags) if flags else ""])
    head = ["data", "ε", "method", *cols, "runs", "flag"]
    print(pd.DataFrame(lines, columns=head).to_string(index=False))
    other = [r for r in rows if r.get("runner", "direct") != "direct"]
    for r in other:
        print(f"{r['data']} {r['runner']}: exit {r['exit']}, {r['seconds']} s, "
              f"same bytes as direct: {r.get('same_bytes_as_direct')}")
    failed = [r for r in rows if r.get("exit", 0) != 0]
    if failed:
        print(f"{len(failed)} run(s) failed: {failed}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sdnist-dir", default=os.environ.get("BEAMSYNTH_SDNIST_DIR"),
                    help="folder holding ma2019.csv and tx2019.csv (module docstring); default "
                    "$BEAMSYNTH_SDNIST_DIR; without it acs_ma/acs_tx are skipped")
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--epsilons", default="0.5,1,2")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--methods", default="independent,privbayes,privbayes gaussian",
                    help=f"comma-separated, of {list(METHODS)}")
    ap.add_argument("--runners", default="direct-multi,dask",
                    help="one privbayes run each (ε = 1, first seed), compared byte for byte with "
                    "the direct run; 'none' for none")
    ap.add_argument("--work-dir", default=None, help="where drafts, train CSVs and outputs go "
                    "(default: a new temporary folder, kept)")
    ap.add_argument("--out", default=None, help="write all rows as JSON")
    a = ap.parse_args()
    rows = run(a)
    print_table(rows)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
