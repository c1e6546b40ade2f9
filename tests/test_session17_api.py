"""Seventeenth session, H87: the plugin API as an ETL engineer meets it, seventh round.

Each test fails on the code before its fix (checked by reverting the fix on scratch):

1. a missing required keyword (``bs.Count()``, ``bs.Histogram(epsilon=1)``) raised Python's
   ``Count.__init__() missing 1 required keyword-only argument: 'epsilon'``, without the ``bs.``
   name or the keywords the step takes (the unknown-keyword and positional paths had both).
2. ``bs.Synthesize(method="privbays")`` said ``unknown method 'privbays'; available: [...]``
   without the nearest name, which every keyword, option and column refusal gives.
3. ``schema.select(["sexx"])`` / ``schema.select(["marital_status"])`` (the field name output rows
   and Parquet files use) raised ``KeyError ... has no column 'marital_status' (columns: [...])``
   without the declared name a mechanism's refusal names (``did you mean 'marital-status'?``).
4. ``job.private(schema, windows=beam.window.FixedWindows(3600))`` was refused with the object's
   repr (``got FixedWindows (<apache_beam.transforms.window.FixedWindows object at 0x...>)``), and
   ``bs.DeclaredWindows(start="2024-01-01T00:00:00Z", ...)`` with no way to pass that text: now the
   window's size and the declared call to make, and the ``datetime`` to pass.
5. ``bs.arrow_schema("adult")`` and ``bs.arrow_schema(private)`` said only what they take; now
   the call to make (``bs.load_schema``; a release of the private collection, or its schema).
6. a producer's misspelt key (``sexx`` for ``sex``) made every element a dead letter saying only
   ``required field 'sex' is missing``; now ``(the element has 'sexx', which is not declared)``,
   for dicts, schema'd rows and Arrow batches alike (typed rows also get the build-time warning).
7. an out-of-domain number or time said ``value 150 is outside the declared integer domain``,
   sending the user to the schema file for the range; now ``... integer domain [17, 99]`` (float
   and datetime ranges too; categorical and string domains, which may be huge, as before).
"""

from __future__ import annotations

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

import beamsynth as bs


@pytest.mark.parametrize(("make", "message"), [
    (lambda: bs.Count(), "bs.Count needs epsilon= (no default); it takes: epsilon, typed, label"),
    (lambda: bs.Histogram(epsilon=1.0),
     "bs.Histogram needs column= (no default); it takes: column, epsilon, tolerance, typed, label"),
    (lambda: bs.Marginals(), "bs.Marginals needs marginals= and epsilon= (no defaults); it takes: "
                             "marginals, epsilon, typed, label"),
    (lambda: bs.PrivBayes(rows=10), "bs.PrivBayes needs epsilon= (no default); it takes: epsilon, "
                                    "delta, rows, count_fraction, options, shard_rows, typed, label"),
    (lambda: bs.PrivacyJob(delta=1e-6), "bs.PrivacyJob needs epsilon= (no default); it takes: "
                                        "epsilon, delta, privacy_unit, seed, name, disjoint"),
    (lambda: bs.DeclaredWindows(start=0, size=60),
     "bs.DeclaredWindows needs end= (no default); it takes: start, end, size"),
    (lambda: bs.WriteManifest(job=bs.PrivacyJob(epsilon=1.0)),
     "bs.WriteManifest needs path= (no default); it takes: job, path, output, label"),
])
def test_a_missing_required_keyword_names_the_step_and_its_keywords(make, message):
    with pytest.raises(TypeError) as err:
        make()
    assert str(err.value) == message


def test_the_other_keyword_errors_are_unchanged():
    with pytest.raises(TypeError, match=r"^bs.Count got an unknown keyword 'lable' \(did you mean "
                                        r"'label'\?\); it takes: epsilon, typed, label$"):
        bs.Count(lable="x")  # an unknown keyword is named first, also when epsilon is missing
    with pytest.raises(TypeError, match=r"call bs.Count\(epsilon=1.0\)$"):
        bs.Count(1.0)
    assert bs.PrivacyUnit().id_column is None  # no required keyword: nothing to say


