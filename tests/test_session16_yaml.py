"""Beam YAML as an ETL engineer meets it, second round (sixteenth session, H84).

Each test pins one stumble met writing pipelines from the README and the YAML docs only, and
fails on the code before its fix (docs/beam-api.md, "Sixteenth session: Beam YAML, second round
(H84)").
"""

from __future__ import annotations

import logging
from importlib import resources

import pytest

yaml_main = pytest.importorskip(
    "apache_beam.yaml.main", reason="Beam YAML needs apache-beam[yaml] (docstring_parser, jinja2, ...)")

import apache_beam as beam  # noqa: E402
import yaml  # noqa: E402

_SCHEMA = {"name": "shop", "privacy_id": "customer", "columns": [
    {"name": "age", "type": "integer",
     "domain": {"kind": "integer", "low": 18, "high": 90, "edges": [18, 30, 45, 60, 91]}},
    {"name": "region", "type": "categorical",
     "domain": {"kind": "categorical", "values": ["north", "south", "east", "west"]}}]}
_ROWS = [{"customer": 1, "age": 30, "region": "north"}, {"customer": 2, "age": 50, "region": "east"}]


def _provider() -> str:
    return str(resources.files("beamsynth.pipelines") / "beamsynth_provider.yaml")


def _spec(step: str, config: dict, tmp_path) -> dict:
    return {"providers": [{"include": _provider()}], "pipeline": {"transforms": [
        {"type": "Create", "name": "In", "config": {"elements": _ROWS}},
        {"type": step, "name": "S", "input": "In",
         "config": {"schema": _SCHEMA, "epsilon": 0.5, "manifest": str(tmp_path / "m.json"),
                    **config}}]}}


def _build(spec: dict) -> beam.Pipeline:
    """The pipeline built from ``spec`` as ``apache_beam.yaml.main`` builds it (no run)."""
    from apache_beam.yaml.yaml_transform import expand_pipeline

    p = beam.Pipeline()
    expand_pipeline(p, yaml.safe_dump(spec, sort_keys=False))
    return p


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
    schema = {k: v for k, v in _SCHEMA.items() if k != "privacy_id"}  # the step names the id
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
