"""Nineteenth session red team (H100) of the eighteenth session's product commits (b333bb8..3562bcc)
and of this session's, with neighbour pairs through the real paths (``beam.io.ReadFromJson`` →
``job.private``, the CLI, the API's PrivBayes manifest) and build-time probes. docs/audits.md
"Nineteenth session: red team of b333bb8.. → 3562bcc" has the numbers and, for each clean check,
the scratch break it catches.

1. Found and fixed (rules 6, 7, 8): Beam's ``ReadFromJson`` (bfd3b88/d6bb3cf wrap its sample)
   turns each pandas chunk into rows by position (the chunk's columns zipped with the sampled
   schema's fields), and pandas orders a chunk's columns as the chunk's first record lists its
   keys. One record with its keys in another order, first in a file (or in a 10,000-line chunk),
   moved every value of its chunk into another field (50 of 50 other records rejected), and a
   one-record file without one of the sampled keys failed the whole run (``missing 1 required
   positional argument``). Rows are now made from each chunk's columns by name.
2. Found and fixed: ``--warn-rejected``'s console summary showed part of a long value (a repr the
   encoders cut without its closing quote matched only to its first space).
3. Found and fixed (H103): one record in the file Beam samples decided the fields of every
   file's rows (a sampled record without ``age``: 50 used vs 0; under ``extra_columns: reject`` a
   sampled undeclared key rejected every row). ``job.private`` (and Beam YAML's steps) applied to
   a DataFrame read give its rows every declared field; a typed row's null undeclared field is no
   field.
4. Clean: H98's seeded Philox engine (e5839e2) gives every stream its own words, read
   interleaved or from eight threads.
5. Found and fixed (consistency, nothing spent): a release config's loader and published JSON
   schema took ``rows: 0``, which 22ef3e3 refuses everywhere else.
"""

from __future__ import annotations

import json
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

import beamsynth  # noqa: F401  (installs the by-name row conversion under test, as any import does)
from beamsynth.runners.local import LocalDirectRunner

pytestmark = pytest.mark.audit


def _jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


# -- 1. ReadFromJson: every record's values are its own, whatever its neighbours' key order -------
def test_dataframe_chunks_become_rows_by_field_name() -> None:
    """pandas orders a JSON chunk's columns as its first record lists its keys; Beam's converter
    zipped them with the sampled schema's fields by position. One record listing ``region``
    first moved every value of its chunk into the other field (``age='east'``, ``region=33``),
    a chunk without ``age`` failed the run (``missing 1 required positional argument``). Each
    row now carries its own values by name, a missing key null, an unsampled key unread. The
    slow test below runs the same files through ``beam.io.ReadFromJson``."""
    import io

    import pandas as pd
    from apache_beam.typehints.pandas_type_compatibility import DataFrameBatchConverter
    from apache_beam.typehints.row_type import RowTypeConstraint

    lines = '{"region": "east", "age": 33}\n{"age": 34, "region": "south"}\n'
    (chunk,) = pd.read_json(io.StringIO(lines), lines=True, dtype=False, chunksize=100)
    assert list(chunk.columns) == ["region", "age"]  # the first record's key order
    fields = RowTypeConstraint.from_fields([("age", int), ("region", str)])
    convert = DataFrameBatchConverter.from_typehints(fields, pd.DataFrame)
    rows = lambda frame: [(r.age, r.region) for r in convert.explode_batch(frame)]  # noqa: E731
    assert rows(chunk) == [(33, "east"), (34, "south")]
    assert rows(pd.DataFrame({"region": ["west"]})) == [(None, "west")]
    assert rows(pd.DataFrame({"zz": [1], "age": [40], "region": ["west"]})) == [(40, "west")]
    assert rows(pd.DataFrame({"age": [41], "region": ["north"]})) == [(41, "north")]


