"""Session 11 audit (H30): what beamsynth *publishes*, on neighbour pairs through the real entry points.

Each test runs D and a neighbour D' (one record added, one malformed line, one out-of-domain
value, ...) through a CLI command, ``beamsynth release`` or the API with the same seed, and diffs
everything a user would publish: output files, the manifest's public part, ``release.json`` and
``public/``. Every difference must be DP output (same seed and same used records: identical) or
sit in the private part.

1. ``beamsynth release`` with its default private quality report: the report read the real rows
   with pandas, so D + one CSV line with an extra field (or one invalid JSON line) stopped the
   whole release (``Error tokenizing data. C error: Expected 16 fields in line 102, saw 17``, exit
   2, nothing published) while D published — whether a release happens depended on one record
   (rules 7, 8). The report now reads the records the pipeline uses (its own readers and
   encoder), and any failure of the private report is written into it instead of stopping the
   release.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from beamsynth.pipelines.cli.main import main

pytestmark = pytest.mark.audit

ROOT = Path(__file__).resolve().parents[2]
ADULT = ROOT / "examples" / "data" / "adult" / "adult.csv"
needs_adult = pytest.mark.skipif(not ADULT.exists(), reason="examples/data/adult/adult.csv absent")


def _adult_lines(n: int) -> tuple[str, list[str]]:
    lines = ADULT.read_text(encoding="utf-8").splitlines()
    return lines[0], lines[1:n + 1]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


_RUN_IDS = re.compile(rb'[0-9a-f]{32}|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00')


# -- 1. beamsynth release: the private quality report must not decide whether a release happens ----
_RELEASE = """
name: small
folder: {root}/rel/small
budget: {{epsilon: 2.0}}
ledger: {{path: {root}/ledger.sqlite, policies: {{adult: {{epsilon: 10}}}}}}
seed: 3
demo: true
tables:
  - name: adult
    input: {data}
    schema: adult
    epsilon: 1.5
    columns: [age, education, sex, income]
    formats: [csv]
reports: {{target: income}}
"""


def _release(root: Path, text: str, suffix: str) -> tuple[int, Path]:
    root.mkdir()
    data = root / f"in.{suffix}"
    data.write_text(text, encoding="utf-8")
    (root / "rel.yaml").write_text(_RELEASE.format(root=root, data=data), encoding="utf-8")
    rc = main(["release", str(root / "rel.yaml"), "--runner=DirectRunner"])
    return rc, root / "rel" / "small"


def _jsonl(header: str, lines: list[str]) -> str:
    names = header.split(",")
    return "".join(json.dumps(dict(zip(names, line.split(",")))) + "\n" for line in lines)


@needs_adult
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_release_publishes_the_same_with_one_malformed_line_more(tmp_path: Path, fmt: str) -> None:
    """Neighbours D (100 Adult rows) and D + one malformed line (CSV: a 17th field; JSONL: not
    JSON). The line is a dead letter, so the used records and, with the same seed, every public
    file must be identical (up to the release id and time); before the fix D + line failed
    (exit 2, nothing published) in the private report's pandas read."""
    header, rows = _adult_lines(100)
    if fmt == "csv":
        base = header + "\n" + "".join(r + "\n" for r in rows)
        extra = rows[0] + ",EXTRA\n"
    else:
        base = _jsonl(header, rows)
        extra = '{"age": 39, "sex": "Male"\n'
    rc_d, rel_d = _release(tmp_path / "d", base, fmt)
    rc_d1, rel_d1 = _release(tmp_path / "d1", base + extra, fmt)
    assert (rc_d, rc_d1) == (0, 0), "whether the release happens depends on one malformed line"
    pub_d = {k: _RUN_IDS.sub(b"X", v) for k, v in _files(rel_d).items() if not k.startswith("private/")}
    pub_d1 = {k: _RUN_IDS.sub(b"X", v) for k, v in _files(rel_d1).items() if not k.startswith("private/")}
    assert pub_d.keys() == pub_d1.keys() and "public/report.html" in pub_d
    assert [k for k in pub_d if pub_d[k] != pub_d1[k]] == []
    # a release refuses an empty input (check_table_inputs) and says so (section 3)
    unit = json.loads((rel_d / "release.json").read_text(encoding="utf-8"))["tables"]["adult"]["privacy_unit"]
    assert "inputs that both hold a record" in unit["empty_input"]
    private = (rel_d1 / "private" / "report.html").read_text(encoding="utf-8")
    assert "Real rows compared: 100 (1 outside the declared domains dropped)" in private


