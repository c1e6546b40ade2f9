"""Method options checked once, for the Python API, Beam YAML and the CLI (fifteenth session, H73).

``pipelines/methods/options.py`` checks a method's options (names, kinds, ``option_limits``
ranges) for every caller, when the pipeline is built, in the caller's words. Each test fails on
the code before it (docs/options.md, "Fifteenth session: options checked once (H73)"); all are
build-time checks: no pipeline runs.
"""

from __future__ import annotations

import logging
from pathlib import Path

import apache_beam as beam
import pytest

import beamsynth as bs
from beamsynth.pipelines.cli.main import main
from beamsynth.pipelines.methods.synthesize import SynthesisConfig, plan_synthesis
from beamsynth.schemas.schema import load_schema


def _api_refusal(method: str, options: dict, *, bound: bool = False) -> str:
    """The message of ``bs.Synthesize(method=..., options=...)``: refused when constructed, or
    (``bound``) when applied to a private collection."""
    with pytest.raises(ValueError) as info:
        step = bs.Synthesize(method=method, epsilon=1.0, delta=1e-6, rows=100, options=options)
        if bound:
            job = bs.PrivacyJob(epsilon=2.0, delta=1e-5)
            private = (beam.Pipeline() | beam.Create([{"age": 30}])
                       | job.private(bs.load_schema("adult")))
            _ = private | step
    return str(info.value)


def _yaml_refusal(method: str, options: dict) -> str:
    from beamsynth.pipelines.yaml_transforms import Synthesize

    logging.disable(logging.WARNING)  # the step's build-time warnings are not what is checked
    try:
        with pytest.raises(ValueError) as info:
            Synthesize(schema="adult", epsilon=1.0, delta=1e-6, rows=100, method=method,
                       manifest="m.json", options=options)
    finally:
        logging.disable(logging.NOTSET)
    return str(info.value)


def _cli_refusal(method: str, options: dict) -> str:
    """The CLI's plan (its options come typed by argparse; the ranges are the methods')."""
    cfg = SynthesisConfig(input="in.csv", schema=load_schema("adult"), output="out.csv",
                          epsilon=1.0, delta=1e-6, method=method, rows=100, options=options)
    with pytest.raises(ValueError) as info:
        plan_synthesis(cfg)
    return str(info.value)


# -- 1. the API refuses options of the wrong kind (it misread them), when bs.Synthesize is built --
@pytest.mark.parametrize(("method", "options", "words"), [
    ("privbayes", {"degree": 1.5}, "options={'degree': 1.5} must be a whole number"),  # ran as 1
    ("privbayes", {"degree": True}, "options={'degree': True} must be a whole number"),
    ("privbayes", {"pb_noise": 0}, "options={'pb_noise': 0} must be one of laplace, gaussian"),
    ("sbhg", {"sbhg_sizing": "bogus"}, "options={'sbhg_sizing': 'bogus'} must be one of auto, off"),
    ("plausible", {"allow_non_dp": "no"}, "options={'allow_non_dp': 'no'} must be true or false"),
    ("plausible", {"pd_generic": 0}, "options={'pd_generic': 0} must be true or false"),
    ("sbhg", {"burn_in": "3"}, "options={'burn_in': '3'} must be a whole number"),
    ("privbayes", {"shrink": [1]}, "options={'shrink': [1]} must be a finite number"),
])
def test_api_refuses_options_of_the_wrong_kind_when_constructed(method, options, words) -> None:
    """Before: bs.Synthesize took each of these and ran it as another value (degree 1, the
    default noise, sizing off, allow_non_dp true)."""
    message = _api_refusal(method, options)
    assert words in message and f"(method {method!r}; docs/options.md)" in message, message


def test_api_options_not_a_mapping_or_near_a_keyword() -> None:
    assert "options ('degree: 2') must be a mapping" in _api_refusal("privbayes", "degree: 2")
    # rows is bs.Synthesize's own keyword, not a method option
    assert "unknown option 'rows' for method 'independent' (did you mean rows=..., not in " \
           "options?)" in _api_refusal("independent", {"rows": 5})
    assert "(did you mean rows: ..., not in options?)" in _yaml_refusal("independent", {"rows": 5})


# -- 2. a falsy value was replaced by the default (`x or default`): now refused, per family -------
@pytest.mark.parametrize("option", ["pb_noise", "sampling", "parents", "pb_sizing"])
def test_privbayes_empty_choice_is_refused_not_the_default(option) -> None:
    """privbayes read ``opts.get(option) or default``: '' ran as the default mode."""
    for message, spelled in ((_api_refusal("privbayes", {option: ""}, bound=True),
                              f"options={{'{option}': ''}} must be one of"),
                             (_cli_refusal("privbayes", {option: ""}), "must be one of")):
        assert spelled in message, message


