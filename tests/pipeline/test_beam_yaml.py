"""The shipped Beam YAML provider and example pipeline: CSV → BeamsynthSynthesize → Avro."""

from __future__ import annotations

import glob
import json
from importlib import resources
from pathlib import Path

import pytest

yaml_main = pytest.importorskip(
    "apache_beam.yaml.main", reason="Beam YAML needs apache-beam[yaml] (docstring_parser, jinja2, ...)")

import fastavro  # noqa: E402

from beamsynth.pipelines.yaml_transforms import Synthesize  # noqa: E402
from beamsynth.schemas.schema import avro_field_name, load_schema  # noqa: E402
from tests.yaml_helpers import build, provider, run_yaml  # noqa: E402

ADULT = Path(__file__).resolve().parents[2] / "examples" / "data" / "adult" / "adult.csv"


def _pipeline_file() -> str:
    return str(resources.files("beamsynth.pipelines") / "synthesize_adult.yaml")


def test_provider_and_example_ship_with_the_package() -> None:
    import yaml

    files = resources.files("beamsynth.pipelines")
    spec = yaml.safe_load((files / "beamsynth_provider.yaml").read_text(encoding="utf-8"))
    assert spec[0]["type"] == "python"
    assert spec[0]["transforms"]["BeamsynthSynthesize"] == "beamsynth.pipelines.yaml_transforms.Synthesize"
    assert (files / "synthesize_adult.yaml").is_file()


def test_budget_is_checked_when_the_step_is_built() -> None:
    with pytest.raises(ValueError, match=r"epsilon \(-1"):
        Synthesize(schema="adult", epsilon=-1)
    with pytest.raises(ValueError, match="batch_rows"):
        Synthesize(schema="adult", epsilon=1.0, batch_rows=0)
    step = Synthesize(schema="adult", epsilon=1.0, rows=10)
    assert step.accountant.spent_epsilon == pytest.approx(1.0)


@pytest.mark.skipif(not ADULT.exists(), reason="examples/data/adult/adult.csv is not in this checkout")
def test_example_yaml_pipeline_reads_csv_synthesizes_and_writes_avro(tmp_path: Path) -> None:
    lines = ADULT.read_text(encoding="utf-8").splitlines(keepends=True)[:401]
    bad = lines[1].split(",")
    bad[0] = "not-an-age"
    data = tmp_path / "in.csv"
    data.write_text("".join(lines + [",".join(bad)]), encoding="utf-8")
    out = tmp_path / "synthetic"
    variables = {"input": str(data), "output": str(out), "epsilon": 1.0}
    run_yaml(Path(_pipeline_file()), None, f"--jinja_variables={json.dumps(variables)}")
    synth = glob.glob(f"{out}-*")
    assert len(synth) == 1
    with open(synth[0], "rb") as fh:
        records = list(fastavro.reader(fh))
    schema = load_schema("adult")
    assert 300 < len(records) < 500  # DP count of 400 good rows, discrete Laplace scale 20
    assert set(records[0]) == {avro_field_name(n) for n in schema.names}
    ages = [r["age"] for r in records]
    assert all(isinstance(a, int) and 17 <= a <= 99 for a in ages)  # declared [17, 99]
    rejected = [json.loads(line) for f in glob.glob(f"{out}.rejected*")
                for line in Path(f).read_text(encoding="utf-8").splitlines()]
    assert len(rejected) == 1 and "not-an-age" in rejected[0]["raw"]
    manifest = json.loads(Path(f"{out}.manifest.json").read_text(encoding="utf-8"))
    assert manifest["operational"]["rows_rejected"] == 1 and manifest["operational"]["rows_used"] == 400
    assert manifest["release"]["budget"]["total"]["epsilon"] == 1.0
    assert manifest["release"]["rows_out"] == len(records)


@pytest.mark.skipif(not ADULT.exists(), reason="examples/data/adult/adult.csv is not in this checkout")
def test_synthesize_step_in_a_test_pipeline() -> None:
    import csv

    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    with open(ADULT, encoding="utf-8", newline="") as fh:
        records = [dict(r) for _, r in zip(range(120), csv.DictReader(fh))]
    rows = [beam.Row(**{avro_field_name(k): v for k, v in r.items()}) for r in records]
    bad = dict(records[0], sex="Robot")
    rows.append(beam.Row(**{avro_field_name(k): v for k, v in bad.items()}))
    with TestPipeline() as p:
        out = (p | "Rows" >> beam.Create(rows)
               | "Synth" >> Synthesize(schema="adult", epsilon=1.0, rows=50, seed=5,
                                       error_handling={"output": "bad"}))
        assert_that(out["output"] | "Count" >> beam.combiners.Count.Globally(), equal_to([50]),
                    label="fifty rows")
        assert_that(out["output"] | "Sex" >> beam.Map(lambda r: r.sex in ("Male", "Female"))
                    | "Distinct" >> beam.Distinct(), equal_to([True]), label="declared values")
        assert_that(out["bad"] | "Reason" >> beam.Map(lambda r: "Robot" in r.reason),
                    equal_to([True]), label="one dead letter")


