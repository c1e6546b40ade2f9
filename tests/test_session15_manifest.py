"""Fifteenth session, H72: manifests written inside the pipeline (API ``bs.WriteManifest``, Beam
YAML ``manifest:``) say which PrivBayes model ran, in the CLI's fields and words.

PrivBayes chooses at run time, from its DP size count n̂ (and the forest's DP picks), the degree
or small-input model per window, the refinement's size and, with a declared target, whether it is
a parent (auto). The CLI reads them from Beam counters after the run; the API and YAML now carry
each window's choices as records from the measuring step into the manifest. These tests run one
seeded job through each front end and compare with the CLI's manifest for the same seed, check
declared windows (an empty window says what it released), neighbours D / D − 1, and the other
runners (slow)."""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path

import apache_beam as beam
import pytest
import yaml
from apache_beam.testing import test_pipeline

import beamsynth as bs
from beamsynth.pipelines.methods.synthesize import SynthesisConfig, run_synthesis

SPEC = {"name": "toy", "target": "y", "columns": [
    {"name": "sex", "type": "categorical", "domain": {"kind": "categorical", "values": ["F", "M"]}},
    {"name": "city", "type": "categorical",
     "domain": {"kind": "categorical", "values": ["Oslo", "Rome", "Lima", "Kiev", "Baku"]}},
    {"name": "band", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 5}},
    {"name": "y", "type": "categorical", "domain": {"kind": "categorical", "values": ["a", "b"]}},
]}
SCHEMA = bs.load_schema(SPEC)
NAMES = [c["name"] for c in SPEC["columns"]]
STEP = "Synthesize[privbayes]"
EPSILON = 5.0
DAY = 86_400
T0 = 1_704_067_200  # 2024-01-01T00:00:00Z
WINDOWS = bs.DeclaredWindows(start=T0, end=T0 + 3 * DAY, size=DAY)
DAYS = ["2024-01-01T00:00:00Z", "2024-01-02T00:00:00Z", "2024-01-03T00:00:00Z"]
CHOSEN = ("chosen_degree_windows", "chosen_small_model_windows", "chosen_refine",
          "chosen_target_parent_windows")


def _records(n: int = 2000, seed: int = 1) -> list[dict]:
    rnd = random.Random(seed)  # y follows sex: the target is worth a parent
    out = []
    for i in range(n):
        sex = rnd.choice("FM")
        out.append({"sex": sex, "city": rnd.choice(["Oslo", "Oslo", "Rome", "Lima"]),
                    "band": rnd.randrange(6), "y": sex == "F" and rnd.random() < 0.8 and "a" or "b",
                    "day": i % 2})
    return out


def _api(folder: Path, records: list[dict], *, windowed: bool = False,
         args: list[str] | None = None) -> tuple[dict, list[str]]:
    """One seeded API job: (manifest, synthetic rows as sorted JSON lines)."""
    folder.mkdir()
    job = bs.PrivacyJob(epsilon=EPSILON, seed=3)
    with test_pipeline.TestPipeline(options=bs.pipeline_options(args or []), blocking=True) as p:
        src = p | beam.Create(records)
        if windowed:
            src = src | "Stamp" >> beam.Map(
                lambda r: beam.window.TimestampedValue(r, T0 + r["day"] * DAY + 60))
        private = src | job.private(SCHEMA, windows=WINDOWS if windowed else None)
        rows = private | bs.PrivBayes(epsilon=EPSILON, rows=50)
        _ = (rows | beam.Map(lambda r: json.dumps(r._asdict(), sort_keys=True))
             | beam.io.WriteToText(str(folder / "rows"), shard_name_template=""))
        _ = p | bs.WriteManifest(job=job, path=str(folder / "manifest.json"))
    rows = sorted((folder / "rows").read_text().splitlines())
    return json.loads((folder / "manifest.json").read_text()), rows


def _csv(folder: Path, records: list[dict]) -> Path:
    path = folder / "in.csv"
    path.write_text("\n".join([",".join(NAMES)] + [",".join(str(r[c]) for c in NAMES)
                                                  for r in records]) + "\n")
    return path


def _cli(folder: Path, records: list[dict], seed: int) -> dict:
    """The CLI's synthesize (run_synthesis) on the same records and seed: its manifest."""
    folder.mkdir()
    cfg = SynthesisConfig(input=str(_csv(folder, records)), schema=SCHEMA,
                          output=str(folder / "out.csv"), epsilon=EPSILON, method="privbayes",
                          rows=50, seed=seed)
    return run_synthesis(cfg)