# -- 2. the API: an element that is no record must not stop the pipeline from being built -----------
def _api_run(elements: list, folder: Path) -> dict:
    import apache_beam as beam

    import beamsynth as bs

    folder.mkdir()
    with beam.Pipeline() as p:
        job = bs.PrivacyJob(epsilon=1.0, seed=11)
        private = p | beam.Create(elements) | job.private(bs.load_schema("adult"))
        _ = (private | bs.Count(epsilon=1.0, typed=True) | beam.Map(lambda c: int(c.value))
             | beam.Map(lambda v: (folder / "count.json").write_text(json.dumps(v))))
        _ = p | bs.WriteManifest(job=job, path=str(folder / "m.json"))
    man = json.loads((folder / "m.json").read_text())
    man.pop("created")
    man["release"]["outputs"].pop("manifest")
    return {"count": json.loads((folder / "count.json").read_text()), "manifest": man}


@needs_adult
@pytest.mark.parametrize("bad", [None, "a line that is no record", 5, ("a",), {1: 2}],
                         ids=["none", "str", "int", "tuple", "int_keys"])
def test_api_builds_and_releases_the_same_with_one_element_that_is_no_record(tmp_path: Path, bad) -> None:
    """Neighbours through ``beam.Create(D) | job.private(schema)``: D = 30 Adult dicts, D' = D +
    one element that is no record. ``beam.Create`` types its PCollection from the values
    (``Union[NoneType, Dict[str, str]]``, ``Dict[Union[int, str], ...]``), and ``job.private``
    refused that type when the pipeline was built (``TypeCheckError: Input type hint violation at
    MakePrivate(adult)``) while D built and released: one element decided whether the job ran.
    Now the element is a dead letter and, with the same seed, the release and the manifest's
    public part are identical."""
    import csv

    with ADULT.open(encoding="utf-8") as fh:
        rows = [dict(r) for _, r in zip(range(30), csv.DictReader(fh))]
    d = _api_run(rows, tmp_path / "d")
    d1 = _api_run(rows + [bad], tmp_path / "d1")
    assert d1["count"] == d["count"]
    assert d1["manifest"]["release"] == d["manifest"]["release"]
    assert (d["manifest"]["operational"]["rows_rejected"], d1["manifest"]["operational"]["rows_rejected"]) == (0, 1)


@pytest.mark.parametrize("kind", ["row_none", "row_str", "table_none", "batch_str"])
def test_api_builds_with_rows_or_arrow_beside_one_element_that_is_no_record(tmp_path: Path, kind: str) -> None:
    """The same for beam.Rows and Arrow inputs: ``Create([None, Row(...)])`` is typed
    ``Union[NoneType, Row(...)]``, ``Create([Table, None])`` ``Union[NoneType, Table]``; both were
    refused when built (the first fix only accepted unions with a dict member). The extra element
    is first where Beam's Create needs it (it reads every element as a Row if the first is one)."""
    import apache_beam as beam
    import pyarrow as pa

    import beamsynth as bs

    schema = bs.load_schema({"name": "t", "columns": [
        {"name": "sex", "type": "categorical", "domain": {"kind": "categorical", "values": ["F", "M"]}}]})
    records = {"row_none": [None, beam.Row(sex="F"), beam.Row(sex="M")],
               "row_str": ["x", beam.Row(sex="F"), beam.Row(sex="M")],
               "table_none": [pa.table({"sex": ["F", "M"]}), None],
               "batch_str": [pa.record_batch({"sex": ["F", "M"]}), "x"]}[kind]
    with beam.Pipeline() as p:
        job = bs.PrivacyJob(epsilon=1.0, seed=1)
        private = p | beam.Create(records) | job.private(schema)
        _ = private | bs.Count(epsilon=1.0)
        _ = p | bs.WriteManifest(job=job, path=str(tmp_path / "m.json"))
    op = json.loads((tmp_path / "m.json").read_text(encoding="utf-8"))["operational"]
    assert (op["rows_read"], op["rows_rejected"]) == (3, 1)


def test_api_still_refuses_a_collection_that_holds_no_record_when_built(caplog) -> None:
    """A PCollection whose type admits no record (``str`` lines of ``ReadFromText`` passed without
    ``json.loads``) was refused when built; since H55 it is warned about instead, since
    ``Create(["a", "b"])`` is ``str`` while ``Create(["a", "b", {...}])`` builds (rule 7;
    tests/audit/test_session14_redteam_api.py)."""
    import apache_beam as beam

    import beamsynth as bs

    p = beam.Pipeline()
    with caplog.at_level("WARNING"):
        _ = p | beam.Create(["a", "b"]) | bs.PrivacyJob(epsilon=1.0).private(bs.load_schema("adult"))
    assert "MakePrivate" in caplog.text and "parse each element first" in caplog.text


