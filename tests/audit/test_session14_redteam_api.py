"""Session 14 red team (H55): the thirteenth session's API, Beam YAML and IO code (5cc3cae..e3aef0a)
against the privacy rules, with neighbour pairs through the real entry points. Each test failed
on the code before its fix (the commit message says how it was checked).

1. Number-looking text in a code column (rule 6). H45's mapping (a number is the one declared
   category of its value, ``1`` → ``"01"``) judged numbers only, so through
   ``beam.io.ReadFromCsv`` → ``job.private`` the same field was used or rejected depending on
   another row: pandas reads ``1``, `` 1``, ``1.0``, ``1e0``, ``+1`` as the number 1 (→ ``"01"``)
   unless one value of the chunk is no number, and then as text (rejected). Neighbours D (30
   rows, codes ``1..3`` spelled five ways, declared ``01..03``) and D + ``x,5``: 30 vs 0 rows used
   (31 rejected). Now text is judged by the value a pandas reader would give it: 30 and 30.
   Booleans likewise (pandas reads ``true``/``TRUE`` as ``True``): declared ``["true", "false"]``,
   D (20 rows) 0 used vs D + ``x`` 20 used; now 20 and 20.
2. Two categories spelling one value (``"1"`` and ``"01"``): no encoder can tell them apart once
   a pandas reader made both the number 1 (D: 20 ``01`` + 10 ``1`` rows all in cell ``"1"``; D + ``x``:
   20 in ``"01"``, 10 in ``"1"``). Left open; ``job.private`` and ``BeamsynthSynthesize`` now warn
   when built (declared values only) and name the fix (read the column as text).
   The same through Beam YAML ``ReadFromJson`` (a column of ints and one string is read as text
   "1"): D (5 × ``{"code": 1}``) vs D + ``{"code": "x"}``, BeamsynthHistogram and
   BeamsynthSynthesize: 5 vs 0 rows used before, 5 and 5 now.
   Privacy ids (rule 5): pandas reads ``01`` as the id 1 in a file of numeric ids and as ``"01"``
   beside one that is none, so one person in two files was two persons: D (a.csv, b.csv: person
   ``01`` three times each, max_contributions 1) 1 row used vs D + ``x9,a`` in b.csv 3 used; now
   1 and 2 (number-looking ids are their number's text, ``privacy_id_text``).
   Date-named columns (``date``, ``created_at``): pandas' JSON reader makes them timestamps
   unless one value of the chunk is no date. YAML ``ReadFromJson`` → BeamsynthCount +
   BeamsynthSynthesize, D (20 records) vs D + ``{"date": "soon", "created_at": "never"}``: 0 vs
   20 rows used; now 20 and 20 (a timestamp is its declared category / epoch number).
   Open string columns: numbers were malformed and their text used; now a number is its text.
3. A ``PCollection`` typed with no record member (``beam.Create(["a", "b"])`` is ``str``) was
   refused when built while the same data plus one dict (``Union[str, Dict]``) built and released
   (rule 7). Now a build-time warning and a dead letter per element, with its reason.
4. Beam YAML statistics steps named alike in two composites (``A/H``, ``B/H``), seeded alike as
   they must be, drew the same noise (noisy - true = [-1, 0, -6, 1] in both); now the full label
   names their spends and seeds their noise (rule 4).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import apache_beam as beam
import pytest

import beamsynth as bs

pytestmark = pytest.mark.audit

CODES = {"name": "codes", "columns": [
    {"name": "code", "type": "categorical",
     "domain": {"kind": "categorical", "values": ["01", "02", "03"]}},
    {"name": "n", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 1000}}]}
FLAGS = {"name": "flags", "columns": [
    {"name": "flag", "type": "categorical",
     "domain": {"kind": "categorical", "values": ["true", "false"]}}]}


def _csv_counts(tmp_path: Path, runs: dict[str, tuple[dict, str]]) -> dict[str, dict]:
    """``beam.io.ReadFromCsv`` → ``job.private`` → ``bs.Count`` + ``bs.WriteManifest`` for each
    ``tag: (schema, csv text)``, one job each (``disjoint=True``: the neighbours share one
    pipeline run, so the pair costs one start-up): the manifests' operational counts."""
    jobs = {}
    with beam.Pipeline() as p:
        for tag, (schema, text) in runs.items():
            path = tmp_path / f"{tag}.csv"
            path.write_text(text, encoding="utf-8")
            jobs[tag] = job = bs.PrivacyJob(epsilon=1.0, seed=1, disjoint=True, name=tag)
            private = (p | f"Read[{tag}]" >> beam.io.ReadFromCsv(str(path))
                       | f"Private[{tag}]" >> job.private(bs.load_schema(schema)))
            _ = private | f"Count[{tag}]" >> bs.Count(epsilon=1.0)
            _ = p | f"Manifest[{tag}]" >> bs.WriteManifest(job=job, path=str(tmp_path / f"{tag}.json"))
    out = {}
    for tag in runs:
        op = json.loads((tmp_path / f"{tag}.json").read_text(encoding="utf-8"))["operational"]
        out[tag] = {k: op[k] for k in ("rows_read", "rows_used", "rows_rejected")}
    return out


