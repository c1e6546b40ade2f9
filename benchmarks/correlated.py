"""Correlated synthesis benchmark: beamsynth PrivBayes vs DataSynthesizer, smartnoise MST and AIM.

Quality (per ε and seed): average TVD over all 1-way, all 2-way and 100 seeded random 3-way
marginals over the declared cells (``beamsynth.pipelines.releases.quality``), and gradient-boosting
accuracy/AUC for a binary target trained on synthetic rows and tested on real ones; wall time of
fit + sample. Adult: synthesize from the train split, evaluate on the test split. ACS national2019:
synthesize from the file, evaluate against the same file (there is no split); ML target ``DPHY``
(ambulatory difficulty, positive ``1`` = yes: 8 % of the rows that have it, null under age 5; a
declared binary label of the data dictionary, predicted from age, income and the other difficulty
columns; H95), so its accuracy/AUC are trained on synthetic rows and tested on the input itself.

beamsynth runs the real ``synthesize`` pipeline (read CSV → PrivBayes → sample → write CSV) on the
DirectRunner, with ``--rows`` = the input size (peers are also given n); pure ε with the CLI's
default noise, or at AIM's δ with ``--pb-noise gaussian`` (or ``auto``) ``--delta 1e-9`` (rows named
``beamsynth privbayes gaussian``). Peers run in their own
virtualenvs through ``benchmarks/peers_correlated.py`` on the same declared cell codes (all columns
categorical); ``--peers run`` launches missing runs (slow: ~10-20 min each), ``--peers saved``
only reads outputs saved by earlier runs of the companion script in ``--peer-dir``.
Peers whose virtualenv is gone and that have no saved runs are skipped with a note.

AIM (private-pgm's ``mechanisms/aim.py``, McKenna et al. 2022) runs in its own virtualenv in
``$BEAMSYNTH_AIM_DIR`` (default ``/work/aim``; setup: ``../shared/tools/aim/README.md``, never a
project dependency) on the same declared cell codes: workload all 2-way marginals of at most
10,000 cells, δ = 1e-9, ``--aim-mms`` (max_model_size, default 80 as in the paper), ``--aim-iters``
(default 1000), at ``--aim-seeds`` (default 0). ``--peers saved`` copies finished runs of
``AIM_DIR/out/aim_<dataset>_eps<e>_seed<s>_mms<m>.csv`` (+ ``.json``: seconds and settings) into
the peer dir; ``--peers run`` runs a missing one (about an hour each on Adult here). AIM's rows
are named with their settings and time; its seconds are fit + sample inside its process.
census_kdd (199,523 train rows, 41 columns, target income ≥ 50,000) is evaluated on its test split.

    nice -n 10 python benchmarks/correlated.py --dataset adult --peers saved
    nice -n 10 python benchmarks/correlated.py --dataset acs --epsilons 1 --peers none
    nice -n 10 python benchmarks/correlated.py --epsilons 0.5,1,2 --peers none --pb-sampling-baseline iid
    nice -n 10 python benchmarks/correlated.py --speed 100000,1000000,3000000
    nice -n 10 python benchmarks/correlated.py --speed 100000,1000000 --speed-method independent

Ratios printed: beamsynth TVD / peer TVD and peer time / beamsynth time at the same ε (peers at
the seeds they were run with). ``--speed`` runs the end-to-end pipeline on an Adult resample of each
size in a fresh subprocess (the resample is written by another one) and prints wall time, CPU
seconds, peak RSS and the load average (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

# one thread per process for the GBM evaluation: the machine is shared, oversubscription hurts
os.environ.setdefault("OMP_NUM_THREADS", "1")

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
HERE = Path(__file__).resolve().parent
PEERS = {"datasynthesizer": "/tmp/peer-ds/bin/python", "mst": "/tmp/peer-mst/bin/python"}
# AIM (private-pgm mechanisms/aim.py) in its own virtualenv, set up as ../shared/tools/aim/README.md
# says: AIM_DIR holds venv/, ppgm/ (the repository's HEAD) and run_aim.py; its runs go to AIM_DIR/out
# as aim_<dataset>_eps<e>_seed<s>_mms<m>.csv + .json (seconds and settings). Never a project dependency.
AIM_DIR = Path(os.environ.get("BEAMSYNTH_AIM_DIR", "/work/aim"))
# Finished AIM runs kept in the repository (synthetic cell codes, gzip, + .json with seconds and
# settings), so a later session re-evaluates them without hours of AIM: see peer_runs/README.md.
PEER_RUNS = HERE / "peer_runs"
PEER_NAMES = ("datasynthesizer", "mst", "aim")
DATASETS = {
    "adult": {"schema": "adult", "file": DATA / "adult" / "adult.csv", "target": "income",
              "positive": ">50K"},
    "acs": {"schema": "acs_national", "file": DATA / "acs_nist_sdnist" / "national2019.csv",
            "target": "DPHY", "positive": "1"},
    "census_kdd": {"schema": "census_kdd", "file": DATA / "census_kdd" / "census_income_kdd.csv.gz",
                   "target": "income", "positive": "50000+"},
}


def load_dataset(name: str):
    """(schema, train frame, test frame) with raw string values."""
    from beamsynth.schemas.schema import load_schema

    spec = DATASETS[name]
    if not Path(spec["file"]).is_file():
        raise SystemExit(f"data file {spec['file']} is missing (needs ../shared/data)")
    schema = load_schema(spec["schema"])
    df = pd.read_csv(spec["file"], dtype=str, keep_default_na=False)
    if "split" in df.columns:
        return schema, df[df.split == "train"].reset_index(drop=True), df[df.split == "test"].reset_index(drop=True)
    return schema, df, df


def run_beamsynth(schema, train_csv: str, rows: int, epsilon: float, seed: int, out_dir: str,
                  degree: int | None = None, sampling: str | None = None, method: str = "privbayes",
                  read_back: bool = True, noise: str | None = None,
                  delta: float = 0.0, input_rows: bool = True,
                  extra_options: dict | None = None) -> tuple[pd.DataFrame | None, float]:
    """The synthesize pipeline end to end on the DirectRunner; returns (synthetic frame, seconds)
    (frame None without ``read_back``; ``input_rows=False``: no public input size, the model is
    sized from a DP count as for a CLI user without --input-rows)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from beamsynth.pipelines.methods.synthesize import SynthesisConfig, run_synthesis

    out = os.path.join(out_dir, f"pb_eps{epsilon}_seed{seed}_{sampling}.csv")
    # public input size (peers are given n too): model sizing
    opts: dict = {"input_rows": rows} if input_rows else {}
    if degree is not None:
        opts["degree"] = degree
    if sampling is not None:
        opts["sampling"] = sampling
    if noise is not None:
        opts["pb_noise"] = noise
    opts.update(extra_options or {})  # --target / --pb-refine-target-picks (H85)
    cfg = SynthesisConfig(input=train_csv, schema=schema, output=out, epsilon=epsilon,
                          method=method, rows=rows, seed=seed, options=opts, delta=delta)
    t0 = time.perf_counter()
    run_synthesis(cfg, PipelineOptions(["--runner=DirectRunner"]))
    seconds = time.perf_counter() - t0
    if not read_back:
        return None, seconds
    return pd.read_csv(out, dtype=str, keep_default_na=False), seconds


