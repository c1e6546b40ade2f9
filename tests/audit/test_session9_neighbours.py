"""Audit (H23): privacy review of the ninth session's new code, through the real paths.

1. PrivBayes refinement sized from the DP count at run time (b1dbbfe): the run may measure
   ``P > P0`` tables at ``ε_meas/P`` each. Found: the spends (and ``bs.WriteManifest``, which is
   assembled before the run, and the plan details) stated the planned ``P0`` picks/tables with
   ``ε/P0`` each and the scale at ``P0``, pointing to a ``chosen_refine`` that only CLI
   ``synthesize`` manifests have: an API manifest said 3 tables at ε 0.0653 (scale 15.3) for a
   run that measured 15 at ε 0.0131 (scale 76.5). Now the spends give ``[min, max]`` over the
   pair counts the run can choose and say where the run's ``P`` is (CLI ``chosen_refine``, the
   Beam counter ``beamsynth/privbayes_refine_pairs_<P>``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import apache_beam as beam
import pandas as pd
import pytest
from apache_beam.metrics.metric import MetricsFilter

import beamsynth as bs
from beamsynth.pipelines.cli.main import main

pytestmark = pytest.mark.audit

ROOT = Path(__file__).resolve().parents[2]
ADULT = ROOT / "examples" / "data" / "adult" / "adult.csv"


def _adult_records(n: int) -> list[dict[str, str]]:
    df = pd.read_csv(ADULT, dtype=str, keep_default_na=False, nrows=n)
    return df.to_dict("records")


def _refine_spends(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["step"].rsplit(".", 1)[-1]: s for s in manifest["release"]["budget"]["spends"]
            if ".refine." in s["step"]}


def _within(value: float, span: Any) -> bool:
    low, high = (span, span) if not isinstance(span, list) else span
    return low * (1 - 1e-9) <= value <= high * (1 + 1e-9)


def _api_privbayes(folder: Path, options: dict[str, Any]) -> tuple[dict[str, Any], dict[int, int], int]:
    """Seeded API PrivBayes on 20,000 Adult records without a public input size: (manifest,
    {P: windows} from the run's counters, synthetic rows)."""
    job = bs.PrivacyJob(epsilon=1.0, seed=11)
    schema = bs.load_schema("adult")
    path = folder / "m.json"
    p = beam.Pipeline()
    private = p | beam.Create(_adult_records(20_000), reshuffle=False) | job.private(schema)
    rows = (private | bs.PrivBayes(epsilon=1.0, rows=50, options=options)
            | beam.combiners.Count.Globally())
    _ = rows | beam.Map(lambda n, f=str(folder / "rows.txt"): Path(f).write_text(str(n)))
    _ = p | bs.WriteManifest(job=job, path=str(path))
    result = p.run()
    result.wait_until_finish()
    chosen = {}
    for c in result.metrics().query(MetricsFilter().with_namespace("beamsynth"))["counters"]:
        name = c.key.metric.name
        if name.startswith("privbayes_refine_pairs_"):
            chosen[int(name.rsplit("_", 1)[1])] = c.committed
    manifest = json.loads(path.read_text(encoding="utf-8"))
    return manifest, chosen, int((folder / "rows.txt").read_text())


def test_api_manifest_states_the_refinement_split_the_run_can_use(tmp_path: Path) -> None:
    manifest, chosen, rows = _api_privbayes(tmp_path, {"refine_pairs": 3})
    spends = _refine_spends(manifest)
    sel, meas = spends["selection"], spends["marginals"]
    # the run raised the 3 requested pairs from n̂ (20,000 Adult rows, ε = 1: 11)
    (pairs,) = chosen
    assert pairs > 3 and chosen[pairs] == 1, chosen
    assert _within(pairs, sel["details"]["picks"]) and _within(pairs, meas["details"]["tables"])
    assert _within(sel["epsilon"] / pairs, sel["details"]["epsilon_per_pick"])
    assert _within(meas["epsilon"] / pairs, meas["details"]["epsilon_per_table"])
    assert _within(pairs / meas["epsilon"], meas["details"]["scale"])  # Δ = m = 1
    assert "DP count" in sel["details"]["pairs_note"]
    total = sum(s["epsilon"] for s in manifest["release"]["budget"]["spends"])
    assert total == pytest.approx(1.0)  # P·ε/P: the same total whatever P
    assert rows == 50  # the output's shape never depends on P


def test_cli_manifest_spends_match_the_run_and_chosen_refine(tmp_path: Path) -> None:
    src = tmp_path / "in.csv"
    pd.read_csv(ADULT, dtype=str, keep_default_na=False, nrows=20_000).to_csv(src, index=False)
    outs = {}
    for name, extra in {"raised": ["--pb-refine-pairs", "3"], "default": []}.items():
        out = tmp_path / name / "out.csv"
        out.parent.mkdir()
        assert main(["synthesize", str(src), "--schema", "adult", "--epsilon", "1", "--rows", "40",
                     "--seed", "5", "--method", "privbayes", *extra, "--output", str(out),
                     "--quiet"]) == 0
        outs[name] = (json.loads(Path(f"{out}.manifest.json").read_text("utf-8")),
                      len(out.read_text("utf-8").splitlines()))
    manifest, lines = outs["raised"]
    sizing = manifest["release"]["details"]["method"]["privbayes"]["sizing"]
    spends = _refine_spends(manifest)
    for p, run in sizing["chosen_refine"].items():
        assert _within(int(p), spends["marginals"]["details"]["tables"])
        assert _within(run["epsilon_per_table"], spends["marginals"]["details"]["epsilon_per_table"])
        assert _within(run["epsilon_per_pick"], spends["selection"]["details"]["epsilon_per_pick"])
        assert _within(run["table_scale"], spends["marginals"]["details"]["scale"])
    # Adult's default request (15 = d) cannot be raised: the spends state the one split, no note
    default = _refine_spends(outs["default"][0])
    assert default["marginals"]["details"]["tables"] == 15
    assert "pairs_note" not in default["marginals"]["details"]
    assert lines == outs["default"][1] == 41  # header + 40 rows whatever P
