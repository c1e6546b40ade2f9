"""Runner presets: expansion, precedence of user options, validation messages."""

from __future__ import annotations

import os

import pytest
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

from beamsynth.runners.local import LOCAL_DIRECT_RUNNER
from beamsynth.runners.presets import (
    DASK_RUNNER,
    PRESETS,
    VERSIONS_BEGIN,
    VERSIONS_END,
    PresetError,
    expand_args,
    flink_versions,
    is_dask,
    job_server_image,
    options_for,
    spark_versions,
    versions_markdown,
)


def _std(opts: PipelineOptions) -> StandardOptions:
    return opts.view_as(StandardOptions)


def test_direct_multi_defaults_to_two_worker_processes():
    opts = options_for(["--runner", "direct-multi"])
    assert _std(opts).runner == LOCAL_DIRECT_RUNNER
    direct = opts.view_as(DirectOptions)
    assert direct.direct_running_mode == "multi_processing"
    assert direct.direct_num_workers == 2


def test_user_option_wins_over_preset_default():
    opts = options_for(["--runner=direct-multi", "--direct_num_workers=3"])
    assert opts.view_as(DirectOptions).direct_num_workers == 3
    assert expand_args(["--runner=direct-multi", "--direct_num_workers", "3"]).count(
        "--direct_num_workers=2") == 0


def test_direct_is_in_process():
    opts = options_for(["--runner=direct"])
    assert opts.view_as(DirectOptions).direct_running_mode == "in_memory"


def test_plain_beam_runner_names_pass_through():
    assert expand_args(["--runner=PortableRunner", "--job_endpoint=embed"]) == [
        "--runner=PortableRunner", "--job_endpoint=embed"]
    # without --runner: the direct preset (the DirectRunner without its Prism switch)
    assert _std(options_for([])).runner == LOCAL_DIRECT_RUNNER
    assert options_for([]).view_as(DirectOptions).direct_running_mode == "in_memory"
    assert _std(options_for(["--runner=DirectRunner"])).runner == "DirectRunner"