@pytest.mark.slow
def test_read_from_json_reads_every_chunk_by_field_name(tmp_path: Path) -> None:
    """A glob of three files: ``a`` (sampled, keys ``age, region``), ``b`` whose first record
    lists ``region`` first (pandas' chunk: columns ``region, age``), ``c`` one record without
    ``age`` and one with an undeclared key listed first. Beam zipped each chunk's columns with
    the schema's fields by position: ``b``'s three records read ``age='east'``, ``region=33``
    (dead letters in ``job.private``), ``c`` failed the run. Each row must carry its own values,
    a missing key as null, an unsampled key not read (2.5 s at load 7; the default test above
    covers the converter)."""
    _jsonl(tmp_path / "a.jsonl", [{"age": 20, "region": "north"}, {"age": 21, "region": "north"}])
    _jsonl(tmp_path / "b.jsonl", [{"region": "east", "age": 33}, {"age": 34, "region": "south"},
                                  {"age": 35, "region": "south"}])
    _jsonl(tmp_path / "c.jsonl", [{"region": "west"}])
    _jsonl(tmp_path / "d.jsonl", [{"zz": 1, "age": 40, "region": "west"}])
    with beam.Pipeline(runner=LocalDirectRunner()) as p:
        rows = (p | beam.io.ReadFromJson(str(tmp_path / "*.jsonl"), lines=True)
                | beam.Map(lambda r: (r.age, r.region)))
        assert_that(rows, equal_to([(20, "north"), (21, "north"), (33, "east"), (34, "south"),
                                    (35, "south"), (None, "west"), (40, "west")]))


# -- 2. The CLI's console summary of dead letters names no value (b214fff's reasons) ---------------
def test_console_summary_of_reasons_strips_long_values() -> None:
    """``--warn-rejected``'s console summary (stderr, never released) groups dead letters by
    reason with the value cut out (``_normalize``). A value longer than a reason shows (its repr
    cut to 60 or 80 characters, so without its closing quote or brace) matched only up to its
    first space: ``value … smith 1970-01-02 alice smit... is outside ...`` put the rest of a
    record's value on the console. Every reason with such a value, the out-of-domain one with
    b214fff's way out included, is now printed without any of it."""
    import numpy as np

    from beamsynth.pipelines.cli.console import _normalize
    from beamsynth.schemas.schema import load_schema
    from beamsynth.transforms.inputs import KeyLayout, _nested_reason

    secret = "alice smith 1970-01-02 " * 4
    schema = load_schema({"name": "s19", "columns": [
        {"name": "race", "type": "categorical",
         "domain": {"kind": "categorical", "values": ["White", "Black"]}},
        {"name": "age", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 99}}]})
    raw = {"race": np.array([secret, "White", "White"], dtype=object),
           "age": np.array(["30", secret, "x " + secret], dtype=object)}
    _, bad = schema.encode_columns(raw, 3)
    reasons = [reason for _, reason in bad]
    reasons.append(_nested_reason(KeyLayout(schema), {"race": {"name": secret}, "age": 3}))
    assert len(reasons) == 4 and all("smith" in r for r in reasons)
    for reason in reasons:
        shown = _normalize(reason)
        assert "smith" not in shown and "alice" not in shown and "1970" not in shown, shown
        assert shown.startswith(("column 'race': value …", "column 'age': value …")), shown


# -- 3. Found and fixed (H103): the sampled file's keys decided the fields of every file ---------
_AGE_REGION = {"name": "s19", "columns": [
    {"name": "age", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 99}},
    {"name": "region", "type": "categorical",
     "domain": {"kind": "categorical", "values": ["north", "south", "east", "west"]}}]}


def _sampled_first(tmp_path: Path, suffix: str = "jsonl") -> Path:
    """An empty file that Beam's match lists first in ``tmp_path`` (Beam samples the first file
    its match lists: directory order on a local disk, not the name order)."""
    from apache_beam.io.filesystems import FileSystems

    for k in range(500):
        path = tmp_path / f"a{k}.{suffix}"
        path.write_text("")
        if FileSystems.match([str(tmp_path / f"*.{suffix}")])[0].metadata_list[0].path == str(path):
            return path
        path.unlink()
    raise AssertionError("no file name listed first")  # pragma: no cover


