"""The plugin API's open items as an ETL engineer meets them (eighteenth session, H96).

Each test fails on the code before its fix (docs/beam-api.md, "Eighteenth session").
"""

from __future__ import annotations

import json
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

import beamsynth as bs
from beamsynth.runners.local import LocalDirectRunner
from tests.yaml_helpers import SHOP_SCHEMA, write_schema

yaml = pytest.importorskip("yaml")



def _schema_file(folder: Path, **changes) -> Path:
    return write_schema(folder, {**SHOP_SCHEMA, **changes}, "shop.yaml")


# -- 1. Beam's ReadFromJson on a file without records reads no rows -------------------------------
def test_read_from_json_on_a_file_without_records_reads_no_rows(tmp_path: Path) -> None:
    """``beam.io.ReadFromJson`` (Beam YAML's ``ReadFromJson`` too) samples the first file when
    built; a file without a record (0 bytes, blank lines) has no sample, and ``StopIteration``
    failed the pipeline when built, so whether a release happened depended on the data (rule 7).
    Now no rows, and a job's Count still releases its one DP row, its manifest reading 0 rows (a
    file with records reads as before: the ReadFromJson jobs of test_session16_api and others)."""
    job = bs.PrivacyJob(epsilon=1.0, seed=3)
    schema = bs.load_schema(str(_schema_file(tmp_path, privacy_id=None)))
    empty, blank = tmp_path / "empty.jsonl", tmp_path / "blank.jsonl"
    empty.write_bytes(b"")
    blank.write_bytes(b"\n\n")
    _ = beam.Pipeline() | beam.io.ReadFromJson(str(blank), lines=True)  # built (was StopIteration)
    with beam.Pipeline(runner=LocalDirectRunner()) as p:
        rows = p | beam.io.ReadFromJson(str(empty), lines=True)
        assert_that(rows, equal_to([]), label="NoRows")
        counts = rows | job.private(schema) | bs.Count(epsilon=0.5) | beam.combiners.Count.Globally()
        assert_that(counts, equal_to([1]), label="OneCount")
        _ = p | bs.WriteManifest(job=job, path=str(tmp_path / "m.json"))
    manifest = json.loads((tmp_path / "m.json").read_text(encoding="utf-8"))
    assert manifest["operational"]["rows_read"] == 0


def test_read_from_json_samples_a_later_file_when_the_first_is_empty(tmp_path: Path) -> None:
    """Beam samples only the first file a pattern matches: with the first empty, the sample must
    come from another file, else every record of the others became a row without fields (each a
    dead letter in ``job.private``). Whichever file the pattern lists first, the rows keep their
    fields."""
    import pandas as pd
    from apache_beam.dataframe.io import _ReadFromPandas

    from beamsynth._json_sample_fix import _first_chunk_of_any_file

    for name in ("a", "c", "e"):
        (tmp_path / f"{name}.jsonl").write_bytes(b"")
    (tmp_path / "b.jsonl").write_text('{"age": 30, "region": "north"}\n', encoding="utf-8")
    read = _ReadFromPandas(pd.read_json, str(tmp_path / "*.jsonl"), (),
                           {"lines": True, "orient": "records", "dtype": False})
    assert list(_first_chunk_of_any_file(read, pd.read_json).columns) == ["age", "region"]
    rows = beam.Pipeline() | beam.io.ReadFromJson(str(tmp_path / "*.jsonl"), lines=True)
    assert [name for name, _ in rows.element_type._fields] == ["age", "region"]


# -- 2. Beam YAML manifests count the records whose ids were rounded ------------------------------
def test_yaml_manifests_count_rounded_ids(tmp_path: Path) -> None:
    """Under ``privacy_ids: rounded`` the API's manifests count the records whose id is 2**53 or
    beyond (``operational.privacy_ids_rounded``); the Beam YAML steps' manifests did not. Now
    ``BeamsynthCount`` (the statistics steps) and ``BeamsynthSynthesize`` do, in the operational
    part only (under ``exact`` there is no such count: the test below)."""
    from beamsynth.pipelines import yaml_stats, yaml_transforms

    schema, big = str(_schema_file(tmp_path, privacy_ids="rounded")), 2**53
    paths = {kind: tmp_path / f"{kind}.json" for kind in ("count", "synth")}
    with beam.Pipeline(runner=LocalDirectRunner()) as p:
        rows = p | beam.Create([beam.Row(customer=big, age=30, region="north"),
                                beam.Row(customer=big + 1, age=40, region="south"),
                                beam.Row(customer=7, age=50, region="east")])
        total = {"epsilon": 1.5}
        _ = rows | yaml_stats.Count(schema=schema, epsilon=0.5, seed=3, job_budget=total,
                                    manifest=str(paths["count"]))
        _ = rows | yaml_transforms.Synthesize(schema=schema, epsilon=1.0, rows=5, seed=4,
                                              job_budget=total, manifest=str(paths["synth"]))
    for kind, path in paths.items():
        m = json.loads(path.read_text(encoding="utf-8"))
        assert m["operational"].get("privacy_ids_rounded") == 2, (kind, m["operational"])
        assert "privacy_ids_rounded" not in json.dumps(m["release"])


