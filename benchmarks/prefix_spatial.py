"""Spatial prefix synthesis on 1M points in the world box (seed 003, Figure 5), plus a heat map.

For each method (basic, improved, direct) and ε ∈ {0.1, 1, 10} (one point = one privacy unit),
runs ``beamsynth prefixes`` on the DirectRunner and reports the paper's earth-mover
approximation (Indyk): the sum over all quadtree cells at all levels 0..depth of the cell
diameter (degrees) × |real count − synthetic count|, next to the same distance for a resample
of the real points with replacement (the paper's black line), measured in the same run.
Also renders real vs synthetic (improved, ε = 1) for a dense region to
``benchmarks/out/prefix_spatial_heatmap.png``.

    nice -n 10 python benchmarks/prefix_spatial.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from beamsynth.pipelines.methods.prefixes import run_prefixes
from beamsynth.schemas.keys import WORLD_BOX, SpatialKeyCodec, prefix_bytes
from beamsynth.transforms.noise import RandomSource

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "spatial" / "points_1m.csv"
OUT = Path(__file__).resolve().parent / "out"
REGION = {"name": "Europe", "lat": (35.0, 60.0), "lon": (-10.0, 30.0)}


def emd_approx(codec: SpatialKeyCodec, real: np.ndarray, synth: np.ndarray) -> float:
    """Σ over levels 0..depth and cells of diameter × |count difference| (codes of both sets)."""
    total = abs(real.shape[0] - synth.shape[0]) * codec.cell_diameter(0)
    both = np.concatenate([real, synth])
    sign = np.concatenate([np.ones(real.shape[0]), -np.ones(synth.shape[0])])
    for d in range(1, codec.depth + 1):
        _, inv = np.unique(prefix_bytes(both, d), return_inverse=True)
        diff = np.bincount(inv.ravel(), weights=sign)
        total += codec.cell_diameter(d) * float(np.abs(diff).sum())
    return total


def heatmap(real: np.ndarray, synth: np.ndarray, path: Path, title: str) -> None:
    """Side-by-side log-density maps of real and synthetic points in ``REGION``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bins = [np.linspace(*REGION["lon"], 321), np.linspace(*REGION["lat"], 201)]
    fig, axes = plt.subplots(1, 2, figsize=(14, 5), sharey=True)
    for ax, pts, name in ((axes[0], real, "real"), (axes[1], synth, title)):
        h, _, _ = np.histogram2d(pts[:, 1], pts[:, 0], bins=bins)
        ax.imshow(np.log1p(h.T), origin="lower", cmap="magma", aspect="auto",
                  extent=[*REGION["lon"], *REGION["lat"]])
        ax.set_title(f"{name} ({int(h.sum())} points in {REGION['name']})")
        ax.set_xlabel("lon")
    axes[0].set_ylabel("lat")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--epsilons", type=float, nargs="+", default=[0.1, 1.0, 10.0])
    ap.add_argument("--methods", nargs="+", default=["basic", "improved", "improved+restore", "direct"],
                    help="improved+restore = improved with --restore-discount")
    ap.add_argument("--depth", type=int, default=14, help="quadtree levels (default 14, ~1.4 km cells)")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--no-heatmap", dest="heatmap", action="store_false")
    args = ap.parse_args(argv)
    if not args.data.exists():
        print(f"data not found: {args.data}", file=sys.stderr)
        return 1
    codec = SpatialKeyCodec(columns=("lat", "lon"), box=WORLD_BOX, depth=args.depth)
    pts = pd.read_csv(args.data)[["lat", "lon"]].to_numpy()
    real = codec.encode_points(pts)
    gen = RandomSource(seed=args.seed).numpy_generator()
    t0 = time.time()
    resample = codec.encode_points(pts[gen.integers(0, len(pts), len(pts))])
    base = emd_approx(codec, real, resample)
    print(f"baseline: resampling the real points: EMD approx {base:.4g} ({time.time() - t0:.1f} s)")
    results: dict[str, object] = {"depth": args.depth, "resample_emd": base, "rows": {}}
    print("method | eps | EMD approx | ratio to resampling | synthetic points | seconds")
    tmp = tempfile.mkdtemp(prefix="prefix_spatial_")
    for method in args.methods:
        for eps in args.epsilons:
            out = os.path.join(tmp, f"{method}_{eps}.csv")
            t0 = time.time()
            run_prefixes(input=str(args.data), codec=codec, method=method.split("+")[0], epsilon=eps,
                         output=out, seed=args.seed, restore=method.endswith("+restore"))
            secs = time.time() - t0
            syn = pd.read_csv(out)[["lat", "lon"]].to_numpy()
            emd = emd_approx(codec, real, codec.encode_points(syn))
            results["rows"][f"{method}/{eps:g}"] = {  # type: ignore[index]
                "emd": emd, "ratio": emd / base, "points": int(len(syn)), "seconds": round(secs, 1)}
            print(f"{method} | {eps:g} | {emd:.4g} | {emd / base:.2f} | {len(syn)} | {secs:.0f}", flush=True)
            if method == "improved" and eps == 1.0 and args.heatmap:
                heatmap(pts, syn, OUT / "prefix_spatial_heatmap.png", "synthetic, improved ε=1")
    OUT.mkdir(parents=True, exist_ok=True)
    name = "prefix_spatial.json" if len(args.methods) > 1 else f"prefix_spatial_{args.methods[0]}.json"
    (OUT / name).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"heat map: {OUT / 'prefix_spatial_heatmap.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
