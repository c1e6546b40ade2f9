"""Peak memory of ``synthesize`` on a large Parquet input against a small one (issue 17).

Parquet files are written the way users write them: ``pandas.DataFrame.to_parquet`` defaults,
``pyarrow.parquet.write_table`` defaults (snappy; a row group holds up to 1,048,576 rows, so a
3M-row file has 3 huge row groups), one single row group (snappy), one single row group
(zstd), and the same rows as CSV (``csv``, for comparison). Rows are an Adult resample (PCG64(2000 + chunk), as ``scale_10m.py``), at ``--small``
and ``--large`` rows. Each file goes through ``synthesize --method independent --quiet`` on each
runner; printed per run: wall seconds, peak RSS of the launcher and of its worker processes
(SDK workers on direct-multi; the 2 Dask workers of the runner's own LocalCluster on dask), and
the large / small ratio of the largest process in the same run.

    nice -n 10 python benchmarks/parquet_memory.py                      # 100k vs 3M, all runners
    nice -n 10 python benchmarks/parquet_memory.py --runners direct --layouts one_group_snappy
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from scale_10m import ADULT, CHUNK, SHARED_ADULT, RssMonitor

LAYOUTS = ("pandas_default", "arrow_default", "one_group_snappy", "one_group_zstd", "csv")
RUNNERS = ("direct", "direct-multi", "dask")


def adult_table(rows: int) -> pa.Table:
    """``rows`` Adult rows (all columns strings) resampled chunk by chunk with PCG64(2000 + chunk)."""
    src = ADULT if ADULT.exists() else SHARED_ADULT
    names = pacsv.read_csv(src).column_names
    base = pacsv.read_csv(src, convert_options=pacsv.ConvertOptions(
        column_types={c: pa.string() for c in names}, strings_can_be_null=False))
    parts = []
    for c, start in enumerate(range(0, rows, CHUNK)):
        n = min(CHUNK, rows - start)
        idx = np.random.Generator(np.random.PCG64(2000 + c)).integers(0, base.num_rows, n)
        parts.append(base.take(pa.array(idx)))
    return pa.concat_tables(parts).combine_chunks()


def write_layout(table: pa.Table, layout: str, path: str) -> None:
    """Write ``table`` to ``path`` in one of :data:`LAYOUTS`."""
    if layout == "pandas_default":
        table.to_pandas().to_parquet(path)
    elif layout == "arrow_default":
        pq.write_table(table, path)
    elif layout == "one_group_snappy":
        pq.write_table(table, path, row_group_size=table.num_rows)
    elif layout == "one_group_zstd":
        pq.write_table(table, path, row_group_size=table.num_rows, compression="zstd")
    elif layout == "csv":  # the same rows as CSV, for comparison
        with open(path, "wb") as fh:
            fh.write((",".join(table.column_names) + "\n").encode())
            pacsv.write_csv(table, fh, pacsv.WriteOptions(include_header=False, quoting_style="none"))
    else:
        raise ValueError(f"layout {layout!r} is not one of {LAYOUTS}")


def run(inp: str, out: str, runner: str) -> tuple[float, float, float]:
    """Wall seconds, launcher peak RSS and largest worker peak RSS (MiB; 0 without workers)."""
    cmd = [sys.executable, "-m", "beamsynth.pipelines.cli.main", "synthesize", inp, "--schema", "adult",
           "--epsilon", "1", "--seed", "7", "--output", out, "--quiet", "--runner", runner]
    mon = RssMonitor(every=0.2)
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate()
    wall = time.perf_counter() - t
    peak = mon.stop()
    if proc.returncode != 0:
        raise RuntimeError(f"synthesize failed ({proc.returncode}):\n{err[-3000:]}")
    launcher = peak.get(proc.pid, ("", 0.0))[1]
    workers = max((rss for pid, (_, rss) in peak.items() if pid != proc.pid), default=0.0)
    return wall, launcher, workers


def make_file(rows: int, layout: str, path: str) -> None:
    """Write the input in a child process, so this process (forked for every run) stays small."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import parquet_memory as m; "
            "m.write_layout(m.adult_table(int(sys.argv[2])), sys.argv[3], sys.argv[4])")
    subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), str(rows), layout, path],
                   check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=100_000)
    ap.add_argument("--large", type=int, default=3_000_000)
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=LAYOUTS)
    ap.add_argument("--runners", nargs="+", default=list(RUNNERS), choices=RUNNERS)
    ap.add_argument("--keep", help="folder for inputs/outputs (default: a temp folder, removed)")
    args = ap.parse_args()
    folder = args.keep or tempfile.mkdtemp(prefix="parquet_memory_")
    os.makedirs(folder, exist_ok=True)
    try:
        files: dict[tuple[str, int], str] = {}
        for rows in (args.small, args.large):
            for layout in args.layouts:
                ext = "csv" if layout == "csv" else "parquet"
                path = os.path.join(folder, f"adult_{rows}_{layout}.{ext}")
                if not os.path.exists(path):
                    make_file(rows, layout, path)
                groups = "" if ext == "csv" else f", {pq.ParquetFile(path).metadata.num_row_groups} row group(s)"
                print(f"{Path(path).name}: {os.path.getsize(path) / 2**20:.1f} MiB{groups}", flush=True)
                files[(layout, rows)] = path
        print(f"{'layout':17s} {'runner':13s} {'rows':>9s} {'wall s':>7s} {'launcher':>9s} "
              f"{'worker':>7s}  (peak RSS MiB)")
        for layout in args.layouts:
            for runner in args.runners:
                got = {}
                for rows in (args.small, args.large):
                    out = os.path.join(folder, f"out_{layout}_{runner}_{rows}.csv")
                    wall, launcher, worker = got[rows] = run(files[(layout, rows)], out, runner)
                    print(f"{layout:17s} {runner:13s} {rows:9,d} {wall:7.1f} {launcher:9.0f} {worker:7.0f}",
                          flush=True)
                big = max(got[args.large][1:]) / max(got[args.small][1:])
                print(f"{layout:17s} {runner:13s} large/small peak RSS of the largest process: {big:.2f}x "
                      f"(launcher {got[args.large][1] / got[args.small][1]:.2f}x)", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
