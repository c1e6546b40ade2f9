"""Session 12 (H40): an open-data portal engineer feeds every public output of ``bs`` into Beam's
own sinks, Beam YAML, other input shapes and streams. Each test is a problem that user hit,
failing on the code before its fix."""

from __future__ import annotations

import glob
import json
import re

import apache_beam as beam
import pyarrow.parquet as pq
import pytest

import beamsynth as bs

ROW = {"age": 39, "sex": "Male", "race": "White", "income": "<=50K"}
SMALL = bs.load_schema("adult").select(["age", "sex", "race", "income"])


def _lines(prefix: str) -> list[str]:
    return [line for path in sorted(glob.glob(prefix + "*")) for line in open(path, encoding="utf-8")]


def test_dead_letters_straight_into_batched_sinks_are_written(tmp_path):
    """`private.dead_letters | beam.io.WriteToCsv(...)` (or WriteToJson, WriteToParquet,
    to_dataframe) wrote an empty file, silently: the dead letters are emitted in _EncodeFn's
    finish_bundle, and Beam 2.77's DoOperation.finish flushes its receivers' batch buffers before
    finish_bundle runs, so a batched consumer fused to it never got them (rule 8: a bad row lost).
    WriteToText, which takes one element at a time, had them."""
    job = bs.PrivacyJob(epsilon=1.0, seed=1)
    out = str(tmp_path)
    with beam.Pipeline() as p:
        private = p | beam.Create([ROW, {"age": "abc"}, dict(ROW, sex="X")]) | job.private(SMALL)
        bad = private.dead_letters
        bad | "Csv" >> beam.io.WriteToCsv(f"{out}/bad_csv", num_shards=1)
        bad | "Json" >> beam.io.WriteToJson(f"{out}/bad_json", num_shards=1)
        bad | "Parquet" >> beam.io.WriteToParquet(f"{out}/bad_parquet", num_shards=1)
        private | bs.Count(epsilon=1.0) | "CountCsv" >> beam.io.WriteToCsv(f"{out}/count")
        p | bs.WriteManifest(job=job, path=f"{out}/manifest.json")
    assert len(_lines(f"{out}/bad_csv")) == 1 + 2      # header + both rejected rows
    assert len(_lines(f"{out}/bad_json")) == 2
    assert sum(pq.read_table(f).num_rows for f in glob.glob(f"{out}/bad_parquet*")) == 2
    assert _lines(f"{out}/count")[0].strip() == "noisy_count"


def test_dask_refusal_of_schemaless_write_to_parquet_names_the_schema_form(tmp_path):
    """`bs.Count(...) | beam.io.WriteToParquet(path)` (no schema: Beam converts schema'd rows
    with a batched DoFn) was refused on --runner dask with 'Write with
    WriteToText/WriteToParquet', i.e. with the very sink refused. It now names the form that
    runs there: dicts and a pyarrow schema, bs.arrow_schema(pcoll)."""
    pytest.importorskip("distributed")
    job = bs.PrivacyJob(epsilon=1.0)
    with pytest.raises(NotImplementedError) as err:
        with beam.Pipeline(options=bs.pipeline_options(["--runner", "dask"])) as p:
            count = p | beam.Create([ROW]) | job.private(SMALL) | bs.Count(epsilon=1.0)
            count | "Parquet" >> beam.io.WriteToParquet(str(tmp_path / "count"))
    message = str(err.value)
    assert message.startswith("the dask runner cannot run step 'Parquet/")
    assert "WriteToParquet(path, bs.arrow_schema(pcoll))" in message
    assert "r._asdict()" in message
    assert not list(tmp_path.glob("count*"))


def _yaml(tmp_path, transforms: str) -> None:
    """Run a Beam YAML pipeline (the provider file included) on the DirectRunner."""
    pytest.importorskip("apache_beam.yaml.main")
    from tests.yaml_helpers import provider, run_yaml

    run_yaml(tmp_path / "job.yaml",
             f"providers:\n  - include: {provider()}\npipeline:\n  transforms:\n{transforms}")