def peer_result(peer: str, dataset: str, epsilon: float, seed: int, peer_dir: Path, mode: str,
                codes_csv: Path) -> tuple[np.ndarray, float] | None:
    """A peer's synthetic codes and seconds, from ``peer_dir`` or (mode run) by running it."""
    out = peer_dir / f"{peer}_eps{epsilon:g}_seed{seed}.csv"
    meta = out.with_suffix(".json")
    if not meta.is_file() and mode == "run" and Path(PEERS[peer]).is_file():
        cmd = ["nice", "-n", "10", PEERS[peer], str(HERE / "peers_correlated.py"), peer,
               str(codes_csv), str(out), "--epsilon", f"{epsilon:g}", "--seed", str(seed)]
        print("running", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=False)
    if not meta.is_file():
        return None
    seconds = json.loads(meta.read_text())["seconds"]
    return pd.read_csv(out).to_numpy(dtype=np.int64), float(seconds)


def aim_result(dataset: str, epsilon: float, seed: int, peer_dir: Path, mode: str, codes_csv: Path,
               shape: dict[str, int], mms: float, iters: int) -> tuple[np.ndarray, float, dict] | None:
    """AIM's synthetic codes, seconds and settings (mms, iters, seed, degree) from ``peer_dir``.

    A finished run of ``AIM_DIR/out`` (e.g. the background queue's) is copied into ``peer_dir``
    first; with mode ``run`` a missing one is run (``AIM_DIR/venv`` python, ``run_aim.py`` in
    ``AIM_DIR``: workload all 2-way marginals ≤ 10,000 cells, δ = 1e-9; about an hour per run on
    Adult at mms 80)."""
    name = f"aim_eps{epsilon:g}_seed{seed}_mms{mms:g}.csv"
    out = peer_dir / name
    meta = Path(str(out) + ".json")
    done = AIM_DIR / "out" / f"aim_{dataset}_eps{epsilon:g}_seed{seed}_mms{mms:g}.csv"
    kept = PEER_RUNS / f"aim_{dataset}_eps{epsilon:g}_seed{seed}_mms{mms:g}.csv.gz"
    if not meta.is_file() and Path(str(done) + ".json").is_file():
        shutil.copyfile(done, out)
        shutil.copyfile(str(done) + ".json", meta)
    if not meta.is_file() and kept.with_suffix(".json").is_file():
        pd.read_csv(kept).to_csv(out, index=False)
        shutil.copyfile(kept.with_suffix(".json"), meta)
    python = AIM_DIR / "venv" / "bin" / "python"
    if not meta.is_file() and mode == "run" and python.is_file():
        domain = peer_dir.parent / "domain.json"
        domain.write_text(json.dumps(shape))
        cmd = ["nice", "-n", "10", str(python), "run_aim.py", str(codes_csv), str(domain), str(out),
               f"{epsilon:g}", str(seed), f"{mms:g}", "2", str(iters)]
        print("running", " ".join(cmd), "in", AIM_DIR, flush=True)
        subprocess.run(cmd, check=False, cwd=AIM_DIR)
    if not meta.is_file():
        return None
    info = json.loads(meta.read_text())
    codes = pd.read_csv(out)[list(shape)].to_numpy(dtype=np.int64)
    settings = {"mms": info.get("mms", mms), "iters": info.get("iters", iters), "seed": info.get("seed", seed),
                "degree": info.get("degree", 2)}
    return codes, float(info["seconds"]), settings