@pytest.mark.parametrize(("make", "message"), [
    (lambda: bs.Synthesize(method="privbays", epsilon=1.0),
     "unknown method 'privbays' (did you mean 'privbayes'?); available: "
     "['independent', 'plausible', 'privbayes', 'sbhg']"),
    (lambda: bs.Synthesize(method="SBHG", epsilon=1.0, delta=1e-6),
     "unknown method 'SBHG' (did you mean 'sbhg'?); available: "
     "['independent', 'plausible', 'privbayes', 'sbhg']"),
    (lambda: bs.PrivBayes(method="independant", epsilon=1.0),
     "unknown method 'independant' (did you mean 'independent'?); available: "
     "['independent', 'plausible', 'privbayes', 'sbhg']"),
])
def test_a_misspelt_method_names_the_nearest(make, message):
    with pytest.raises(ValueError) as err:
        make()
    assert str(err.value) == message


ADULT_COLUMNS = ("['age', 'workclass', 'fnlwgt', 'education', 'education-num', 'marital-status', "
                 "'occupation', 'relationship', 'race', 'sex', 'capital-gain', 'capital-loss', "
                 "'hours-per-week', 'native-country', 'income']")


@pytest.mark.parametrize(("names", "meant"), [
    (["sexx"], "sex"), (["age", "marital_status"], "marital-status"),
    (["Native-Country"], "native-country"), (["education_num"], "education-num"),
])
def test_schema_select_names_the_declared_column(names, meant):
    schema = bs.load_schema("adult")
    with pytest.raises(KeyError) as err:
        schema.select(names)
    assert err.value.args[0].endswith(f"adult.yaml' has no column {names[-1]!r} (did you mean "
                                      f"{meant!r}?; columns: {ADULT_COLUMNS})")
    with pytest.raises(KeyError, match=r"has no column 'zzz' \(columns: \["):
        schema.select(["zzz"])  # nothing close: the list only, as before


@pytest.mark.parametrize(("windows", "got"), [
    (beam.window.FixedWindows(3600),
     "FixedWindows(size=3600s): a Beam window opens only where a record falls, which a release "
     "must not reveal; declare the public range instead: windows=bs.DeclaredWindows(start=..., "
     "end=..., size=3600)"),
    (beam.window.Sessions(600),
     "Sessions(gap=600s): a Beam window opens only where a record falls, which a release must not "
     "reveal; declare the public range instead: windows=bs.DeclaredWindows(start=..., end=..., "
     "size=...)"),
    (3600, "int (3600)"),
])
def test_windows_that_are_not_declared_are_refused_with_the_declared_call(windows, got):
    job = bs.PrivacyJob(epsilon=1.0)
    with pytest.raises(TypeError) as err:
        job.private(bs.load_schema("adult"), windows=windows)
    assert str(err.value) == ("windows must be None or bs.DeclaredWindows(start=, end=, size=), got "
                              + got)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"start": "2024-01-01T00:00:00Z", "end": None, "size": 3600},
     "start must be epoch seconds (int) or an aware datetime, got '2024-01-01T00:00:00Z'; pass "
     "datetime.datetime.fromisoformat('2024-01-01T00:00:00Z')"),
    ({"start": 0, "end": "2024-01-02", "size": 3600},
     "end must be epoch seconds (int) or an aware datetime, got '2024-01-02'; pass "
     "datetime.datetime.fromisoformat('2024-01-02').replace(tzinfo=datetime.timezone.utc)"),
    ({"start": "yesterday", "end": None, "size": 60},
     "start must be epoch seconds (int) or an aware datetime, got 'yesterday'"),
])
def test_declared_windows_from_iso_text_say_what_to_pass(kwargs, message):
    with pytest.raises(TypeError) as err:
        bs.DeclaredWindows(**kwargs)
    assert str(err.value) == message