def test_yaml_step_on_unparsed_text_lines_is_warned_about_when_built(tmp_path, caplog):
    """YAML `ReadFromText` -> BeamsynthSynthesize (the parse step forgotten) ran: every
    Row(line=...) was an error row ("required field 'age' is missing") and the step released
    100 synthetic rows learned from no record, without a word. Typed rows carrying none of the
    declared columns now get a warning when the pipeline is built, naming the fields and the
    parse steps; every line reaches the error output. A warning, not a refusal: YAML's
    ReadFromJson infers the rows' type from the records, so a refusal would make whether a
    release happens depend on one record (rule 7, tests/audit/test_session13_redteam.py)."""
    data = tmp_path / "in.csv"
    data.write_text("age,sex\n39,Male\n", encoding="utf-8")
    out = tmp_path / "out"
    with caplog.at_level("WARNING", logger="beamsynth.pipelines.yaml_transforms"):
        _yaml(tmp_path, f"""\
    - {{type: ReadFromText, name: Read, config: {{path: "{data}"}}}}
    - type: BeamsynthSynthesize
      name: Synth
      input: Read
      config: {{schema: adult, epsilon: 0.5, rows: 10, error_handling: {{output: bad}}}}
    - {{type: WriteToJson, input: Synth.output, config: {{path: "{out}"}}}}
    - {{type: WriteToJson, input: Synth.bad, config: {{path: "{out}.bad"}}}}
""")
    message = "\n".join(r.getMessage() for r in caplog.records)
    assert re.search(r"BeamsynthSynthesize 'Synth': its input rows have fields \['line'\], none "
                     r"of schema 'adult''s columns.*ReadFromCsv", message), message
    bad = [json.loads(line) for line in _lines(f"{out}.bad")]
    assert len(bad) == 2 and all("required field" in b["reason"] for b in bad), bad


@pytest.mark.parametrize("config, message", [
    ("{schema: adult, epsilonn: 0.5}",
     r"BeamsynthSynthesize: unknown config key 'epsilonn' \(did you mean 'epsilon'\?\); its "
     r"config takes: schema, epsilon, delta, method, rows"),
    ("{epsilon: 0.5}",
     r"BeamsynthSynthesize: config needs schema: \(a schema file or a bundled name"),
])
def test_yaml_config_typo_and_missing_schema_say_what_the_step_takes(tmp_path, config, message):
    """A key typo said 'Synthesize.__init__() got an unexpected argument 'epsilonn'' and a
    missing schema 'Synthesize.__init__() missing 1 required -only argument: 'schema'' (Beam
    YAML strips the word 'keyword' from a TypeError): now the step's name, the nearest key and
    the keys it takes, or what a schema is."""
    with pytest.raises(ValueError, match=message):
        _yaml(tmp_path, f"""\
    - {{type: Create, name: Rows, config: {{elements: [{{age: 39}}]}}}}
    - {{type: BeamsynthSynthesize, name: Synth, input: Rows, config: {config}}}
""")


def _late_stream():
    """Declared days 1-2 (t0 = 2024-01-01): on time lines 1 (F, day 1) and 2 (M, day 2); line 3
    (an out-of-domain 'X') arrives with the watermark 1 h into day 1, line 4 after day 1's
    release, line 5 stamped after the declared range."""
    from apache_beam.testing import test_stream
    from apache_beam.transforms import window as beam_window

    day, t0 = 86_400, 1_704_067_200

    def event(line, sex, ts):
        return beam_window.TimestampedValue(beam.Row(sex=sex, line=line), ts)

    stream = (test_stream.TestStream().advance_watermark_to(t0)
              .add_elements([event(1, "F", t0 + 60), event(2, "M", t0 + day + 60)])
              .advance_watermark_to(t0 + 3600)
              .add_elements([event(3, "X", t0 + 4000)])           # rejected by the encoder
              .advance_watermark_to(t0 + day + 1)
              .add_elements([event(4, "M", t0 + 120)])            # late for day 1's release
              .add_elements([event(5, "M", t0 + 9 * day)])        # outside the declared range
              .advance_watermark_to_infinity())
    return stream, (t0, t0 + 2 * day, day)


def _streaming():
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    options = PipelineOptions(["--direct_running_mode=in_memory"])
    options.view_as(StandardOptions).streaming = True
    return options


TOY = {"name": "toy", "columns": [
    {"name": "sex", "type": "categorical", "domain": {"kind": "categorical", "values": ["F", "M"]}}]}


def test_dead_letters_of_a_stream_survive_a_windowed_file_sink(tmp_path):
    """On a stream, `private.dead_letters | WriteToText(path, triggering_frequency=5)` (Beam's
    way to write a global-window stream: FixedWindows(5 s), allowed lateness 0) lost a record
    rejected by the encoder (stamped at its window's start, behind the watermark) and a record
    late for its window's release (stamped in that window): Beam dropped both as late data,
    silently; only an element stamped after the declared range reached the file. A stream's
    dead letters are now stamped no earlier than when they are made."""
    stream, (start, end, size) = _late_stream()
    job = bs.PrivacyJob(epsilon=1.0, seed=3)
    out = str(tmp_path / "dead")
    with beam.Pipeline(options=_streaming()) as p:
        private = p | stream | job.private(
            bs.load_schema(TOY), position_field="line", source="events",
            windows=bs.DeclaredWindows(start=start, end=end, size=size))
        (private.dead_letters | beam.Map(lambda r: str(r.position))
         | beam.io.WriteToText(out, num_shards=1, triggering_frequency=5))
        private | bs.Count(epsilon=1.0) | "Counts" >> beam.Map(lambda r: None)
    assert sorted(line.strip() for line in _lines(out)) == ["3", "4", "5"]


