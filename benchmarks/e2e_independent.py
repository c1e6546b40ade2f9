"""End-to-end overhead: ``beamsynth synthesize --method independent`` vs pandas+numpy in one process.

Input: one CSV of ``--rows`` rows resampled i.i.d. from the bundled Adult data (numpy PCG64
seeded by 1000, as ``benchmarks/workers_scale.py``; public-data resampling for a benchmark, not
a privacy mechanism). Both sides run as fresh processes (interpreter start and imports included)
doing the same work:

* beamsynth: ``python -m beamsynth.pipelines.cli.main synthesize IN --schema adult --epsilon 1
  --method independent --seed 7 --output OUT`` (default runner, as a user types it);
* baseline (``--baseline IN OUT``): ``pandas.read_csv`` → ``Schema.encode_columns`` (the declared
  domains, with reasons) → ``np.bincount`` per column → discrete Laplace noise from
  ``transforms/noise.py`` on every declared cell + a noisy row count → clip/normalize → numpy
  categorical sampling of each column → ``Schema.decode_rows`` → ``DataFrame.to_csv``.

The two are alternated ``--repeat`` times; medians of wall seconds (and CPU seconds of the
process tree) are printed with their ratio (goal: beamsynth ≤ 3× the baseline), the load
average before and after, and a SHA-256 of the seeded beamsynth output. ``--before DIR`` also
times an older tree (``DIR/beamsynth/{pipelines,transforms,...}``, e.g. from ``git archive``)
in the same run and says whether both wrote the same bytes (an optimisation must not change
the seeded file).

Measured 2026-11-24 (2 cores, load average 12.6 → 7.3 during the run, 1M rows, 108 MiB,
3 repeats, ``--before`` = the tree before the columnar coder, transforms/coders.py): median CPU
beamsynth 37.3 s, before 41.9 s, baseline 21.8 s → **1.72×** the baseline (before: 1.93×);
median wall 218 s / 333 s / 228 s (0.96× / 1.46×: wall times swung 61-230 s for the same
baseline under the load, so read the CPU ratio); seeded outputs byte-identical before/after
(sha256 3d346d50…). 200k rows, /usr/bin/time, 2 runs each: before 12.7/12.0 s user, after
11.5/10.9 s, baseline 5.3/5.6 s.

    nice -n 10 python benchmarks/e2e_independent.py                   # 1M rows, 3 repeats
    nice -n 10 python benchmarks/e2e_independent.py --rows 200000 --repeat 1
    nice -n 10 python benchmarks/e2e_independent.py --before /tmp/old   # /tmp/old/beamsynth/...
    python -m cProfile -o /tmp/e2e.prof -m beamsynth.pipelines.cli.main synthesize ...   # profile
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil

ROOT = Path(__file__).resolve().parents[1]
ADULT = ROOT / "examples" / "data" / "adult" / "adult.csv"
SHARED_ADULT = ROOT.parent / "shared" / "data" / "adult" / "adult.csv"
EPSILON = 1.0
COUNT_FRACTION = 0.05


def make_input(path: str, rows: int, seed: int = 1000) -> str:
    """A CSV of ``rows`` Adult rows drawn with replacement (PCG64 seeded by ``seed``)."""
    df = pd.read_csv(ADULT if ADULT.exists() else SHARED_ADULT, dtype=str, keep_default_na=False)
    idx = np.random.Generator(np.random.PCG64(seed)).integers(0, len(df), rows)
    df.iloc[idx].to_csv(path, index=False)
    return path


def baseline(inp: str, out: str, seed: int = 7) -> int:
    """The same work as ``synthesize --method independent`` in one process; returns rows written."""
    from beamsynth.schemas.schema import load_schema
    from beamsynth.transforms.noise import RandomSource, discrete_laplace

    schema = load_schema("adult")
    df = pd.read_csv(inp, dtype=str, keep_default_na=False)
    batch, _bad = schema.encode_columns({c.name: df[c.name] for c in schema.columns}, len(df))
    rs = RandomSource(seed=seed)
    eps_count = EPSILON * COUNT_FRACTION
    eps_col = (EPSILON - eps_count) / len(schema.columns)
    n = max(0, len(batch) + int(discrete_laplace(rs.child("count"), 1.0 / eps_count, 1)[0]))
    gen = rs.child("sample").numpy_generator()
    codes = np.empty((n, len(schema.columns)), dtype=np.int64)
    for j, col in enumerate(schema.columns):
        counts = np.bincount(batch.codes[:, j], minlength=col.cells).astype(np.float64)
        counts += discrete_laplace(rs.child("m", j), 1.0 / eps_col, col.cells)
        p = np.clip(counts, 0, None)
        p = p / p.sum() if p.sum() > 0 else np.full(col.cells, 1.0 / col.cells)
        codes[:, j] = gen.choice(col.cells, size=n, p=p)
    pd.DataFrame(schema.decode_rows(codes, rs.child("decode"))).to_csv(out, index=False)
    return n


def tree_cpu(proc: psutil.Process) -> float:
    """CPU seconds of ``proc`` and its live children (polled; children that ended are in
    ``children_*`` of the parent's times)."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            pass
    return total


def timed(cmd: list[str], pythonpath: str | None = None) -> tuple[float, float]:
    """Wall and CPU seconds (process tree) of one command (``pythonpath``: put first on the path)."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env)
    ps = psutil.Process(proc.pid)
    cpu = 0.0
    while proc.poll() is None:
        cpu = max(cpu, tree_cpu(ps)) if ps.is_running() else cpu
        time.sleep(0.2)
    wall = time.perf_counter() - t
    err = proc.stderr.read()
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed ({proc.returncode}):\n{err[-3000:]}")
    return wall, cpu


def beamsynth_cmd(inp: str, out: str, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "beamsynth.pipelines.cli.main", "synthesize", inp, "--schema", "adult",
            "--epsilon", str(EPSILON), "--method", "independent", "--seed", "7", "--output", out,
            "--quiet", *extra]


def sha256(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", help="folder to keep the input/output in (default: a temp folder)")
    ap.add_argument("--before", metavar="DIR",
                    help="also time beamsynth imported from DIR (a folder holding an older "
                         "'beamsynth' package tree) in the same run, and compare its output bytes")
    ap.add_argument("--baseline", nargs=2, metavar=("IN", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("extra", nargs="*", help="extra CLI options for beamsynth (after --)")
    args = ap.parse_args()
    if args.baseline:
        baseline(*args.baseline)
        return
    folder = args.keep or tempfile.mkdtemp(prefix="e2e_independent_")
    os.makedirs(folder, exist_ok=True)
    inp = os.path.join(folder, f"adult_{args.rows}.csv")
    if not os.path.exists(inp):
        make_input(inp, args.rows)
    print(f"input: {args.rows:,} rows, {os.path.getsize(inp) / 2**20:.1f} MiB; "
          f"load average before: {os.getloadavg()}", flush=True)
    runs = {"beamsynth": (beamsynth_cmd(inp, os.path.join(folder, "synthetic.csv"), args.extra), None),
            "baseline": ([sys.executable, __file__, "--baseline", inp,
                          os.path.join(folder, "baseline.csv")], None)}
    if args.before:
        runs["before"] = (beamsynth_cmd(inp, os.path.join(folder, "synthetic_before.csv"),
                                        args.extra), args.before)
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in runs}
    for r in range(args.repeat):
        for name, (cmd, path) in runs.items():
            times[name].append(timed(cmd, path))
        print(f"repeat {r + 1}: " + ", ".join(f"{k} {v[-1][0]:.1f} s wall" for k, v in times.items())
              + f"; load {os.getloadavg()[0]:.1f}", flush=True)
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
           for k, v in times.items()}
    for i, what in enumerate(("wall", "CPU")):
        print(f"median {what}: " + ", ".join(f"{k} {v[i]:.1f} s" for k, v in med.items()) + "; "
              + ", ".join(f"{k}/baseline {med[k][i] / med['baseline'][i]:.2f}x"
                          for k in med if k != "baseline"))
    digest = sha256(runs["beamsynth"][0][runs["beamsynth"][0].index("--output") + 1])
    print(f"seeded output sha256 {digest}; load average after: {os.getloadavg()}")
    if args.before:
        old = sha256(runs["before"][0][runs["before"][0].index("--output") + 1])
        print(f"before and after outputs byte-identical: {old == digest}")


if __name__ == "__main__":
    main()
