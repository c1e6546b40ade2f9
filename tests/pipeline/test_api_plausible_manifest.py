"""The API manifest of plausible deniability (``bs.PlausibleDeniability`` + ``bs.WriteManifest``):
run-time figures come from PCollections inside the pipeline (not Beam metrics). Public:
``released`` (the output's own size, per declared window too); private (operational part):
candidates, tested, pass rate and the per-reason rejections, since ``tested`` is 0 exactly when
the seed split is empty (the neighbour pair below)."""

from __future__ import annotations

import collections
import json
import random
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.testing import test_pipeline

import beamsynth as bs

SCHEMA = bs.load_schema({"name": "toy", "columns": [
    {"name": "sex", "type": "categorical", "domain": {"kind": "categorical", "values": ["F", "M"]}},
    {"name": "city", "type": "categorical",
     "domain": {"kind": "categorical", "values": ["Oslo", "Rome", "Lima", "Kiev", "Baku"]}},
    {"name": "band", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 5}},
]})
DAY = 86_400
T0 = 1_704_067_200  # 2024-01-01T00:00:00Z
WINDOWS = bs.DeclaredWindows(start=T0, end=T0 + 3 * DAY, size=DAY)
DAYS = ["2024-01-01T00:00:00Z", "2024-01-02T00:00:00Z", "2024-01-03T00:00:00Z"]
STEP = "Synthesize[plausible]"
OMEGA_1 = {"omega": 1}  # one resampled column: rare copied pairs fail the test (pass rate < 1)


def _records(n: int = 600) -> list[dict]:
    rnd = random.Random(11)  # skewed: common cells pass the test, rare ones are rejected
    return [{"sex": rnd.choice("FFFM"), "city": rnd.choice(["Oslo"] * 6 + ["Rome", "Lima", "Kiev", "Baku"]),
             "band": min(int(rnd.expovariate(0.8)), 5), "day": rnd.randrange(2)} for _ in range(n)]


def _run(folder: Path, records: list[dict], *, windowed: bool = False,
         args: list[str] | None = None, options: dict | None = None) -> tuple[dict, list[dict]]:
    """One seeded job: plausible rows written as JSON lines, the manifest; (manifest, rows)."""
    folder.mkdir()
    job = bs.PrivacyJob(epsilon=500.0, delta=1e-5, seed=3)
    with test_pipeline.TestPipeline(options=bs.pipeline_options(args or []), blocking=True) as p:
        src = p | beam.Create(records)
        if windowed:
            src = src | "Stamp" >> beam.Map(
                lambda r: beam.window.TimestampedValue(r, T0 + r["day"] * DAY + 60))
        private = src | job.private(SCHEMA, windows=WINDOWS if windowed else None)
        rows = private | bs.PlausibleDeniability(epsilon=400.0, delta=1e-6, rows=100,
                                                    options=options)
        _ = (rows | beam.Map(lambda r: json.dumps(r._asdict(), sort_keys=True))
             | beam.io.WriteToText(str(folder / "rows"), shard_name_template=""))
        _ = p | bs.WriteManifest(job=job, path=str(folder / "manifest.json"))
    lines = (folder / "rows").read_text().splitlines()
    return json.loads((folder / "manifest.json").read_text()), [json.loads(x) for x in lines]


def _details(manifest: dict) -> dict:
    (entry,) = [m for m in manifest["release"]["details"]["mechanisms"] if m["step"] == STEP]
    return entry["details"]


def test_api_manifest_states_released_rows_and_private_pass_rate(tmp_path):
    manifest, rows = _run(tmp_path / "run", _records(), options=OMEGA_1)
    public, private = _details(manifest), manifest["operational"]["mechanisms"][STEP]
    assert public["released"] == len(rows) > 0
    assert private["released"] == len(rows)
    assert 0 < private["released"] < private["tested"] == private["candidates"]
    assert private["pass_rate"] == private["released"] / private["tested"]
    reasons = private["rejection_reasons"]
    assert sum(reasons.values()) == private["tested"] - private["released"]
    # nothing data-revealing beyond the output's size in the public part
    assert not {"candidates", "tested", "pass_rate", "rejection_reasons"} & set(public)
    assert "private operational part" in public["counts_note"]


def test_public_manifest_hides_an_empty_seed_split(tmp_path):
    """Neighbours D (2 records: the seed split is empty, 0 candidates) and D + 1 record (that
    record is a seed: ~Poisson(100) candidates, none released): the public parts are equal."""
    base = [{"sex": "F", "city": "Oslo", "band": 0, "day": 0}, {"sex": "M", "city": "Rome", "band": 1, "day": 0}]
    small, _ = _run(tmp_path / "d", base)
    large, _ = _run(tmp_path / "d1", base + [{"sex": "F", "city": "Lima", "band": 2, "day": 0}])
    tested = [m["operational"]["mechanisms"][STEP]["tested"] for m in (small, large)]
    assert tested[0] == 0 < tested[1]  # the pair does differ in the (private) number tested
    for m in (small, large):
        m.pop("created")
        m["release"].pop("outputs")
    assert small["release"] == large["release"]
    assert _details(small)["released"] == 0


def test_windowed_manifest_lists_released_rows_of_every_declared_window(tmp_path):
    manifest, rows = _run(tmp_path / "w", _records(), windowed=True)
    public, private = _details(manifest), manifest["operational"]["mechanisms"][STEP]
    written = collections.Counter(r["window_start"] for r in rows)
    assert public["released_per_window"] == [{"window_start": d, "released": written.get(d, 0)}
                                             for d in DAYS]
    assert written[DAYS[0]] > 0 and written[DAYS[1]] > 0 and DAYS[2] not in written
    assert public["released"] == len(rows)
    per = {w["window_start"]: w for w in private["per_window"]}
    assert per[DAYS[2]]["tested"] == 0 and per[DAYS[0]]["tested"] > 0
    assert sum(w["tested"] for w in per.values()) == private["tested"]


@pytest.mark.slow
@pytest.mark.parametrize("runner", ["direct-multi", "dask"])
def test_other_runners_write_the_same_manifest_figures(tmp_path, runner, request):
    args = ["--runner", runner]
    if runner == "dask":
        args.append(f"--dask_client_address={request.getfixturevalue('dask_address')}")
    direct, direct_rows = _run(tmp_path / "direct", _records(), options=OMEGA_1)
    other, other_rows = _run(tmp_path / runner, _records(), args=args, options=OMEGA_1)
    assert sorted(map(str, other_rows)) == sorted(map(str, direct_rows))
    assert _details(other) == _details(direct)
    assert other["operational"]["mechanisms"] == direct["operational"]["mechanisms"]