def test_yaml_manifest_counts_rounded_ids_only_where_ids_are_rounded(tmp_path: Path) -> None:
    from beamsynth.pipelines.yaml_transforms import _SumCountsFn, reads_rounded_ids

    counts = {"rows_read": 3, "privacy_ids_rounded": 2}
    assert _SumCountsFn(rounded=True).extract_output(counts)["privacy_ids_rounded"] == 2
    assert _SumCountsFn(rounded=True).extract_output({})["privacy_ids_rounded"] == 0
    assert "privacy_ids_rounded" not in _SumCountsFn().extract_output(counts)
    assert [reads_rounded_ids(bs.load_schema(str(_schema_file(tmp_path, **change))))
            for change in ({}, {"privacy_ids": "exact"}, {"privacy_id": None})] == [True, False, False]


# -- 3. rows=0 refused and a large δ warned, in one validator for every caller --------------------
@pytest.mark.parametrize(("make", "message"), [
    (lambda: bs.PrivBayes(epsilon=1.0, rows=0), "rows=0: the row count must be a whole number >= 1"),
    (lambda: bs.Synthesize(method="sbhg", epsilon=1.0, delta=1e-6, rows=-2),
     "rows=-2: the row count must be a whole number >= 1"),
    (lambda: bs.IndependentSynthesis(epsilon=1.0, rows=0), "or unset for a DP count"),
])
def test_api_refuses_zero_rows(make, message) -> None:
    """``bs.PrivBayes(rows=0)`` spent its ε for no row without a word (H87's open item)."""
    with pytest.raises(ValueError, match=message):
        make()


def test_api_refuses_a_row_count_of_another_type() -> None:
    with pytest.raises(TypeError, match=r"rows='5': the row count must be a whole number >= 1 or "
                                        r"unset, got str"):
        bs.PrivBayes(epsilon=1.0, rows="5")


@pytest.mark.parametrize(("caller", "shown"), [("cli", "--rows 0"), ("yaml", "rows: 0")])
def test_cli_and_yaml_refuse_zero_rows_in_their_words(caller: str, shown: str) -> None:
    """The CLI's ``--rows 0``, a YAML step's and a release table's ``rows: 0`` (all through
    ``plan_synthesis``) were taken: ε spent, a header-only file written."""
    from beamsynth.pipelines.methods.synthesize import SynthesisConfig, plan_synthesis
    from beamsynth.pipelines.methods.wording import Vocabulary

    cfg = SynthesisConfig(input="in.csv", schema=bs.load_schema("adult"), output="out.csv",
                          epsilon=1.0, rows=0)
    with pytest.raises(ValueError, match=f"^{shown}: the row count must be a whole number >= 1"):
        plan_synthesis(cfg, vocabulary=Vocabulary(caller))


def test_large_delta_is_warned_once_when_built(monkeypatch, caplog) -> None:
    """``bs.PrivacyJob(delta=0.5)`` was taken without a word; δ ≥ 1 was and is refused. Now a
    total δ above 1e-3 logs a warning naming the value, once per value (YAML builds several
    accountants of one total)."""
    import logging

    from beamsynth.transforms import budget

    monkeypatch.setattr(budget, "_WARNED_DELTAS", set())
    with caplog.at_level(logging.WARNING, logger="beamsynth.transforms.budget"):
        bs.PrivacyJob(epsilon=1.0, delta=1e-3)
        assert not caplog.records
        bs.PrivacyJob(epsilon=1.0, delta=0.5)
        bs.PrivacyJob(epsilon=2.0, delta=0.5)
    assert [r.getMessage()[:24] for r in caplog.records] == ["delta=0.5 is above 0.001"]
    with pytest.raises(ValueError, match=r"delta \(1\) must be in \[0, 1\)"):
        bs.PrivacyJob(epsilon=1.0, delta=1)