# -- 1. number-looking text and booleans through a pandas reader ----------------------------------
SPELLINGS = ["1", " 1", "1.0", "1e0", "+1", "2", "2.0", "3", "03", "3."]


def test_number_and_boolean_text_is_judged_as_a_pandas_reader_gives_it() -> None:
    """The encoder alone: each spelling pandas reads as the number ``v`` (or as text, beside a
    value that is no number) is the declared category of ``v``, and each boolean spelling the
    declared ``"true"``/``"false"``; Unicode digits are no number to pandas and stay rejected.
    Before the fix text ``1`` and the boolean ``True`` were outside the domain."""
    col = bs.load_schema(CODES).columns[0]
    import pandas as pd  # the values pandas gives a numeric chunk
    numbers = pd.to_numeric(pd.Series(SPELLINGS)).tolist()
    as_text, _ = col.encode(SPELLINGS)
    as_numbers, _ = col.encode(numbers)
    assert as_text.tolist() == as_numbers.tolist() == [0, 0, 0, 0, 0, 1, 1, 2, 2, 2]
    assert col.encode(["\u0661"])[0].tolist() == [-1]
    flags = ["true", "TRUE", "True", "false", "FALSE", " true"]
    flag = bs.load_schema(FLAGS).columns[0]
    import io
    parsed = pd.read_csv(io.StringIO("flag\n" + "\n".join(flags[:-1]) + "\n"))["flag"].tolist()
    assert parsed == [True, True, True, False, False]  # what a pandas reader gives
    assert flag.encode(flags)[0].tolist() == [0, 0, 0, 1, 1, 0]
    assert flag.encode(parsed)[0].tolist() == [0, 0, 0, 1, 1]


def test_open_string_numbers_are_used_as_their_text_is() -> None:
    """An open string column (``kind: string``, digits declared): a pandas reader gives ``123``,
    ``01``, ``1.5`` as numbers unless a value of the chunk is none; numbers were all malformed
    ('is not a valid string') and their text used, so one added row decided whether every other
    row counted (rule 6). Now a number is its text (``1`` for ``01``: the spelling itself is lost
    upstream, docs/audits.md); used or rejected alike."""
    import pandas as pd

    col = bs.load_schema({"name": "z", "columns": [{"name": "zip", "type": "string", "domain": {
        "kind": "string", "max_length": 5, "alphabet": "0123456789."}}]}).columns[0]
    texts = ["123", "01", "1.5", "99999", "123456", "1e0"]
    as_text, _ = col.encode(texts)
    as_numbers, _ = col.encode(pd.to_numeric(pd.Series(texts)).tolist())
    assert (as_text >= 0).tolist() == (as_numbers >= 0).tolist() == [True] * 4 + [False, True]
    assert as_text[[0, 2, 3]].tolist() == as_numbers[[0, 2, 3]].tolist()


