"""The declared prediction target across the plugin (issue 18, H42; follow-up of H41): the API on
dicts, Rows and Arrow gives the CLI's rows, a bad name fails when the pipeline is built with the
nearest declared column, Beam YAML and release configs take it, and the manifests name it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import yaml

import beamsynth as bs
from beamsynth.pipelines.cli.main import main

COLUMNS = 8
N = 1000


def _frame() -> pd.DataFrame:
    rng = np.random.default_rng(7)
    y = rng.integers(0, 2, N)
    frame = {f"x{i}": np.where(rng.random(N) < 0.8, y + 2 * rng.integers(0, 3, N),
                               rng.integers(0, 6, N)).astype(str) for i in range(COLUMNS)}
    frame["label"] = np.array(["no", "yes"])[y]
    return pd.DataFrame(frame)


def _spec(target: str | None = None) -> dict:
    spec = {"name": "t", "columns": [
        {"name": f"x{i}", "type": "categorical",
         "domain": {"kind": "categorical", "values": [str(v) for v in range(6)]}}
        for i in range(COLUMNS)]
        + [{"name": "label", "type": "categorical",
            "domain": {"kind": "categorical", "values": ["no", "yes"]}}]}
    if target is not None:
        spec["target"] = target
    return spec


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("target")
    src = tmp / "in.csv"
    _frame().to_csv(src, index=False)
    (tmp / "schema.yaml").write_text(yaml.safe_dump(_spec()))
    (tmp / "schema_t.yaml").write_text(yaml.safe_dump(_spec("label")))
    return tmp


def _elements(kind: str) -> list:
    records = _frame().to_dict("records")
    if kind == "dicts":
        return records
    if kind == "rows":
        return [beam.Row(**r) for r in records]
    table = pa.Table.from_pylist(records)
    return table.to_batches(max_chunksize=300)


def _api(tmp: Path, kind: str, *, schema: dict, options: dict, tag: str) -> tuple[list, dict]:
    job = bs.PrivacyJob(epsilon=1.0, seed=5)
    out = tmp / f"api_{tag}"
    with beam.Pipeline() as p:
        private = p | beam.Create(_elements(kind)) | job.private(bs.load_schema(schema))
        rows = private | bs.PrivBayes(epsilon=1.0, rows=200, options=options)
        (rows | beam.Map(lambda r: json.dumps([str(v) for v in r]))
         | beam.io.WriteToText(str(out), num_shards=1, shard_name_template=""))
        p | bs.WriteManifest(job=job, path=str(tmp / f"api_{tag}.json"))
    got = sorted(tuple(json.loads(line)) for line in out.read_text().splitlines())
    return got, json.loads((tmp / f"api_{tag}.json").read_text())


def _cli(tmp: Path, schema: Path, tag: str, *extra: str) -> tuple[list, dict]:
    seed = bs.PrivacyJob(epsilon=1.0, seed=5).step_seed("Synthesize[privbayes]")
    out = tmp / f"cli_{tag}.csv"
    assert main(["synthesize", str(tmp / "in.csv"), "--schema", str(schema), "--epsilon", "1",
                 "--method", "privbayes", "--rows", "200", "--seed", str(seed), "--quiet",
                 "--output", str(out), *extra]) == 0
    with open(out, newline="") as fh:
        got = sorted(tuple(r) for r in list(csv.reader(fh))[1:])
    return got, json.loads(Path(str(out) + ".manifest.json").read_text())


def test_privbayes_module_re_exports_the_star():
    import beamsynth.transforms.privbayes as pb
    import beamsynth.transforms.privbayes_star as star

    for name in star.__all__:
        assert name in pb.__all__ and getattr(pb, name) is getattr(star, name)


@pytest.mark.parametrize("kind", ["dicts", "rows", "arrow"])
def test_api_target_gives_the_cli_rows(data, kind):
    """bs.PrivBayes(options={"target": ...}) on dicts, Rows and Arrow batches: the rows of
    ``beamsynth synthesize --target`` run with the API step's seed (the job seed's stream for
    the step ``Synthesize[privbayes]``); the schema's ``target`` key gives the same rows, and
    without a target they differ (the star ran: the DP count picked k = 0)."""
    api, manifest = _api(data, kind, schema=_spec(), options={"target": "label"}, tag=kind)
    cli, cli_manifest = _cli(data, data / "schema.yaml", f"flag_{kind}", "--target", "label")
    assert len(api) == 200 and api == cli
    key, _ = _api(data, kind, schema=_spec("label"), options={}, tag=f"key_{kind}")
    assert key == api
    (step,) = manifest["release"]["details"]["mechanisms"]
    details = step["details"]["privbayes"]
    assert details["target"]["column"] == "label" and details["target"]["index"] == COLUMNS
    (small,) = cli_manifest["release"]["details"]["method"]["privbayes"]["sizing"][
        "chosen_small_model_windows"]
    assert small.startswith("star of ") and "'label'" in small
    if kind == "dicts":
        plain, _ = _api(data, kind, schema=_spec(), options={}, tag="plain")
        assert plain != api


@pytest.mark.parametrize("rows", [200, None])
def test_api_bad_target_fails_when_built_with_the_nearest_column(rows):
    job = bs.PrivacyJob(epsilon=1.0)
    p = beam.Pipeline()
    private = p | beam.Create(_elements("dicts")[:5]) | job.private(bs.load_schema(_spec()))
    with pytest.raises(ValueError, match=r"options=\{'target': 'lable'\}: 'lable' is not a "
                       r"declared column of schema 't' \(did you mean 'label'\?; columns: "):
        private | bs.PrivBayes(epsilon=1.0, rows=rows, options={"target": "lable"})
    with pytest.raises(ValueError, match=r"did you mean 'label'\?"):
        private | bs.Synthesize(method="privbayes", epsilon=1.0, rows=rows,
                                options={"target": "Label"})
    assert job.accountant.spent_epsilon == 0


def test_cli_bad_target_names_the_flag_and_the_nearest_column(data, capsys):
    assert main(["synthesize", str(data / "in.csv"), "--schema", str(data / "schema.yaml"),
                 "--epsilon", "1", "--method", "privbayes", "--quiet", "--output",
                 str(data / "bad.csv"), "--target", "lable"]) == 2
    err = capsys.readouterr().err
    assert "--target lable: 'lable' is not a declared column" in err and "'label'?" in err
    assert not (data / "bad.csv").exists()
