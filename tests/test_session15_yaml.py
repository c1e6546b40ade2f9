"""Beam YAML as a user meets it, fourth round (fifteenth session, H70).

Each test pins one stumble a YAML user met, and fails on the code before its fix
(docs/beam-api.md, "Fifteenth session: Beam YAML as a user meets it (H70)").
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

yaml_main = pytest.importorskip(
    "apache_beam.yaml.main", reason="Beam YAML needs apache-beam[yaml] (docstring_parser, jinja2, ...)")


from beamsynth.pipelines.yaml_transforms import Synthesize  # noqa: E402
from tests.yaml_helpers import build, json_lines, provider, run_yaml  # noqa: E402


def _synth_spec(config: dict) -> dict:
    return {"providers": [{"include": provider()}],
            "pipeline": {"type": "chain", "transforms": [
                {"type": "Create", "config": {"elements": [{"age": 30, "sex": "Male"}]}},
                {"type": "BeamsynthSynthesize",
                 "config": {"schema": "adult", "epsilon": 1.0, "manifest": "m.json", **config}}]}}


def _refusal(**config) -> str:
    logging.disable(logging.WARNING)  # the build-time warnings are not what is checked here
    try:
        with pytest.raises(ValueError) as info:
            Synthesize(**{"schema": "adult", "epsilon": 1.0, "manifest": "m.json", **config})
    finally:
        logging.disable(logging.NOTSET)
    return str(info.value)


# -- 1. messages name the YAML keys, not the CLI's flags -------------------------------------------
@pytest.mark.parametrize(("config", "spelled"), [
    ({"method": "privbayes", "options": {"target_parent": "bogus"}},
     "options: {target_parent: 'bogus'}"),
    ({"method": "privbayes", "options": {"target": "incme"}}, "options: {target: 'incme'}"),
    ({"method": "sbhg"}, "delta: 1e-06"),
    ({"method": "plausible", "rows": 100, "options": {"plausible_test": "deterministic"}},
     "options: {allow_non_dp: True}"),
    # transforms/privbayes_plan.py, which knows no caller, names every caller's spelling
    ({"method": "privbayes", "options": {"pb_noise": "gaussian"}},
     "API and Beam YAML options pb_noise: gaussian) needs delta > 0"),
    ({"method": "privbayes", "schema": {"name": "h", "columns": [
        {"name": "a", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 10**9}},
        {"name": "b", "type": "categorical", "domain": {"kind": "categorical", "values": ["x"]}}]}},
     "Beam YAML method: independent"),
    ({"method": "sbhg", "delta": 1e-6, "options": {"sbhg_selection_fraction": 1.5}},
     "options: {sbhg_selection_fraction: 1.5}: the selection fraction must be in (0, 1)"),
])
def test_method_messages_spell_yaml_keys(config: dict, spelled: str) -> None:
    """Was ``--target-parent bogus: must be one of ...``, ``--target incme: ...``, ``pass e.g.
    --delta 1e-06``, ``pass --allow-non-dp``: flags a YAML user cannot write."""
    message = _refusal(**config)
    assert spelled in message, message
    assert "CLI --" in message or " --" not in f" {message}", message  # a flag only as the CLI's


def test_yaml_pipeline_refusal_names_the_option_key() -> None:
    """Through Beam YAML itself (the text a user sees, after Beam's prefix)."""
    with pytest.raises(ValueError, match=r"options: \{target_parent: 'bogus'\}:? must be one of"):
        build(_synth_spec({"method": "privbayes", "options": {"target_parent": "bogus"}}))


# -- 2. options of the wrong kind are refused in YAML words, not misread ---------------------------
@pytest.mark.parametrize(("method", "options", "words"), [
    ("privbayes", {"degree": 1.5}, "options: {degree: 1.5} must be a whole number"),  # ran as 1
    ("privbayes", {"degree": True}, "options: {degree: True} must be a whole number"),  # as 1
    ("privbayes", {"pb_noise": 0}, "options: {pb_noise: 0} must be one of laplace, gaussian"),
    ("privbayes", {"sampling": False}, "options: {sampling: False} must be one of balanced, iid"),
    ("privbayes", {"input_rows": 1.5}, "options: {input_rows: 1.5} must be a whole number"),
    ("privbayes", {"shrink": [1]}, "options: {shrink: [1]} must be a finite number"),  # TypeError
    ("sbhg", {"sbhg_sizing": "bogus"}, "options: {sbhg_sizing: 'bogus'} must be one of auto, off"),
    ("sbhg", {"burn_in": "3"}, "options: {burn_in: '3'} must be a whole number"),
    ("plausible", {"allow_non_dp": "no"}, "options: {allow_non_dp: 'no'} must be true or false"),
    ("privbayes", "target: income", "options ('target: income') must be a mapping"),
])
def test_options_of_the_wrong_kind_are_refused(method: str, options, words: str) -> None:
    """Before: degree 1.5 / True ran as degree 1, pb_noise 0 / sampling false / sbhg_sizing
    'bogus' ran as the default, allow_non_dp 'no' was true, a list failed with Python's
    ``int() argument must be ...``, a string options read its characters as option names."""
    message = _refusal(method=method, delta=1e-6, rows=100, options=options)
    assert words in message, message


def test_options_of_the_right_kind_still_build() -> None:
    logging.disable(logging.WARNING)
    try:
        step = Synthesize(schema="adult", epsilon=1.0, method="privbayes", manifest="m.json",
                          options={"degree": 2, "shrink": 1, "structure_fraction": 0.2,
                                   "pb_noise": "laplace", "target": "income", "sampling": None})
    finally:
        logging.disable(logging.NOTSET)
    assert step.accountant.total.epsilon == 1.0


# -- 3. step keys shared by every step --------------------------------------------------------------
@pytest.mark.parametrize("step", ["BeamsynthSynthesize", "BeamsynthHistogram", "BeamsynthCount"])
def test_error_output_named_output_is_refused(step: str) -> None:
    """``error_handling: {output: output}`` returned the error rows under the released rows' tag
    ``output``: a ``WriteToCsv`` of ``STEP.output`` wrote the private bad rows, not the release."""
    extra = {"column": "sex"} if step == "BeamsynthHistogram" else {}
    spec = {"providers": [{"include": provider()}], "pipeline": {"transforms": [
        {"type": "Create", "name": "Rows", "config": {"elements": [{"age": "30"}]}},
        {"type": step, "name": "S", "input": "Rows",
         "config": {"schema": "adult", "epsilon": 1.0, "manifest": "m.json",
                    "error_handling": {"output": "output"}, **extra}},
        {"type": "WriteToJson", "input": "S.output", "config": {"path": "never-written"}}]}}
    with pytest.raises(ValueError, match=r"error_handling output 'output' is also a release output"):
        build(spec)


@pytest.mark.parametrize("seed", ["abc", 1.5])
def test_synthesize_seed_must_be_an_int(seed) -> None:
    """Was accepted when built (the statistics steps refused it)."""
    assert "must be an int (tests and demos only)" in _refusal(seed=seed)


# -- 4. a run: error rows say which step, why and where; the manifest counts them -----------------
TINY = {"name": "tiny", "columns": [
    {"name": "color", "type": "categorical",
     "domain": {"kind": "categorical", "values": ["red", "green", "blue"]}}]}


def test_error_rows_name_the_step_with_reason_and_position(tmp_path: Path) -> None:
    """Two steps' error outputs: BeamsynthSynthesize's rows said ``source: beam-yaml`` while
    BeamsynthCount's said ``Count``; now each names its step."""
    schema = tmp_path / "tiny.json"
    schema.write_text(json.dumps(TINY), encoding="utf-8")
    data = tmp_path / "in.csv"
    data.write_text("line,color\n2,red\n3,purple\n4,blue\n5,\n", encoding="utf-8")
    out = tmp_path / "out"
    common = {"schema": str(schema), "seed": 1, "position_field": "line",
              "job_budget": {"epsilon": 1.0}, "error_handling": {"output": "bad"}}
    run_yaml(tmp_path / "pipeline.yaml", {"providers": [{"include": provider()}], "pipeline": {"transforms": [
        {"type": "ReadFromCsv", "name": "Read",
         "config": {"path": str(data), "keep_default_na": False, "dtype": "str"}},
        {"type": "BeamsynthSynthesize", "name": "Synth", "input": "Read",
         "config": {**common, "epsilon": 0.5, "rows": 3, "manifest": f"{out}/synth.json"}},
        {"type": "BeamsynthCount", "name": "Count", "input": "Read",
         "config": {**common, "epsilon": 0.5}},
        {"type": "WriteToJson", "input": "Synth.bad", "config": {"path": f"{out}/synth_bad"}},
        {"type": "WriteToJson", "input": "Count.bad", "config": {"path": f"{out}/count_bad"}},
        {"type": "WriteToCsv", "input": "Synth.output", "config": {"path": f"{out}/synth"}},
        {"type": "WriteToCsv", "input": "Count.output", "config": {"path": f"{out}/count"}}]}})
    for step, name in [("Synth", "synth_bad"), ("Count", "count_bad")]:
        bad = sorted(json_lines(f"{out}/{name}*"), key=lambda r: r["row"])
        assert [(r["source"], r["row"]) for r in bad] == [(step, 3), (step, 5)], bad
        assert "outside the declared categorical domain" in bad[0]["reason"]
        assert "null in a non-nullable column" in bad[1]["reason"]
    manifest = json.loads((out / "synth.json").read_text(encoding="utf-8"))
    assert {k: manifest["operational"][k] for k in ("rows_read", "rows_used", "rows_rejected")} \
        == {"rows_read": 4, "rows_used": 2, "rows_rejected": 2}
    assert manifest["release"]["budget"]["spent"]["epsilon"] == pytest.approx(1.0)
    assert manifest["operational"]["inputs"] == ["Synth"]  # was "beam-yaml"; Count's says "Count"


# -- 5. numbers YAML reads as text, API words in the statistics steps ------------------------------
def _step_refusal(step: str, **config) -> str:
    from beamsynth.pipelines import yaml_stats

    cls = {"BeamsynthSynthesize": Synthesize, "BeamsynthCount": yaml_stats.Count}[step]
    logging.disable(logging.WARNING)
    try:
        with pytest.raises(ValueError) as info:
            cls(**{"schema": "adult", "epsilon": 1.0, "manifest": "m.json", **config})
    finally:
        logging.disable(logging.NOTSET)
    return str(info.value)


@pytest.mark.parametrize(("step", "config", "words"), [
    # YAML 1.1 reads 1e-6 (no dot) as the text '1e-6': "delta must be a number, got str"
    ("BeamsynthSynthesize", {"delta": "1e-6"}, "YAML reads 1e-6 as text (an exponent needs a "
                                               "dot in YAML: write 1.0e-6)"),
    ("BeamsynthSynthesize", {"job_budget": {"epsilon": 1.0, "delta": "1e-5"}}, "write 1.0e-5"),
    # a quoted Jinja variable: the budget's Python advice "pass epsilon=0.5 (... float(...) ...)"
    ("BeamsynthCount", {"epsilon": "0.5"}, "BeamsynthCount: epsilon ('0.5') must be a number; "
                                           "quoted, it is text"),
    ("BeamsynthSynthesize", {"count_fraction": "0.1"}, "count_fraction ('0.1') must be a number"),
    ("BeamsynthSynthesize", {"method": "privbayes", "options": {"refine_fraction": "5e-1"}},
     "options: {refine_fraction: '5e-1'} must be a finite number; YAML reads 5e-1 as text"),
    # the API's keyword: "max_contributions (2) needs an id_column"
    ("BeamsynthCount", {"max_contributions": 2}, "max_contributions (2) needs privacy_id: COLUMN"),
])
def test_yaml_words_for_numbers_and_units(step: str, config: dict, words: str) -> None:
    message = _step_refusal(step, **config)
    assert words in message, message
    assert "float(" not in message and "id_column" not in message, message


def test_exponent_with_a_dot_is_a_number_in_beam_yaml() -> None:
    """What the message advises builds (Beam YAML's loader reads 1.0e-6 as a float)."""
    p = build(_synth_spec({"method": "sbhg", "delta": 1.0e-6, "rows": 10}))
    assert p is not None


# -- 6. declared windows: rows outside them are counted in the manifests ----------------------------
def test_rows_outside_the_windows_are_counted_in_every_window_manifest(tmp_path: Path) -> None:
    """A row stamped outside the declared windows went to the error output and to the counter
    ``beamsynth/rows_outside_windows`` only: no manifest of BeamsynthSynthesize counted it (its
    manifests are per window), while BeamsynthHistogram's one manifest did (rule 8)."""
    schema = tmp_path / "tiny.json"
    schema.write_text(json.dumps(TINY), encoding="utf-8")
    data = tmp_path / "in.csv"
    data.write_text("ts,color\n100,red\n7300,blue\n99999,red\n", encoding="utf-8")
    out = tmp_path / "out"
    run_yaml(tmp_path / "pipeline.yaml", {"providers": [{"include": provider()}], "pipeline": {"transforms": [
        {"type": "ReadFromCsv", "name": "Read",
         "config": {"path": str(data), "keep_default_na": False, "dtype": "str"}},
        {"type": "AssignTimestamps", "name": "Stamp", "input": "Read",
         "config": {"timestamp": "float(ts)", "language": "python"}},
        {"type": "BeamsynthSynthesize", "name": "Synth", "input": "Stamp",
         "config": {"schema": str(schema), "epsilon": 1.0, "rows": 2, "seed": 1,
                    "windows": {"start": 0, "end": 10800, "size": 3600},
                    "manifest": f"{out}/synth.json"}},
        {"type": "WriteToCsv", "input": "Synth", "config": {"path": f"{out}/synth"}}]}})
    manifests = sorted(out.glob("synth.*.json"))
    assert len(manifests) == 3
    ops = [json.loads(m.read_text(encoding="utf-8"))["operational"] for m in manifests]
    assert [(o["rows_read"], o["rows_outside_windows"]) for o in ops] == [(1, 1), (0, 1), (1, 1)]


# -- 7. a schema path: which folder a relative path is read from ------------------------------------
def test_relative_schema_path_names_the_folder_searched(tmp_path: Path, monkeypatch) -> None:
    """Beam YAML reads ``providers: - include:`` from the pipeline file's folder, but a step's
    ``schema: tiny.json`` from the working directory: the refusal said only 'no such file'."""
    (tmp_path / "tiny.json").write_text(json.dumps(TINY), encoding="utf-8")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    message = _step_refusal("BeamsynthCount", schema="tiny.json")
    assert message.startswith("BeamsynthCount: schema 'tiny.json': no such file"), message
    assert f"read from the working directory ({elsewhere})" in message, message
    assert "working directory" not in _step_refusal("BeamsynthSynthesize",
                                                    schema=str(tmp_path / "no.json"))
    assert "schema (3) must be a schema file" in _step_refusal("BeamsynthSynthesize", schema=3)


# -- 8. one seed warning per seeded statistics step, in YAML words ---------------------------------
def test_seeded_statistics_step_warns_once(caplog) -> None:
    """A seeded BeamsynthCount also logged the API's ``PrivacyJob 'beam-yaml statistics': seed=4:
    ...`` (a job the YAML user never made) after the step's own warning."""
    spec = _synth_spec({})
    spec["pipeline"]["transforms"][1] = {
        "type": "BeamsynthCount", "config": {"schema": "adult", "epsilon": 1.0, "seed": 4,
                                             "manifest": "m.json"}}
    with caplog.at_level(logging.WARNING):
        build(spec)
    seeded = [r.getMessage() for r in caplog.records if "seed=4" in r.getMessage()]
    assert len(seeded) == 1 and seeded[0].startswith("BeamsynthCount: seed=4"), seeded


# -- 9. one manifest file per step ------------------------------------------------------------------
@pytest.mark.parametrize("second", ["BeamsynthCount", "BeamsynthSynthesize"])
def test_two_steps_with_one_manifest_path_are_refused(second: str) -> None:
    """A copied step that kept ``manifest: m.json`` built, and the second file replaced the first
    (with the first step's exact counts) when the run ended."""
    steps = [{"type": kind, "name": name, "input": "Rows",
              "config": {"schema": "adult", "epsilon": 0.5, "job_budget": {"epsilon": 1.0},
                         "manifest": "same/m.json"}}
             for kind, name in [("BeamsynthCount", "First"), (second, "Second")]]
    spec = {"providers": [{"include": provider()}], "pipeline": {"transforms": [
        {"type": "Create", "name": "Rows", "config": {"elements": [{"age": "30"}]}}, *steps]}}
    with pytest.raises(ValueError, match=r"Second': manifest 'same/m.json' is also step 'First''s"):
        build(spec)


def test_yaml_error_row_positions_are_read_as_job_private_reads_them() -> None:
    """The YAML step's position reader was a copy of job.private's from before H68's fix: it gave
    12 for 12.7 and passed 2**70 (past a Beam int) through; it now calls the one reader
    (``inputs.record_position``), so those fall back to the row's own index (review, lead)."""
    from beamsynth.pipelines.yaml_transforms import _position

    assert [_position({"p": v}, "p", 5) for v in (12.7, 2**70, True, None, "12", 12.0, 7)] == [
        5, 5, 5, 5, 12, 12, 7]
    assert _position({"p": 3}, None, 5) == 5
