"""BeamsynthOptions (a PipelineOptions subclass) and the check of forwarded CLI options."""

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beamsynth.runners.options import (
    BeamsynthOptions,
    UnknownOptionError,
    beam_option_flags,
    beamsynth_settings,
    check_pipeline_args,
    privacy_job_from_options,
    suggest_flag,
)


def test_options_parse_as_beam_options():
    options = PipelineOptions(["--beamsynth_epsilon=1.5", "--beamsynth_delta", "1e-6",
                               "--beamsynth_seed=7", "--beamsynth_manifest", "gs://b/m.json",
                               "--runner=DirectRunner"])
    view = options.view_as(BeamsynthOptions)
    assert (view.beamsynth_epsilon, view.beamsynth_delta, view.beamsynth_seed) == (1.5, 1e-6, 7)
    assert options.get_all_options()["beamsynth_manifest"] == "gs://b/m.json"
    s = beamsynth_settings(options)
    assert (s.epsilon, s.delta, s.seed, s.manifest, s.seeded) == (1.5, 1e-6, 7, "gs://b/m.json", True)


def test_defaults_are_secure_and_unset():
    s = beamsynth_settings(None)
    assert (s.epsilon, s.delta, s.seed, s.manifest, s.seeded) == (None, 0.0, None, None, False)
    assert beamsynth_settings(PipelineOptions([])) == s


@pytest.mark.parametrize("flag, message", [
    ("--beamsynth_epsilon=0", "--beamsynth_epsilon (0.0) must be a finite number > 0"),
    ("--beamsynth_epsilon=inf", "--beamsynth_epsilon (inf) must be a finite number > 0"),
    ("--beamsynth_delta=1", "--beamsynth_delta (1.0) must be in [0, 1)"),
    ("--beamsynth_seed=-1", "--beamsynth_seed (-1) must be an int >= 0"),
    ("--beamsynth_manifest= ", "--beamsynth_manifest (' ') must be a non-empty path"),
])
def test_settings_validation_messages(flag, message):
    with pytest.raises(ValueError) as err:
        beamsynth_settings(PipelineOptions([flag]))
    assert str(err.value) == message


def test_known_flags_include_beam_dask_and_ours():
    flags = set(beam_option_flags())
    assert {"--runner", "--direct_num_workers", "--job_endpoint", "--project",
            "--beamsynth_epsilon", "--beamsynth_manifest"} <= flags
    pytest.importorskip("apache_beam.runners.dask.dask_runner")
    assert "--dask_client_address" in flags


@pytest.mark.parametrize("args", [
    [], ["--runner", "direct-multi", "--direct_num_workers", "4"],
    ["--runner=dask", "--dask_client_address", "localhost:8786"],
    ["--job_endpoint=localhost:8099", "--environment_type", "LOOPBACK"],
    ["--experiments", "a", "--experiments=b"],
])
def test_beam_options_pass(args):
    check_pipeline_args(args, own_flags=["--rows"])


@pytest.mark.parametrize("args, message", [
    (["--rowz", "10"], "unrecognized option --rowz (did you mean --rows?): neither beamsynth nor "
                       "Beam knows it"),
    (["--runner", "direct", "--rowz=10"], "unrecognized option --rowz (did you mean --rows?): "
                                          "neither beamsynth nor Beam knows it"),
    # Beam takes no abbreviations: an abbreviation would be dropped, so it is refused
    (["--direct_num_worker", "2"], "unrecognized option --direct_num_worker (did you mean "
                                   "--direct_num_workers?): neither beamsynth nor Beam knows it"),
    (["--zzzzzz"], "unrecognized option --zzzzzz: neither beamsynth nor Beam knows it"),
    (["--direct_num_workers", "x"], "invalid pipeline option: argument --direct_num_workers: "
                                    "invalid int value: 'x'"),
    (["--beamsynth_epsilon", "1"], "--beamsynth_epsilon is a pipeline option for Beam jobs that use "
                                   "beamsynth from Python; on the command line use --epsilon"),
])
def test_unknown_options_refused(args, message):
    with pytest.raises(UnknownOptionError) as err:
        check_pipeline_args(args, own_flags=["--rows", "--epsilon"])
    assert str(err.value) == message


def test_suggestion_treats_dash_and_underscore_alike():
    assert suggest_flag("--count_fraction", ["--count-fraction", "--rows"]) == "--count-fraction"
    assert suggest_flag("--qqqq", ["--rows"]) is None


def test_privacy_job_from_options():
    job = privacy_job_from_options(PipelineOptions(["--beamsynth_epsilon=2", "--beamsynth_delta=1e-6",
                                                    "--beamsynth_seed=5"]), name="etl")
    assert (job.accountant.total.epsilon, job.accountant.total.delta, job.seed, job.name) == (
        2.0, 1e-6, 5, "etl")
    with pytest.raises(ValueError) as err:
        privacy_job_from_options(PipelineOptions(["--runner=DirectRunner"]))
    assert str(err.value) == "--beamsynth_epsilon is required: the job's total ε has no default"