def test_one_record_in_the_sampled_file_does_not_decide_the_fields(tmp_path: Path) -> None:
    """D: the file Beam samples (the first its match lists) is empty, so the sample is ``zb``'s
    first chunk (``age, region``); D + 1: it holds one record without ``age``, so Beam's rows of
    every file had no ``age`` field and ``job.private`` rejected all 51 (measured: 50 used vs 0;
    a build-time warning named the missing column). Since H103 ``job.private``, applied to the
    read, makes the read's rows again from its frames with every declared field
    (``Optional[Any]``), whatever was sampled: the fields it encodes are the same on both sides
    (Beam's own rows keep the sample's fields, for the user's other steps). Built only (0.4 s); the slow test below runs
    the pair on direct and direct-multi."""
    import beamsynth as bs

    _jsonl(tmp_path / "zb.jsonl", [{"age": 30 + i, "region": "south"} for i in range(5)])
    first = _sampled_first(tmp_path)
    sampled, read = [], []
    for records in ([], [{"region": "west"}]):
        _jsonl(first, records)
        p = beam.Pipeline()
        rows = p | beam.io.ReadFromJson(str(tmp_path / "*.jsonl"), lines=True)
        _ = rows | bs.PrivacyJob(epsilon=1.0, seed=1).private(bs.load_schema(_AGE_REGION))
        sampled.append([name for name, _ in rows.element_type._fields])  # after job.private
        encode = _applied(p, ")/Encode")  # the rows job.private encodes: its Encode step's input
        assert len(encode) == 1
        (rows_read,) = encode[0].main_inputs.values()
        read.append(sorted(rows_read.element_type._fields, key=repr))
    # Beam's own rows keep the sample's type: a user's step built for it (WriteToJson batching
    # them) failed the run when a first version of the fix retyped them in place
    assert sampled == [["age", "region"], ["region"]]
    assert read[0] == read[1], read
    assert [name for name, _ in read[0]] == ["age", "region"]


def _applied(pipeline: beam.Pipeline, suffix: str) -> list:
    """The pipeline's applied transforms whose full label ends with ``suffix`` (graph only)."""
    found = []

    class Visitor(beam.pipeline.PipelineVisitor):
        def enter_composite_transform(self, node) -> None:  # noqa: ANN001 - Beam's node
            if node.full_label.endswith(suffix):
                found.append(node)

        def visit_transform(self, node) -> None:  # noqa: ANN001 - Beam's node
            self.enter_composite_transform(node)

    pipeline.visit(Visitor())
    return found


def _write_records(path: Path, records: list[dict], lines: bool) -> None:
    if lines:
        _jsonl(path, records)
    else:  # one JSON array per file; a file without records is empty (149060c)
        path.write_text(json.dumps(records) if records else "", encoding="utf-8")


def _count_through_read(folder: Path, runner: str, lines: bool, schema: dict) -> tuple[dict, str]:
    """``beam.io.ReadFromJson(glob)`` → ``job.private(schema)`` → ``bs.Count`` (seed 3): the
    manifest's counts of the source and the released count's text."""
    import beamsynth as bs

    job, out = bs.PrivacyJob(epsilon=1.0, seed=3), folder / "out"
    opts = bs.pipeline_options(["--runner", runner])
    with beam.Pipeline(options=opts) as p:
        rows = p | beam.io.ReadFromJson(str(folder / "*.json"), lines=lines)
        private = rows | job.private(bs.load_schema(schema), source="in")
        (private | bs.Count(epsilon=1.0) | beam.Map(lambda r: json.dumps(r._asdict()))
         | beam.io.WriteToText(str(out / "count"), shard_name_template=""))
        p | bs.WriteManifest(job=job, path=str(out / "m.json"))
    manifest = json.loads((out / "m.json").read_text(encoding="utf-8"))
    return manifest["operational"]["sources"]["in"], (out / "count").read_text(encoding="utf-8")


