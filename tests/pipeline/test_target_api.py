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
    return _cli_seed(tmp, schema, seed, *extra, tag=tag)


def _cli_seed(tmp: Path, schema: Path, seed: int, *extra: str, tag: str = "") -> tuple[list, dict]:
    out = tmp / f"cli_{tag or seed}.csv"
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


@pytest.fixture(scope="module")
def cli_with_target(data) -> tuple[list, dict]:
    """``beamsynth synthesize --target label`` with the API step's seed: run once, read by the
    three input kinds below (the same arguments each time)."""
    return _cli(data, data / "schema.yaml", "flag", "--target", "label")


@pytest.mark.parametrize("kind", ["dicts", "rows", "arrow"])
def test_api_target_gives_the_cli_rows(data, cli_with_target, kind):
    """bs.PrivBayes(options={"target": ...}) on dicts, Rows and Arrow batches: the rows of
    ``beamsynth synthesize --target`` run with the API step's seed (the job seed's stream for
    the step ``Synthesize[privbayes]``); the schema's ``target`` key gives the same rows, and
    without a target they differ (the star ran: the DP count picked k = 0)."""
    api, manifest = _api(data, kind, schema=_spec(), options={"target": "label"}, tag=kind)
    cli, cli_manifest = cli_with_target
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


@pytest.mark.parametrize("noise,delta", [("laplace", 0.0), ("gaussian", 1e-9)])
def test_spends_sized_from_the_dp_count_name_the_star(noise, delta):
    """Without public rows the spends are the planned network's; the size count's use (and the
    zCDP spend's small_input_model) say that k = 0 means the star around the named target."""
    from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant
    from beamsynth.transforms.privbayes import DPPrivBayes

    def spends(target):
        acc = PrivacyAccountant(total=ApproxDP(epsilon=1.0, delta=delta))
        DPPrivBayes(schema=bs.load_schema(_spec()), budget=ApproxDP(epsilon=1.0, delta=delta),
                    sizing="auto", noise=noise, target=target, accountant=acc)
        return {s.step: s for s in acc.spends}

    with_target, without = spends("label"), spends(None)
    assert "star around the declared target 'label'" in with_target[
        "privbayes.size_count"].details["use"]
    assert "star" not in without["privbayes.size_count"].details["use"]
    if noise == "gaussian":
        model = with_target["privbayes.zcdp"].details["small_input_model"]["model"]
        assert model.startswith("the star around the declared target 'label'")
        assert "star" not in without["privbayes.zcdp"].details["small_input_model"]["model"]
    assert {k: (s.budget.epsilon, s.budget.delta) for k, s in with_target.items()} == {
        k: (s.budget.epsilon, s.budget.delta) for k, s in without.items()}


def _yaml_rows(tmp: Path, schema: Path, options: str, tag: str) -> tuple[list, dict]:
    pytest.importorskip("apache_beam.yaml.main", reason="Beam YAML needs apache-beam[yaml]")
    from tests.yaml_helpers import provider, run_yaml

    out = tmp / f"yaml_{tag}"
    names = ", ".join(_frame().columns)
    spec = f"""
providers:
  - include: "{provider()}"
pipeline:
  transforms:
    - type: ReadFromCsv
      name: Read
      config: {{path: "{tmp / 'in.csv'}", dtype: str, keep_default_na: false, header: 0,
               names: [{names}]}}
    - type: BeamsynthSynthesize
      name: Synth
      input: Read
      config: {{schema: "{schema}", epsilon: 1.0, method: privbayes, rows: 200, seed: 11,
               manifest: "{out}.manifest.json"{options}}}
    - type: WriteToJson
      name: Write
      input: Synth
      config: {{path: "{out}"}}
"""
    run_yaml(tmp / f"{tag}.yaml", spec)
    got = sorted(tuple(str(v) for v in json.loads(line).values())
                 for f in sorted(tmp.glob(f"yaml_{tag}-*")) for line in f.read_text().splitlines())
    return got, json.loads(Path(f"{out}.manifest.json").read_text())


def test_beam_yaml_takes_the_target_as_an_option_or_the_schema_key(data):
    """BeamsynthSynthesize with options: {target: label}, or a schema with target: label, gives
    the CLI's rows (YAML's seed is the CLI's); the manifest names the star and its target."""
    by_option, manifest = _yaml_rows(data, data / "schema.yaml", ", options: {target: label}", "opt")
    by_key, _ = _yaml_rows(data, data / "schema_t.yaml", "", "key")
    cli, _ = _cli_seed(data, data / "schema.yaml", 11, "--target", "label")
    assert len(by_option) == 200 and by_option == by_key == cli
    details = manifest["release"]["details"]["method"]["privbayes"]
    assert details["target"]["column"] == "label"
    plain, _ = _yaml_rows(data, data / "schema.yaml", "", "plain")
    assert plain != by_option


