"""Scale: ``synthesize --method privbayes`` on N Adult rows, 2-process DirectRunner vs Dask (2 workers).

Input: CSVs of ``--rows`` rows (several sizes, e.g. ``--rows 1000000 3000000``) resampled i.i.d.
from the bundled Adult data in chunks of 1M rows, chunk ``c`` drawn with numpy PCG64(2000 + c)
(so the first 1M rows of every size are the same; public-data resampling for a benchmark, not a
privacy mechanism). Each size runs the real CLI in a fresh process:

* ``--runner direct-multi`` (2 SDK worker processes), and
* ``--runner dask``: the runner's own ``distributed.LocalCluster``, which on a 2-core machine is
  2 worker processes × 1 thread (the script prints the processes it saw),

both with ``--seed 7``. Printed per run: wall seconds, peak RSS of every process of the run
(the CLI process, its SDK workers or Dask workers; sampled every 0.5 s with psutil), the load average, and the SHA-256 of the output; then per runner the time ratio of
each size to the smallest (goal at 10M vs 1M: ≤ 12×), and whether both runners wrote the same
bytes.

Measured 2026-11-24 at 1M rows (108 MiB; load average 16.7 during the DirectRunner run, 16.5 →
3.6 during Dask's): direct-multi 963 s, peak RSS SDK workers 405 / 401 MiB, launcher 213 MiB;
dask 708 s, workers 755 / 518 MiB, launcher 254 MiB; outputs byte-identical (sha256
5d66bd87d105f948…). 3M rows (325 MiB), load 3.1: direct-multi 414 s, SDK workers 396 / 392
MiB, launcher 213 MiB (flat from 1M); the Dask 3M run was stopped unfinished at 03:52 and 10M
was not run (load above 4 until 03:40), so no time ratio at equal load exists yet.

10M, measured 2026-11-24 04:34-05:42 UTC (tree ea04fbd, 1M then 10M back to back, nice 5; the
machine shared with 5 other engineers: load 1/5/15 min 2.4/1.9/1.7 at the start, 9.7 between
the runs, 11-16 during most of the 10M run, 6.9 at its end):

=============  ======  =====  ============  ==================  ========  ================
runner         rows    MiB    wall s        peak RSS workers    launcher  sha256
=============  ======  =====  ============  ==================  ========  ================
direct-multi   1M      108    342           389 / 386 MiB       212 MiB   5d66bd87d105f948
direct-multi   10M     1084   3724 (10.9×)  436 / 412 MiB       212 MiB   afb7270aa25518df
=============  ======  =====  ============  ==================  ========  ================

The 1M output is the same bytes as the earlier session's. The 10M run used 1,390 CPU seconds
(launcher 13, SDK workers 689 + 687). Where the time goes (cProfile, 300k rows, in-process
DirectRunner, 116 s of pipeline): sampling 72 s (post-processing: raking the network's pool to
the refinement tables, ``refine.rake_weights`` 36 s, and pair balancing, ``balance_pairs`` 34 s),
reading 10 s, encoding 8 s, the measurement step 17 s (fixed: the refinement's selection on the
model, not on the data), the rest writing. The data is read once: one fused stage reads, encodes
and feeds both combines (the privbayes candidate counts and the DP row count) their partial
accumulators; only accumulators, the model and 50k-row sampling shards cross processes. Every
stage is linear in the rows, so the ratio stays near 10×.

Dask (2 workers × 1 thread), measured the same day after two runner fixes (tree f024df0):
Beam's Dask translation had no combiner lifting, so every ``CombineGlobally`` grouped all
``EncodedBatch`` elements (int32 codes, 60 MB per 1M rows) in one task, and its ``Reshuffle`` was
the identity, so all sampling shards ran in the one task holding the model, on one worker, which
also held every sampled table. Now combines are lifted and ``Reshuffle`` deals items round robin.

==============================  ====  =========  =========  ==================  ========  ================
dask                            rows  wall s     CPU s      peak RSS workers    launcher  sha256
==============================  ====  =========  =========  ==================  ========  ================
lifted, shards in one task      1M    760        308        719 / 544 MiB       256 MiB   5d66bd87d105f948
lifted + spread                 1M    316        247        885 / 751 MiB       255 MiB   5d66bd87d105f948
lifted + spread                 3M    592        667        1235 / 715 MiB      308 MiB   056c64e2a571b283
lifted + spread, stopped        10M   (7.5 min)  245        808 / 695 MiB       515 MiB   —
==============================  ====  =========  =========  ==================  ========  ================

A direct-multi 3M run right after (tree f024df0, load 1.5/2.5/5.1 → 3.3/3.4/4.5): 478 s wall,
446 s CPU, SDK workers 419 / 401 MiB, launcher 213 MiB, sha256 056c64e2a571b283, the same bytes
as Dask's 3M output. Loads (1/5/15 min) at start → end: 7.0/8.1/9.4 → 11.5/10.2/9.7 (one task), 4.8/8.3/9.3 →
4.9/6.4/8.2 (1M), 5.6/8.0/8.3 → 2.2/3.0/5.4 (3M). Both 1M outputs are the DirectRunner's bytes.
At 3M the time is 1.9× wall and 2.7× CPU the 1M run's, but one worker's peak grew from 885 to
1,235 MiB, after reading (both workers were at 715 / 683 MiB while reading 3M rows, ``--status``):
probably dask running ready sampling tasks before their consumers and keeping each task's
tables until then (a hypothesis, not traced). The 10M Dask run was stopped after 7.5 minutes
(load 8-10, still reading: 245 of an estimated 2,500 CPU seconds) because it could not end before
the session's deadline; its peaks are those of the reading phase only. Not flat yet: the
launcher, which hosts the dask scheduler, doubled (255 → 515 MiB: its graph has one task per
partition and step, 7 partitions at 1M, 68 at 10M, and every task carries its step's DoFn; not
confirmed by a profile), and a worker can hold the outputs of several read tasks at once (a
ParDo's bundle output stays in memory until both its main-output and metrics selections ran).

Dask 10M, measured 2026-11-24 (session 7; a snapshot of tree 5d435be plus the runner's changes,
run with ``PYTHONPATH`` pointing at it so peers' uncommitted edits could not change the output;
1M then 10M back to back, nice 5, my tests running beside the 1M run):

==============================  ====  =========  =========  ==================  ========  ================
dask                            rows  wall s     CPU s      peak RSS workers    launcher  sha256
==============================  ====  =========  =========  ==================  ========  ================
data-sized partitions 1b21f22   1M    559        258        662 / 654 MiB       240 MiB   5d66bd87d105f948
data-sized partitions 1b21f22   10M   1,238      1,895      2,155 / 1,217 MiB   332 MiB   afb7270aa25518df
+ carried metrics d63d099       1M    709        268        595 / 532 MiB       237 MiB   5d66bd87d105f948
+ carried metrics d63d099       10M   1,622      2,009      797 / 785 MiB       318 MiB   afb7270aa25518df
==============================  ====  =========  =========  ==================  ========  ================

Loads (1/5/15 min): 12.1/11.9/10.5 at the start, 12.4/13.3/12.0 between the runs, 16.5/15.8/14.5
at the end. Both outputs are the DirectRunner's bytes (1M: the earlier sessions' digest, so the
tree's seeded output has not changed; 10M: direct-multi's afb7270aa25518df from tree ea04fbd).
10M / 1M: 2.22x wall (the 1M run was slowed by tests), **7.34x CPU** (goal ≤ 12x: met). Memory
was not flat: the workers grew during sampling (peaks sampled every minute from the status file:
850 MiB at 633 CPU s, 1,448 at 1,379, 2,155 at 1,501). Cause, reproduced on a synthetic chain
(Create → CombineGlobally → 200 shards → Reshuffle → a 20 MB array per shard → Map → Map, 2 workers):
every bundle's metric-selection task kept the bundle's whole output in memory until it ran, and
dask ran those near the end: 20 shards 311 / 368 MiB, 200 shards 2,645 / 3,739 MiB; without the
metrics tasks 262 / 262 MiB; with them at dask priority 100, 1,906 / 2,345 MiB. The runner now
passes a bundle's metrics to the step's only ParDo reader (``_Carried``), so linear chains fuse
into one task: 251 / 253 MiB at 20 shards, 263 / 264 MiB at 200.

With it (same snapshot + d63d099, 1M then 10M, nice 5; load 9.6/10.6/11.8 → 8.1/11.1/11.8 during
1M, → 5.2/5.9/7.1 at the end of 10M; a peer process at nice -5 took ~65% of one core): 10M / 1M
= 2.29x wall, **7.50x CPU**; both outputs the DirectRunner's bytes. Workers no longer grow while
sampling (797 / 785 MiB reached by 760 of 2,009 CPU s, in the read phase, unchanged to the end;
the run before had 1,061 / 1,370 MiB at 1,251 CPU s and 2,155 at 1,501). Not flat yet: workers
+200-250 MiB and launcher +81 MiB from 1M to 10M. The launcher hosts the scheduler, whose graph
still grows with the read parts (16 MiB each: 7 at 1M, 68 at 10M); what the workers' read-phase
growth is was not traced (suspects: several parts' raw blocks held at once, allocator
fragmentation over 10x more tasks).

Dask after the fused stages (d4262f0), 2026-11-27, 1M then 10M back to back (``--keep
/tmp/scale``; load 3.9-7.0): 1M 198 s wall / 153 CPU s, workers 431 / 428 MiB, launcher 236 MiB,
sha256 7a37da67b5863707; 10M (68 read parts of 16 MiB) 1,930 s / 1,386 CPU s (9.75x wall,
9.07x CPU), workers 583 / 554 MiB, launcher 311 MiB, sha256 4c270012a722ee65. Still not flat.
Parts experiment (docs/runners.md, "Tasks follow the cluster"): one input, only
``--split-bytes`` varied, 2 workers x 1 thread. With one dask partition per read part a worker
kept the state of nearly every task it ran until the run ended (``distributed`` forgets a task
after its dependents), and the graph had about 98 tasks per part: 1M rows in 7 / 68 / 200 parts
gave workers 413-423 / 404-426 / 503-538 MiB, 741 / 12,091 / 44,659 scheduler tasks, 191 / 185 /
289 s. The combine accumulators alive at once were a small part of it (8 MiB over both workers
at 68 parts, 24 at 200: the degree-1 candidate counts are 121 KB per part). A ``Create`` now has
at most 4 partitions per worker thread (8 here), so the graph no longer grows with the parts:
1M in 68 / 200 parts gave 389-392 / 390-395 MiB, 874 scheduler tasks, 131 / 190 s, launcher
271 / 383 -> 227 / 228 MiB, the same bytes. A 10M run with the cap was not made yet (its graph
is 1M's: 8 partitions).

    nice -n 10 python benchmarks/scale_10m.py --rows 1000000 3000000
    nice -n 10 python benchmarks/scale_10m.py --rows 1000000 10000000 --runners direct-multi
    nice -n 5 python benchmarks/scale_10m.py --rows 1000000 10000000 --runners dask \
        --keep /tmp/scale10m --status /tmp/scale10m/status.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil

ROOT = Path(__file__).resolve().parents[1]
ADULT = ROOT / "examples" / "data" / "adult" / "adult.csv"
SHARED_ADULT = ROOT.parent / "shared" / "data" / "adult" / "adult.csv"
CHUNK = 1_000_000


def make_input(path: str, rows: int) -> str:
    """A CSV of ``rows`` Adult rows, written chunk by chunk (PCG64(2000 + chunk))."""
    df = pd.read_csv(ADULT if ADULT.exists() else SHARED_ADULT, dtype=str, keep_default_na=False)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="") as fh:
        for c, start in enumerate(range(0, rows, CHUNK)):
            n = min(CHUNK, rows - start)
            idx = np.random.Generator(np.random.PCG64(2000 + c)).integers(0, len(df), n)
            df.iloc[idx].to_csv(fh, index=False, header=(c == 0))
    os.replace(tmp, path)
    return path


class RssMonitor:
    """Peak RSS (MiB) and CPU seconds (user + system, as last sampled) of every descendant of
    this process, sampled every ``every`` seconds. CPU seconds hardly depend on the machine's
    load, unlike wall time, so they compare runs made at different loads."""

    def __init__(self, every: float = 0.5, status: str | None = None) -> None:
        self.peak: dict[int, tuple[str, float]] = {}
        self.cpu: dict[int, float] = {}
        self._status, self._written = status, 0.0
        self._every, self._stop = every, threading.Event()
        self._me = psutil.Process()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for p in self._me.children(recursive=True):
                try:
                    rss = p.memory_info().rss / 2**20
                    name = " ".join(p.cmdline()[1:4])[:60]
                    times = p.cpu_times()
                except psutil.Error:
                    continue
                self.cpu[p.pid] = times.user + times.system
                if rss > self.peak.get(p.pid, ("", 0.0))[1]:
                    self.peak[p.pid] = (name, rss)
            if self._status and time.monotonic() - self._written > 10:
                self._write_status()
            self._stop.wait(self._every)

    def _write_status(self) -> None:
        """Peaks and CPU so far (for a run stopped before its end)."""
        self._written = time.monotonic()
        with open(self._status, "w", encoding="utf-8") as fh:
            json.dump({"time": time.strftime("%H:%M:%S"), "load": os.getloadavg(),
                       "cpu_seconds": sum(self.cpu.values()),
                       "peak_rss_mib": {str(k): v for k, v in self.peak.items()}}, fh, indent=1)

    def stop(self) -> dict[int, tuple[str, float]]:
        self._stop.set()
        self._thread.join()
        return self.peak


def run(inp: str, out: str, runner: list[str],
        status: str | None = None) -> tuple[float, dict[int, tuple[str, float]], float]:
    """Wall seconds, per-process peak RSS and total CPU seconds of one ``synthesize --method
    privbayes`` run."""
    cmd = [sys.executable, "-m", "beamsynth.pipelines.cli.main", "synthesize", inp, "--schema", "adult",
           "--epsilon", "1", "--method", "privbayes", "--seed", "7", "--output", out, "--quiet",
           *runner]
    mon = RssMonitor(status=status)
    t = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t
    peak = mon.stop()
    if proc.returncode != 0:
        raise RuntimeError(f"synthesize failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, peak, sum(mon.cpu.values())


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 3_000_000])
    ap.add_argument("--runners", nargs="+", default=["direct-multi", "dask"],
                    choices=["direct-multi", "dask"])
    ap.add_argument("--keep", help="folder for inputs/outputs (default: a temp folder, removed)")
    ap.add_argument("--status", help="JSON file rewritten every 10 s with the running run's peak "
                                     "RSS per process and CPU seconds so far")
    args = ap.parse_args()
    folder = args.keep or tempfile.mkdtemp(prefix="scale_10m_")
    os.makedirs(folder, exist_ok=True)
    results: dict[tuple[str, int], tuple[float, str, float]] = {}
    try:
        for rows in args.rows:
            inp = os.path.join(folder, f"adult_{rows}.csv")
            if not os.path.exists(inp):
                make_input(inp, rows)
            print(f"== {rows:,} rows ({os.path.getsize(inp) / 2**20:.0f} MiB)", flush=True)
            for name in args.runners:
                extra = ["--runner", name]
                out = os.path.join(folder, f"out_{name}_{rows}.csv")
                load = "/".join(f"{x:.1f}" for x in os.getloadavg())
                wall, peak, cpu = run(inp, out, extra, args.status)
                digest = sha256(out)
                results[(name, rows)] = (wall, digest, cpu)
                after = "/".join(f"{x:.1f}" for x in os.getloadavg())
                print(f"{name:13s} {wall:8.1f} s wall  {cpu:8.1f} s CPU  load (1/5/15 min) {load} -> "
                      f"{after}  sha256 {digest[:16]}", flush=True)
                for pid, (what, rss) in sorted(peak.items(), key=lambda kv: -kv[1][1]):
                    if rss >= 50:
                        print(f"    pid {pid:7d} peak RSS {rss:8.0f} MiB  {what}")
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    base = min(args.rows)
    for name in args.runners:
        for rows in args.rows:
            if rows != base and (name, rows) in results:
                r = results[(name, rows)][0] / results[(name, base)][0]
                c = results[(name, rows)][2] / max(results[(name, base)][2], 1e-9)
                print(f"{name}: time at {rows:,} / time at {base:,} = {r:.2f}x wall, {c:.2f}x CPU "
                      f"(rows ratio {rows / base:.0f}x)")
    if len(args.runners) == 2:
        for rows in args.rows:
            same = results[("direct-multi", rows)][1] == results[("dask", rows)][1]
            print(f"{rows:,} rows: direct-multi and dask outputs byte-identical: {same}")


if __name__ == "__main__":
    main()