# -- tiny schema: fast tests of the step's privacy rules ----------------------------------------
TINY = """
name: tiny
extra_columns: {extra}
columns:
  - name: color
    type: categorical
    nullable: true
    domain: {{kind: categorical, values: [red, green, blue]}}
  - name: age
    type: integer
    domain: {{kind: integer, low: 0, high: 99, edges: [0, 50, 100]}}
"""


def _tiny(tmp_path: Path, extra: str = "ignore") -> str:
    path = tmp_path / f"tiny-{extra}.yaml"
    path.write_text(TINY.format(extra=extra), encoding="utf-8")
    return str(path)


def test_each_row_is_judged_against_the_schema_alone(tmp_path: Path) -> None:
    """No row decides how another parses (the first row's keys used to be the column set): a
    missing nullable field is null, a missing required field or an undeclared field (under
    extra_columns: reject) rejects that row only; used(D + r) − used(D) ∈ {∅, {r}}."""
    from beamsynth.pipelines.yaml_transforms import encode_rows

    schema = load_schema(_tiny(tmp_path, "reject"))
    rows = [{"age": "30"}, {"color": "red", "age": "40"}, {"color": "red"},
            {"color": "blue", "age": "10", "zzz": "1"}, {"color": "green", "age": None}]
    batch, bad = encode_rows(schema, rows)
    assert batch.codes.tolist() == [[3, 0], [0, 0]]  # color null → cell 3; age 30/40 → bin 0
    assert [(r.row, r.reason) for r in bad] == [
        (3, "required field 'age' is missing"),
        (4, "undeclared field(s) ['zzz'] and the schema says extra_columns: reject"),
        (5, "column 'age': null in a non-nullable column")]
    lines = [dict(r, line=100 + i) for i, r in enumerate(rows)]  # source positions in a field
    batch, bad = encode_rows(schema, lines, position_field="line")
    assert batch.codes.tolist() == [[3, 0], [0, 0]]  # the position field is not undeclared
    assert [r.row for r in bad] == [102, 103, 104]
    base = [{"color": "red", "age": "40"}, {"age": "70"}, {"color": "blue", "age": "5"}]
    extra_r = [{"age": "1"}, {"color": "red"}, {"color": "red", "age": "2", "x": "y"}, {},
               {"age": "3", "color": "purple"}, "not a row", {"age": "1", "age_": "2"}]
    for extra in ("ignore", "reject"):
        schema = load_schema(_tiny(tmp_path, extra))
        before, _ = encode_rows(schema, base)
        for r in extra_r:
            for pos in (0, len(base)):  # the extra row first (it used to fix the columns) or last
                rows = base[:pos] + [r] + base[pos:]
                after, _ = encode_rows(schema, rows)
                kept = [c for i, c in enumerate(after.codes.tolist())]
                assert len(after) - len(before) in (0, 1), (extra, r)
                others = kept[1:] if (len(after) > len(before) and pos == 0) else kept[:len(before)]
                assert others == before.codes.tolist(), (extra, r, pos)


_KEYS = ("color", "age", "x", "age_")
_VALUES = ("red", "blue", "purple", "3", "150", "", None, 7, 2.5, float("nan"), "a\x00b", "ü")


