"""DP histograms of every Adult column: beamsynth vs PipelineDP on the same DirectRunner.

Both sides get the same input, the 48,842 Adult rows already encoded to declared cells (the
bundled schema: 15 columns, 14 attributes + income), and release a DP count for **every**
declared cell of every column (public partitions, no partition selection), one record per
privacy unit, total ε split equally over the columns, Laplace-type noise:

* beamsynth: ``EncodedBatch`` elements (20k rows, int32 codes) → ``DPMarginals`` (one pass,
  ``MarginalCountsCombineFn``) in one pipeline;
* PipelineDP 0.3.1 (installed in its own virtualenv, never a project dependency): one row tuple
  per element → ``DPEngine.aggregate(COUNT, public_partitions=cells)`` per column, one pipeline,
  run as a subprocess by that virtualenv's Python.

Both sides feed their input with ``beam.Create`` (so Beam encodes it with the element coder,
pickles and bz2-compresses the payload into the pipeline, and decodes it again) and run on the
in-process DirectRunner of apache-beam (the peer venv sees the same Beam; apache-beam 2.77's
DirectRunner first tries the Prism runner and falls back, on both sides alike). beamsynth's
counting itself takes milliseconds: its time is Beam's per-pipeline cost (the 1,000-row line)
plus moving the batches, whose wire form is ``EncodedBatch``'s compact pickle (codes in the
narrowest unsigned dtype, printed as "wire size").

Times are pipeline runs (construction + run), wall clock and process CPU time (all threads;
the machine is shared, so CPU time is the steadier figure), medians over ``--repeat`` /
``--peer-repeat``; the ratios are PipelineDP / beamsynth, both measured in this run, and the
1-minute load average is printed with them. A pandas ``value_counts`` floor is printed for
scale. Setup of the peer::

    python -m venv --system-site-packages /tmp/peer-pdp
    /tmp/peer-pdp/bin/pip install pipeline-dp==0.3.1
    nice -n 10 python benchmarks/vs_pipelinedp.py --peer-python /tmp/peer-pdp/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ADULT = Path(__file__).resolve().parents[1] / "examples" / "data" / "adult" / "adult.csv"
SHARED_ADULT = Path(__file__).resolve().parents[2] / "shared" / "data" / "adult" / "adult.csv"


def adult_codes() -> tuple[np.ndarray, list[int], list[str]]:
    """Encoded Adult (rows × columns cell indices), cells per column, column names."""
    import pandas as pd

    from beamsynth.schemas.schema import load_schema

    schema = load_schema("adult")
    path = ADULT if ADULT.exists() else SHARED_ADULT
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    batch, bad = schema.encode_columns({c: df[c].astype(object) for c in schema.names}, len(df))
    if bad:
        raise ValueError(f"{len(bad)} Adult rows do not encode, e.g. {bad[:2]}")
    return batch.codes, list(schema.shape), list(schema.names)


def _append_line(x: object, path: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(f"{x}\n")


def _sink_lines(path: str) -> list[str]:
    return Path(path).read_text().splitlines() if Path(path).exists() else []


def run_beamsynth(codes: np.ndarray, shape: list[int], names: list[str],
                  epsilon: float) -> tuple[float, float]:
    """(wall, CPU) seconds for one beamsynth pipeline releasing every column's DP histogram."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from beamsynth.schemas.schema import EncodedBatch
    from beamsynth.transforms.budget import PureDP
    from beamsynth.transforms.measure import DPMarginals

    sink = tempfile.mktemp(suffix=".txt")
    t, c = time.perf_counter(), time.process_time()
    batches = [EncodedBatch(codes[s:s + 20_000]) for s in range(0, codes.shape[0], 20_000)]
    per = PureDP(epsilon=epsilon).split({n: 1.0 for n in names})
    with beam.Pipeline(options=PipelineOptions(["--direct_running_mode=in_memory"])) as p:
        (p | beam.Create(batches)
           | DPMarginals(specs=[(j,) for j in range(len(shape))], shape=shape, names=names,
                         budgets=[per[n] for n in names])
           | beam.Map(lambda ms: [m.values.size for m in ms])
           | beam.Map(_append_line, sink))
    elapsed = time.perf_counter() - t, time.process_time() - c
    assert _sink_lines(sink) == [str(shape)], (_sink_lines(sink), shape)
    return elapsed