def evaluate(schema, test_codes: np.ndarray, synth, target, positive, seed: int) -> dict:
    """TVD1/2/3 (+ accuracy/AUC if a target is given) of synthetic data against real test codes."""
    from beamsynth.pipelines.releases.quality import as_codes, ml_efficacy, quality_report

    codes = as_codes(schema, synth)
    q = quality_report(schema, test_codes, codes, n_three_way=100, seed=0)
    out = {"tvd1": q.tvd1, "tvd2": q.tvd2, "tvd3": q.tvd3}
    if target is not None:
        out.update(ml_efficacy(schema, codes, test_codes, target=target, positive=positive, seed=seed))
    return out


def quality_main(a: argparse.Namespace) -> int:
    from beamsynth.pipelines.releases.quality import encode_frame, ml_efficacy, quality_report

    schema, train, test = load_dataset(a.dataset)
    spec = DATASETS[a.dataset]
    train_codes, _ = encode_frame(schema, train)
    test_codes, _ = encode_frame(schema, test)
    peer_dir = Path(a.peer_dir or HERE / "_peers" / a.dataset / "out")
    peer_dir.mkdir(parents=True, exist_ok=True)
    codes_csv = peer_dir.parent / "train_codes.csv"
    if not codes_csv.is_file():
        pd.DataFrame(train_codes, columns=schema.names).to_csv(codes_csv, index=False)
    eps_list = [float(e) for e in a.epsilons.split(",")]
    seeds = [int(s) for s in a.seeds.split(",")]
    rows: list[dict] = []
    skipped: set[str] = set()
    aim_seeds = {int(x) for x in a.aim_seeds.split(",")}
    real = quality_report(schema, test_codes, train_codes, n_three_way=100, seed=0)
    ref = {"method": "real train vs test", "epsilon": None, "tvd1": real.tvd1, "tvd2": real.tvd2,
           "tvd3": real.tvd3, "seconds": None}
    if spec["target"]:
        ref.update(ml_efficacy(schema, train_codes, test_codes, target=spec["target"],
                               positive=spec["positive"]))
    rows.append(ref)
    with tempfile.TemporaryDirectory() as tmp:
        train_csv = os.path.join(tmp, "train.csv")
        train[schema.names].to_csv(train_csv, index=False)
        earlier = {}
        from beamsynth.transforms.privbayes_plan import resolve_noise

        # the mode the run resolves to (no --pb-noise: the CLI's default, laplace)
        gaussian = resolve_noise(a.pb_noise or "laplace", a.delta)[0] == "gaussian"
        ours = "beamsynth privbayes" + (" gaussian" if gaussian else "") + (
            " (DP n̂)" if a.no_input_rows else "")
        for f in (a.beamsynth_from or "").split(","):
            # beamsynth rows of earlier runs: the main method's are reused, others kept as they are
            for r in json.loads(Path(f).read_text()) if f else []:
                if r["method"] == ours:
                    earlier[(r["epsilon"], r["seed"])] = r
                elif r["method"].startswith("beamsynth") and r["epsilon"] in eps_list:
                    rows.append(r)
        extra = {k: v for k, v in (("target", a.target),
                                   ("refine_target_picks", a.pb_refine_target_picks)) if v is not None}
        for eps in eps_list:
            for seed in seeds:
                for extra_mode in (a.pb_sampling_baseline or "").split(","):
                    # same ε and seed with another --pb-sampling: the before/after of one run
                    if not extra_mode:
                        continue
                    synth, secs = run_beamsynth(schema, train_csv, len(train), eps, seed, tmp,
                                                a.degree, extra_mode)
                    r = {"method": f"beamsynth privbayes ({extra_mode})", "epsilon": eps, "seed": seed,
                         "seconds": secs}
                    r.update(evaluate(schema, test_codes, synth, spec["target"], spec["positive"], seed))
                    rows.append(r)
                    print(json.dumps(r), flush=True)
                if (eps, seed) in earlier:
                    r = earlier[(eps, seed)]
                else:
                    synth, secs = run_beamsynth(schema, train_csv, len(train), eps, seed, tmp, a.degree,
                                                noise=a.pb_noise, delta=a.delta,
                                                input_rows=not a.no_input_rows,
                                                extra_options=extra)
                    r = {"method": ours, "epsilon": eps, "seed": seed, "seconds": secs, **extra}
                    if gaussian:
                        r["delta"] = a.delta
                    r.update(evaluate(schema, test_codes, synth, spec["target"], spec["positive"], seed))
                rows.append(r)
                print(json.dumps(r), flush=True)
                if a.peers == "none":
                    continue
                for peer in ("datasynthesizer", "mst"):
                    if not Path(PEERS[peer]).is_file() and not any(peer_dir.glob(f"{peer}_*.json")):
                        skipped.add(f"{peer} (no venv at {PEERS[peer]}, no saved runs)")
                        continue
                    got = peer_result(peer, a.dataset, eps, seed, peer_dir, a.peers, codes_csv)
                    if got is None:
                        continue
                    r = {"method": peer, "epsilon": eps, "seed": seed, "seconds": got[1]}
                    r.update(evaluate(schema, test_codes, got[0], spec["target"], spec["positive"], seed))
                    rows.append(r)
                    print(json.dumps(r), flush=True)
                if seed in aim_seeds:
                    got = aim_result(a.dataset, eps, seed, peer_dir, a.peers, codes_csv,
                                     dict(zip(schema.names, schema.shape)), a.aim_mms, a.aim_iters)
                    if got is None:
                        skipped.add(f"aim eps={eps:g} seed={seed} (no run in {peer_dir} or {AIM_DIR / 'out'})")
                        continue
                    r = {"method": "aim", "epsilon": eps, "seed": seed, "seconds": got[1],
                         "settings": got[2]}
                    r.update(evaluate(schema, test_codes, got[0], spec["target"], spec["positive"], seed))
                    rows.append(r)
                    print(json.dumps(r), flush=True)
    for note in sorted(skipped):
        print("skipped:", note)
    print_table(rows)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(rows, indent=1))
    return 0


