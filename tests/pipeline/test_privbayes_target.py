"""A declared prediction target through the CLI (issue 18, H41): --target and the schema key give
the small-input star, its spends add up, and without a target the seeded output is unchanged."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from beamsynth.pipelines.cli.main import main

COLUMNS = 8


def _data(tmp_path, target_key=False):
    rng = np.random.default_rng(7)
    n = 1000
    y = rng.integers(0, 2, n)
    frame = {f"x{i}": np.where(rng.random(n) < 0.8, y + 2 * rng.integers(0, 3, n),
                               rng.integers(0, 6, n)).astype(str) for i in range(COLUMNS)}
    frame["y"] = np.array(["no", "yes"])[y]
    src = tmp_path / "in.csv"
    pd.DataFrame(frame).to_csv(src, index=False)
    spec = {"name": "t", "columns": [
        {"name": f"x{i}", "type": "categorical",
         "domain": {"kind": "categorical", "values": [str(v) for v in range(6)]}} for i in range(COLUMNS)]
        + [{"name": "y", "type": "categorical", "domain": {"kind": "categorical",
                                                           "values": ["no", "yes"]}}]}
    if target_key:
        spec["target"] = "y"
    schema = tmp_path / ("schema_t.yaml" if target_key else "schema.yaml")
    schema.write_text(yaml.safe_dump(spec))
    return src, schema


def _run(src, schema, out, *extra):
    assert main(["synthesize", str(src), "--schema", str(schema), "--epsilon", "1", "--method",
                 "privbayes", "--rows", "200", "--seed", "5", "--quiet", "--output", str(out),
                 *extra]) == 0
    manifest = json.loads(Path(str(out) + ".manifest.json").read_text())
    return hashlib.sha256(Path(out).read_bytes()).hexdigest(), manifest


def _small(manifest):
    return manifest["release"]["details"]["method"]["privbayes"]["sizing"].get(
        "chosen_small_model_windows", {})


def _eps(manifest):
    return sum(s["epsilon"] for s in manifest["release"]["budget"]["spends"])


def test_target_flag_and_schema_key(tmp_path):
    src, schema = _data(tmp_path)
    plain_hash, plain = _run(src, schema, tmp_path / "plain.csv")
    assert not any("star" in k for k in _small(plain))
    flag_hash, flag = _run(src, schema, tmp_path / "flag.csv", "--target", "y")
    (model,) = _small(flag)
    assert model.startswith("star of ") and _small(flag)[model] == 1
    assert abs(_eps(flag) - 1.0) < 1e-9 and abs(_eps(plain) - 1.0) < 1e-9
    _, tschema = _data(tmp_path, target_key=True)
    key_hash, key = _run(src, tschema, tmp_path / "key.csv")
    assert _small(key) == _small(flag) and key_hash == flag_hash != plain_hash
    # public input rows: the star is planned at build time, one spend of the whole method ε
    _, public = _run(src, schema, tmp_path / "public.csv", "--target", "y", "--input-rows", "1000")
    spends = {s["step"]: s["epsilon"] for s in public["release"]["budget"]["spends"]}
    assert spends["privbayes.marginals"] == 1.0 and "privbayes.structure" not in spends
    star = public["release"]["details"]["method"]["privbayes"]["star"]
    assert star["target"] == "y" and star["target_index"] == COLUMNS  # its name and index (H42)


def test_bad_target_is_refused(tmp_path, capsys):
    src, schema = _data(tmp_path)
    assert main(["synthesize", str(src), "--schema", str(schema), "--epsilon", "1", "--method",
                 "privbayes", "--quiet", "--output", str(tmp_path / "o.csv"),
                 "--target", "income"]) == 2
    assert "'income'" in capsys.readouterr().err
    assert not (tmp_path / "o.csv").exists()