@pytest.mark.parametrize("extra", ["ignore", "reject"])
def test_adding_one_row_changes_the_used_rows_by_at_most_that_row(tmp_path: Path, extra: str) -> None:
    """Property (derandomized hypothesis, 300 cases per mode): for rows D with any key sets and
    values and one more row r at any position, used(D + r) is used(D), or used(D) with r's own
    encoding inserted."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from beamsynth.pipelines.yaml_transforms import encode_rows

    schema = load_schema(_tiny(tmp_path, extra))
    row = st.dictionaries(st.sampled_from(_KEYS), st.sampled_from(_VALUES), max_size=4)

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(rows=st.lists(row, max_size=8), extra_row=row, where=st.integers(0, 8))
    def check(rows, extra_row, where):
        pos = min(where, len(rows))
        before = encode_rows(schema, rows)[0].codes.tolist()
        after = encode_rows(schema, rows[:pos] + [extra_row] + rows[pos:])[0].codes.tolist()
        alone = encode_rows(schema, [extra_row])[0].codes.tolist()
        if len(after) == len(before):
            assert after == before and alone == []
        else:
            i = len(encode_rows(schema, rows[:pos])[0])
            assert after[:i] + after[i + 1:] == before and [after[i]] == alone

    check()


def _metric(result, name: str) -> int:
    from apache_beam.metrics.metric import MetricsFilter

    found = result.metrics().query(MetricsFilter().with_namespace("beamsynth").with_name(name))
    return sum(c.committed for c in found["counters"])


def test_bad_row_without_error_handling_is_counted_not_fatal_and_seed_is_marked(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Without error_handling an out-of-domain row used to fail the whole run with its value in
    the exception text. Now the run succeeds, the row is dropped and counted (metric, manifest's
    operational part), and no log or manifest text carries the value. A seeded step is marked:
    a warning when built, the manifest's randomness, a counter of its rows."""
    import apache_beam as beam

    from beamsynth.pipelines.io.manifest import SEEDED_NOTE

    secret = "purple-SECRET-4711"
    rows = [beam.Row(color="red", age=str(20 + i)) for i in range(12)]
    rows.append(beam.Row(color=secret, age="33"))
    manifest = tmp_path / "step.manifest.json"
    with caplog.at_level("INFO"):
        p = beam.Pipeline()
        _ = (p | beam.Create(rows)
             | Synthesize(schema=_tiny(tmp_path), epsilon=1.0, rows=7, seed=3, manifest=str(manifest)))
        result = p.run()
        result.wait_until_finish()
    assert _metric(result, "rows_rejected_schema") == 1
    assert _metric(result, "rows_encoded") == 12
    assert _metric(result, "seeded_rows_not_for_release") == 7
    assert not any(secret in rec.getMessage() for rec in caplog.records)
    assert any(SEEDED_NOTE in rec.getMessage() for rec in caplog.records)
    text = manifest.read_text(encoding="utf-8")
    assert secret not in text
    m = json.loads(text)
    assert m["release"]["randomness"] == SEEDED_NOTE and m["release"]["seed"] == 3
    assert m["release"]["rows_out"] == 7
    assert {k: m["operational"][k] for k in ("rows_read", "rows_used", "rows_rejected")} == {
        "rows_read": 13, "rows_used": 12, "rows_rejected": 1}
    assert m["release"]["budget"]["spent"]["epsilon"] == pytest.approx(1.0)


def test_windowed_input_is_refused_when_the_pipeline_is_built(tmp_path: Path) -> None:
    import apache_beam as beam
    from apache_beam.transforms import window

    p = beam.Pipeline()
    rows = (p | beam.Create([beam.Row(color="red", age="3")])
            | beam.WindowInto(window.FixedWindows(60)))
    with pytest.raises(ValueError) as err:
        _ = rows | Synthesize(schema=_tiny(tmp_path), epsilon=1.0, rows=5)
    assert str(err.value).startswith(
        "BeamsynthSynthesize 'Synthesize': input is windowed with FixedWindows(size=60s)")
    assert "give the step windows: {start: S, end: E, size: SECONDS}" in str(err.value)
    with pytest.raises(ValueError, match=r"method 'sbhg' cannot release an empty window"):
        Synthesize(schema=_tiny(tmp_path), epsilon=1.0, delta=1e-6, rows=5, method="sbhg",
                   windows={"start": 0, "end": 180, "size": 60})
    with pytest.raises(ValueError, match=r"windows \({'start': 0}\) must be"):
        Synthesize(schema=_tiny(tmp_path), epsilon=1.0, rows=5, windows={"start": 0})


def _two_steps(tmp_path: Path, eps: tuple[float, float], job: str) -> str:
    steps = "".join(f"""
    - type: BeamsynthSynthesize
      name: Synth{i}
      input: Rows
      config: {{schema: "{_tiny(tmp_path)}", epsilon: {e}, rows: 5{job}}}""" for i, e in enumerate(eps))
    return f"""
providers:
  - include: "{provider()}"
pipeline:
  transforms:
    - type: Create
      name: Rows
      config:
        elements: [{{color: red, age: "3"}}]{steps}
"""


