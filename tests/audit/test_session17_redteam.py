"""Seventeenth session red team (H86) of the sixteenth session's last commits (83681e9..db1793e),
with neighbour pairs through the real paths (Beam YAML, the API, the CLI's option checks) and
build-time probes. docs/audits.md "Seventeenth session: red team of the sixteenth session's last
commits (H86)" has the numbers and, for each clean check, the broken variant it catches.

1. Found and fixed: the shipped example ``pipelines/windowed_counts.yaml`` (a7c508b) stamped a
   row whose time is ``nan``, ``inf`` or ``1e20`` with that value: Beam's ``Stamp`` step failed
   the whole run (``ValueError: cannot convert float NaN to integer``, ``OverflowError``) on one
   row (rule 8). Such a row is now stamped before the declared start like a missing time: an
   error row, counted.
2. Found and fixed: the Beam YAML statistics steps' manifests (``BeamsynthCount``, ...) stated no
   ids mode while their encoder read ids with the schema's ``privacy_ids`` (rounded by default:
   ids 2**53 and 2**53 + 1 one person); 26a3b8d lets a step's ``privacy_id`` name any rows' id
   field. The manifest states ``privacy_unit.ids`` as ``BeamsynthSynthesize``'s (H83, 8b746d6).
3. Clean: a statistics step's ``privacy_id`` naming the rows' id column (26a3b8d) bounds every
   statistics step per id (Count, Histogram, Marginals, Prefixes in one pipeline).
4. Clean: ``refine_target_picks`` (f3f482b, db1793e) is checked alike by the API, Beam YAML and
   the CLI, no other method takes it (plausible's generator included), nothing is spent before
   a refusal, and the spends are the same with and without it.
5. Clean: ``Method.releases_records()`` (c8eecd2) decides as the identity test it replaced, for
   every registered method and for user-defined subclasses.
"""

from __future__ import annotations

import json
import logging
from importlib import resources

import apache_beam as beam
import pytest

pytestmark = pytest.mark.audit

yaml = pytest.importorskip("yaml")

_SCHEMA = {"name": "shop", "privacy_id": "customer", "columns": [
    {"name": "age", "type": "integer",
     "domain": {"kind": "integer", "low": 18, "high": 90, "edges": [18, 30, 45, 60, 91]}},
    {"name": "region", "type": "categorical",
     "domain": {"kind": "categorical", "values": ["north", "south", "east", "west"]}}]}


def _provider() -> str:
    return str(resources.files("beamsynth.pipelines") / "beamsynth_provider.yaml")


def _run_yaml(transforms: list[dict]) -> None:
    """A Beam YAML pipeline of ``transforms`` (after the provider), run on the direct runner."""
    from apache_beam.yaml.yaml_transform import expand_pipeline

    spec = {"providers": [{"include": _provider()}], "pipeline": {"transforms": transforms}}
    logging.disable(logging.WARNING)
    try:
        with beam.Pipeline(runner="beamsynth.runners.local.LocalDirectRunner") as p:
            expand_pipeline(p, yaml.safe_dump(spec, sort_keys=False))
    finally:
        logging.disable(logging.NOTSET)


# -- 1. the example's stamp: a non-finite or huge time is an error row, never a crash --------------
def _example_transforms(variables: dict) -> list[dict]:
    """The steps of ``pipelines/windowed_counts.yaml`` rendered with ``variables`` (its Jinja
    variables), the stamping callable's ``start`` included."""
    import jinja2

    text = (resources.files("beamsynth.pipelines") / "windowed_counts.yaml").read_text("utf-8")
    return yaml.safe_load(jinja2.Template(text).render(**variables))["pipeline"]["transforms"]


@pytest.mark.parametrize("ts", ["nan", "NaN", "inf", "-inf", "Infinity", "1e20", "-1e20", "1e300",
                                "9.3e12"])