@needs_adult
def test_report_cli_reads_the_real_rows_by_the_pipeline_rules(tmp_path: Path) -> None:
    """``beamsynth report`` (private) on a real file with one malformed line: the line is counted
    as dropped, as the pipeline dead-letters it, instead of pandas failing the command."""
    header, rows = _adult_lines(60)
    real = tmp_path / "real.csv"
    real.write_text(header + "\n" + "".join(r + "\n" for r in rows) + rows[0] + ",EXTRA\n", encoding="utf-8")
    synth = tmp_path / "synth.csv"
    synth.write_text(header + "\n" + "".join(r + "\n" for r in rows[:30]), encoding="utf-8")
    out = tmp_path / "r.html"
    assert main(["--quiet", "report", "--real", str(real), "--synthetic", str(synth), "--schema", "adult",
                 "--output", str(out)]) == 0
    assert "Real rows compared: 60 (1 outside the declared domains dropped)" in out.read_text(encoding="utf-8")


# -- 3. the stated guarantee when an empty input is refused ---------------------------------------------
_TOY_SCHEMA = """name: toy
columns:
  - {name: sex, type: categorical, domain: {kind: categorical, values: [F, M]}}
  - {name: band, type: integer, domain: {kind: integer, low: 0, high: 5}}
"""
_COMMANDS = {
    "synthesize": lambda d: ["synthesize", "--schema", str(d / "s.yaml"), "--epsilon", "1", "--rows", "5",
                             "--output", str(d / "out.csv")],
    "histogram": lambda d: ["histogram", "--column", "sex", "--domain", f"{d / 's.yaml'}:sex", "--epsilon", "1",
                            "--tolerance", "0.5", "--output", str(d / "out.csv")],
    "prefixes": lambda d: ["prefixes", "--kind", "text", "--column", "sex", "--alphabet", "fm", "--max-length",
                           "2", "--epsilon", "1", "--output", str(d / "out.csv")],
}


def _toy_run(folder: Path, command: str, records: list[str], *extra: str) -> tuple[int, dict | None]:
    folder.mkdir()
    (folder / "s.yaml").write_text(_TOY_SCHEMA, encoding="utf-8")
    (folder / "in.csv").write_text("sex,band\n" + "".join(f"{r}\n" for r in records), encoding="utf-8")
    rc = main(["--quiet", *_COMMANDS[command](folder), str(folder / "in.csv"), "--seed", "1",
               "--runner=DirectRunner", *extra])
    path = folder / "out.csv.manifest.json"
    return rc, json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


@pytest.mark.parametrize("command", sorted(_COMMANDS))
def test_manifest_states_that_an_empty_input_was_refused(tmp_path: Path, command: str) -> None:
    """Neighbours (no record, one record): by default the command refuses the first (exit 2) and
    releases the second, so the (ε, δ) guarantee holds only between inputs that both hold a record
    (docs/methods.md, 'Empty inputs'). The published manifest must say so; until the eleventh
    session it stated plain 'add/remove one privacy unit' (and the histogram's details 'still ε-DP'
    on an empty input) whether or not the empty neighbour had been refused. With --allow-empty both
    sides release and the full guarantee stands (no note)."""
    from beamsynth.pipelines.io.records import EMPTY_INPUT_REFUSED

    assert _toy_run(tmp_path / "empty", command, [])[0] == 2
    rc, man = _toy_run(tmp_path / "one", command, ["F,1"])
    assert rc == 0 and man["release"]["privacy_unit"]["empty_input"] == EMPTY_INPUT_REFUSED
    rc_e, man_e = _toy_run(tmp_path / "empty_allowed", command, [], "--allow-empty")
    rc_1, man_1 = _toy_run(tmp_path / "one_allowed", command, ["F,1"], "--allow-empty")
    assert (rc_e, rc_1) == (0, 0)
    assert "empty_input" not in man_e["release"]["privacy_unit"]
    assert man_e["release"]["privacy_unit"] == man_1["release"]["privacy_unit"]


@pytest.mark.parametrize("line", ["   ", "\t", " \x0b "])
def test_a_csv_line_of_white_space_is_a_record_for_the_empty_input_check_too(tmp_path: Path, line: str) -> None:
    """The reading rules make a CSV line of white space a record (a dead letter; only empty lines
    are blank), but the pre-flight called a file whose header is followed only by white space
    empty. So D = header + one line of spaces (one record, rejected) was refused (exit 2) while
    its neighbour D + 'F,1' released: the refusal depended on a record being invalid, against the
    stated guarantee ('between inputs that both hold a record'). Both must release."""
    rc, man = _toy_run(tmp_path / "d", "synthesize", [line])
    assert rc == 0 and (man["operational"]["rows_read"], man["operational"]["rows_rejected"]) == (1, 1)
    assert _toy_run(tmp_path / "d1", "synthesize", [line, "F,1"])[0] == 0
    assert _toy_run(tmp_path / "blank", "synthesize", ["", ""])[0] == 2  # blank lines are no records
