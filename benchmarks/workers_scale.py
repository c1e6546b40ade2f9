"""Full ``beamsynth synthesize`` on the multi-process DirectRunner: 1 vs 2 worker processes.

Input: ``--files`` CSV files of ``--rows`` rows each, resampled i.i.d. from the bundled Adult
data (numpy PCG64 seeded by file number: the same files on every run; public-data resampling
for a benchmark, not a privacy mechanism). Each configuration runs the real CLI
(``python -m beamsynth.pipelines.cli.main synthesize ... --method independent --seed 7``) in a fresh
process, alternating 1 and 2 workers, ``--repeat`` times; medians are printed with the ratio
measured in the same run (goal: 2 workers ≥ 1.6× faster), the CPU seconds of every process of
the run (runner process and SDK worker processes, sampled from /proc every 0.2 s), the cores
other processes used meanwhile (machine busy time minus the run's), the load average, and
whether the seeded outputs of both configurations are identical (sorted rows).

On a shared machine the 2-worker run can only be faster if a second core is free: with one other
busy process the scheduler's fair share caps the speed-up near 4/3 whatever the pipeline does,
so read the ratio next to the "other processes used" figure (``--wait-quiet`` waits for a quiet
moment before each run).

    nice -n 10 python benchmarks/workers_scale.py                       # 2 × 1M rows, 3 repeats
    nice -n 10 python benchmarks/workers_scale.py --wait-quiet 300      # wait for idle cores
    nice -n 10 python benchmarks/workers_scale.py --rows 200000 --repeat 1   # quick
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil

ADULT = Path(__file__).resolve().parents[1] / "examples" / "data" / "adult" / "adult.csv"
SHARED_ADULT = Path(__file__).resolve().parents[2] / "shared" / "data" / "adult" / "adult.csv"


def make_inputs(folder: str, files: int, rows: int) -> list[str]:
    """``files`` CSVs of ``rows`` Adult rows drawn with replacement (PCG64 seeded by file number)."""
    df = pd.read_csv(ADULT if ADULT.exists() else SHARED_ADULT, dtype=str, keep_default_na=False)
    paths = []
    for f in range(files):
        idx = np.random.Generator(np.random.PCG64(1000 + f)).integers(0, len(df), rows)
        path = os.path.join(folder, f"adult_{f}.csv")
        df.iloc[idx].to_csv(path, index=False)
        paths.append(path)
    return paths


class CpuMonitor:
    """CPU seconds (user + system) of a process and all its descendants, polled from /proc."""

    def __init__(self, pid: int, every: float = 0.2) -> None:
        self._root, self._every = pid, every
        self.cpu: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        try:
            root = psutil.Process(self._root)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for p in procs:
            try:
                t = p.cpu_times()
                name = "runner" if p.pid == self._root else "worker"
                self.cpu[p.pid] = (name, t.user + t.system)
            except psutil.NoSuchProcess:
                pass

    def _run(self) -> None:
        while not self._stop.is_set():
            self._poll()
            self._stop.wait(self._every)

    def stop(self) -> dict[str, list[float]]:
        self._stop.set()
        self._thread.join()
        out: dict[str, list[float]] = {"runner": [], "worker": []}
        for name, sec in self.cpu.values():
            if name == "worker" and sec < 0.5:  # helper processes that did no work
                continue
            out[name].append(round(sec, 1))
        return out


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (all processes, all cores) since boot."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0)


def others_busy(seconds: float = 2.0) -> float:
    """Cores used by other processes over the next ``seconds`` (this process is idle then)."""
    before = busy_seconds()
    time.sleep(seconds)
    return (busy_seconds() - before) / seconds


def wait_quiet(limit: float, threshold: float = 0.3) -> float:
    """Wait (up to ``limit`` seconds) until other processes use < ``threshold`` cores."""
    end = time.time() + limit
    used = others_busy()
    while used >= threshold and time.time() < end:
        used = others_busy()
    return used


def run_once(inputs: list[str], out: str, workers: int, extra: list[str]) -> tuple[float, dict]:
    """Wall seconds of one CLI run and the CPU seconds per process (plus ``others``: cores used
    on average by processes outside the run while it ran)."""
    glob = os.path.join(os.path.dirname(inputs[0]), "adult_*.csv")
    cmd = [sys.executable, "-m", "beamsynth.pipelines.cli.main", "synthesize", glob, "--schema", "adult",
           "--epsilon", "1", "--method", "independent", "--seed", "7", "--output", out,
           "--runner", "direct-multi", f"--direct_num_workers={workers}", *extra]
    busy = busy_seconds()
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    mon = CpuMonitor(proc.pid)
    _, err = proc.communicate()
    wall = time.perf_counter() - t
    busy = busy_seconds() - busy
    cpu = mon.stop()
    cpu["others"] = max(0.0, busy - sum(cpu["runner"]) - sum(cpu["worker"])) / wall
    if proc.returncode != 0:
        raise RuntimeError(f"synthesize failed ({proc.returncode}):\n{err[-3000:]}")
    return wall, cpu


def sorted_rows(path: str) -> list[str]:
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    return [lines[0], *sorted(lines[1:])]


QUIET = 0.15  # cores used by other processes below which a run counts as undisturbed


def summary(label: str, walls: dict[int, list[float]], cpus: dict[int, list[dict]], a: int, b: int) -> None:
    """Print medians and best times of ``walls[a]`` vs ``walls[b]`` with the CPU seconds."""
    if not walls[a] or not walls[b]:
        print(f"{label}: no runs")
        return
    ma, mb = float(np.median(walls[a])), float(np.median(walls[b]))

    def cpu(w: int) -> str:
        med = lambda xs: float(np.median(xs))  # noqa: E731
        return (f"{w} worker(s): worker CPU {med([sum(c['worker']) for c in cpus[w]]):.1f} s in all, "
                f"busiest worker {med([max(c['worker'], default=0.0) for c in cpus[w]]):.1f} s, "
                f"runner {med([sum(c['runner']) for c in cpus[w]]):.1f} s")

    print(f"{label} ({len(walls[a])} + {len(walls[b])} runs): median wall {a} worker(s) {ma:.1f} s, "
          f"{b} workers {mb:.1f} s, speed-up {ma / mb:.2f}x (goal >= 1.6x); best {min(walls[a]):.1f} s "
          f"vs {min(walls[b]):.1f} s = {min(walls[a]) / min(walls[b]):.2f}x")
    print(f"    CPU (medians): {cpu(a)}; {cpu(b)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows per input file")
    ap.add_argument("--files", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="pairs of runs (1 then 2 workers)")
    ap.add_argument("--workers", type=int, nargs=2, default=[1, 2], metavar=("A", "B"))
    ap.add_argument("--beam-arg", action="append", default=[], help="extra option for every run")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                    help=f"before each run wait up to SECONDS until other processes use < {QUIET} cores")
    ap.add_argument("--quiet-pairs", type=int, default=0, metavar="K",
                    help="keep running pairs (up to --max-minutes) until K pairs ran undisturbed")
    ap.add_argument("--max-minutes", type=float, default=30.0)
    args = ap.parse_args()
    a, b = args.workers
    deadline = time.time() + 60 * args.max_minutes
    with tempfile.TemporaryDirectory() as tmp:
        inputs = make_inputs(tmp, args.files, args.rows)
        size = sum(os.path.getsize(p) for p in inputs) / 2**20
        print(f"synthesize (independent, seed 7) on {args.files} x {args.rows:,} Adult-resample CSV "
              f"rows ({size:.0f} MiB); {os.cpu_count()} cores; load average before "
              f"{os.getloadavg()[0]:.2f}", flush=True)
        walls: dict[int, list[float]] = {w: [] for w in args.workers}
        cpus: dict[int, list[dict]] = {w: [] for w in args.workers}
        quiet_walls: dict[int, list[float]] = {w: [] for w in args.workers}
        quiet_cpus: dict[int, list[dict]] = {w: [] for w in args.workers}
        loads = []
        r = 0
        while r < args.repeat or (len(quiet_walls[a]) < args.quiet_pairs and time.time() < deadline):
            r += 1
            pair = {}
            for w in args.workers:
                out = os.path.join(tmp, f"out_{w}.csv")
                if args.wait_quiet:
                    wait_quiet(args.wait_quiet, QUIET)
                wall, cpu = run_once(inputs, out, w, args.beam_arg)
                walls[w].append(wall)
                cpus[w].append(cpu)
                pair[w] = (wall, cpu)
                loads.append(os.getloadavg()[0])
                print(f"  run {r}: {w} worker(s) {wall:6.1f} s; CPU s runner {cpu['runner']} "
                      f"workers {cpu['worker']}; other processes used {cpu['others']:.2f} cores "
                      f"meanwhile; load {loads[-1]:.2f}", flush=True)
            if all(c["others"] < QUIET for _, c in pair.values()):
                for w, (wall, cpu) in pair.items():
                    quiet_walls[w].append(wall)
                    quiet_cpus[w].append(cpu)
        same = sorted_rows(os.path.join(tmp, f"out_{a}.csv")) == sorted_rows(os.path.join(tmp, f"out_{b}.csv"))
        summary("all runs", walls, cpus, a, b)
        summary(f"undisturbed pairs (other processes < {QUIET} cores in both runs)", quiet_walls, quiet_cpus, a, b)
        print(f"seeded outputs identical (sorted rows): {same}; load average during runs "
              f"{min(loads):.2f}-{max(loads):.2f} on {os.cpu_count()} cores (other processes share them)")


if __name__ == "__main__":
    main()