def test_local_direct_runner_never_tries_prism(monkeypatch):
    """The preset's runner runs a pipeline without touching Beam's Prism runner and restores
    the option it uses to decline it."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import TypeOptions
    from apache_beam.runners.portability import prism_runner
    from apache_beam.testing.util import assert_that, equal_to

    tried = []

    def record(self, *a, **k):  # Beam's DirectRunner catches a failure here and falls back
        tried.append(1)
        raise RuntimeError("no Prism here")

    monkeypatch.setattr(prism_runner.PrismRunner, "run_pipeline", record)
    for argv, expect_prism in (([], False), (["--runner=DirectRunner"], True)):
        tried.clear()
        opts = options_for(argv)
        with beam.Pipeline(options=opts) as p:
            assert_that(p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x * 2), equal_to([2, 4, 6]))
        assert bool(tried) is expect_prism, argv
        assert opts.view_as(TypeOptions).allow_unsafe_triggers is False


def test_dask_preset_and_plain_daskrunner_name_select_the_dotted_class():
    for argv in (["--runner", "dask"], ["--runner=DaskRunner"]):
        opts = options_for(argv + ["--dask_client_address=tcp://h:8786"])
        assert _std(opts).runner == DASK_RUNNER
        assert is_dask(opts)
    assert not is_dask(options_for(["--runner=direct"]))
    assert not is_dask(None)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--runner=dataflow", "--project=p", "--region=r"],
         "runner preset 'dataflow' needs --temp_location (missing: ['temp_location'])"),
        (["--runner=dataflow"],
         "runner preset 'dataflow' needs --project, --region, --temp_location "
         "(missing: ['project', 'region', 'temp_location'])"),
        (["--runner=flink"], "runner preset 'flink' needs --flink_master (missing: ['flink_master'])"),
        (["--runner=spark"],
         "runner preset 'spark' needs --spark_master_url (missing: ['spark_master_url'])"),
        (["--runner=flink", "--flink_master=h:8081", "--flink_version=1.18"],
         "--flink_version ('1.18') is not published for this apache-beam; supported: "
         "1.19, 1.20, 2.0, 2.1, 2.2"),
        (["--runner=FlinkRunner", "--flink_version", "9.9"], "--flink_version ('9.9') is not published"),
        (["--runner=spark", "--spark_master_url=local[2]", "--spark_version=2"],
         "--spark_version ('2') is not published for this apache-beam; supported: 3"),
        (["--runner=flink", "--flink_master=http//h"],
         "--flink_master ('http//h') must be host:port, http(s)://host:port, [local] or [auto]"),
        (["--runner=spark", "--spark_master_url=h:7077"],
         "--spark_master_url ('h:7077') must be spark://host:port, local, local[N], local[*]"),
        (["--runner=flink", "--flink_master=h:8081", "--job_endpoint=h:8099"],
         "runner preset 'flink': give --flink_master (Beam's flink runner) or --job_endpoint"),
        (["--runner=spark-portable"],
         "runner preset 'spark-portable' needs --job_endpoint (missing: ['job_endpoint'])"),
        (["--runner=direct-multi", "--direct_num_workers=0"], "--direct_num_workers ('0') must be an int >= 1"),
        (["--runner=direct-multi", "--direct_num_workers=two"], "--direct_num_workers ('two') must be an int >= 1"),
        (["--runner=direct", "--direct_running_mode=fast"],
         "--direct_running_mode ('fast') must be one of in_memory, multi_threading, multi_processing"),
        (["--runner=dataflow", "--project=p", "--region=r", "--temp_location=/tmp/x"],
         "--temp_location ('/tmp/x') must be a gs:// path for Dataflow"),
        (["--runner"], "--runner needs a value"),
    ],
)
def test_invalid_options_raise_with_the_value(argv, message):
    with pytest.raises(PresetError) as err:
        options_for(argv)
    assert message in str(err.value)


@pytest.mark.parametrize("runner", ["flink", "spark", "flink-portable", "spark-portable"])
def test_a_job_endpoint_selects_the_portable_runner(runner):
    argv = expand_args(["--runner", runner, "--job_endpoint", "localhost:8099"])
    assert argv[0] == "--runner=PortableRunner"
    opts = PipelineOptions(argv).get_all_options()
    assert opts["job_endpoint"] == "localhost:8099"
    assert opts["environment_type"] == "LOOPBACK"


def test_native_flink_and_spark_presets_build_beams_runners():
    """Beam's FlinkRunner/SparkRunner with their options (built, not run: no job server here)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import FlinkRunnerOptions, SparkRunnerOptions
    from apache_beam.runners.portability.flink_runner import FlinkRunner
    from apache_beam.runners.portability.spark_runner import SparkRunner

    opts = options_for(["--runner", "flink", "--flink_master", "flink-host:8081",
                        "--flink_version", "1.20", "--parallelism", "4"])
    assert _std(opts).runner == "FlinkRunner"
    flink = opts.view_as(FlinkRunnerOptions)
    assert (flink.flink_master, flink.flink_version, flink.parallelism) == ("flink-host:8081", "1.20", 4)
    assert isinstance(beam.Pipeline(options=opts).runner, FlinkRunner)
    default = options_for(["--runner=flink", "--flink_master=[local]"]).view_as(FlinkRunnerOptions)
    assert default.flink_version == flink_versions()[-1]  # Beam's default, not ours
    opts = options_for(["--runner=spark", "--spark_master_url=spark://spark-host:7077"])
    assert opts.view_as(SparkRunnerOptions).spark_master_url == "spark://spark-host:7077"
    assert isinstance(beam.Pipeline(options=opts).runner, SparkRunner)
    for url in ("local", "local[4]", "local[*]", "spark://a:7077,b:7077"):
        options_for(["--runner=spark", f"--spark_master_url={url}"])


def test_versions_come_from_beam():
    from apache_beam.options.pipeline_options import FlinkRunnerOptions

    assert flink_versions() == FlinkRunnerOptions.PUBLISHED_FLINK_VERSIONS
    assert "1.18" not in flink_versions()
    assert spark_versions() == ["3"]
    version = flink_versions()[0]
    assert job_server_image("flink", version) == (
        f"apache/beam_flink{version}_job_server:{apache_beam_version()}")
    with pytest.raises(ValueError, match=r"flink version \('1.18'\) must be one of"):
        job_server_image("flink", "1.18")