def _api_details(manifest: dict) -> dict:
    (entry,) = [m for m in manifest["release"]["details"]["mechanisms"] if m["step"] == STEP]
    return entry["details"]["privbayes"]


def _chosen(details: dict) -> dict:
    return {k: details["sizing"][k] for k in CHOSEN if k in details["sizing"]}


def test_api_manifest_names_the_model_refinement_and_target_mode_the_cli_names(tmp_path):
    """bs.WriteManifest states the degree, refinement and target-parent mode that ran, equal to
    the CLI's manifest for the same seed (the API step's seed is job.step_seed(step)); before H72
    the API manifest had none of the chosen_* fields."""
    records = _records()
    api, _ = _api(tmp_path / "api", records)
    seed = bs.PrivacyJob(epsilon=EPSILON, seed=3).step_seed(STEP)
    cli = _cli(tmp_path / "cli", records, seed)
    pb_api, pb_cli = _api_details(api), cli["release"]["details"]["method"]["privbayes"]
    assert _chosen(pb_api) == _chosen(pb_cli)
    assert set(_chosen(pb_api)) == {"chosen_degree_windows", "chosen_refine",
                                    "chosen_target_parent_windows"}
    assert pb_api["sizing"]["chosen_degree_windows"] == {"1": 1}
    assert pb_api["sizing"]["chosen_target_parent_windows"] == {"required": 1}
    assert pb_api == pb_cli  # one shape: every privbayes detail, the noise mode's words included
    assert "mechanisms" not in api["operational"]  # the choices are public: nothing private added


def _yaml(folder: Path, records: list[dict], seed: int, *, windows: str = "") -> list[dict]:
    """The Beam YAML step on the same records: its manifests (one per declared window)."""
    pytest.importorskip("apache_beam.yaml.main", reason="Beam YAML needs apache-beam[yaml]")
    from tests.yaml_helpers import provider, run_yaml

    folder.mkdir()
    (folder / "schema.yaml").write_text(yaml.safe_dump(SPEC))
    stamp = """
    - type: AssignTimestamps
      name: Time
      input: Read
      config: {timestamp: "1704067260 + 86400 * int(day)", language: python}""" if windows else ""
    names = ", ".join(NAMES + ["day"])
    (folder / "in.csv").write_text("\n".join([",".join(NAMES + ["day"])] + [
        ",".join(str(r[c]) for c in NAMES + ["day"]) for r in records]) + "\n")
    spec = f"""
providers:
  - include: "{provider()}"
pipeline:
  transforms:
    - type: ReadFromCsv
      name: Read
      config: {{path: "{folder / 'in.csv'}", dtype: str, keep_default_na: false, header: 0,
               names: [{names}]}}{stamp}
    - type: BeamsynthSynthesize
      name: Synth
      input: {"Time" if windows else "Read"}
      config: {{schema: "{folder / 'schema.yaml'}", epsilon: {EPSILON}, method: privbayes,
               rows: 50, seed: {seed}, manifest: "{folder / 'm.json'}"{windows}}}
    - type: WriteToJson
      name: Write
      input: Synth
      config: {{path: "{folder / 'rows'}"}}
"""
    run_yaml(folder / "p.yaml", spec)
    return [json.loads(p.read_text()) for p in sorted(folder.glob("m*.json"))]


def test_yaml_manifest_names_the_model_refinement_and_target_mode_the_cli_names(tmp_path):
    """The Beam YAML step's manifest: the CLI's privbayes details for the same seed (YAML's seed
    is the CLI's)."""
    records = _records()
    (manifest,) = _yaml(tmp_path / "yaml", records, 11)
    cli = _cli(tmp_path / "cli", records, 11)
    pb_yaml = manifest["release"]["details"]["method"]["privbayes"]
    pb_cli = cli["release"]["details"]["method"]["privbayes"]
    assert set(_chosen(pb_yaml)) == {"chosen_degree_windows", "chosen_refine",
                                     "chosen_target_parent_windows"}
    assert pb_yaml == pb_cli