def test_steps_of_one_yaml_pipeline_share_the_job_budget(tmp_path: Path) -> None:
    """Each step used to have its own accountant, so two steps of 0.6 ran under a 1.0 claim.
    Now they spend from one job ledger: overspending fails when the pipeline is built."""
    from beamsynth.pipelines.yaml_transforms import job_accountant
    from beamsynth.transforms.budget import BudgetExceededError

    job = ", job_budget: {epsilon: 1.0}"
    with pytest.raises(ValueError) as err:
        build(_two_steps(tmp_path, (0.6, 0.6), job))
    assert isinstance(err.value.__cause__, BudgetExceededError)
    assert str(err.value).endswith(
        "step 'Synth1' asks for ε=0.6 but only (ε=0.4, δ=0) of the total "
        "ε=1 remains (already spent: Synth0/independent.marginals ε=0.6); spent by step: "
        "Synth0 ε=0.6 of job_budget ε=1 (lower a step's epsilon, or raise job_budget on every "
        "step)")
    with pytest.raises(ValueError, match=r"steps \['Synth0', 'Synth1'\] run in one pipeline"):
        build(_two_steps(tmp_path, (0.5, 0.5), ""))
    p = build(_two_steps(tmp_path, (0.4, 0.6), job))
    acct = job_accountant(p)
    assert acct.spent_epsilon == pytest.approx(1.0)
    assert {s.step.split("/")[0] for s in acct.spends} == {"Synth0", "Synth1"}


def test_steps_of_one_job_share_one_privacy_unit(tmp_path: Path) -> None:
    import apache_beam as beam

    p = beam.Pipeline()
    rows = p | beam.Create([beam.Row(color="red", age="3", pid="a")])
    job = {"epsilon": 1.0}
    _ = rows | "Records" >> Synthesize(schema=_tiny(tmp_path), epsilon=0.3, rows=5, job_budget=job)
    with pytest.raises(ValueError) as err:
        _ = rows | "People" >> Synthesize(schema=_tiny(tmp_path), epsilon=0.3, rows=5, job_budget=job,
                                          privacy_id="pid", max_contributions=2)
    assert str(err.value) == (
        "BeamsynthSynthesize 'People': privacy unit (privacy_id='pid', max_contributions=2) "
        "differs from the other steps' (privacy_id=None, max_contributions=1); budgets of one "
        "job add up only for one privacy unit")


def test_windowed_step_counts_every_row_read_outside_and_bound_included(tmp_path: Path) -> None:
    """A newcomer's windowed YAML run (2026-11-27, query log, 3-hour windows, privacy id with
    max_contributions 2) lost rows twice: a row stamped outside the declared windows reached no
    error output and no manifest (only a counter), and the manifests' operational counts did not
    add up (read 2,502 = used 2,133 + rejected 322, the 47 rows dropped by the contribution bound
    unreported). Now outside rows (and rows never stamped) go to the error output with their reason
    and position, counted in beamsynth/rows_outside_windows (they belong to no window's manifest),
    and each window's manifest has rows_dropped_by_bound: read = used + rejected + dropped."""
    import apache_beam as beam
    from apache_beam.transforms.window import TimestampedValue

    day = 86_400
    rows = [TimestampedValue(beam.Row(color="red", age=str(20 + i % 50), pid=f"p{i % 3}", line=i),
                             (i % 2) * day + 10 + i) for i in range(20)]
    rows.append(TimestampedValue(beam.Row(color="red", age="30", pid="p9", line=99), 5 * day))
    rows.append(TimestampedValue(beam.Row(color="Robot", age="30", pid="p8", line=98), 20))
    unstamped = [beam.Row(color="red", age="30", pid="p7", line=97)]   # Beam's minimum timestamp
    manifest = tmp_path / "w.manifest.json"
    bad = tmp_path / "bad.jsonl"
    with beam.Pipeline() as p:
        out = ((p | beam.Create(rows), p | "Unstamped" >> beam.Create(unstamped)) | beam.Flatten()
               | Synthesize(schema=_tiny(tmp_path), epsilon=1.0, rows=4, seed=2, privacy_id="pid",
                            max_contributions=2, windows={"start": 0, "end": 2 * day, "size": day},
                            manifest=str(manifest), position_field="line",
                            error_handling={"output": "bad"}))
        _ = (out["bad"] | beam.Map(lambda r: json.dumps(r._asdict()))
             | beam.io.WriteToText(str(bad), num_shards=1, shard_name_template=""))
    dead = sorted((d["row"], d["reason"]) for d in map(json.loads, bad.read_text().splitlines()))
    assert [r for r, _ in dead] == [97, 98, 99]
    assert "(none assigned? stamp the elements upstream)" in dead[0][1]
    assert dead[2][1] == ("timestamp 1970-01-06T00:00:00Z is outside the declared windows "
                          "[1970-01-01T00:00:00Z, 1970-01-03T00:00:00Z)")
    ops = [json.loads(Path(f).read_text())["operational"]
           for f in sorted(glob.glob(str(tmp_path / "w.manifest.*.json")))]
    assert len(ops) == 2
    for o in ops:
        assert o["rows_read"] == o["rows_used"] + o["rows_rejected"] + o["rows_dropped_by_bound"]
    assert [o["rows_dropped_by_bound"] for o in ops] == [4, 4]   # 3 people x 10 rows, k = 2
    assert sum(o["rows_read"] for o in ops) == 21