def test_runners_doc_lists_the_versions_of_the_installed_beam():
    """docs/runners.md holds versions_markdown() between its markers (regenerate it with
    ``python -m beamsynth.runners.presets --versions``) and names no unpublished image."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "runners.md").read_text(encoding="utf-8")
    block = doc.split(VERSIONS_BEGIN, 1)[1].split(VERSIONS_END, 1)[0].strip()
    assert block == versions_markdown()
    for engine, version in re.findall(r"apache/beam_(flink|spark)([0-9.]+)_job_server", doc):
        allowed = flink_versions() if engine == "flink" else spark_versions()
        assert version in allowed, f"docs/runners.md names {engine} {version}"


def apache_beam_version() -> str:
    import apache_beam

    return apache_beam.__version__


def test_dataflow_preset_accepts_a_complete_option_set():
    opts = options_for(["--runner=dataflow", "--project=p", "--region=europe-west1",
                        "--temp_location=gs://b/tmp"]).get_all_options()
    assert opts["runner"] == "DataflowRunner"
    assert (opts["project"], opts["region"], opts["temp_location"]) == ("p", "europe-west1", "gs://b/tmp")


def test_only_direct_and_dask_presets_claim_to_have_run_here():
    assert {n for n, p in PRESETS.items() if p.tested_here} == {"direct", "direct-multi", "dask"}


def test_cli_uses_the_presets():
    from beamsynth.pipelines.cli.synthesize import pipeline_options

    opts = pipeline_options(["--runner", "direct-multi"])
    assert opts.view_as(DirectOptions).direct_num_workers == 2


def test_options_for_refuses_one_string():
    """A preset name passed as one string would be split into characters by Beam and ignored,
    running the job on the default runner without a word (seen using ``bs.pipeline_options``)."""
    with pytest.raises(TypeError, match=r"not the string 'direct-multi'"):
        options_for("direct-multi")
    with pytest.raises(TypeError, match=r"must be strings; got 2"):
        options_for(["--direct_num_workers", 2])


def test_direct_presets_quiet_sdk_workers_unless_asked():
    """Workers' INFO lines (one set per bundle and worker on direct-multi) buried the CLI's
    progress: both direct presets default the SDK harness to WARNING; the user's level wins."""
    from apache_beam.options.pipeline_options import WorkerOptions

    for runner in ("direct", "direct-multi"):
        opts = options_for([f"--runner={runner}"]).view_as(WorkerOptions)
        assert opts.default_sdk_harness_log_level == "WARNING", runner
        opts = options_for([f"--runner={runner}", "--default_sdk_harness_log_level=INFO"])
        assert opts.view_as(WorkerOptions).default_sdk_harness_log_level == "INFO", runner
    assert options_for([]).view_as(WorkerOptions).default_sdk_harness_log_level == "WARNING"


def test_dask_preset_sets_distributed_log_level_unless_the_user_did(monkeypatch):
    """dask.distributed printed ~70 INFO lines per CLI run (scheduler, nannies, workers): the
    dask preset hands the workers' level to its config variable; a user's own setting stays."""
    import beamsynth.runners.presets as presets

    monkeypatch.delenv(presets.DASK_LOG_VARIABLE, raising=False)
    monkeypatch.setattr(presets, "_dask_level_set", [])
    options_for(["--runner=dask"])
    assert os.environ[presets.DASK_LOG_VARIABLE] == "warning"
    options_for(["--runner=dask", "--default_sdk_harness_log_level=INFO"])  # e.g. CLI --verbose
    assert os.environ[presets.DASK_LOG_VARIABLE] == "info"
    options_for(["--runner=dask", "--default_sdk_harness_log_level=40"])
    assert os.environ[presets.DASK_LOG_VARIABLE] == "error"
    monkeypatch.setenv(presets.DASK_LOG_VARIABLE, "debug")  # the user's
    options_for(["--runner=dask"])
    assert os.environ[presets.DASK_LOG_VARIABLE] == "debug"
    options_for(["--runner=direct"])  # other runners leave it alone
    assert os.environ[presets.DASK_LOG_VARIABLE] == "debug"