@pytest.mark.slow  # four ReadFromCsv in one run: 8.5 s at load 6 (the encoder test is fast)
def test_read_from_csv_neighbours_use_the_same_rows(tmp_path: Path) -> None:
    """Neighbours D (30 rows, codes spelled as in ``SPELLINGS``) and D + ``x,5`` through
    ``beam.io.ReadFromCsv`` → ``job.private``: 30 vs 0 rows used before the fix (the added row
    made the column text, and text ``1`` was outside ``01..03``). Declared ``["true", "false"]``:
    pandas reads ``true``/``TRUE``/``false`` as booleans unless one value is none; D (20 rows)
    had 0 rows used, D + ``x`` 20 (``True`` is no declared text)."""
    rows = "".join(f'"{SPELLINGS[i % len(SPELLINGS)]}",{i}\n' for i in range(30))
    flags = "".join(("true\n", "TRUE\n", "false\n", "False\n")[i % 4] for i in range(20))
    got = _csv_counts(tmp_path, {"d": (CODES, "code,n\n" + rows),
                                 "d1": (CODES, "code,n\n" + rows + "x,5\n"),
                                 "f": (FLAGS, "flag\n" + flags),
                                 "f1": (FLAGS, "flag\n" + flags + "x\n")})
    assert [got[t]["rows_used"] for t in ("d", "d1", "f", "f1")] == [30, 30, 20, 20]
    assert [got[t]["rows_rejected"] for t in ("d", "d1", "f", "f1")] == [0, 1, 0, 1]


def test_privacy_id_spellings_a_pandas_reader_gives_as_one_number_are_one_person() -> None:
    """The id alone: ``07``, `` 7``, ``7.0``, ``+7``, ``7e0`` are the number 7 to pandas in a file
    whose ids are all numbers, and text beside one that is none; both forms are the person
    ``"7"`` now (``"07"`` was a second person). Other text is kept (``x9``, ``a.b``, ``E7``)."""
    import pandas as pd

    from beamsynth.schemas.schema import privacy_id_text

    ids = ["07", " 7", "7.0", "+7", "7e0", "-07", "7.50"]
    numbers = pd.to_numeric(pd.Series(ids)).tolist()
    assert [privacy_id_text(v) for v in ids] == [privacy_id_text(v) for v in numbers] == [
        "7", "7", "7", "7", "7", "-7", "7.5"]
    assert [privacy_id_text(v) for v in ("x9", "a.b", "E7", "user01")] == ["x9", "a.b", "E7", "user01"]


@pytest.mark.slow  # two ReadFromCsv runs: about 8 s at load 7 (the id test above is fast)
def test_read_from_csv_one_person_in_two_files_is_bounded_once(tmp_path: Path) -> None:
    """Neighbours through ``beam.io.ReadFromCsv("*.csv")`` → ``job.private`` (privacy id ``pid``,
    max_contributions 1): D = a.csv and b.csv, three rows of person ``01`` each, and D + the row
    ``x9,a`` in b.csv. Pandas reads each file alone: in D both give the id as 1 (1 row used); the
    added row made b.csv's ids text, ``01`` there became a second person: 3 rows used, two of
    person 01 (rule 5). Now 1 and 2."""
    schema = bs.load_schema({"name": "p", "columns": [
        {"name": "code", "type": "categorical", "domain": {"kind": "categorical", "values": ["a", "b"]}}]})
    used = []
    for tag, extra in (("d", ""), ("d1", "x9,a\n")):
        folder = tmp_path / tag
        folder.mkdir()
        (folder / "a.csv").write_text("pid,code\n" + "01,a\n" * 3, encoding="utf-8")
        (folder / "b.csv").write_text("pid,code\n" + "01,b\n" * 3 + extra, encoding="utf-8")
        job = bs.PrivacyJob(epsilon=1.0, seed=1, privacy_unit=bs.PrivacyUnit(id_column="pid"))
        with beam.Pipeline() as p:
            private = p | beam.io.ReadFromCsv(str(folder / "*.csv")) | job.private(schema)
            _ = private | bs.Count(epsilon=1.0)
            _ = p | bs.WriteManifest(job=job, path=str(folder / "m.json"))
        used.append(json.loads((folder / "m.json").read_text(encoding="utf-8"))["operational"]["rows_used"])
    assert used == [1, 2]