def test_arrow_schema_of_a_name_or_a_private_collection_says_what_to_pass():
    with pytest.raises(TypeError) as err:
        bs.arrow_schema("adult")
    assert str(err.value) == ("arrow_schema takes a Schema or a PCollection of beamsynth rows, got "
                              "str ('adult'); for a schema's records pass "
                              "bs.arrow_schema(bs.load_schema('adult'))")
    job = bs.PrivacyJob(epsilon=1.0)
    private = beam.Pipeline() | beam.Create([{"sex": "Male"}]) | job.private(bs.load_schema("adult"))
    with pytest.raises(TypeError) as err:
        bs.arrow_schema(private)
    assert str(err.value).endswith(
        "; a private collection is no output: pass a release of it (bs.arrow_schema(synthetic), "
        "bs.arrow_schema(tables['age'])) or its schema")


SMALL = {"name": "small", "columns": [
    {"name": "sex", "type": "categorical", "domain": {"kind": "categorical", "values": ["F", "M"]}},
    {"name": "marital-status", "type": "categorical",
     "domain": {"kind": "categorical", "values": ["single", "married"]}}]}
MISSPELT = [{"sexx": "F", "marital-status": "single"},      # a misspelt key
            {"sex": "M", "Marital_Status": "married"},      # another case of the field name
            {"sex": "F"},                                   # nothing like it: as before
            {"sex": "M", "marital-status": "single"}]       # used
REASONS = ["required field 'sex' is missing (the element has 'sexx', which is not declared)",
           "required field 'marital-status' is missing (the element has 'Marital_Status', which "
           "is not declared)",
           "required field 'marital-status' is missing"]


def _dicts(p):
    return p | beam.Create(MISSPELT)


def _rows(p):  # Beam's Create takes one Row type: every row with the misspelt field
    return p | beam.Create([beam.Row(sexx="F", marital_status="single"),
                            beam.Row(sexx="M", marital_status="married")])


def _arrow(p):  # one batch per element: a batch has one set of columns
    return p | beam.Create([pa.RecordBatch.from_pylist([d]) for d in MISSPELT])


@pytest.mark.parametrize(("make", "expected"), [
    (_dicts, REASONS), (_rows, REASONS[:1] * 2), (_arrow, REASONS)], ids=["dicts", "rows", "arrow"])
def test_a_missing_field_names_the_elements_field_that_looks_like_it(make, expected):
    job = bs.PrivacyJob(epsilon=1.0)
    with TestPipeline() as p:
        private = make(p) | job.private(bs.load_schema(SMALL))
        reasons = private.dead_letters | beam.Map(lambda r: r.reason)
        assert_that(reasons, equal_to(expected))


def test_an_out_of_domain_number_or_time_names_the_declared_range():
    schema = bs.load_schema({"name": "r", "columns": [
        {"name": "age", "type": "integer", "domain": {"kind": "integer", "low": 17, "high": 99}},
        {"name": "pay", "type": "float", "domain": {"kind": "float", "low": 0, "high": 1000.5,
                                                     "bins": 4}},
        {"name": "day", "type": "datetime", "domain": {"kind": "datetime", "start": "2024-01-01",
                                                        "end": "2024-12-31", "granularity": "day"}},
        {"name": "sex", "type": "categorical", "domain": {"kind": "categorical", "values": ["F"]}}]})
    good = {"age": 30, "pay": 1.0, "day": "2024-02-02", "sex": "F"}
    records = [dict(good, age=150), dict(good, pay=2000), dict(good, day="2031-01-01"),
               dict(good, sex="X"), good]
    job = bs.PrivacyJob(epsilon=1.0)
    with TestPipeline() as p:
        private = p | beam.Create(records) | job.private(schema)
        assert_that(private.dead_letters | beam.Map(lambda r: r.reason), equal_to([
            "column 'age': value 150 is outside the declared integer domain [17, 99]",
            "column 'pay': value 2000 is outside the declared float domain [0.0, 1000.5]",
            "column 'day': value '2031-01-01' is outside the declared datetime domain "
            "[2024-01-01T00:00:00, 2024-12-31T00:00:00]",
            "column 'sex': value 'X' is outside the declared categorical domain (to keep such rows, declare a catch-all cell, other: OTHER in the domain, and on_out_of_domain: other; docs/schema-format.md)"]))
