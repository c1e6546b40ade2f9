"""Beam YAML as an ETL engineer meets it, second round (sixteenth session, H84).

Each test pins one stumble met writing pipelines from the README and the YAML docs only, and
fails on the code before its fix (docs/beam-api.md, "Sixteenth session: Beam YAML, second round
(H84)").
"""

from __future__ import annotations

import glob
import json
import logging
import time
from importlib import resources
from pathlib import Path

import pytest

yaml_main = pytest.importorskip(
    "apache_beam.yaml.main", reason="Beam YAML needs apache-beam[yaml] (docstring_parser, jinja2, ...)")

import apache_beam as beam  # noqa: E402
import yaml  # noqa: E402

from tests.yaml_helpers import SHOP_SCHEMA, build, json_lines, provider, run_yaml  # noqa: E402

_ROWS = [{"customer": 1, "age": 30, "region": "north"}, {"customer": 2, "age": 50, "region": "east"}]


def _spec(step: str, config: dict, tmp_path) -> dict:
    return {"providers": [{"include": provider()}], "pipeline": {"transforms": [
        {"type": "Create", "name": "In", "config": {"elements": _ROWS}},
        {"type": step, "name": "S", "input": "In",
         "config": {"schema": SHOP_SCHEMA, "epsilon": 0.5, "manifest": str(tmp_path / "m.json"),
                    **config}}]}}


def _build(spec: dict) -> beam.Pipeline:
    return build(spec, sort_keys=False)  # the steps' keys in the order written (line numbers)


def _refusal(step: str, config: dict, tmp_path) -> str:
    logging.disable(logging.WARNING)
    try:
        with pytest.raises(ValueError) as info:
            _build(_spec(step, config, tmp_path))
    finally:
        logging.disable(logging.NOTSET)
    return str(info.value)


# -- 1. a misspelt method names the key and the nearest method -------------------------------------
@pytest.mark.parametrize("windows", [None, {"start": 0, "end": 7200, "size": 3600}])
def test_misspelt_method_names_the_nearest_method(tmp_path, windows) -> None:
    """Was ``unknown method 'privbays'; available: [...]`` (no step, no key, no nearest name), or
    with windows ``method 'privbays' cannot release an empty window``."""
    config = {"method": "privbays"} | ({"windows": windows} if windows else {})
    message = _refusal("BeamsynthSynthesize", config, tmp_path)
    assert "BeamsynthSynthesize: method: 'privbays'" in message, message
    assert "did you mean 'privbayes'?" in message, message
    assert "empty window" not in message, message


# -- 2. an option of another method says which method takes it -------------------------------------
@pytest.mark.parametrize(("method", "options", "words"), [
    ("independent", {"degree": 2}, "degree is an option of method privbayes"),
    ("independent", {"target": "region"}, "target is an option of method privbayes"),
    ("privbayes", {"top_r": 3}, "top_r is an option of method sbhg"),
])
def test_option_of_another_method_names_that_method(tmp_path, method, options, words) -> None:
    """Was ``unknown option 'degree' for method 'independent'; its options: none``: the user who
    copied a privbayes step's options was not told the option exists, only elsewhere."""
    config = {"method": method, "options": options, "delta": 1.0e-6}
    message = _refusal("BeamsynthSynthesize", config, tmp_path)
    assert words in message, message
    assert f"method: {method}" in message or f"method {method!r}" in message, message


# -- 3. a privacy_id or position_field that no input row carries is warned about when built --------
@pytest.mark.parametrize("step", ["BeamsynthSynthesize", "BeamsynthCount"])
@pytest.mark.parametrize(("config", "words"), [
    ({"privacy_id": "custmer"}, "privacy_id 'custmer' is not a field of its input rows "
                                "(did you mean 'customer'?"),
    ({"position_field": "lineno"}, "position_field 'lineno' is not a field of its input rows"),
])
def test_missing_privacy_id_field_is_warned_when_built(tmp_path, caplog, step, config,
                                                       words) -> None:
    """Was silent: ``privacy_id: custmer`` ran, every one of 404 rows went to the error output
    (``required field 'custmer' is missing``) and the release spent its ε on no record."""
    schema = {k: v for k, v in SHOP_SCHEMA.items() if k != "privacy_id"}  # the step names the id
    with caplog.at_level(logging.WARNING):
        _build(_spec(step, {"schema": schema, **config}, tmp_path))
    assert words in caplog.text, caplog.text


