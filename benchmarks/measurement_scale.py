"""Scale of the one-pass measurement: vs a numpy floor, 1 vs 2 workers, peak memory.

Input: the bundled Adult data encoded with the bundled schema (15 columns), resampled i.i.d. to
N rows in batches of 20k (``beamsynth.runners.loadgen``; batch ``s`` is the same rows on every
run and worker). Measured, all in the same run, medians over ``--repeat``:

(a) throughput of ``MarginalCountsCombineFn`` in a Beam pipeline (the ``direct`` preset, in-process:
    ``Create(batch starts) → ResampleBatchesFn → CombineGlobally(MarginalCountsCombineFn)``) vs a
    numpy floor doing the same resampling plus one ``np.bincount`` per table per batch, no Beam,
    at 1M and 10M rows (goal: ≥ 25% of the floor). The tables of both are compared exactly.
(c) the same pipeline on the multi-process DirectRunner with 1 vs 2 worker processes at the
    largest N (goal: 2 workers ≥ 1.6× faster). On a shared 2-core machine this is bounded by
    what the other processes leave free: the load average is printed next to it.
(d) peak resident memory (``ru_maxrss``) of a fresh process running the in-process pipeline at
    each N (goal: flat, i.e. not growing with N).

    nice -n 10 python benchmarks/measurement_scale.py                 # all of (a), (c), (d)
    nice -n 10 python benchmarks/measurement_scale.py --rows 1000000  # quick
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import apache_beam as beam
import numpy as np
from apache_beam.metrics.metric import MetricsFilter

from beamsynth.runners.loadgen import (
    METRICS_NAMESPACE,
    ResampleBatchesFn,
    batch_starts,
    resample_rows,
    save_tables,
)
from beamsynth.runners.presets import options_for
from beamsynth.transforms.measure import MarginalCountsCombineFn

ADULT = Path(__file__).resolve().parents[1] / "examples" / "data" / "adult" / "adult.csv"
SHARED_ADULT = Path(__file__).resolve().parents[2] / "shared" / "data" / "adult" / "adult.csv"
BATCH = 20_000


def adult_codes_file(folder: str) -> tuple[str, list[int]]:
    """Encode Adult once; save the codes as ``.npy``; return (path, cells per column)."""
    import pandas as pd

    from beamsynth.schemas.schema import load_schema

    schema = load_schema("adult")
    df = pd.read_csv(ADULT if ADULT.exists() else SHARED_ADULT, dtype=str, keep_default_na=False)
    batch, bad = schema.encode_columns({c: df[c].astype(object) for c in schema.names}, len(df))
    if bad:
        raise ValueError(f"{len(bad)} Adult rows do not encode")
    path = os.path.join(folder, "adult_codes.npy")
    np.save(path, batch.codes)
    return path, list(schema.shape)


def numpy_floor(codes: np.ndarray, rows: int, shape: list[int]) -> tuple[float, float, list[np.ndarray]]:
    """(wall, CPU) seconds for resampling + one bincount per column per batch (no Beam), tables."""
    t, c = time.perf_counter(), time.process_time()
    tables = [np.zeros(s, dtype=np.int64) for s in shape]
    for start in batch_starts(rows, BATCH):
        data = resample_rows(codes, start, min(BATCH, rows - start))
        for j, s in enumerate(shape):
            tables[j] += np.bincount(data[:, j], minlength=s)
    return time.perf_counter() - t, time.process_time() - c, tables


LAST_SPREAD: dict[str, int] = {}  # batches drawn per worker process in the last run


def beam_measure(codes_path: str, rows: int, shape: list[int], args: list[str],
                 out_path: str) -> tuple[float, float]:
    """(wall, CPU of this process) seconds for the Beam pipeline (construction + run); tables
    saved to ``out_path``; batches per worker process in ``LAST_SPREAD``."""
    specs = [(j,) for j in range(len(shape))]
    t, c = time.perf_counter(), time.process_time()
    p = beam.Pipeline(options=options_for(args))
    (p
     | "Starts" >> beam.Create(batch_starts(rows, BATCH))
     | "Resample" >> beam.ParDo(ResampleBatchesFn(codes_path=codes_path, rows=rows, batch=BATCH))
     # EncodedBatch of 20k rows
     | "Count" >> beam.CombineGlobally(MarginalCountsCombineFn(specs, shape))
     # tuple of count tables
     | "Save" >> beam.Map(save_tables, out_path))
    result = p.run()
    result.wait_until_finish()
    elapsed = time.perf_counter() - t, time.process_time() - c
    counters = result.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE))["counters"]
    LAST_SPREAD.clear()
    for m in counters:
        LAST_SPREAD[m.key.metric.name] = int(m.committed or m.attempted or 0)
    return elapsed


def _load_tables(path: str) -> list[np.ndarray]:
    with np.load(path) as z:
        return [z[f"t{i}"] for i in range(len(z.files))]


IN_PROCESS = ["--direct_running_mode=in_memory"]


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def workers_args(n: int) -> list[str]:
    return ["--direct_running_mode=multi_processing", f"--direct_num_workers={n}"]


def child_peak_memory(codes_path: str, rows: int, shape: list[int]) -> float:
    """Peak RSS (MiB) of a fresh process running the in-process pipeline on ``rows``."""
    res = subprocess.run([sys.executable, __file__, "--child", codes_path, str(rows), json.dumps(shape)],
                         check=True, capture_output=True, text=True)
    return json.loads(res.stdout.strip().splitlines()[-1])["peak_mib"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-floor", action="store_true", help="skip (a)")
    ap.add_argument("--skip-workers", action="store_true", help="skip (c)")
    ap.add_argument("--skip-memory", action="store_true", help="skip (d)")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        path, rows, shape = args.child[0], int(args.child[1]), json.loads(args.child[2])
        with tempfile.TemporaryDirectory() as tmp:
            beam_measure(path, rows, shape, IN_PROCESS, os.path.join(tmp, "t.npz"))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps({"peak_mib": peak}))
        return
    with tempfile.TemporaryDirectory() as tmp:
        path, shape = adult_codes_file(tmp)
        codes = np.load(path)
        out = os.path.join(tmp, "tables.npz")
        beam_measure(path, BATCH, shape, IN_PROCESS, out)  # warm-up
        print(f"Adult resampled, {len(shape)} one-way tables, batches of {BATCH:,} rows; "
              f"medians of {args.repeat}; machine shared (load average {os.getloadavg()[0]:.1f})")
        if not args.skip_floor:
            print("(a) one-pass measurement vs numpy floor")
        for rows in [] if args.skip_floor else args.rows:
            tf, tb, cf, cb = [], [], [], []
            for _ in range(args.repeat):
                t, c, ref = numpy_floor(codes, rows, shape)
                tf.append(t)
                cf.append(c)
                t, c = beam_measure(path, rows, shape, IN_PROCESS, out)
                tb.append(t)
                cb.append(c)
                got = _load_tables(out)
                assert all(np.array_equal(a, b) for a, b in zip(ref, got)) and len(got) == len(ref)
            f, b = float(np.median(tf)), float(np.median(tb))
            fc, bc = float(np.median(cf)), float(np.median(cb))
            print(f"    N={rows:>11,}: numpy {f:7.2f} s ({rows / f / 1e6:6.2f} M rows/s)  "
                  f"beam {b:7.2f} s ({rows / b / 1e6:6.2f} M rows/s)  ratio {f / b:5.2f} wall, "
                  f"{fc / bc:5.2f} CPU (goal >= 0.25); tables identical")
        if not args.skip_workers:
            rows = max(args.rows)
            t1, t2, c1, c2, spread = [], [], [], [], []
            for _ in range(args.repeat):
                c = _children_cpu()
                t1.append(beam_measure(path, rows, shape, workers_args(1), out)[0])
                c1.append(_children_cpu() - c)
                ref = _load_tables(out)
                c = _children_cpu()
                t2.append(beam_measure(path, rows, shape, workers_args(2), out)[0])
                c2.append(_children_cpu() - c)
                spread.append(sorted(LAST_SPREAD.values()))
                assert all(np.array_equal(a, b) for a, b in zip(ref, _load_tables(out)))
            a, b = float(np.median(t1)), float(np.median(t2))
            print(f"(c) N={rows:,}, multi-process DirectRunner: 1 worker {a:.2f} s, 2 workers "
                  f"{b:.2f} s, speed-up {a / b:.2f}x (goal >= 1.6x); runs 1w {[round(x, 1) for x in t1]}"
                  f" 2w {[round(x, 1) for x in t2]}; worker-process CPU 1w "
                  f"{float(np.median(c1)):.1f} s, 2w {float(np.median(c2)):.1f} s (CPU/wall "
                  f"{float(np.median(c1)) / a:.2f} vs {float(np.median(c2)) / b:.2f}); batches per "
                  f"worker process with 2 workers {spread}; load average "
                  f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        if not args.skip_memory:
            peaks = {rows: child_peak_memory(path, rows, shape) for rows in args.rows}
            lo, hi = min(args.rows), max(args.rows)
            print("(d) peak RSS of a fresh process: " + ", ".join(
                f"N={r:,}: {m:.0f} MiB" for r, m in peaks.items())
                + f"; ratio {peaks[hi] / peaks[lo]:.2f} for {hi / lo:.0f}x the rows (goal: flat)")


if __name__ == "__main__":
    main()
