"""The API's ordered synthetic rows at scale (H82): what gathering a window's released tables
under one key (``release_rows(order=)``, H81's ``_RowsInOrder``) costs a user's job.

The job, as a user writes it: ``bs.PrivacyJob(epsilon=2, seed=SEED)``, the bundled Adult sample
(``--input-rows`` rows as dicts, ``beam.Create``) ``| job.private(adult)``,
``| bs.Synthesize(method=M, rows=R)`` (default ``shard_rows``), then one sink with Beam's default
sharding (``num_shards`` not given): ``WriteToText`` of ``json.dumps(row._asdict())`` or
``WriteToParquet`` of ``row._asdict()`` with ``bs.arrow_schema(schema)`` (``--sinks
text,parquet``); ``text1`` is ``WriteToText`` with ``num_shards=1``, the form docs/beam-api.md
advises for releases.

Each case runs in a fresh process (``--case``), on ``--runner`` (beamsynth's presets), with the
beamsynth tree given by ``--tree`` (``main``: the installed one; a path: a folder holding a
``beamsynth`` package, put first on ``PYTHONPATH``, e.g. a symlinked worktree of an older
commit), or with ``--order off``: the installed tree with the rows step's ``order`` dropped (the
unordered rows step of before H81, same tree otherwise). It prints wall seconds, the peak RSS of
the launcher and of the largest descendant process (a direct-multi SDK worker, a Dask worker;
polled every 0.1 s with psutil), the files written, their rows, and two digests: of the rows
sorted (same release?) and of the files' bytes in file-name order (same order?).

Run under ``nice -n 5`` on the shared machine; compare cases of one run only::

    nice -n 5 python benchmarks/api_ordered_rows.py --rows 1000000 --methods independent \\
        --runners direct-multi --sinks text --trees off,main --repeat 1
"""

from __future__ import annotations

import argparse
import csv
import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ADULT = ROOT / "examples" / "data" / "adult" / "adult.csv"


class _PeakRss:
    """Peak RSS of this process and of each descendant, polled in a thread."""

    def __init__(self, every: float = 0.1) -> None:
        import psutil

        self._me = psutil.Process()
        self._every, self._stop = every, threading.Event()
        self.self_peak, self.child_peak = 0, {}
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                self.self_peak = max(self.self_peak, self._me.memory_info().rss)
                for child in self._me.children(recursive=True):
                    try:
                        rss = child.memory_info().rss
                    except psutil.Error:
                        continue
                    self.child_peak[child.pid] = max(self.child_peak.get(child.pid, 0), rss)
            except psutil.Error:
                pass
            self._stop.wait(self._every)

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _records(n: int) -> list[dict]:
    with open(ADULT, newline="", encoding="utf-8") as fh:
        out = []
        for row in csv.DictReader(fh):
            row.pop("split", None)
            out.append(row)
            if len(out) == n:
                break
    return out


def _unordered_rows_step() -> None:
    """The installed tree's Synthesize with the rows step of before H81 (no gather)."""
    from beamsynth.pipelines import job as _job
    from beamsynth.transforms.private import release_rows

    def unordered(private, fn, *args, row_type, order=None):
        return release_rows(private, fn, *args, row_type=row_type)

    _job.release_rows = unordered


