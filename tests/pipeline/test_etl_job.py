"""examples/etl_job.py end to end: JSON events → four DP releases under one ε, Parquet + manifest.

The input is a 240-row sample of the bundled Adult data as JSON lines with an undeclared extra
field on every event, two lines that are not JSON, one line that is not UTF-8, one JSON object
with no declared field and one out-of-domain value: 5 dead letters, 240 + 4 records read.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
from pathlib import Path

import apache_beam as beam
import pyarrow.parquet as pq
import pytest

import beamsynth as bs

ROOT = Path(__file__).resolve().parents[2]
ADULT = ROOT / "examples" / "data" / "adult" / "adult.csv"
EPSILON = 1.0
PAIRS = [("sex", "race"), ("workclass", "income")]


def _load_script():
    spec = importlib.util.spec_from_file_location("etl_job", ROOT / "examples" / "etl_job.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


etl_job = _load_script()


@pytest.fixture(scope="module")
def events(tmp_path_factory) -> Path:
    with ADULT.open(encoding="utf-8") as fh:
        rows = [r for _, r in zip(range(240), csv.DictReader(fh))]
    path = tmp_path_factory.mktemp("etl") / "events.jsonl"
    with path.open("w", encoding="utf-8") as out:
        for i, row in enumerate(rows):
            row = dict(row, ingest_id=f"evt-{i}")          # a field the schema does not declare
            if i == 7:
                row["sex"] = "Unknown"                     # out of the declared domain
            out.write(json.dumps(row) + "\n")
            if i == 10:
                out.write('{"age": 39, "sex": \n')         # truncated JSON
            if i == 20:
                out.write("not json at all\n")
            if i == 30:
                out.write('{"ingest_id": "evt-x"}\n')     # no declared value
    with path.open("ab") as out:
        out.write(b'\xff\xfe{"age": "40"}\n')                 # not UTF-8
    return path


def _args(events: Path, out: Path, *extra: str) -> list[str]:
    return [str(events), "--schema", "adult", "--epsilon", str(EPSILON), "--output", str(out),
            "--rows", "100", "--seed", "5", "--marginals", *(",".join(p) for p in PAIRS), *extra]


def _check_outputs(out: Path) -> dict:
    schema = bs.load_schema("adult")
    synthetic = pq.read_table(out / "synthetic.parquet")
    assert synthetic.num_rows == 100
    assert synthetic.schema.names == [f.name for f in bs.arrow_schema(schema)]
    hist = pq.read_table(out / "histogram_native-country.parquet")
    assert hist.schema.names[-1] == "noisy_count" and hist.num_rows > 0
    for a, b in PAIRS:
        table = pq.read_table(out / f"marginal_{a}__{b}.parquet")
        assert table.schema.names == [a, b, "noisy_count"]
        assert table.num_rows == schema.column(a).cells * schema.column(b).cells  # every cell
    count = pq.read_table(out / "count.parquet")
    assert count.num_rows == 1 and count.schema.names == ["noisy_count"]

    dead = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    reasons = sorted(d["reason"].split(":")[0] for d in dead)
    assert len(dead) == 5, reasons
    assert reasons == ["column 'sex'", "invalid JSON", "invalid JSON", "no declared values",
                       "not UTF-8"]

    manifest = json.loads((out / "manifest.json").read_text())
    budget = manifest["release"]["budget"]
    spent = sum(s["epsilon"] for s in budget["spends"])
    assert spent <= EPSILON + 1e-9 and budget["spent"]["epsilon"] <= EPSILON + 1e-9
    steps = {s["step"].split("/")[0] for s in budget["spends"]}
    assert steps == {"Synthesize", "Histogram", "Marginals", "Count"}
    ops = manifest["operational"]["sources"]["events"]
    assert ops == {"read": 244, "rejected": 5, "dropped_by_bound": 0, "used": 239}
    assert manifest["release"]["randomness"] == "seeded: not for release"
    return manifest


def test_etl_job_direct_runner(events, tmp_path, capsys):
    out = tmp_path / "out"
    assert etl_job.main(_args(events, out)) == 0
    printed = capsys.readouterr().out
    assert "synthetic 0.6 (ε=0.6)" in printed and "fractions sum 1" in printed
    # the exact counts a user checks (nothing dropped silently), from the manifest
    assert ("events read 244 = used 239 + rejected 5 (rejected.jsonl) + dropped by the "
            "contribution bound 0") in printed
    _check_outputs(out)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        etl_job.output_files(etl_job.plan(etl_job.build_parser().parse_args(_args(events, out)))))


def test_help_names_beam_options_and_a_used_folder_is_refused(events, tmp_path, capsys):
    with pytest.raises(SystemExit):
        etl_job.main(["--help"])
    assert "--runner direct-multi" in capsys.readouterr().out
    out = tmp_path / "out"
    out.mkdir()
    (out / "marginal_age__sex.parquet").write_bytes(b"an earlier run's release")
    with pytest.raises(SystemExit) as exc:
        etl_job.main(_args(events, out))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "holds files this run does not write: marginal_age__sex.parquet" in err
    assert sorted(p.name for p in out.iterdir()) == ["marginal_age__sex.parquet"]


def test_overspending_split_fails_before_reading(events, tmp_path, monkeypatch):
    def never_run(self, *a, **k):
        raise AssertionError("the pipeline must not run")

    monkeypatch.setattr(beam.Pipeline, "run", never_run)
    out = tmp_path / "out"
    fractions = "synthetic=0.7,histogram=0.2,marginals=0.2,count=0.05"   # 1.15 · ε
    with pytest.raises(bs.BudgetExceededError, match="Marginals"):
        etl_job.main(_args(events, out, "--fractions", fractions))
    assert not out.exists()


def test_mistyped_flag_is_refused(events, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        etl_job.main(_args(events, tmp_path / "out", "--rowz", "10"))
    assert exc.value.code == 2
    assert "--rowz" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_schema_driven_choices():
    schema = bs.load_schema("adult")
    assert etl_job.histogram_column(schema) == max(
        (c for c in schema.columns if c.type == "categorical"), key=lambda c: c.cells).name
    pairs = etl_job.default_pairs(schema)
    assert pairs and all(schema.column(a).cells * schema.column(b).cells <= etl_job.MAX_PAIR_CELLS
                         for a, b in pairs)
    with pytest.raises(argparse.ArgumentTypeError, match="'bogus=1'"):
        etl_job.parse_fractions("bogus=1")


@pytest.mark.parametrize("extra, message", [
    (["--fractions", "synthetic=0.6"], "--fractions 'synthetic=0.6' misses ['count', 'histogram', "
                                       "'marginals']"),          # argparse used to hide this
    (["--epsilon", "0"], "epsilon (0.0) must be a finite number > 0"),   # was a traceback
    (["--histogram-column", "nope"], "--histogram-column 'nope' is not declared; columns: ['age'"),
    (["--degree", "9"], "options={'degree': 9} must be a whole number in [0, 8]"),  # API words
])
def test_bad_option_values_exit_2_with_the_message(events, tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as exc:
        etl_job.main(_args(events, tmp_path / "out", *extra))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_etl_job_two_process_runner(events, tmp_path):
    out = tmp_path / "out"
    assert etl_job.main(_args(events, out, "--runner", "direct-multi")) == 0
    _check_outputs(out)


EXPECTED_FILES = {"synthetic.parquet", "histogram_native-country.parquet", "count.parquet",
                  "rejected.jsonl", "manifest.json",
                  *(f"marginal_{a}__{b}.parquet" for a, b in PAIRS)}


@pytest.mark.slow
def test_same_files_when_every_event_is_bad(tmp_path):
    """Data-independent shape: no usable event still writes every release file (and the count)."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('not json\n{"ingest_id": 1}\n', encoding="utf-8")
    out = tmp_path / "out"
    assert etl_job.main(_args(bad, out, "--line-numbers")) == 0
    assert {f.name for f in out.iterdir()} == EXPECTED_FILES
    dead = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert sorted((d["position"], d["reason"]) for d in dead) == [
        (1, "invalid JSON: Expecting value: line 1 column 1 (char 0)"), (2, "no declared values")]
    assert pq.read_table(out / "synthetic.parquet").num_rows == 100
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["operational"]["sources"]["events"] == {
        "read": 2, "rejected": 2, "dropped_by_bound": 0, "used": 0}