def print_table(rows: list[dict]) -> None:
    """Means per (method, ε) and the ratios against the peers at the same ε."""
    df = pd.DataFrame(rows)
    cols = [c for c in ("tvd1", "tvd2", "tvd3", "accuracy", "auc", "seconds") if c in df.columns]
    df["epsilon"] = df["epsilon"].astype(object).where(df["epsilon"].notna(), "-")
    g = df.groupby(["epsilon", "method"], sort=False)[cols].mean()
    g["runs"] = df.groupby(["epsilon", "method"], sort=False).size()
    print()
    print(g.to_string(float_format=lambda v: f"{v:.4f}"))
    print()
    for method in ("beamsynth privbayes", "beamsynth privbayes gaussian"):
        ours = df[df.method == method].groupby("epsilon")[cols].mean()
        _print_ratios(df, ours, method, cols)
    if "settings" in df.columns:
        for _, r in df[df.method == "aim"].iterrows():
            print(f"aim run eps={r.epsilon} seed={r.seed}: {r.settings}, {r.seconds:.0f} s")


def _print_ratios(df: pd.DataFrame, ours: pd.DataFrame, method: str, cols: list[str]) -> None:
    for peer in PEER_NAMES:
        theirs = df[df.method == peer].groupby("epsilon")[cols].mean()
        for eps in theirs.index:
            if eps not in ours.index:
                continue
            o, t = ours.loc[eps], theirs.loc[eps]
            print(f"eps={eps}: {method} vs {peer}: TVD2 ratio {o.tvd2 / t.tvd2:.3f}, TVD3 ratio "
                  f"{o.tvd3 / t.tvd3:.3f} (< 1 = beamsynth better); speed-up "
                  f"{t.seconds / o.seconds:.1f}x ({peer} {t.seconds:.0f} s / beamsynth end to end "
                  f"{o.seconds:.1f} s)")


