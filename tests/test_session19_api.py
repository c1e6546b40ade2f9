"""The plugin API's open items and the ninth round as an ETL engineer (nineteenth session, H101).

Each test fails on the code before its fix (docs/beam-api.md, "Nineteenth session").
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

import apache_beam as beam
import pytest

import beamsynth as bs


# -- 1. ReadFromJson(lines=False) on a file without records reads no rows ------------------------
@pytest.mark.parametrize("text", ["", "\n  \n", "[]"])
def test_read_from_json_whole_file_without_records_is_built(tmp_path: Path, text: str) -> None:
    """``beam.io.ReadFromJson(path, lines=False)`` samples the whole first file when built: a
    0-byte or blank file failed the pipeline when built (pandas' ``Expected object or value``),
    and each such file failed the run on the workers. Now the build gives rows of no field (a
    ``[]`` file already did) and the workers' reader reads such a file as no rows."""
    from beamsynth._json_sample_fix import WholeJsonReader

    path = tmp_path / "drop.json"
    path.write_text(text, encoding="utf-8")
    rows = beam.Pipeline() | beam.io.ReadFromJson(str(path), lines=False)  # was ValueError
    assert beam.typehints.schemas.named_fields_from_element_type(rows.element_type) == []
    assert len(WholeJsonReader()(io.StringIO(text), orient="records", dtype=False)) == 0


def test_read_from_json_whole_files_of_a_pattern_keep_their_fields(tmp_path: Path) -> None:
    """A pattern whose first file is empty (or ``[]``) samples the file with records when built,
    and the workers' reader (pickled, as Beam ships it) reads an empty file as no rows with the
    sample's columns (a column-less frame failed Beam's conversion to rows: ``KeyError: 'sex'``;
    measured through a pipeline on direct and direct-multi, docs/beam-api.md "Nineteenth
    session"). Build and reader only: no pipeline run."""
    import pickle

    from apache_beam.dataframe import io as dataframe_io

    from beamsynth._json_sample_fix import WholeJsonReader

    (tmp_path / "a0.json").write_text("", encoding="utf-8")
    (tmp_path / "a1.json").write_text("[]", encoding="utf-8")
    (tmp_path / "a2.json").write_text(json.dumps([{"age": 30, "sex": "Male"}]), encoding="utf-8")
    rows = beam.Pipeline() | beam.io.ReadFromJson(str(tmp_path / "a*.json"), lines=False)
    fields = beam.typehints.schemas.named_fields_from_element_type(rows.element_type)
    assert [name for name, _ in fields] == ["age", "sex"]  # was ValueError when built

    read = dataframe_io.read_json(str(tmp_path / "a*.json"), lines=False, orient="records")
    reader = WholeJsonReader(sample_from=read)
    with open(tmp_path / "a0.json", encoding="utf-8") as first:
        assert list(reader(first, orient="records")) == ["age", "sex"]  # the build-time sample
    worker = pickle.loads(pickle.dumps(reader))
    for name in ("a0.json", "a1.json"):
        with open(tmp_path / name, encoding="utf-8") as handle:
            frame = worker(handle, orient="records")
        assert len(frame) == 0 and list(frame.columns) == ["age", "sex"]


# -- 2. every numeric flag of the commands names itself and echoes the value ----------------------
_CASES = [("synthesize", flag, value) for flag in (
    "--epsilon", "--delta", "--count-fraction", "--count-epsilon", "--max-contributions",
    "--split-bytes", "--max-record-lines") for value in ("nan", "inf", "-1")]
_CASES += [("histogram", flag, value) for flag in ("--epsilon", "--tolerance", "--max-contributions")
           for value in ("nan", "-1")]
_CASES += [("prefixes", flag, value) for flag in (
    "--epsilon", "--max-contributions", "--max-length", "--depth", "--max-depth", "--threshold",
    "--final-fraction") for value in ("nan", "0")]
_BASE = {"synthesize": ["--schema", "adult", "--epsilon", "1"],
         "histogram": ["--column", "c", "--domain", "list:a,b", "--epsilon", "1"],
         "prefixes": ["--column", "c", "--epsilon", "1"]}


@pytest.mark.parametrize("command,flag,value", _CASES)
def test_cli_numeric_flags_are_refused_naming_the_flag(tmp_path: Path, capsys, command: str,
                                                      flag: str, value: str) -> None:
    """``--count-epsilon nan`` was refused as ``epsilon (nan) must be ...`` (another flag's
    name), ``--epsilon -1`` as ``epsilon (-1.0)``, ``--split-bytes -1`` as ``split_bytes
    (-1)``, and ``prefixes --epsilon nan`` only after reading its input. Now each is refused
    while the command line is parsed, naming the flag and echoing the text, exit 2, nothing
    read (the input does not exist) or written."""
    from beamsynth.pipelines.cli.main import main

    base = list(_BASE[command])
    if flag in base:
        del base[base.index(flag):base.index(flag) + 2]
    with pytest.raises(SystemExit) as exc:
        main([command, str(tmp_path / "missing.csv"), *base, f"{flag}={value}",
              "--output", str(tmp_path / "out.csv")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: '{value}' is not a " in err, err
    assert "missing.csv" not in err and list(tmp_path.iterdir()) == []


# -- 3. progress lines say their count is partial ------------------------------------------------
def test_progress_rows_line_says_so_far(capsys) -> None:
    """The CLI's running row count printed ``synthesize: rows used 20000`` as its last line on
    Adult's 48,842 rows (the last 1-2-5 milestone passed), which read as the count; each line
    now says ``so far`` (the total is the manifest's, printed at the end)."""
    import numpy as np

    from beamsynth.pipelines.methods.progress import RowProgressFn
    from beamsynth.schemas.schema import EncodedBatch

    fn = RowProgressFn("synthesize")
    for n in (1, 3, 30_000):
        list(fn.process(EncodedBatch(np.zeros((n, 1), dtype=np.int32), None)))
    lines = [x.strip() for x in capsys.readouterr().err.splitlines()]
    assert lines == ["synthesize: rows used 1 so far", "synthesize: rows used 4 so far",
                     "synthesize: rows used 30004 so far"]


# -- 4. one reader of a run's beamsynth counters ------------------------------------------------
def _result(*counters: tuple[str, int | None, int]) -> SimpleNamespace:
    found = [SimpleNamespace(key=SimpleNamespace(metric=SimpleNamespace(name=name)),
                             committed=committed, attempted=attempted)
             for name, committed, attempted in counters]
    return SimpleNamespace(metrics=lambda: SimpleNamespace(query=lambda f: {"counters": [
        c for c in found if not f.names or c.key.metric.name in f.names]}))


def test_run_counters_is_the_one_reader_of_a_runs_counters() -> None:
    """``synthesize.counter_value``, PrivBayes' refinement picks and the CLI's
    ``--fail-on-rejected`` pre-pass each repeated the metrics query and the committed/attempted
    fallback (three copies); they now read ``pipelines/io/metrics.run_counters``: committed where
    reported, else attempted, summed by name; ``None`` where the runner has no metrics."""
    from beamsynth.pipelines.io.metrics import run_counters
    from beamsynth.pipelines.methods.synthesize import counter_value

    pick = 'privbayes_refine_pick_1:["age", "sex"]'
    result = _result(("rows_read", 7, 9), ("rows_read", None, 2), (pick, 1, 1),
                     ("rows_rejected_domain", 1, 1))
    assert run_counters(result) == {"rows_read": 9, pick: 1, "rows_rejected_domain": 1}
    assert run_counters(result, prefix="privbayes_refine_pick_") == {pick: 1}
    assert counter_value(result, "rows_read") == 9 and counter_value(result, "rows_late") == 0

    def broken():
        raise NotImplementedError("no metrics")

    assert run_counters(SimpleNamespace(metrics=broken)) is None
    assert counter_value(SimpleNamespace(metrics=broken), "rows_read") is None


# -- 5. plausible deniability's PrivBayes generator lists its refinement picks ---------------------
def test_plausible_privbayes_generator_lists_its_refinement_picks() -> None:
    """``--method plausible`` (generator ``privbayes``, the default) ran PrivBayes' refinement,
    whose DP picks were recorded (Beam counters) but never reached the manifest (13ff712 listed
    them for PrivBayes itself). Now the CLI's ``details.model.privbayes.refine.picks`` and the
    API/YAML manifests (the generator's ``model:`` records) list them with the refinement's ε
    per pick and per table. (A real plan takes ~10 s to build: the method's run-time part is
    checked on its own here; the CLI run is in docs/beam-api.md, "Nineteenth session".)"""
    from beamsynth.pipelines.methods.plausible import (
        PlausibleMethod,
        PlausibleRunTime,
        _model_choice_items,
    )
    from beamsynth.transforms.privbayes_measure import refine_pick_choices

    refine = {"epsilon_per_pick": 0.013, "epsilon_per_table": 0.052}
    pick = 'privbayes_refine_pick_1:["age", "sex"]'
    picks = [{"pick": 1, "pair": ["age", "sex"], "windows": 1}]
    method = PlausibleMethod.__new__(PlausibleMethod)  # its run-time part only (no 10 s plan)
    method._metrics, method.model_plan = {}, {"refine": dict(refine)}
    method._model_plan = SimpleNamespace(sizing=None)
    method.collect_metrics(_result((pick, 1, 1), ("plausible_released", 3, 3)))
    got = method._model_details()["refine"]
    assert got["picks"] == picks and got["epsilon_per_pick"] == 0.013
    assert method._metrics["plausible_released"] == 3

    measured = SimpleNamespace(sizing=None, refinement=SimpleNamespace(
        tables=(SimpleNamespace(names=("age", "sex")),)))
    assert refine_pick_choices(measured) == (pick,)
    assert _model_choice_items(measured) == [("model:" + pick, 1)]  # the API/YAML records
    plan = SimpleNamespace(degree=1, n_columns=2, sizing=None, zcdp=None)
    details = {"model": {"generator": "privbayes", "privbayes": {"refine": dict(refine)}}}
    public, _ = PlausibleRunTime(plan)(details, {"released": 3, "model:" + pick: 1})
    assert public["model"]["privbayes"]["refine"]["picks"] == picks



# -- ninth round: a prefix tree on a stream under Beam's DirectRunner -----------------------------
def test_prefix_tree_on_a_stream_is_refused_on_the_direct_runner_when_built() -> None:
    """A TestStream job over declared days (Count, Marginals, Histogram, both synthesizers ran)
    hung with ``bs.PrefixTree``: Beam's streaming DirectRunner fails a level's side-input lookup
    on an empty bundle in its executor thread, unreported, and the pipeline never ends. Now the
    step is refused when applied, nothing spent (bounded reads: test_api_windows and others)."""
    import datetime as dt

    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.test_stream import TestStream

    utc = dt.timezone.utc
    days = bs.DeclaredWindows(start=dt.datetime(2024, 1, 1, tzinfo=utc),
                              end=dt.datetime(2024, 1, 3, tzinfo=utc), size=86_400)
    schema = bs.load_schema({"name": "t", "columns": [
        {"name": "kind", "type": "categorical", "domain": {"kind": "categorical", "values": ["a", "b"]}}]})
    keys = {"name": bs.TextKey(column="name", alphabet="abc", max_length=3)}
    job = bs.PrivacyJob(epsilon=1.0, seed=1)
    p = beam.Pipeline(options=PipelineOptions(["--streaming"]))
    private = p | TestStream().add_elements([{"kind": "a", "name": "ab"}]) | job.private(
        schema, keys=keys, windows=days)
    with pytest.raises(ValueError, match=r"PrefixTree\[name\]: a prefix tree on an unbounded "
                                         r"input .*nothing was spent"):
        _ = private | bs.PrefixTree(key="name", epsilon=0.5, method="improved")
    assert not job.accountant.spends  # bounded inputs build as before (test_api_windows, ...)


def test_help_of_every_named_synthesizer_states_its_guarantee() -> None:
    """``help(bs.SBHG)``, ``help(bs.IndependentSynthesis)``, ``help(bs.PlausibleDeniability)`` and
    ``help(bs.PrivBayes)`` named their mechanism but not their guarantee for adding or removing
    one privacy unit (rule 2), which ``help(bs.Count)`` and the other statistics state."""
    import inspect

    for name, dp in (("IndependentSynthesis", "ε-DP"), ("PrivBayes", "ε-DP"), ("SBHG", "(ε, δ)-DP"),
                     ("PlausibleDeniability", "(ε, δ)-DP")):
        doc = " ".join(inspect.getdoc(getattr(bs, name)).split())
        assert "Guarantee:" in doc and dp in doc and "adding or removing one privacy unit" in doc, name


def test_cli_count_options_with_public_rows_are_warned_about(tmp_path: Path, capsys) -> None:
    """``--rows 5 --count-epsilon 0.1`` (or ``--count-fraction 0.2``) ran without a word: no DP
    count is made with a public row count, so the option was silently unused (the API refuses
    ``count_fraction`` with ``rows``). Now the CLI warns, naming the flag, before anything is
    read (here the input does not exist: exit 2 after the warning)."""
    from beamsynth.pipelines.cli.main import main

    for flag, value in (("--count-epsilon", "0.1"), ("--count-fraction", "0.2")):
        assert main(["synthesize", str(tmp_path / "missing.csv"), "--schema", "adult",
                     "--epsilon", "1", "--rows", "5", flag, value,
                     "--output", str(tmp_path / "o.csv")]) == 2
        err = capsys.readouterr().err
        assert f"warning: {flag} is not used with --rows 5" in err, err
    assert main(["synthesize", str(tmp_path / "missing.csv"), "--schema", "adult", "--epsilon",
                 "1", "--rows", "5", "--output", str(tmp_path / "o.csv")]) == 2
    assert "is not used with --rows" not in capsys.readouterr().err
