"""PrivBayes' budget-aware size through ``synthesize`` (issue 18): a tiny input falls back to
independent 1-way marginals, decided from a DP count (no ``--rows``), and the manifest says so."""

from __future__ import annotations

import pandas as pd
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beamsynth.pipelines.methods.synthesize import SynthesisConfig, run_synthesis
from beamsynth.schemas.schema import load_schema
from beamsynth.transforms.privbayes import FOREST_ONE_WAY_FRACTION, SIZE_COUNT_FRACTION

SCHEMA = {"privacy_id": None, "columns": [
    {"name": "a", "type": "categorical", "domain": {"kind": "categorical", "values": ["x", "y", "z"]}},
    {"name": "b", "type": "categorical", "domain": {"kind": "categorical", "values": ["p", "q"]}},
    {"name": "n", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 9, "bins": 5}},
]}


def test_tiny_input_falls_back_to_independent_and_the_manifest_records_it(tmp_path):
    src = tmp_path / "in.csv"
    src.write_text("a,b,n\n" + "".join(f"{'xyz'[i % 3]},{'pq'[i % 2]},{i % 10}\n" for i in range(40)),
                   encoding="utf-8")
    out = tmp_path / "out.csv"
    manifest = run_synthesis(SynthesisConfig(
        input=str(src), schema=load_schema(SCHEMA), output=str(out), epsilon=1.0,
        method="privbayes", seed=3), PipelineOptions(["--runner=DirectRunner"]))
    spends = {s["step"]: s for s in manifest["release"]["budget"]["spends"]}
    assert list(spends)[:2] == ["row_count", "privbayes.size_count"]
    method_eps = 1.0 - spends["row_count"]["epsilon"]
    assert spends["privbayes.size_count"]["epsilon"] == pytest.approx(SIZE_COUNT_FRACTION * method_eps)
    assert manifest["release"]["budget"]["spent"]["epsilon"] == pytest.approx(1.0)
    sizing = manifest["release"]["details"]["method"]["privbayes"]["sizing"]
    assert sizing["rows_source"].startswith("DP count")
    # 40 rows at ε ≈ 1 on 3 columns: n̂·ε/(d·g²) ≈ 40/(3·11.4) < θ, so the one (global) window
    # measured 1-way tables only
    assert sizing["chosen_degree_windows"] == {"0": 1}
    # and which small-input model ran (H32: nothing said whether the forest or √cells tables)
    assert sizing["chosen_small_model_windows"] == {"independent 1-way tables (∝ √cells, whole ε)": 1}
    assert len(pd.read_csv(out)) > 0


def _forest_input(tmp_path):
    """300 rows over the shape (3, 2, 30): no θ-useful network at ε = 1, one affordable pair."""
    schema = {"privacy_id": None, "columns": [
        *SCHEMA["columns"][:2],
        {"name": "n", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 29}}]}
    src = tmp_path / "in.csv"
    src.write_text("a,b,n\n" + "".join(f"{'xyz'[i % 3]},{'pq'[(i % 3) // 2]},{i % 30}\n"
                                       for i in range(300)), encoding="utf-8")
    return schema, src


def test_dp_count_forest_is_named_in_the_manifest(tmp_path):
    """The run-time (DP count) small-input forest: the manifest names it and its edge count."""
    schema, src = _forest_input(tmp_path)
    manifest = run_synthesis(SynthesisConfig(  # as the next test, with the DP count, not input_rows
        input=str(src), schema=load_schema(schema), output=str(tmp_path / "out.csv"),
        epsilon=1.0, method="privbayes", rows=50, seed=3), PipelineOptions(["--runner=DirectRunner"]))
    sizing = manifest["release"]["details"]["method"]["privbayes"]["sizing"]
    assert sizing["chosen_degree_windows"] == {"0": 1}
    (model, windows), = sizing["chosen_small_model_windows"].items()
    assert windows == 1 and model.startswith("forest of ") and "chosen edge(s)" in model, model


def test_small_public_input_runs_the_forest_model_and_lists_its_spends(tmp_path):
    schema, src = _forest_input(tmp_path)
    # 300 rows, ε = 1, shape (3, 2, 30): no θ-useful network (300/(3·31.9) < 4.5), but the
    # 6-cell pair (a, b) is affordable (300·0.1/4 ≥ 6): the forest model with one step
    out = tmp_path / "out.csv"
    manifest = run_synthesis(SynthesisConfig(
        input=str(src), schema=load_schema(schema), output=str(out), epsilon=1.0,
        method="privbayes", rows=50, seed=3, options={"input_rows": 300}),
        PipelineOptions(["--runner=DirectRunner"]))
    spends = {s["step"]: s for s in manifest["release"]["budget"]["spends"]}
    # the 1-way tables are released first and the edges scored against them (H102): 3/4 of the
    # structure share moves to them, the structure's score has sensitivity m
    assert list(spends) == ["privbayes.one_way", "privbayes.structure", "privbayes.marginals"]
    assert spends["privbayes.one_way"]["epsilon"] == pytest.approx(FOREST_ONE_WAY_FRACTION + 0.075)
    assert spends["privbayes.structure"]["details"]["sensitivity"] == 1.0
    assert manifest["release"]["details"]["method"]["privbayes"]["forest"]["structure_score"] == (
        "margins")
    assert manifest["release"]["budget"]["spent"]["epsilon"] == pytest.approx(1.0)
    details = manifest["release"]["details"]["method"]["privbayes"]
    assert details["forest"]["steps"] == 1 and details["sizing"]["chosen_degree"] == 0
    assert details["sizing"]["forest_score"].startswith("margins: ")
    assert len(pd.read_csv(out)) == 50