def test_yaml_error_rows_of_a_stream_survive_a_windowed_file_sink(tmp_path):
    """The same for the Beam YAML step's error output: the late row (4) was dropped by
    WriteToText(triggering_frequency=5)."""
    from beamsynth.pipelines.yaml_transforms import Synthesize

    stream, (start, end, size) = _late_stream()
    schema = tmp_path / "toy.json"
    schema.write_text(json.dumps(TOY), encoding="utf-8")
    out = str(tmp_path / "bad")
    with beam.Pipeline(options=_streaming()) as p:
        steps = p | stream | Synthesize(
            schema=str(schema), epsilon=1.0, rows=2, seed=1, position_field="line",
            windows={"start": start, "end": end, "size": size}, error_handling={"output": "bad"})
        (steps["bad"] | beam.Map(lambda r: str(r.row))
         | beam.io.WriteToText(out, num_shards=1, triggering_frequency=5))
    assert sorted(line.strip() for line in _lines(out)) == ["3", "4", "5"]


def test_yaml_error_row_without_position_field_has_no_made_up_position(tmp_path):
    """Without position_field, an error row's `row` was its place in the step's input batch, and
    Beam's BatchElements sizes batches by timing: the same bad line 401 of a CSV came out as row
    145 on one run and row 25 on the next (DirectRunner, one and two processes). It looked like
    a line number and was none. It is now null, as the API's dead letters (position=None), and
    stays the given field's value with position_field."""
    from beamsynth.pipelines.yaml_transforms import Synthesize

    schema = tmp_path / "toy.json"
    schema.write_text(json.dumps(TOY), encoding="utf-8")
    rows = [beam.Row(sex="F", line=1), beam.Row(sex="X", line=2), beam.Row(sex="M", line=3)]
    out = tmp_path / "bad"
    with beam.Pipeline() as p:
        data = p | beam.Create(rows)
        for name, field in (("NoField", None), ("WithField", "line")):
            steps = data | name >> Synthesize(schema=str(schema), epsilon=0.5, rows=2,
                                              position_field=field, error_handling={"output": "bad"},
                                              job_budget={"epsilon": 1.0})
            (steps["bad"] | f"{name}Row" >> beam.Map(lambda r: json.dumps(r.row))
             | f"{name}Write" >> beam.io.WriteToText(f"{out}_{name}", num_shards=1))
    assert _lines(f"{out}_NoField") == ["null\n"]
    assert _lines(f"{out}_WithField") == ["2\n"]


def test_yaml_windowed_rows_say_their_window(tmp_path):
    """A YAML step with windows: {start, end, size} wrote its synthetic rows without their
    window: one WriteToParquet file held three days' rows (20 each) with no way to tell them
    apart, while the API's rows start with window_start. They now do too (ISO 8601 UTC)."""
    from apache_beam.transforms import window as beam_window
    from apache_beam.typehints.schemas import schema_from_element_type

    from beamsynth.pipelines.yaml_transforms import Synthesize

    day, t0 = 86_400, 1_704_067_200
    schema = tmp_path / "toy.json"
    schema.write_text(json.dumps(TOY), encoding="utf-8")
    out = str(tmp_path / "syn")
    with beam.Pipeline() as p:
        rows = (p | beam.Create([(beam.Row(sex="F"), t0 + 60), (beam.Row(sex="M"), t0 + 2 * day)])
                | beam.MapTuple(beam_window.TimestampedValue))
        synthetic = rows | Synthesize(schema=str(schema), epsilon=1.0, rows=2, seed=1,
                                      windows={"start": t0, "end": t0 + 3 * day, "size": day})
        fields = [f.name for f in schema_from_element_type(synthetic.element_type).fields]
        synthetic | beam.io.WriteToParquet(out, num_shards=1, shard_name_template="")
    assert fields == ["window_start", "sex"]
    starts = sorted(pq.read_table(out).column("window_start").to_pylist())
    assert starts == ["2024-01-01T00:00:00Z"] * 2 + ["2024-01-02T00:00:00Z"] * 2 + [
        "2024-01-03T00:00:00Z"] * 2