def run_pipelinedp(codes_path: str, shape: list[int], epsilon: float) -> tuple[float, float]:
    """(Runs inside the peer venv.) (wall, CPU) seconds for one PipelineDP pipeline, all columns."""
    import apache_beam as beam
    import pipeline_dp
    from apache_beam.options.pipeline_options import PipelineOptions

    codes = np.load(codes_path)
    rows = [(i, *map(int, r)) for i, r in enumerate(codes.tolist())]
    sink = tempfile.mktemp(suffix=".txt")
    t, c = time.perf_counter(), time.process_time()
    with beam.Pipeline(options=PipelineOptions(["--direct_running_mode=in_memory"])) as p:
        pcoll = p | beam.Create(rows)
        accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=epsilon, total_delta=1e-10)
        engine = pipeline_dp.DPEngine(accountant, pipeline_dp.BeamBackend())
        params = pipeline_dp.AggregateParams(
            noise_kind=pipeline_dp.NoiseKind.LAPLACE, metrics=[pipeline_dp.Metrics.COUNT],
            max_partitions_contributed=1, max_contributions_per_partition=1)
        results = []
        for j, cells in enumerate(shape):
            extractors = pipeline_dp.DataExtractors(
                privacy_id_extractor=lambda r: r[0],
                partition_extractor=lambda r, j=j: r[1 + j],
                value_extractor=lambda r: 0)
            results.append(engine.aggregate(pcoll, params, extractors,
                                            public_partitions=list(range(cells)))
                           | f"Count{j}" >> beam.combiners.Count.Globally())
        accountant.compute_budgets()
        (results | beam.Flatten() | beam.Map(_append_line, sink))
    elapsed = time.perf_counter() - t, time.process_time() - c
    out = sorted(int(x) for x in _sink_lines(sink))
    assert out == sorted(shape), (out, shape)  # one DP count per declared cell
    return elapsed


def pandas_floor(codes: np.ndarray) -> float:
    import pandas as pd

    df = pd.DataFrame(codes)
    t = time.perf_counter()
    for c in df.columns:
        df[c].value_counts()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer-python", default="/tmp/peer-pdp/bin/python")
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3, help="beamsynth runs (median reported)")
    ap.add_argument("--peer-repeat", type=int, default=1, help="PipelineDP runs (slow; median)")
    ap.add_argument("--peer", nargs=2, metavar=("CODES_NPY", "SHAPE_JSON"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer:  # inside the PipelineDP virtualenv
        wall, cpu = run_pipelinedp(args.peer[0], json.loads(args.peer[1]), args.epsilon)
        print(json.dumps({"seconds": wall, "cpu_seconds": cpu}))
        return
    from beamsynth.schemas.schema import EncodedBatch

    codes, shape, names = adult_codes()
    run_beamsynth(codes[:1000], shape, names, args.epsilon)  # warm-up (imports, pickling)
    small = [run_beamsynth(codes[:1000], shape, names, args.epsilon) for _ in range(args.repeat)]
    ours = [run_beamsynth(codes, shape, names, args.epsilon) for _ in range(args.repeat)]
    peer = []
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "codes.npy")
        np.save(path, codes)
        for _ in range(args.peer_repeat):
            res = subprocess.run([args.peer_python, __file__, "--epsilon", str(args.epsilon),
                                  "--peer", path, json.dumps(shape)],
                                 check=True, capture_output=True, text=True)
            got = json.loads(res.stdout.strip().splitlines()[-1])
            peer.append((got["seconds"], got["cpu_seconds"]))
    floor = pandas_floor(codes)
    wire = sum(len(pickle.dumps(EncodedBatch(codes[s:s + 20_000]), pickle.HIGHEST_PROTOCOL))
               for s in range(0, codes.shape[0], 20_000))
    t_ours, t_peer = float(np.median([w for w, _ in ours])), float(np.median([w for w, _ in peer]))
    c_ours, c_peer = float(np.median([c for _, c in ours])), float(np.median([c for _, c in peer]))
    print(f"Adult: {codes.shape[0]:,} rows, {len(shape)} columns, {sum(shape)} declared cells, ε={args.epsilon}")
    print(f"pandas value_counts floor : {floor:8.3f} s")
    print(f"EncodedBatch wire size    : {wire / 1e6:8.3f} MB pickled (codes {codes.dtype}: "
          f"{codes.nbytes / 1e6:.3f} MB in memory)")
    print(f"beamsynth DPMarginals     : wall {t_ours:8.3f} s, CPU {c_ours:8.3f} s  (median of {len(ours)})")
    print(f"beamsynth on 1,000 rows   : wall {float(np.median([w for w, _ in small])):8.3f} s, CPU "
          f"{float(np.median([c for _, c in small])):8.3f} s  (Beam's fixed cost per pipeline)")
    print(f"PipelineDP 0.3.1          : wall {t_peer:8.3f} s, CPU {c_peer:8.3f} s  (median of {len(peer)})")
    print(f"speed-up beamsynth vs PipelineDP = {t_peer / t_ours:.1f}x wall, {c_peer / c_ours:.1f}x CPU "
          f"(goal >= 50x); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (shared)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