def test_declared_fields_present_give_no_field_warning(tmp_path, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        _build(_spec("BeamsynthSynthesize", {"privacy_id": "customer"}, tmp_path))
    assert "is not a field of its input rows" not in caplog.text, caplog.text


# -- 4. declared windows build without Beam's Flatten windowing warning ----------------------------
def test_windowed_manifest_builds_without_flatten_window_warning(tmp_path, caplog) -> None:
    """Was ``WARNING:apache_beam.transforms.core:All input pcollections must have the same
    window. Windowing for flatten set to ...`` on every windowed ``BeamsynthSynthesize`` with a
    manifest (its released tables carry AfterWatermark, its counts the default trigger): a
    warning the user could not act on, about the step's own wiring."""
    config = {"windows": {"start": 0, "end": 10800, "size": 3600}, "method": "privbayes"}
    with caplog.at_level(logging.WARNING):
        _build(_spec("BeamsynthSynthesize", config, tmp_path))
    assert "must have the same window" not in caplog.text, caplog.text


# -- 5. a row whose time is missing or not a number: an error row, counted, never a crash ----------
def _example_stamp():
    """The stamping callable of ``pipelines/windowed_counts.yaml``, rendered with ts, start=0."""
    import jinja2

    text = (resources.files("beamsynth.pipelines") / "windowed_counts.yaml").read_text("utf-8")
    spec = yaml.safe_load(jinja2.Template(text).render(
        input="x", output="y", schema="adult", ts="ts", start=0, end=3600))
    stamp = next(t for t in spec["pipeline"]["transforms"] if t["type"] == "AssignTimestamps")
    scope: dict = {}
    exec(stamp["config"]["timestamp"]["callable"], scope)  # noqa: S102 (the shipped example)
    return next(v for k, v in scope.items() if callable(v) and not k.startswith("__"))


@pytest.mark.parametrize(("ts", "stamped"), [("10", 10.0), ("", -1.0), ("abc", -1.0), (None, -1.0)])
def test_example_stamps_an_unusable_time_outside_the_windows(ts, stamped) -> None:
    """A row's time missing, empty or not a number is stamped before the declared start (so the
    steps count it as an error row) instead of failing the run (slow test below runs it)."""
    row = beam.Row(customer="1", ts=ts)
    assert _example_stamp()(row) == stamped


# the whole example on 5 rows (8 s at load 5); the stamp itself: the test above
@pytest.mark.slow
def test_windowed_example_counts_rows_without_a_usable_time(tmp_path) -> None:
    """The docs' stamping recipe, ``AssignTimestamps`` with ``timestamp: "float(ts)"``, failed the
    whole run on one row without a time (``TypeError: float() argument must be ... not
    'NoneType'`` in Beam's step, measured on 404 JSON rows with one short row). The shipped
    example ``pipelines/windowed_counts.yaml`` stamps such rows outside the declared windows, so
    both steps send them to the error output and count them (rule 8)."""
    (tmp_path / "ev.csv").write_text("customer,age,region,ts\n1,30,north,10\n2,40,south,3700\n"
                                     "3,50,east,\n4,60,west,abc\n5,33,north,20\n",
                                     encoding="utf-8")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(SHOP_SCHEMA), encoding="utf-8")
    example = resources.files("beamsynth.pipelines") / "windowed_counts.yaml"
    variables = {"input": str(tmp_path / "ev.csv"), "output": str(tmp_path / "ev"),
                 "schema": str(tmp_path / "s.yaml"), "ts": "ts", "start": 0, "end": 10800}
    started = time.monotonic()
    logging.disable(logging.WARNING)
    try:
        run_yaml(example, None, f"--jinja_variables={json.dumps(variables)}")
    finally:
        logging.disable(logging.NOTSET)
    errors = json_lines(str(tmp_path / "ev.rejected*"))
    assert sorted(e["source"] for e in errors) == ["Count", "Count", "Synthesize", "Synthesize"]
    assert all("outside the declared windows" in e["reason"] for e in errors), errors
    count = json.loads((tmp_path / "ev.count.manifest.json").read_text(encoding="utf-8"))
    assert count["operational"]["rows_read"] == 5 and count["operational"]["rows_rejected"] == 2
    manifests = sorted(glob.glob(str(tmp_path / "ev.synthetic.manifest.*.json")))
    assert len(manifests) == 3  # one per declared hour, the empty one included
    for m in manifests:
        assert json.loads(Path(m).read_text(encoding="utf-8"))["operational"][
            "rows_outside_windows"] == 2
    assert len(glob.glob(str(tmp_path / "ev-count-*"))) == 3
    print(f"ran in {time.monotonic() - started:.1f} s")