def run_case(args) -> dict:
    import apache_beam as beam

    import beamsynth as bs

    if args.order == "off":
        _unordered_rows_step()
    schema = bs.load_schema("adult")
    records = _records(args.input_rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prefix = str(out / "synth")
    options = bs.pipeline_options([f"--runner={args.runner}"])
    start = time.perf_counter()
    with _PeakRss() as peak:
        job = bs.PrivacyJob(epsilon=2.0, seed=args.seed)
        with beam.Pipeline(options=options) as p:
            rows = (p | "Records" >> beam.Create(records) | job.private(schema)
                    | bs.Synthesize(method=args.method, epsilon=2.0, rows=args.rows))
            if args.sink in ("text", "text1"):  # text1: one file (num_shards=1), as docs advise
                one = {"num_shards": 1} if args.sink == "text1" else {}
                _ = (rows | "Json" >> beam.Map(lambda r: json.dumps(r._asdict()))
                     | beam.io.WriteToText(prefix, file_name_suffix=".jsonl", **one))
            else:
                _ = (rows | "Dicts" >> beam.Map(lambda r: r._asdict())
                     | beam.io.WriteToParquet(prefix, bs.arrow_schema(schema),
                                              file_name_suffix=".parquet"))
    wall = time.perf_counter() - start
    files = sorted(glob.glob(prefix + "*"))
    ordered, lines, counts = hashlib.sha256(), [], []
    for f in files:
        if args.sink != "parquet":
            data = Path(f).read_bytes()
            ordered.update(data)
            part = data.decode().splitlines()
        else:
            import pyarrow.parquet as pq

            table = pq.read_table(f)
            part = [json.dumps(r, sort_keys=True, default=str) for r in table.to_pylist()]
            ordered.update("\n".join(part).encode())
        counts.append(len(part))
        lines.extend(part)
    same = hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()[:12]
    top = max(peak.child_peak.values(), default=0)
    return {"wall_s": round(wall, 1), "launcher_rss_mb": round(peak.self_peak / 2**20),
            "worker_peak_rss_mb": round(top / 2**20), "processes": len(peak.child_peak),
            "files": len(files), "rows_per_file": counts, "rows_sorted": same,
            "bytes_in_name_order": ordered.hexdigest()[:12]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1000000", help="synthetic rows, comma-separated sizes")
    ap.add_argument("--methods", default="independent,privbayes")
    ap.add_argument("--runners", default="direct-multi,dask")
    ap.add_argument("--sinks", default="text")
    ap.add_argument("--trees", default="off,main",
                    help="off (installed tree, no gather), main (installed), or a path")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--input-rows", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--case", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--method", help=argparse.SUPPRESS)
    ap.add_argument("--runner", help=argparse.SUPPRESS)
    ap.add_argument("--sink", help=argparse.SUPPRESS)
    ap.add_argument("--order", default="on", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.case:
        args.rows = int(args.rows)
        print("RESULT " + json.dumps(run_case(args)), flush=True)
        return 0
    results = []
    for rows in [int(r) for r in args.rows.split(",")]:
        for method in args.methods.split(","):
            for runner in args.runners.split(","):
                for sink in args.sinks.split(","):
                    base = None
                    for rep in range(args.repeat):
                        for tree in args.trees.split(","):
                            env = dict(os.environ)
                            order = "off" if tree == "off" else "on"
                            if tree not in ("off", "main"):
                                env["PYTHONPATH"] = tree + os.pathsep + env.get("PYTHONPATH", "")
                            with tempfile.TemporaryDirectory(prefix="h82_") as tmp:
                                cmd = [sys.executable, __file__, "--case", "--rows", str(rows),
                                       "--method", method, "--runner", runner, "--sink", sink,
                                       "--order", order, "--out", tmp, "--seed", str(args.seed),
                                       "--input-rows", str(args.input_rows)]
                                done = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                                      cwd=tempfile.gettempdir())
                            line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
                            if done.returncode or not line:
                                print(f"FAILED {tree} {method} {runner} {sink} {rows}:\n"
                                      + done.stderr[-3000:], flush=True)
                                continue
                            res = json.loads(line[0][7:])
                            res.update(rows=rows, method=method, runner=runner, sink=sink,
                                       tree=tree, rep=rep)
                            if base is None:
                                base = res
                            res["wall_vs_first"] = round(res["wall_s"] / base["wall_s"], 2)
                            res["worker_rss_vs_first"] = round(
                                res["worker_peak_rss_mb"] / max(base["worker_peak_rss_mb"], 1), 2)
                            results.append(res)
                            print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