@pytest.mark.slow
@pytest.mark.parametrize(("runner", "lines", "added", "reject"), [
    ("direct", True, {"region": "west"}, False),
    ("direct-multi", True, {"region": "west"}, False),
    ("direct", False, {"region": "west"}, False),
    ("direct-multi", False, {"region": "west"}, False),
    ("direct", True, {"zz": 1, "age": 40, "region": "west"}, True)])
def test_one_sampled_record_changes_the_used_records_by_itself(
        tmp_path: Path, runner: str, lines: bool, added: dict, reject: bool) -> None:
    """The neighbour pair through the real path (two runs a case: 4.5-44 s on direct, 20-156 s
    on direct-multi at load 14-19; the default test above, built only, and
    ``test_undeclared_null_field_of_a_row_is_no_field`` cover the behaviour): D, the
    sampled file empty and ``zb`` 50 records → used 50; D + 1, one record in the sampled file.
    Before H103: ``{"region": "west"}`` made every row lack ``age`` (used 0, rejected 51, count
    0 instead of 50), and under ``extra_columns: reject`` a sampled undeclared key ``zz`` (null
    in every other row) rejected all 51. Now D + 1 uses D's 50 and the release bytes are equal
    (``{"region": "west"}`` itself is rejected: no ``age``; the ``zz`` record too, under
    ``reject``)."""
    schema = {**_AGE_REGION, "extra_columns": "reject"} if reject else _AGE_REGION
    results = []
    for records in ([], [added]):
        folder = tmp_path / f"d{len(records)}"
        folder.mkdir()
        _write_records(folder / "zb.json", [{"age": 30 + i, "region": "south"} for i in range(50)],
                       lines)
        _write_records(_sampled_first(folder, "json"), records, lines)
        results.append(_count_through_read(folder, runner, lines, schema))
    (d, d_count), (d1, d1_count) = results
    assert (d["read"], d["used"], d["rejected"]) == (50, 50, 0)
    assert (d1["read"], d1["used"], d1["rejected"]) == (51, 50, 1), d1
    assert d1_count == d_count, (d_count, d1_count)


def test_a_dataframe_read_behind_a_user_step_warns_whatever_was_sampled(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``read | beam.Filter(...) | job.private(...)``: the read's rows cannot be retyped behind a
    user step, so ``job.private`` warns when built. Before H103 it warned only when the sample
    lacked a declared column (``its input rows have fields ['region'] and lack 'age'``): the log
    said what the sampled record held. Now the same warning on both sides, naming no field.
    Built only (0.5 s)."""
    import logging

    import beamsynth as bs

    _jsonl(tmp_path / "zb.jsonl", [{"age": 30 + i, "region": "south"} for i in range(5)])
    first = _sampled_first(tmp_path)
    said = []
    for records in ([], [{"region": "west"}]):
        _jsonl(first, records)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="beamsynth"):
            rows = beam.Pipeline() | beam.io.ReadFromJson(str(tmp_path / "*.jsonl"), lines=True)
            _ = (rows | beam.Filter(lambda r: True)
                 | bs.PrivacyJob(epsilon=1.0, seed=1).private(bs.load_schema(_AGE_REGION)))
        said.append([r.getMessage() for r in caplog.records if "MakePrivate" in r.getMessage()])
    assert said[0] == said[1], said
    assert len(said[0]) == 1 and "Beam DataFrame read" in said[0][0]
    assert "region" not in said[0][0] and "'age'" not in said[0][0]


def test_undeclared_null_field_of_a_row_is_no_field() -> None:
    """``extra_columns: reject`` (H103): a DataFrame read gives every row the fields its sample
    had, so a typed row's undeclared field that is null is no field it carries (one sampled
    record ``{"zz": 1, ...}`` made every other row carry ``zz=None`` and rejected all of them);
    a dict's own key, null or not, and a row's non-null undeclared field still reject their
    element. The same rule in Beam YAML's steps."""
    from beamsynth.pipelines.yaml_transforms import _as_dict, _judge_row
    from beamsynth.schemas.schema import load_schema
    from beamsynth.transforms.inputs import KeyLayout, encode_elements

    schema = load_schema({**_AGE_REGION, "extra_columns": "reject"})
    elements = [beam.Row(age=30, region="south", zz=None), beam.Row(age=31, region="south", zz=1),
                {"age": 32, "region": "south", "zz": None}, {"age": 33, "region": "south"}]
    batches, dead = encode_elements(KeyLayout(schema), elements, source="s")
    assert sum(len(b) for b in batches) == 2
    assert sorted(json.loads(d.element)["age"] for d in dead) == [31, 32]
    judged = [_judge_row(schema, _as_dict(e))[1] is None for e in elements]
    assert judged == [True, False, False, True]