DATES = {"name": "dates", "columns": [
    {"name": "date", "type": "categorical",
     "domain": {"kind": "categorical", "values": ["2020-01", "2020-02", "2020-03"]}},
    {"name": "created_at", "type": "integer",
     "domain": {"kind": "integer", "low": 0, "high": 2_000_000_000, "bins": 20}}]}


def test_date_named_columns_pandas_made_timestamps_are_their_declared_values() -> None:
    """pandas' JSON reader (``beam.io.ReadFromJson``, YAML ``ReadFromJson``) turns a column named
    like a date (``date``, ``created_at``) into timestamps when every value of the chunk parses
    as one, and leaves it alone beside one that does not. The timestamps were all dead letters
    ('Timestamp('2020-01-01 00:00:00') is outside the declared categorical domain'); now the
    declared category of the same instant and the epoch seconds (first unit, as pandas tries
    them, inside the declared range), as the untouched values are."""
    import io

    import pandas as pd

    lines = "".join(json.dumps({"date": f"2020-0{i % 3 + 1}", "created_at": 1_600_000_000 + i}) + "\n"
                    for i in range(6))
    stamped = pd.read_json(io.StringIO(lines), lines=True, dtype=False)
    plain = pd.read_json(io.StringIO(lines + '{"date": "soon", "created_at": "never"}\n'),
                         lines=True, dtype=False)
    assert isinstance(stamped["date"][0], pd.Timestamp) and isinstance(plain["date"][0], str)
    schema = bs.load_schema(DATES)
    for col in schema.columns:
        a, why_a = col.encode(stamped[col.name].tolist())
        b, _ = col.encode(plain[col.name].tolist()[:6])
        assert a.tolist() == b.tolist() and not why_a, col.name