def test_declared_windows_list_each_windows_choice_an_empty_one_included(tmp_path):
    """Three declared days, records in the first two: sizing.chosen_per_window names each
    window's degree/model (the empty third day: what the DP count chose there), in window
    order; the chosen_* totals count windows, as the CLI's."""
    manifest, rows = _api(tmp_path / "w", _records(), windowed=True)
    sizing = _api_details(manifest)["sizing"]
    per = sizing["chosen_per_window"]
    assert [w["window_start"] for w in per] == DAYS
    assert {json.loads(r)["window_start"] for r in rows} == set(DAYS)  # 50 rows in each
    assert per[0]["degree"] == per[1]["degree"] == 1
    assert per[0]["model"] == "network with 1 parent(s) per column"
    assert per[0]["target_parent"] == per[1]["target_parent"] == "required"
    assert per[0]["refine_pairs"] == per[1]["refine_pairs"] == 6
    assert per[2]["degree"] == 0 and per[2]["model"] == "independent 1-way tables (∝ √cells, whole ε)"
    assert "target_parent" not in per[2] and "refine_pairs" not in per[2]
    assert sum(sizing["chosen_degree_windows"].values()) == 3
    assert sizing["chosen_degree_windows"] == {"0": 1, "1": 2}
    assert sizing["chosen_small_model_windows"] == {per[2]["model"]: 1}
    assert sizing["chosen_target_parent_windows"] == {per[0]["target_parent"]: 2}


def test_yaml_declared_windows_each_manifest_names_its_windows_choice(tmp_path):
    """BeamsynthSynthesize with declared windows writes one manifest per window; each names the
    model its window ran: at the API step's seed, the API job's chosen_per_window above (network
    of degree 1 with the target as a parent (required) and 6 refinement pairs on the two days with records,
    the independent 1-way tables on the empty third day)."""
    seed = bs.PrivacyJob(epsilon=EPSILON, seed=3).step_seed(STEP)
    manifests = _yaml(tmp_path / "yaml", _records(), seed,
                      windows=f", windows: {{start: {T0}, end: {T0 + 3 * DAY}, size: {DAY}}}")
    sizings = [m["release"]["details"]["method"]["privbayes"]["sizing"] for m in manifests]
    assert [m["release"]["details"]["window"]["start"] for m in manifests] == [
        T0, T0 + DAY, T0 + 2 * DAY]
    assert [s["chosen_degree_windows"] for s in sizings] == [{"1": 1}, {"1": 1}, {"0": 1}]
    assert [list(s.get("chosen_refine", {})) for s in sizings] == [["6"], ["6"], []]
    assert [s.get("chosen_target_parent_windows") for s in sizings] == [{"required": 1}] * 2 + [None]
    assert sizings[2]["chosen_small_model_windows"] == {
        "independent 1-way tables (∝ √cells, whole ε)": 1}
    assert "chosen_per_window" not in sizings[0]  # one window per manifest


def test_plausible_hook_puts_the_generators_choices_in_model_sizing():
    """The API/YAML hook of plausible deniability (picklable, the generator's plan only): its
    model records (model:<counter>) become details.model.privbayes.sizing's CLI fields, the
    released rows stay public and the tested count private; the recorded details are not
    changed. The end-to-end run is the slow test below."""
    from beamsynth.pipelines.methods.synthesize import plan_synthesis

    cfg = SynthesisConfig(input="x", schema=SCHEMA, output="", epsilon=400.0, delta=1e-6,
                          method="plausible", rows=100, seed=1, options={"generator": "privbayes"})
    method = plan_synthesis(cfg).method
    details, hook = method.details(), pickle.loads(pickle.dumps(method.run_time_details))
    public, private = hook(details, {"released": 5, "rejected": 3,
                                     "model:privbayes_degree_1": 1,
                                     "model:privbayes_refine_pairs_6": 1})
    assert public["released"] == 5 and private["tested"] == 8
    sizing = public["model"]["privbayes"]["sizing"]
    assert sizing["chosen_degree_windows"] == {"1": 1}
    assert sizing["chosen_refine"]["6"]["windows"] == 1
    assert "chosen_degree_windows" not in details["model"]["privbayes"]["sizing"]
    assert "model:privbayes_degree_1" not in json.dumps([public, private])