@pytest.mark.slow
def test_privacy_id_bounds_contributions(events, tmp_path):
    """--privacy-id user --max-contributions 2 on 100 users × ~2.4 events: at most 200 used."""
    with_ids = tmp_path / "ids.jsonl"
    lines = events.read_bytes().splitlines()
    with with_ids.open("wb") as out:
        for i, line in enumerate(lines):
            try:
                event = json.loads(line)
            except ValueError:
                out.write(line + b"\n")
                continue
            out.write(json.dumps(dict(event, user=f"u{i % 100}")).encode() + b"\n")
    out = tmp_path / "out"
    assert etl_job.main(_args(with_ids, out, "--privacy-id", "user",
                              "--max-contributions", "2", "--line-numbers")) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    dead = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    positions = {d["reason"].split(":")[0]: d["position"] for d in dead}
    assert positions == {"column 'sex'": 8, "invalid JSON": positions["invalid JSON"],
                         "no declared values": 34, "not UTF-8": 244}
    assert sorted(d["position"] for d in dead if d["reason"].startswith("invalid JSON")) == [12, 23]
    ops = manifest["operational"]["sources"]["events"]
    assert ops["read"] == 244 and ops["rejected"] == 5
    assert ops["used"] == 200 and ops["dropped_by_bound"] == 39
    assert manifest["release"]["privacy_unit"]["max_contributions"] == 2
