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
    yaml_main.run(argv=["--runner=DirectRunner", f"--yaml_pipeline_file={_pipeline_file()}",
                        f"--jinja_variables={json.dumps(variables)}"])
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


def test_bad_row_without_error_handling_fails_the_step_loudly() -> None:
    import csv

    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline

    with open(ADULT, encoding="utf-8", newline="") as fh:
        record = next(csv.DictReader(fh))
    bad = beam.Row(**{avro_field_name(k): v for k, v in dict(record, sex="Robot").items()})
    with pytest.raises(Exception, match="rejected: column 'sex'.*configure 'error_handling"):
        with TestPipeline() as p:
            _ = (p | beam.Create([bad])
                 | Synthesize(schema="adult", epsilon=1.0, rows=5, seed=5))