def test_example_stamps_a_non_finite_or_huge_time_before_the_declared_start(ts):
    """Before: the callable returned ``float(ts)`` for any text ``float`` parses, and Beam's step
    failed the run on the stamp (NaN: ``ValueError: cannot convert float NaN to integer``;
    ±inf: ``OverflowError``; 1e20 and 9.3e12: ``OverflowError: Python int too large to convert
    to C long``, measured on the whole example with one such row among four). Now such a row is
    stamped one second before the declared start (outside the windows: an error row, counted)."""
    steps = _example_transforms({"input": "x", "output": "y", "schema": "adult", "ts": "ts",
                                 "start": 3600, "end": 14400})
    (stamp,) = [t for t in steps if t["type"] == "AssignTimestamps"]
    scope: dict = {}
    exec(stamp["config"]["timestamp"]["callable"], scope)  # noqa: S102 (the shipped example)
    fn = scope["stamp"]
    assert fn(beam.Row(customer="1", ts=ts)) == 3599.0
    assert fn(beam.Row(customer="1", ts="7200.5")) == 7200.5  # a usable time is kept
    assert fn(beam.Row(customer="1", ts="20000")) == 20000.0  # after the end: kept, outside


# the whole example with such rows (29 s at load 6-9): slow; the stamp itself is the test above
@pytest.mark.slow
def test_windowed_example_survives_non_finite_and_huge_times(tmp_path):
    """The whole example on 6 CSV rows, 3 with times ``nan``, ``inf`` and ``1e20``: the run ends,
    both steps send those 3 rows to the error output and count them (read 6 = used 3 +
    rejected 3). Before: the run failed in Beam's ``Stamp`` step on the first of them."""
    import glob

    (tmp_path / "ev.csv").write_text("customer,age,region,ts\n1,30,north,10\n2,40,south,3700\n"
                                     "3,50,east,nan\n4,60,west,inf\n6,61,west,1e20\n"
                                     "5,33,north,20\n", encoding="utf-8")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(_SCHEMA), encoding="utf-8")
    out = tmp_path / "ev"
    _run_yaml(_example_transforms({"input": str(tmp_path / "ev.csv"), "output": str(out),
                                   "schema": str(tmp_path / "s.yaml"), "ts": "ts", "start": 0,
                                   "end": 10800}))
    errors = [json.loads(line) for f in glob.glob(f"{out}.rejected*")
              for line in open(f, encoding="utf-8").read().splitlines()]
    assert sorted(e["source"] for e in errors) == ["Count"] * 3 + ["Synthesize"] * 3
    count = json.loads((tmp_path / "ev.count.manifest.json").read_text(encoding="utf-8"))
    assert count["operational"]["rows_read"] == 6 and count["operational"]["rows_rejected"] == 3


# -- 2. the statistics steps' manifests state how ids were read --------------------------------
@pytest.mark.parametrize(("mode", "kind"), [("rounded", "Count"), ("exact", "Count"),
                                            ("rounded", "Histogram")])
def test_yaml_statistics_manifest_states_how_ids_were_read(tmp_path, mode, kind):
    """``BeamsynthCount``/``BeamsynthHistogram`` read ids with the schema's ``privacy_ids``: with
    ``rounded`` (the default) ids 2**53 and 2**53 + 1 are one person (1 row dropped by the bound
    of 1), with ``exact`` two (0 dropped). Before, the manifest's ``privacy_unit`` stated no mode
    either way (fails on 26a3b8d..db1793e); now ``ids`` is the encoder's mode."""
    from beamsynth.pipelines import yaml_stats

    schema = tmp_path / "shop.yaml"
    schema.write_text(yaml.safe_dump({**_SCHEMA, "privacy_ids": mode}), encoding="utf-8")
    big, manifest = 2**53, tmp_path / "m.json"
    extra = {"columns": ["region"]} if kind == "Histogram" else {}
    with beam.Pipeline() as p:
        _ = (p | beam.Create([beam.Row(customer=big, age=30, region="north"),
                              beam.Row(customer=big + 1, age=40, region="south")])
             | getattr(yaml_stats, kind)(schema=str(schema), epsilon=0.5, seed=3,
                                         manifest=str(manifest), **extra))
    m = json.loads(manifest.read_text(encoding="utf-8"))
    assert m["release"]["privacy_unit"].get("ids") == mode, m["release"]["privacy_unit"]
    assert m["operational"]["rows_dropped_by_bound"] == (1 if mode == "rounded" else 0)
