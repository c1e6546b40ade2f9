"""The API's ``PrefixTree(method="direct")`` keys at scale (H89): what ordering a window's
synthetic-key tables costs a user's job, in a ratio against another tree measured in the same run.

The job, as a user writes it: ``--keys`` text keys drawn (numpy, seed ``--data-seed``; benchmark
data, not privacy randomness) from the bundled word sample with Zipf weights, written to a text
file and read back with ``ReadFromText`` as dicts ``{"q": word}``, ``| job.private(schema,
keys={"q": bs.TextKey(column="q", alphabet=ALPHABET, max_length=12)})``, ``| bs.PrefixTree(key="q",
method="direct", epsilon=1)``, its ``keys`` rows ``| WriteToText(num_shards=1)`` as JSON lines
(the form docs/beam-api.md advises for releases), seeded job (``--seed``).

Each case runs in a fresh process, on ``--runner`` (beamsynth's presets), with the beamsynth
tree given by ``--trees``: ``main`` (the installed one) or a path (a folder holding a
``beamsynth`` package, put first on ``PYTHONPATH``, e.g. one built from ``git archive`` of an
older commit). It prints wall seconds, the peak RSS of the launcher and of the largest
descendant process (polled every 0.1 s with psutil), the rows written and two digests: of the
rows sorted (same release?) and of the file's bytes (same order?). Ratios are against the first
tree of the same size and repeat. Run under ``nice -n 5`` on the shared machine::

    nice -n 5 python benchmarks/prefix_keys_order.py --keys 1000000,5000000 \\
        --trees /tmp/old,main --repeat 1
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS = ROOT / "examples" / "data" / "text" / "words_sample.txt"
sys.path.insert(0, str(ROOT / "benchmarks"))
ALPHABET = "abcdefghijklmnopqrstuvwxyz"


def write_keys(path: Path, n: int, seed: int) -> None:
    """``n`` keys drawn from the word sample (lower-case, at most 12 characters), Zipf weights."""
    import numpy as np

    words = sorted({w.strip().lower() for w in WORDS.read_text(encoding="utf-8").splitlines()
                    if w.strip() and len(w.strip()) <= 12 and w.strip().isalpha()})
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, len(words) + 1)
    picks = rng.choice(len(words), size=n, p=weights / weights.sum())
    with open(path, "w", encoding="utf-8") as fh:
        for start in range(0, n, 100_000):
            fh.write("\n".join(words[i] for i in picks[start:start + 100_000]) + "\n")


def _unordered_keys() -> None:
    """The installed tree's PrefixTree with its rows steps unordered (no gather of the tables)."""
    from beamsynth.transforms import private_ops
    from beamsynth.transforms.private import release_rows

    def unordered(private, fn, *args, row_type, order=None):
        return release_rows(private, fn, *args, row_type=row_type)

    private_ops.release_rows = unordered


def run_case(args) -> dict:
    import apache_beam as beam
    from api_ordered_rows import _PeakRss

    import beamsynth as bs

    if args.order == "off":
        _unordered_keys()

    out = Path(args.out)
    data = Path(args.data)
    prefix = str(out / "keys")
    schema = bs.load_schema({"name": "queries", "columns": [
        {"name": "q", "type": "string",
         "domain": {"kind": "string", "alphabet": ALPHABET, "max_length": 12}}]})
    options = bs.pipeline_options([f"--runner={args.runner}"])
    start = time.perf_counter()
    with _PeakRss() as peak:
        job = bs.PrivacyJob(epsilon=1.0, seed=args.seed)
        with beam.Pipeline(options=options) as p:
            tree = (p | "Read" >> beam.io.ReadFromText(str(data))
                    | "Dicts" >> beam.Map(lambda w: {"q": w})
                    | job.private(schema, keys={"q": bs.TextKey(column="q", alphabet=ALPHABET,
                                                                 max_length=12)})
                    | bs.PrefixTree(key="q", method="direct", epsilon=1.0))
            _ = (tree["keys"] | "Json" >> beam.Map(lambda r: json.dumps(r._asdict()))
                 | beam.io.WriteToText(prefix, file_name_suffix=".jsonl", num_shards=1))
    wall = time.perf_counter() - start
    files = sorted(glob.glob(prefix + "*"))
    ordered, lines = hashlib.sha256(), []
    for f in files:
        raw = Path(f).read_bytes()
        ordered.update(raw)
        lines.extend(raw.decode().splitlines())
    top = max(peak.child_peak.values(), default=0)
    return {"wall_s": round(wall, 1), "launcher_rss_mb": round(peak.self_peak / 2**20),
            "worker_peak_rss_mb": round(top / 2**20), "rows": len(lines),
            "rows_sorted": hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()[:12],
            "bytes": ordered.hexdigest()[:12]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", default="1000000", help="input keys, comma-separated sizes")
    ap.add_argument("--trees", default="main",
                    help="main (installed), off (installed, rows unordered) or paths, comma-separated")
    ap.add_argument("--runner", default="direct")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--data-seed", type=int, default=0)
    ap.add_argument("--case", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--order", default="on", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.case:
        print("RESULT " + json.dumps(run_case(args)), flush=True)
        return 0
    with tempfile.TemporaryDirectory(prefix="h89_keys_") as data_dir:
        for n in [int(k) for k in args.keys.split(",")]:
            data = Path(data_dir) / f"keys_{n}.txt"
            write_keys(data, n, args.data_seed)
            for rep in range(args.repeat):
                base = None
                for tree in args.trees.split(","):
                    env = dict(os.environ)
                    if tree not in ("main", "off"):
                        env["PYTHONPATH"] = tree + os.pathsep + env.get("PYTHONPATH", "")
                    with tempfile.TemporaryDirectory(prefix="h89_out_") as tmp:
                        cmd = [sys.executable, __file__, "--case", "--runner", args.runner,
                               "--seed", str(args.seed), "--data", str(data), "--out", tmp,
                               "--order", "off" if tree == "off" else "on"]
                        done = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                              cwd=tempfile.gettempdir())
                    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
                    if done.returncode or not line:
                        print(f"FAILED {tree} {n}:\n" + done.stderr[-3000:], flush=True)
                        continue
                    res = {"keys": n, "tree": tree, "rep": rep, **json.loads(line[0][7:])}
                    base = base or res
                    res["wall_vs_first"] = round(res["wall_s"] / base["wall_s"], 2)
                    res["launcher_rss_vs_first"] = round(
                        res["launcher_rss_mb"] / max(base["launcher_rss_mb"], 1), 2)
                    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