def test_privbayes_zero_structure_fraction_is_refused_in_each_callers_words() -> None:
    """``structure_fraction or DEFAULT_STRUCTURE_FRACTION``: 0 ran as 0.3 in every front end."""
    assert "options={'structure_fraction': 0} must be a number in (0, 1)" in _api_refusal(
        "privbayes", {"structure_fraction": 0})
    assert "options: {structure_fraction: 0} must be a number in (0, 1)" in _yaml_refusal(
        "privbayes", {"structure_fraction": 0})
    assert "--pb-structure-fraction 0 must be a number in (0, 1)" in _cli_refusal(
        "privbayes", {"structure_fraction": 0.0})


def test_given_values_are_read_not_defaults() -> None:
    """A valid value reaches the plan as given (structure_fraction 0.5, not 0.3), and a whole
    number written 2.0 is read as 2 (sbhg refused top_r 2.0 as 'top_r (2.0) must be an int')."""
    cfg = SynthesisConfig(input="in.csv", schema=load_schema("adult"), output="out.csv",
                          epsilon=1.0, method="privbayes", rows=100,
                          options={"structure_fraction": 0.5, "input_rows": 30_000, "degree": 2.0})
    spends = {s.step: s for s in plan_synthesis(cfg).accountant.spends}
    network = sum(s.budget.epsilon for name, s in spends.items() if name.startswith("privbayes.")
                  and not name.startswith("privbayes.refine"))
    assert spends["privbayes.structure"].budget.epsilon == pytest.approx(0.5 * network)
    step = bs.SBHG(epsilon=1.0, delta=1e-6, rows=100, options={"top_r": 2.0, "burn_in": 3.0})
    job = bs.PrivacyJob(epsilon=1.0, delta=1e-6)
    private = beam.Pipeline() | beam.Create([{"age": 30}]) | job.private(bs.load_schema("adult"))
    _ = private | step
    assert step._plan.method.transform.details()["top_r"] == 2


# -- 3. ranges in the caller's words (were the transforms' names: groups, rows, chain_length) ----
@pytest.mark.parametrize(("method", "option", "value", "flag", "must"), [
    ("privbayes", "refine_groups", 0, "--pb-refine-groups", "a whole number in [2, 64]"),
    ("privbayes", "input_rows", -1, "--input-rows", "a whole number >= 0"),
    ("sbhg", "input_rows", -1, "--input-rows", "a whole number >= 0"),  # sbhg took -1
    ("sbhg", "sbhg_chain_length", 0, "--chain-length", "a whole number >= 1"),
    ("plausible", "k", 0, "--k", "a whole number >= 1"),
])
def test_range_errors_name_the_option_as_each_caller_wrote_it(method, option, value, flag,
                                                                must) -> None:
    api = _api_refusal(method, {option: value})
    assert f"options={{'{option}': {value}}} must be {must}" in api, api
    yaml = _yaml_refusal(method, {option: value})
    assert f"BeamsynthSynthesize: options: {{{option}: {value}}} must be {must}" in yaml, yaml
    cli = _cli_refusal(method, {option: value})
    assert f"{flag} {value} must be {must}" in cli, cli


def test_plausible_schema_dependent_ranges_in_the_callers_words() -> None:
    """omega depends on the schema (adult: 15 columns), so the method checks it; it said
    ``omega (16) must be in [1, 15]`` to every caller."""
    assert "options={'omega': 16} must be in [1, 15]" in _api_refusal(
        "plausible", {"omega": 16}, bound=True)
    assert "--omega 16 must be in [1, 15]" in _cli_refusal("plausible", {"omega": 16})


def test_cli_refuses_an_out_of_range_option_before_reading(tmp_path: Path, capsys) -> None:
    """argparse types --input-rows as an int; its range is the method's: sbhg built with -1."""
    src = tmp_path / "in.csv"
    src.write_text("age,sex\n30,Male\n", encoding="utf-8")
    out = tmp_path / "o.csv"
    code = main(["synthesize", str(src), "--schema", "adult", "--epsilon", "1", "--delta", "1e-6",
                 "--method", "sbhg", "--input-rows", "-1", "--quiet", "--output", str(out)])
    assert code == 2
    assert "--input-rows -1 must be a whole number >= 0 (method 'sbhg'" in capsys.readouterr().err
    assert not out.exists()