# -- 6. BeamsynthPrefixes' option refusals spell YAML keys ----------------------------------------
@pytest.mark.parametrize(("config", "words"), [
    ({"method": "improved", "max_depth": 3},
     "BeamsynthPrefixes: max_depth: 3 is not used by method: improved; it applies to method: "
     "basic and direct"),
    ({"method": "basic", "discount": "skip"}, "it applies to method: improved only"),
    ({"method": "improvd"}, "method: 'improvd' must be one of"),
])
def test_prefix_option_refusals_spell_yaml_keys(tmp_path, config, words) -> None:
    """Was the API's ``max_depth (3) is not used by method 'improved'; it applies to
    method='basic' and 'direct'``: a keyword call the YAML user never writes."""
    key = {"kind": "text", "column": "region", "alphabet": "abcdefghijklmnopqrstuvwxyz",
           "max_length": 5}
    message = _refusal("BeamsynthPrefixes", {"key": key, **config}, tmp_path)
    assert words in message, message
    assert "method='" not in message and "method (" not in message, message


# -- 7. an overspend across steps sums each step's spends ------------------------------------------
def test_overspend_names_each_steps_total(tmp_path) -> None:
    """Was a list of every mechanism's spend (``Synth/row_count ε=0.025, Synth/privbayes.size_count
    ε=0.0095, ...`` , six for one privbayes step), which the user had to add up to find the step
    whose ε to lower; now each step's total, in the order of the pipeline, follows."""
    budget = {"job_budget": {"epsilon": 1.0}, "manifest": None}
    spec = {"providers": [{"include": provider()}], "pipeline": {"transforms": [
        {"type": "Create", "name": "In", "config": {"elements": _ROWS}},
        *[{"type": t, "name": n, "input": "In",
           "config": {"schema": SHOP_SCHEMA, "epsilon": e, **budget, **extra,
                      "manifest": str(tmp_path / f"{n}.json")}}
          for t, n, e, extra in [("BeamsynthSynthesize", "Synth", 0.5, {"method": "privbayes"}),
                                 ("BeamsynthCount", "Count", 0.1, {}),
                                 ("BeamsynthHistogram", "Hist", 0.4, {"column": "age"}),
                                 ("BeamsynthMarginals", "Tables", 0.2,
                                  {"marginals": [["age", "region"]]})]]]}}
    logging.disable(logging.WARNING)
    try:
        with pytest.raises(ValueError) as info:
            _build(spec)
    finally:
        logging.disable(logging.NOTSET)
    message = str(info.value)
    assert "step 'Tables' asks for ε=0.2" in message, message
    assert "spent by step: Synth ε=0.5, Count ε=0.1, Hist ε=0.4 of job_budget ε=1" in message, message


# -- 8. a step's privacy_id names the id column for the statistics steps too -----------------------
@pytest.mark.parametrize("step", ["BeamsynthCount", "BeamsynthHistogram"])
def test_statistics_step_privacy_id_overrides_the_schemas(tmp_path, step) -> None:
    """The schema declares ``privacy_id: customer``, the rows call it ``cust_id``: the step's
    ``privacy_id: cust_id`` worked on ``BeamsynthSynthesize`` (as the CLI's ``--privacy-id``) but
    the statistics steps refused it in the API's words, ``schema privacy_id ('customer') differs
    from the job's id_column ('cust_id')``."""
    rows = [{"cust_id": r["customer"], "age": r["age"], "region": r["region"]} for r in _ROWS]
    spec = _spec(step, {"privacy_id": "cust_id", "max_contributions": 2,
                        **({"column": "age"} if step == "BeamsynthHistogram" else {})}, tmp_path)
    spec["pipeline"]["transforms"][0]["config"]["elements"] = rows
    logging.disable(logging.WARNING)
    try:
        _build(spec)
    finally:
        logging.disable(logging.NOTSET)
