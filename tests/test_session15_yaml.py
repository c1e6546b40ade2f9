"""Beam YAML as a user meets it, fourth round (fifteenth session, H70).

Each test pins one stumble a YAML user met, and fails on the code before its fix
(docs/beam-api.md, "Fifteenth session: Beam YAML as a user meets it (H70)").
"""

from __future__ import annotations

import logging
from importlib import resources

import pytest

yaml_main = pytest.importorskip(
    "apache_beam.yaml.main", reason="Beam YAML needs apache-beam[yaml] (docstring_parser, jinja2, ...)")

import apache_beam as beam  # noqa: E402
import yaml  # noqa: E402

from beamsynth.pipelines.yaml_transforms import Synthesize  # noqa: E402


def _provider() -> str:
    return str(resources.files("beamsynth.pipelines") / "beamsynth_provider.yaml")


def _build(spec: dict) -> beam.Pipeline:
    """The pipeline built from ``spec`` as ``apache_beam.yaml.main`` builds it (no run)."""
    from apache_beam.yaml.yaml_transform import expand_pipeline

    p = beam.Pipeline()
    expand_pipeline(p, yaml.safe_dump(spec))
    return p


def _synth_spec(config: dict) -> dict:
    return {"providers": [{"include": _provider()}],
            "pipeline": {"type": "chain", "transforms": [
                {"type": "Create", "config": {"elements": [{"age": 30, "sex": "Male"}]}},
                {"type": "BeamsynthSynthesize",
                 "config": {"schema": "adult", "epsilon": 1.0, "manifest": "m.json", **config}}]}}


def _refusal(**config) -> str:
    logging.disable(logging.WARNING)  # the build-time warnings are not what is checked here
    try:
        with pytest.raises(ValueError) as info:
            Synthesize(schema="adult", epsilon=1.0, manifest="m.json", **config)
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
])
def test_method_messages_spell_yaml_keys(config: dict, spelled: str) -> None:
    """Was ``--target-parent bogus: must be one of ...``, ``--target incme: ...``, ``pass e.g.
    --delta 1e-06``, ``pass --allow-non-dp``: flags a YAML user cannot write."""
    message = _refusal(**config)
    assert spelled in message, message
    assert " --" not in f" {message}", message


def test_yaml_pipeline_refusal_names_the_option_key() -> None:
    """Through Beam YAML itself (the text a user sees, after Beam's prefix)."""
    with pytest.raises(ValueError, match=r"options: \{target_parent: 'bogus'\}: must be one of"):
        _build(_synth_spec({"method": "privbayes", "options": {"target_parent": "bogus"}}))