@pytest.mark.slow  # 5-8 s at load 4: test_plausible_hook_puts_the_generators_choices_in_model_sizing
def test_plausible_privbayes_generator_names_its_model_choices_as_the_cli(tmp_path):
    """Plausible deniability's PrivBayes generator without input_rows sizes its model from its own
    DP count: API (and now CLI) manifests name what ran in details.model.privbayes.sizing; before
    H72 neither did (counters only). Equal at the same seed, with the released rows."""
    records = _records(1500)
    folder = tmp_path / "api"
    folder.mkdir()
    job = bs.PrivacyJob(epsilon=400.0, delta=1e-5, seed=3)
    with test_pipeline.TestPipeline(options=bs.pipeline_options([]), blocking=True) as p:
        private = p | beam.Create(records) | job.private(SCHEMA)
        _ = private | bs.PlausibleDeniability(epsilon=400.0, delta=1e-6, rows=100,
                                              options={"generator": "privbayes"})
        _ = p | bs.WriteManifest(job=job, path=str(folder / "m.json"))
    (entry,) = json.loads((folder / "m.json").read_text())["release"]["details"]["mechanisms"]
    (tmp_path / "cli").mkdir()
    cfg = SynthesisConfig(input=str(_csv(tmp_path / "cli", records)), schema=SCHEMA,
                          output=str(tmp_path / "cli" / "out.csv"), epsilon=400.0, delta=1e-6,
                          method="plausible", rows=100, seed=job.step_seed("Synthesize[plausible]"),
                          options={"generator": "privbayes"})
    cli = run_synthesis(cfg)["release"]["details"]["method"]
    assert entry["details"]["model"] == cli["model"]
    assert entry["details"]["released"] == cli["released"] > 0
    sizing = cli["model"]["privbayes"]["sizing"]
    assert sizing["chosen_degree_windows"] == {"1": 1} and list(sizing["chosen_refine"]) == ["6"]


def _diff(a, b, path=()) -> list[tuple]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str)
                for d in _diff(a.get(k), b.get(k), (*path, k))]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, (*path, i))]
    return [] if a == b else [path]


def test_neighbours_manifests_differ_only_where_dp_outputs_differ(tmp_path):
    """D (89 records) and D − 1 (its last record removed), same seed: the same-seed DP count
    n̂ = n − 10 is 79 and 78, on either side of the degree-1 threshold (79, from the plan), so D
    ran the network and D − 1 the star around the target. The public parts differ only in the
    chosen_* fields (functions of n̂); the exact counts stay in operational."""
    base = _records(89)
    small, _ = _api(tmp_path / "d1", base[:-1])
    large, _ = _api(tmp_path / "d", base)
    for m in (small, large):
        m.pop("created")
        m["release"].pop("outputs")
        m["release"].pop("versions")
    assert _api_details(large)["sizing"]["chosen_degree_windows"] == {"1": 1}
    assert _api_details(small)["sizing"]["chosen_degree_windows"] == {"0": 1}
    assert _api_details(small)["sizing"]["chosen_small_model_windows"] == {
        "star of 3 column(s) around the target 'y' + 1-way tables": 1}
    diffs = _diff(small["release"], large["release"])
    prefix = ("details", "mechanisms", 0, "details", "privbayes", "sizing")
    refine = ("details", "mechanisms", 0, "details", "privbayes", "refine")  # D's DP picks (H96)
    chosen = [p for p in diffs if p[:6] == prefix and p[6] in CHOSEN]
    picks = [p for p in diffs if p[:6] == refine and p[6] in ("picks", "picks_note")]
    assert chosen and len(chosen) + len(picks) == len(diffs), diffs
    assert {p[6] for p in chosen} == {"chosen_degree_windows", "chosen_small_model_windows",
                                       "chosen_refine", "chosen_target_parent_windows"}
    assert large["operational"]["rows_used"] == small["operational"]["rows_used"] + 1 == 89
    text = json.dumps(large["release"])
    assert "rows_hat" not in text and "rows_used" not in text


@pytest.mark.slow  # ~10-15 s: two runners; the default tests above cover the direct runner
@pytest.mark.parametrize("runner", ["direct-multi", "dask"])
def test_other_runners_write_the_same_choices(tmp_path, runner, request):
    """direct-multi (declared windows) and beamsynth's DaskRunner (the global window: it refuses
    declared windows; it computes only the last-applied step): the same rows and the same
    manifest choices as the direct runner."""
    args = ["--runner", runner]
    windowed = runner != "dask"
    if runner == "dask":
        args.append(f"--dask_client_address={request.getfixturevalue('dask_address')}")
    direct, direct_rows = _api(tmp_path / "direct", _records(), windowed=windowed)
    other, other_rows = _api(tmp_path / runner, _records(), windowed=windowed, args=args)
    assert other_rows == direct_rows and len(other_rows) == (150 if windowed else 50)
    assert _api_details(other) == _api_details(direct)
    sizing = _api_details(other)["sizing"]
    assert sum(sizing["chosen_degree_windows"].values()) == (3 if windowed else 1)
    assert len(sizing.get("chosen_per_window", [])) == (3 if windowed else 0)