# -- 6. the dask runner's own cluster: workers get time to exit, no "still alive ... killing" ------
def test_dask_close_gives_the_workers_time_to_exit() -> None:
    """``distributed``'s cluster close asks each worker process to stop and kills it 4 s later
    (``WARNING distributed.nanny: Worker process still alive after 4.0 seconds, killing``); on the
    shared machine a worker with Beam loaded took longer. The runner now closes its own
    cluster's workers first, each given ``CLOSE_SECONDS``; a user's cluster is never closed."""
    pytest.importorskip("distributed")
    from beamsynth.runners import dask_runner, dask_shutdown

    calls: list = []

    class Cluster:
        workers: dict = {}

        def sync(self, fn, *args):
            calls.append((fn.__name__, args))

    class Client:
        def __init__(self, cluster):
            self.cluster = cluster

        def run(self, fn, **kwargs):
            calls.append((fn.__name__, ()))

        def close(self):
            calls.append(("close", ()))

    own = Cluster()
    dask_runner._close(Client(own))
    assert [name for name, _ in calls] == ["stop_heartbeats", "close_workers", "close"]
    assert calls[1][1] == (own,) and dask_shutdown.CLOSE_SECONDS > 5  # distributed: 5 s
    calls.clear()
    dask_runner._close(Client(None))  # a user's cluster (--dask_client_address)
    assert calls == [("close", ())]


_SLOW_EXIT_CLI = """
import asyncio, sys
import distributed
close = distributed.Worker.close
async def slow_close(self, *args, **kwargs):
    await asyncio.sleep(6)  # a worker process slower to exit than distributed's 4 s
    return await close(self, *args, **kwargs)
distributed.Worker.close = slow_close
if __name__ == "__main__":
    if sys.argv.pop(1) == "old":
        from beamsynth.runners import dask_shutdown
        async def keep(cluster, timeout=0):
            return None
        dask_shutdown.close_workers = keep
    from beamsynth.pipelines.cli.main import main
    sys.argv = ["beamsynth", *sys.argv[1:]]
    raise SystemExit(main())
"""