def test_yaml_row_breaking_its_inferred_schema_is_an_error_row_not_a_crash(tmp_path):
    """YAML `ReadFromJson` infers a Beam schema from the file's first 100 lines (pandas: `n` an
    int64, not nullable); a later line lacking `n` reached BeamsynthSynthesize and crashed the
    run in the step's own batching ('Attempted to encode null for non-nullable field "n"
    [while running 'Synth/Batch/...']': Beam samples the first 10 batches' sizes, then fewer,
    with the input's RowCoder: 5 of 6 runs on HEAD crashed). The batches are now plain lists,
    so the row is judged like any other: an error row. The batch coder is checked directly too
    (the run alone crashes only when Beam samples that batch)."""
    from apache_beam.typehints.row_type import RowTypeConstraint

    from beamsynth.pipelines.yaml_transforms import Synthesize

    typed = RowTypeConstraint.from_fields([("sex", str), ("n", int)])  # n: not nullable
    p = beam.Pipeline()
    rows = p | beam.Create([beam.Row(sex="F", n=1)]).with_output_types(typed)
    schema = tmp_path / "toy.json"
    schema.write_text(json.dumps(TOY), encoding="utf-8")
    _ = rows | "Synth" >> Synthesize(schema=str(schema), epsilon=0.5, rows=2)
    nodes = [p.transforms_stack[0]]
    while nodes[0].full_label != "Synth/Batch":  # depth first through the applied steps
        nodes = nodes[0].parts + nodes[1:]
    batches = nodes[0].outputs[None]                  # list[beam.Row] out of the step's batching
    coder = beam.coders.registry.get_coder(batches.element_type)
    assert coder.decode(coder.encode([beam.Row(sex="X", n=None)]))[0].n is None
    data = tmp_path / "in.jsonl"
    lines = [json.dumps({"sex": "FM"[i % 2], "n": i}) for i in range(300)]
    data.write_text("\n".join(lines + [json.dumps({"sex": "X"})]) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    _yaml(tmp_path, f"""\
    - {{type: ReadFromJson, name: Read, config: {{path: "{data}"}}}}
    - type: BeamsynthSynthesize
      name: Synth
      input: Read
      config: {{schema: "{schema}", epsilon: 0.5, rows: 10, error_handling: {{output: bad}}}}
    - {{type: WriteToJson, input: Synth.output, config: {{path: "{out}"}}}}
    - {{type: WriteToJson, input: Synth.bad, config: {{path: "{out}.bad"}}}}
""")
    bad = [json.loads(line) for line in _lines(f"{out}.bad")]
    assert [(b["row"], b["reason"]) for b in bad] == [
        (None, "column 'sex': value 'X' is outside the declared categorical domain (to keep such rows, declare a catch-all cell, other: OTHER in the domain, and on_out_of_domain: other; docs/schema-format.md)")]
    assert len(_lines(f"{out}-")) == 10


def test_job_private_on_typed_rows_without_a_declared_column_is_warned_about_when_built(caplog):
    """The API twin of the YAML warning: `ReadFromCsv(path, header=None, names=['a', 'b'])`
    (Adult without its header names) -> job.private(schema) ran: all 402 rows dead letters and
    a Count released on no record, silently. Typed rows (beam.Row, named tuples) carrying none of
    the fields job.private reads (declared columns, privacy id, key columns) now get a warning
    when built, naming the fields (not a refusal: rule 7, the type may be inferred from the
    records); rows with one of them get none."""
    typed = beam.typehints.row_type.RowTypeConstraint.from_fields([("a", str), ("b", str)])
    job = bs.PrivacyJob(epsilon=1.0)
    p = beam.Pipeline()
    rows = p | beam.Create([beam.Row(a="39", b="Male")]).with_output_types(typed)
    with caplog.at_level("WARNING", logger="beamsynth.transforms.private"):
        rows | job.private(SMALL)
    assert re.search(r"MakePrivate\(adult\): its input rows have fields \['a', 'b'\], none of the "
                     r"fields it reads \(age, sex, race, income\)", caplog.text), caplog.text
    caplog.clear()
    keyed = bs.load_schema({"name": "k", "columns": [{"name": "kind", "type": "categorical",
                            "nullable": True, "domain": {"kind": "categorical", "values": ["x"]}}]})
    name = beam.typehints.row_type.RowTypeConstraint.from_fields([("name", str)])
    ok = p | "Names" >> beam.Create([beam.Row(name="ola")]).with_output_types(name)
    ok | "Keyed" >> job.private(keyed, keys={"name": bs.TextKey(column="name", alphabet="alo",
                                                                  max_length=3)})
    assert "none of the fields" not in caplog.text