def _release(tmp: Path, table: dict) -> dict:
    return {"name": "t", "folder": str(tmp / "rel-{date}"), "budget": {"epsilon": 1.0},
            "ledger": {"path": str(tmp / "l.sqlite"), "policies": {"src": {"epsilon": 5.0}}},
            "tables": [{"name": "a", "source": "src", "input": str(tmp / "in.csv"),
                        "schema": str(tmp / "schema.yaml"), "epsilon": 1.0, "method": "privbayes",
                        "rows": 200,
                        **table}],
            "reports": {"private": False, "public": False}}


def test_release_config_takes_the_target_in_the_table_options(data):
    """A release table's options: {target: ...} (or its schema's key) plan the star when the
    pipeline is built; a bad name is refused with the table's path and the nearest column."""
    from beamsynth.pipelines.releases.config import ReleaseConfigError, load_release_config
    from beamsynth.pipelines.releases.release import plan_release

    for table in ({"options": {"target": "label", "input_rows": 1000}},
                  {"schema": str(data / "schema_t.yaml"), "options": {"input_rows": 1000}}):
        plan = plan_release(load_release_config(_release(data, table), date="2026-01-01"))
        (spend,) = plan.spends
        assert spend.step == "a.privbayes.marginals" and spend.epsilon == 1.0
        star = plan.plans["a"].accountant.spends[0].details
        assert star["target"] == "label" and star["target_index"] == COLUMNS
    bad = _release(data, {"options": {"target": "lable"}})
    with pytest.raises(ReleaseConfigError, match=r"^tables\[0\]\.options\.target: 'lable' is not a "
                       r"declared column of schema 't' \(did you mean 'label'\?"):
        plan_release(load_release_config(bad, date="2026-01-01"))


def test_an_empty_target_turns_the_schema_key_off(data):
    """--target '' (options={"target": ""}) is no target, even where the schema declares one:
    the rows of the schema without the key, and no star in the manifest."""
    keyless, _ = _cli_seed(data, data / "schema.yaml", 3, tag="keyless")
    off, manifest = _cli_seed(data, data / "schema_t.yaml", 3, "--target", "", tag="off")
    on, _ = _cli_seed(data, data / "schema_t.yaml", 3, tag="on")
    assert off == keyless != on
    details = manifest["release"]["details"]["method"]["privbayes"]
    assert "target" not in details and not any(
        "star" in k for k in details["sizing"].get("chosen_small_model_windows", {}))


def test_cli_console_says_which_model_ran(data, capsys):
    """Sized from the DP count, the plan and spend lines name the planned network; a line after
    the run says the star around the target ran (progress on, the default)."""
    assert main(["synthesize", str(data / "in.csv"), "--schema", str(data / "schema_t.yaml"),
                 "--epsilon", "1", "--method", "privbayes", "--rows", "50", "--seed", "1",
                 "--output", str(data / "console.csv")]) == 0
    err = capsys.readouterr().err
    assert ("privbayes: the DP size count chose the small-input model (k = 0) in 1 window(s): "
            "star of ") in err and "around the target 'label' + 1-way tables in 1 window(s)" in err


def test_beam_yaml_refuses_an_unknown_option_name():
    """options: {targt: label} ran the model without a target, silently (the API refuses it)."""
    from beamsynth.pipelines.yaml_transforms import Synthesize

    with pytest.raises(ValueError, match=r"^BeamsynthSynthesize: unknown option 'targt' for method "
                       r"'privbayes' \(did you mean 'target'\?\); its options: degree, "):
        Synthesize(schema=_spec(), epsilon=1.0, method="privbayes", rows=10,
                   options={"targt": "label"})


def test_release_config_refuses_an_unknown_option_name(data):
    """A release table's options: {targt: label} ran the model without a target, silently."""
    from beamsynth.pipelines.releases.config import ReleaseConfigError, load_release_config

    bad = _release(data, {"options": {"targt": "label"}})
    with pytest.raises(ReleaseConfigError, match=r"^tables\[0\]\.options\.targt: is not an option "
                       r"of method 'privbayes' \(did you mean 'target'\?\); its options: degree, "):
        load_release_config(bad, date="2026-01-01")