def make_resample(n: int, path: str, seed: int = 0) -> None:
    """An n-row i.i.d. resample of the Adult train split, written as CSV (benchmark input)."""
    schema, train, _ = load_dataset("adult")
    idx = np.random.default_rng(seed).integers(0, len(train), n)
    train.iloc[idx][schema.names].to_csv(path, index=False)


def speed_child(n: int, path: str, method: str = "privbayes") -> int:
    """One end-to-end run on a prepared resample; prints seconds, CPU seconds and peak RSS.

    The output is not read back (reading 1M+ rows into pandas would dominate the peak RSS)."""
    from beamsynth.schemas.schema import load_schema

    schema = load_schema("adult")
    before = resource.getrusage(resource.RUSAGE_SELF)
    with tempfile.TemporaryDirectory() as tmp:
        _, secs = run_beamsynth(schema, path, n, 1.0, 0, tmp, method=method, read_back=False)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(json.dumps({"rows": n, "method": method, "seconds": secs, "cpu_seconds": cpu,
                      "peak_rss_mb": after.ru_maxrss / 1024,
                      "rss_before_run_mb": before.ru_maxrss / 1024,
                      "load_average_1min": os.getloadavg()[0]}))
    return 0


def speed_main(a: argparse.Namespace) -> int:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in [int(x) for x in a.speed.split(",")]:
            path = os.path.join(tmp, f"adult_{n}.csv")
            subprocess.run([sys.executable, __file__, "--make-resample", str(n), path], check=True)
            proc = subprocess.run([sys.executable, __file__, "--speed-child", str(n), path,
                                   "--speed-method", a.speed_method],
                                  capture_output=True, text=True, check=False)
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if not line:
                print(proc.stderr[-2000:])
                return 1
            r = json.loads(line[-1])
            results.append(r)
            print(json.dumps(r), flush=True)
            os.remove(path)
    a0 = results[0]
    for a1 in results[1:]:  # against the first (smallest) size of the same run
        print(f"rows x{a1['rows'] / a0['rows']:.0f}: time x{a1['seconds'] / a0['seconds']:.2f}, "
              f"CPU x{a1['cpu_seconds'] / a0['cpu_seconds']:.2f}, "
              f"peak RSS x{a1['peak_rss_mb'] / a0['peak_rss_mb']:.2f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", choices=sorted(DATASETS), default="adult")
    ap.add_argument("--epsilons", default="0.1,0.5,1,2,5")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--degree", type=int, default=None)
    ap.add_argument("--pb-sampling-baseline", default=None,
                    help="also run beamsynth with these --pb-sampling modes (e.g. iid), same seeds")
    ap.add_argument("--peers", choices=["none", "saved", "run"], default="saved")
    ap.add_argument("--peer-dir", default=None)
    ap.add_argument("--pb-noise", choices=["auto", "laplace", "gaussian"], default=None,
                    help="beamsynth privbayes noise (default: the CLI's, laplace; gaussian, or "
                         "auto with --delta > 0: zCDP at --delta, rows named 'beamsynth "
                         "privbayes gaussian')")
    ap.add_argument("--delta", type=float, default=0.0, help="beamsynth δ (gaussian: AIM's 1e-9)")
    ap.add_argument("--no-input-rows", action="store_true",
                    help="beamsynth without the public input size: sized from a DP count")
    ap.add_argument("--aim-mms", type=float, default=80.0, help="AIM max_model_size (MB; paper default 80)")
    ap.add_argument("--aim-iters", type=int, default=1000, help="AIM max_iters (mirror descent)")
    ap.add_argument("--aim-seeds", default="0", help="seeds at which AIM runs are read or run")
    ap.add_argument("--out", default=None, help="write all rows as JSON")
    ap.add_argument("--target", default=None,
                    help="privbayes' declared target (the CLI's --target; default: the schema's)")
    ap.add_argument("--pb-refine-target-picks", type=lambda s: s if s == "auto" else int(s),
                    default=None, help="privbayes: the refinement's first N picks among the "
                    "target's pairs (H85), or auto: a floor of 5 (H88)")
    ap.add_argument("--beamsynth-from", default=None,
                    help="comma-separated earlier --out JSONs: their rows of this run's beamsynth "
                         "method are reused, other beamsynth rows kept (re-evaluate peers only)")
    ap.add_argument("--speed", default=None, help="comma-separated row counts for the speed run")
    ap.add_argument("--speed-method", default="privbayes",
                    help="synthesis method of the speed run (e.g. independent)")
    ap.add_argument("--speed-child", nargs=2, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--make-resample", nargs=2, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.make_resample is not None:
        make_resample(int(a.make_resample[0]), a.make_resample[1])
        return 0
    if a.speed_child is not None:
        return speed_child(int(a.speed_child[0]), a.speed_child[1], a.speed_method)
    if a.speed:
        return speed_main(a)
    return quality_main(a)


if __name__ == "__main__":
    raise SystemExit(main())