@pytest.mark.slow  # two Beam YAML runs: about 12 s at load 7
def test_yaml_read_from_json_date_named_columns_neighbours_use_the_same_rows(tmp_path: Path) -> None:
    """Neighbours through Beam YAML ``ReadFromJson`` → ``BeamsynthCount`` + ``BeamsynthSynthesize``:
    D (20 records ``{"date": "2020-0m", "created_at": 16000000xx}``) and D + ``{"date": "soon",
    "created_at": "never"}``: 0 vs 20 rows used by both steps before the fix; 20 and 20 now."""
    pytest.importorskip("apache_beam.yaml.main")
    from tests.yaml_helpers import provider, run_yaml

    schema = _schema_file(DATES)
    base = [{"date": f"2020-0{i % 3 + 1}", "created_at": 1_600_000_000 + i} for i in range(20)]
    used = []
    for tag, records in (("d", base), ("d1", base + [{"date": "soon", "created_at": "never"}])):
        folder = tmp_path / tag
        folder.mkdir()
        (folder / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        common = f'schema: "{schema}", epsilon: 0.5, seed: 7, job_budget: {{epsilon: 1.0}}'
        run_yaml(folder / "job.yaml", f"""providers:
  - include: {provider()}
pipeline:
  transforms:
    - {{type: ReadFromJson, name: R, config: {{path: "{folder / 'd.jsonl'}"}}}}
    - {{type: BeamsynthCount, name: C, input: R, config: {{{common}, manifest: "{folder / 'c.json'}"}}}}
    - {{type: BeamsynthSynthesize, name: S, input: R, config: {{{common}, rows: 3,
        manifest: "{folder / 's.json'}"}}}}
""")
        used.append([json.loads((folder / f"{m}.json").read_text(encoding="utf-8"))["operational"]["rows_used"]
                     for m in ("c", "s")])
    assert used == [[20, 20], [20, 20]]


def test_text_key_whole_floats_are_their_integer_text() -> None:
    """A text key of digits (zip codes) through ``beam.io.ReadFromCsv`` → ``job.private(keys=)``:
    pandas reads the column as ints, or as floats when one row lacks the key, and
    ``bs.TextKey`` wrote ``2134.0`` ('characters outside the declared alphabet: '.''). Neighbours
    D (20 rows) and D + a row without zip: 20 vs 0 rows used (21 rejected); now 20 and 20 (1
    rejected), as hierarchy keys and codes do since d5b3cea."""
    key = bs.TextKey(column="zip", alphabet="0123456789", max_length=5)
    assert key.normalize(2134.0) == key.normalize(2134) == ("2134", None)


# -- 2. two categories spelling one value: warned about when built --------------------------------
BOTH = {"name": "both", "columns": [
    {"name": "code", "type": "categorical",
     "domain": {"kind": "categorical", "values": ["1", "01", "2"]}}]}


def test_two_spellings_of_one_value_are_warned_about_when_built(caplog) -> None:
    """Declared ``"1"`` and ``"01"``: ``job.private`` and ``BeamsynthSynthesize`` warn when built;
    a number and the text a pandas reader gives for it agree (``1``, ``1.0``, ``"1.0"``,
    ``" 1"`` → ``"1"``); only ``"01"`` read as a number cannot be told from ``"1"``."""
    from beamsynth.pipelines.yaml_transforms import Synthesize

    schema = bs.load_schema(BOTH)
    with caplog.at_level(logging.WARNING):
        _ = beam.Pipeline() | beam.Create([{"code": "1"}]) | bs.PrivacyJob(epsilon=1.0).private(schema)
    assert "declares '1' and '01'" in caplog.text and "read the column as text" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        Synthesize(schema=str(_schema_file(BOTH)), epsilon=1.0, rows=5, manifest="m.json")
    assert "declares '1' and '01'" in caplog.text
    codes, _ = schema.columns[0].encode([1, 1.0, "1.0", " 1", "01", "1"])
    assert codes.tolist() == [0, 0, 0, 0, 1, 0]


def _schema_file(schema: dict) -> Path:
    import tempfile

    path = Path(tempfile.mkdtemp()) / "schema.json"
    path.write_text(json.dumps(schema), encoding="utf-8")
    return path


# -- 3. a PCollection typed with no record member -------------------------------------------------
def _str_runs(runs: dict[str, list], tmp_path: Path) -> dict[str, tuple[list, dict]]:
    """Each ``tag: elements`` through ``beam.Create`` → ``job.private`` → ``bs.Count`` +
    ``bs.WriteManifest``, one job each (``disjoint=True``: both neighbours in one pipeline run):
    the sorted ``[reason, element]`` dead letters and the manifest per tag."""
    schema = bs.load_schema({"name": "codes", "columns": CODES["columns"][:1]})
    with beam.Pipeline() as p:
        for tag, elements in runs.items():
            job = bs.PrivacyJob(epsilon=1.0, seed=1, disjoint=True, name=tag)
            private = p | f"Create[{tag}]" >> beam.Create(elements) | f"Private[{tag}]" >> job.private(schema)
            _ = (private.dead_letters
                 | f"Reasons[{tag}]" >> beam.Map(lambda r: json.dumps([r.reason, r.element]))
                 | f"Write[{tag}]" >> beam.io.WriteToText(str(tmp_path / f"dead_{tag}"),
                                                          shard_name_template=""))
            _ = private | f"Count[{tag}]" >> bs.Count(epsilon=1.0)
            _ = p | f"Manifest[{tag}]" >> bs.WriteManifest(job=job, path=str(tmp_path / f"{tag}.json"))
    return {tag: (sorted(json.loads(line) for line in (tmp_path / f"dead_{tag}").read_text(
                encoding="utf-8").splitlines()),
                  json.loads((tmp_path / f"{tag}.json").read_text(encoding="utf-8")))
            for tag in runs}


def test_str_elements_build_and_release_like_their_neighbour(tmp_path: Path, caplog) -> None:
    """Neighbours ``Create(["a", "b"])`` (typed ``str``) and ``Create(["a", "b", {"code": "01"}])``
    (``Union[str, Dict]``): the first was refused when built (``TypeCheckError: Input type hint
    violation at MakePrivate(codes)``), the second built and released (rule 7). Now both release,
    the strings are dead letters with their reason, and the build warns naming the parse step."""
    with caplog.at_level(logging.WARNING):
        got = _str_runs({"d": ["a", "b"], "d1": ["a", "b", {"code": "01"}]}, tmp_path)
    assert "typed <class 'str'>" in caplog.text and "parse each element first" in caplog.text
    (d, md), (d1, md1) = got["d"], got["d1"]
    reason = "element of type str is not a dict, beam.Row, named tuple or Arrow table"
    assert d == d1 == [[reason, '"a"'], [reason, '"b"']]
    assert (md["operational"]["rows_used"], md1["operational"]["rows_used"]) == (0, 1)
    assert [(b["total"], b["spent"]) for b in (md["release"]["budget"], md1["release"]["budget"])] \
        == [({"epsilon": 1.0, "delta": 0.0}, {"epsilon": 1.0, "delta": 0.0})] * 2


# -- 4. Beam YAML statistics steps of one name in two composites ---------------------------------
@pytest.mark.slow  # one Beam YAML run: 9 s at load 7
def test_yaml_stats_steps_named_alike_in_two_composites_draw_their_own_noise(tmp_path: Path) -> None:
    """Two ``BeamsynthHistogram`` steps named ``H``, one in composite ``A`` over D1 (a, b, c, a) and
    one in ``B`` over D2 (six d), seeded alike (the statistics steps of a pipeline share one job
    seed): both seeded their noise from ``step_seed("histogram[H]")``, so the two releases had the
    same noise (measured: noisy - true = [-1, 0, -6, 1] in both) and D1 - D2 came out exact, and
    the manifest named both spends ``H/histogram``. Now the step's full label (``A/H``, ``B/H``)
    names the spends and seeds the noise (rule 4); a top-level step keeps its label."""
    pytest.importorskip("apache_beam.yaml.main")
    from tests.yaml_helpers import provider, run_yaml

    schema = _schema_file({"name": "s", "columns": [{"name": "code", "type": "categorical", "domain": {
        "kind": "categorical", "values": ["a", "b", "c", "d"]}}]})
    (tmp_path / "d1.csv").write_text("code\na\nb\nc\na\n", encoding="utf-8")
    (tmp_path / "d2.csv").write_text("code\n" + "d\n" * 6, encoding="utf-8")

    def composite(name: str, read: str) -> str:
        return f"""    - type: composite
      name: {name}
      input: {read}
      transforms:
        - {{type: BeamsynthHistogram, name: H, input: input, config: {{schema: "{schema}",
            column: code, epsilon: 0.5, seed: 7, job_budget: {{epsilon: 1.0}},
            manifest: "{tmp_path / name}.json"}}}}
      output: H
    - {{type: WriteToJson, input: {name}, config: {{path: "{tmp_path / ('out' + name)}"}}}}
"""
    run_yaml(tmp_path / "job.yaml", f"""providers:
  - include: {provider()}
pipeline:
  transforms:
    - {{type: ReadFromCsv, name: R1, config: {{path: "{tmp_path / 'd1.csv'}"}}}}
    - {{type: ReadFromCsv, name: R2, config: {{path: "{tmp_path / 'd2.csv'}"}}}}
{composite("A", "R1")}{composite("B", "R2")}""")
    true = {"A": {"a": 2, "b": 1, "c": 1, "d": 0}, "B": {"a": 0, "b": 0, "c": 0, "d": 6}}
    noise = {}
    for name in ("A", "B"):
        rows = [json.loads(line) for f in sorted(tmp_path.glob(f"out{name}*"))
                for line in f.read_text(encoding="utf-8").splitlines()]
        noise[name] = [r["noisy_count"] - true[name][r["value"]] for r in rows]
    assert noise["A"] != noise["B"]
    spends = json.loads((tmp_path / "A.json").read_text(encoding="utf-8"))["release"]["budget"]["spends"]
    assert sorted(s["step"] for s in spends) == ["A/H/histogram", "B/H/histogram"]