# -- 4. Clean: H98's seeded Philox engine (e5839e2) reads each stream's own words -----------------
def test_seeded_streams_read_their_own_words_interleaved_and_in_threads() -> None:
    """Seeded streams now keep (key, position) and read through one per-thread Philox re-keyed
    per read. Eight streams read 3 words at a time, interleaved in one thread and in eight
    threads (a barrier between reads), must equal the words of ``np.random.Philox`` built for
    each stream's key (the old implementation). A scratch engine that keeps reading on from the
    last stream's state instead of re-keying fails."""
    import threading

    import numpy as np

    from beamsynth.transforms.noise import RandomSource, _derive_key

    reads, k = 50, 3
    expected = {i: np.random.Philox(key=_derive_key(11, ("s", i))).random_raw(reads * k)
                for i in range(8)}
    streams = {i: RandomSource(seed=11).child("s", i) for i in range(8)}
    got: dict[int, list] = {i: [] for i in range(8)}
    for _ in range(reads):
        for i in range(8):
            got[i].append(streams[i].words(k))
    assert all(np.array_equal(np.concatenate(got[i]), expected[i]) for i in range(8))

    barrier, threaded = threading.Barrier(8), {}

    def work(i: int) -> None:
        rs, out = RandomSource(seed=11).child("s", i), []
        for _ in range(reads):
            barrier.wait()
            out.append(rs.words(k))
        threaded[i] = np.concatenate(out)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(np.array_equal(threaded[i], expected[i]) for i in range(8))


# -- 5. A release config refuses rows: 0 when loaded, as every other front end (22ef3e3) ----------
def test_release_config_refuses_zero_rows_when_loaded(tmp_path: Path) -> None:
    """22ef3e3 refuses ``rows=0`` in the API, CLI, YAML and (through ``plan_synthesis``) release
    plans; the release config's own loader and its published JSON schema still said ``rows``
    ``>= 0`` (``(5.0) must be an integer >= 0``), so ``rows: 0`` passed the schema an editor
    checks and failed only when planned. Nothing was spent or read either way."""
    from beamsynth.pipelines.releases.config import (
        RELEASE_CONFIG_SCHEMA,
        ReleaseConfigError,
        load_release_config,
    )

    data = tmp_path / "in.csv"
    data.write_text("age,sex\n30,Male\n", encoding="utf-8")
    cfg = {"name": "t", "folder": str(tmp_path / "rel-{date}"), "budget": {"epsilon": 1.0},
           "ledger": {"path": str(tmp_path / "l.sqlite"), "policies": {"src": {"epsilon": 5.0}}},
           "tables": [{"name": "a", "source": "src", "input": str(data), "schema": "adult",
                       "epsilon": 0.6, "columns": ["age", "sex"], "rows": 0}],
           "reports": {"private": False, "public": False}}
    with pytest.raises(ReleaseConfigError, match=r"tables\[0\]\.rows.*>= 1"):
        load_release_config(cfg, date="2026-01-01")
    table = RELEASE_CONFIG_SCHEMA["properties"]["tables"]["items"]["properties"]["rows"]
    assert table["minimum"] == 1
    assert not (tmp_path / "l.sqlite").exists()