@pytest.mark.slow
def test_cli_on_dask_with_progress_prints_no_worker_killed_line(tmp_path: Path) -> None:
    """The user's path: ``beamsynth histogram --runner dask`` with progress on, worker processes
    that take 6 s to close. The old close (``close_workers`` a no-op) prints the nanny's
    ``Worker process still alive after 4.0 seconds, killing``; the runner's prints none. The
    default test above covers the close order."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    script = tmp_path / "cli.py"
    script.write_text(_SLOW_EXIT_CLI)
    stderr = {}
    for mode in ("old", "new"):
        out = tmp_path / f"sex_{mode}.csv"
        done = subprocess.run(
            [sys.executable, str(script), mode, "histogram",
             str(root / "examples/data/adult/adult.csv"), "--column", "sex", "--domain",
             "list:Female,Male", "--epsilon", "1", "--tolerance", "0.5", "--seed", "3",
             "--output", str(out), "--runner", "dask"],
            capture_output=True, text=True, cwd=root, timeout=600)
        assert done.returncode == 0, done.stderr
        assert "rows read 48842" in done.stderr and out.exists()
        stderr[mode] = done.stderr
    assert "still alive after" in stderr["old"], stderr["old"]
    assert "still alive after" not in stderr["new"], stderr["new"]


# -- 4. an out-of-domain category names the way to keep such rows --------------------------------
def test_out_of_domain_category_names_the_catch_all(tmp_path: Path) -> None:
    """A new category (``'Martian'``) made a dead letter saying only ``is outside the declared
    categorical domain``, with no way out named (H87's open item). Now the reason names the
    schema's catch-all: how to declare one, or, where the domain has one, ``on_out_of_domain:
    other``; with that set the row is used, in its catch-all cell. Numbers keep their range."""
    def schema(**sex_options):
        path = tmp_path / "s.yaml"
        path.write_text(yaml.safe_dump({"name": "s", "columns": [
            {"name": "race", "type": "categorical",
             "domain": {"kind": "categorical", "values": ["White", "Black"]}},
            {"name": "sex", "type": "categorical", **sex_options,
             "domain": {"kind": "categorical", "values": ["F", "M"], "other": "OTHER"}},
            {"name": "age", "type": "integer",
             "domain": {"kind": "integer", "low": 17, "high": 99}}]}), encoding="utf-8")
        return bs.load_schema(str(path))

    columns = {"race": ["Martian", "White", "White"], "sex": ["F", "X", "M"],
               "age": ["30", "40", "150"]}
    _, bad = schema().encode_columns(columns, 3)
    assert bad == [
        (0, "column 'race': value 'Martian' is outside the declared categorical domain (to keep "
            "such rows, declare a catch-all cell, other: OTHER in the domain, and "
            "on_out_of_domain: other; docs/schema-format.md)"),
        (1, "column 'sex': value 'X' is outside the declared categorical domain (to count such "
            "values in its catch-all 'OTHER' instead: on_out_of_domain: other)"),
        (2, "column 'age': value '150' is outside the declared integer domain [17, 99]")]
    batch, bad = schema(on_out_of_domain="other").encode_columns(columns, 3)
    assert [row for row, _ in bad] == [0, 2] and batch.codes[:, 1].tolist() == [2]  # OTHER


# -- 7. the refinement's DP picks in the manifest's public part ----------------------------------
def test_refinement_picks_are_recorded_parsed_and_stated_with_their_spends() -> None:
    """``--pb-refine-target-picks`` (and every refinement): which pairs the DP selection picked
    reached no manifest. Each window's picks are now records ``privbayes_refine_pick_<j>:[a, b]``
    (Beam counters for the CLI, ``run_counts`` for the API/YAML manifests), stated in
    ``details.privbayes.refine.picks`` next to the refinement's ε per pick and per table."""
    from types import SimpleNamespace

    from beamsynth.pipelines.io.metrics import run_counters
    from beamsynth.pipelines.methods.privbayes import (
        _choice_items,
        refine_picks,
        with_refine_picks,
    )
    from beamsynth.transforms.privbayes_measure import refine_pick_choices

    tables = tuple(SimpleNamespace(names=pair) for pair in (("age", "income"), ("sex", "race")))
    measured = SimpleNamespace(refinement=SimpleNamespace(tables=tables), sizing=None)
    names = refine_pick_choices(measured)
    assert names == ('privbayes_refine_pick_1:["age", "income"]',
                     'privbayes_refine_pick_2:["sex", "race"]')
    assert _choice_items(measured) == [(n, 1) for n in names]
    assert refine_pick_choices(SimpleNamespace(refinement=None)) == ()
    counts = {names[1]: 2, names[0]: 2, 'privbayes_refine_pick_2:["age", "sex"]': 1,
              "privbayes_degree_1": 3}
    picks = refine_picks(counts)
    assert picks == [{"pick": 1, "pair": ["age", "income"], "windows": 2},
                     {"pick": 2, "pair": ["age", "sex"], "windows": 1},
                     {"pick": 2, "pair": ["sex", "race"], "windows": 2}]
    out = with_refine_picks({"refine": {"epsilon_per_pick": 0.01, "epsilon_per_table": 0.04}},
                            picks)
    assert out["refine"]["picks"] == picks and out["refine"]["epsilon_per_pick"] == 0.01
    assert with_refine_picks({"refine": None}, picks) == {"refine": None}

    counter = SimpleNamespace(key=SimpleNamespace(metric=SimpleNamespace(name=names[0])),
                              committed=1, attempted=1)
    other = SimpleNamespace(key=SimpleNamespace(metric=SimpleNamespace(name="rows_read")),
                            committed=9, attempted=9)
    result = SimpleNamespace(metrics=lambda: SimpleNamespace(
        query=lambda f: {"counters": [counter, other]}))
    assert run_counters(result, prefix="privbayes_refine_pick_") == {names[0]: 1}


@pytest.mark.slow
def test_api_manifest_lists_the_refinement_picks(tmp_path: Path) -> None:
    """The API's manifest (400 bundled Adult rows sized as 40,000, target income, picks auto):
    ``release.details.method... refine.picks`` lists every pick once, in order, each a pair of
    declared columns, and nothing of it is in ``operational``. The default test above covers
    the records and their parsing."""
    import csv

    root = Path(__file__).resolve().parents[1]
    with open(root / "examples/data/adult/adult.csv", encoding="utf-8") as fh:
        records = [dict(r) for _, r in zip(range(400), csv.DictReader(fh))]
    job = bs.PrivacyJob(epsilon=2.0, seed=5)
    with beam.Pipeline(runner=LocalDirectRunner()) as p:
        private = p | beam.Create(records) | job.private(bs.load_schema("adult"))
        _ = private | bs.PrivBayes(epsilon=2.0, rows=50, options={
            "target": "income", "refine_target_picks": "auto", "input_rows": 40_000})
        _ = p | bs.WriteManifest(job=job, path=str(tmp_path / "m.json"))
    manifest = json.loads((tmp_path / "m.json").read_text(encoding="utf-8"))
    (step,) = manifest["release"]["details"]["mechanisms"]
    refine = step["details"]["privbayes"]["refine"]
    columns = set(bs.load_schema("adult").names)
    assert [p["pick"] for p in refine["picks"]] == list(range(1, refine["pairs"] + 1)), refine
    assert all(p["windows"] == 1 and len(p["pair"]) == 2 and set(p["pair"]) <= columns
               for p in refine["picks"])
    assert refine["epsilon_per_pick"] > 0 and refine["epsilon_per_table"] > 0
    assert "picks" not in json.dumps(manifest["operational"])
