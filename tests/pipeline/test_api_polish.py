"""API polish from a newcomer trial (issue 16): no keyword is silently ignored, messages speak the
caller's vocabulary, and what the schema tools print matches what the mechanisms use."""

from __future__ import annotations

import inspect

import pytest

import beamsynth as bs

NAMED = [bs.IndependentSynthesis, bs.PrivBayes, bs.SBHG, bs.PlausibleDeniability]


def test_named_synthesizers_refuse_another_method():
    with pytest.raises(TypeError, match=r"bs\.PrivBayes always runs method 'privbayes' and takes "
                       r"no method \('sbhg'\); use bs\.SBHG\(\.\.\.\) or "
                       r"bs\.Synthesize\(method='sbhg', \.\.\.\)"):
        bs.PrivBayes(epsilon=0.1, method="sbhg")
    with pytest.raises(TypeError, match=r"takes no method \('independent'\)"):
        bs.SBHG(epsilon=0.1, delta=1e-6, method="independent")
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        bs.PrivBayes(epsilon=0.1, method="nope")
    assert bs.PrivBayes(epsilon=0.1, method="privbayes")._method == "privbayes"  # same: harmless


@pytest.mark.parametrize("cls", NAMED, ids=lambda c: c.__name__)
def test_named_synthesizer_signatures_have_no_method(cls):
    params = inspect.signature(cls).parameters
    assert "method" not in params and "epsilon" in params and "rows" in params
    assert "method" in inspect.signature(bs.Synthesize).parameters


def test_count_fraction_with_public_rows_is_refused():
    with pytest.raises(ValueError, match=r"count_fraction \(0\.2\) .* used only with rows=None; "
                       r"with rows=100 nothing is counted"):
        bs.Synthesize(epsilon=1.0, rows=100, count_fraction=0.2)
    assert bs.Synthesize(epsilon=1.0, count_fraction=0.2)._fraction == 0.2
    assert bs.Synthesize(epsilon=1.0)._fraction == 0.05


@pytest.mark.parametrize("method,option,value", [
    ("improved", "max_depth", 3), ("basic", "discount", "skip"), ("direct", "discount", "uniform"),
    ("direct", "threshold", 5.0), ("basic", "restore_discount", True),
    ("direct", "restore_discount", True)])
def test_prefix_tree_refuses_options_its_method_ignores(method, option, value):
    with pytest.raises(ValueError, match=rf"{option} \({value!r}\) is not used by method "
                       rf"'{method}'"):
        bs.PrefixTree(key="q", epsilon=0.5, method=method, **{option: value})


def test_prefix_tree_takes_the_options_its_method_uses():
    bs.PrefixTree(key="q", epsilon=0.5, method="basic", max_depth=2, threshold=3.0)
    bs.PrefixTree(key="q", epsilon=0.5, method="direct", max_depth=2)
    t = bs.PrefixTree(key="q", epsilon=0.5, method="improved", discount="skip", threshold=2.0,
                      restore_discount=True)
    assert t._discount == "skip"
    assert bs.PrefixTree(key="q", epsilon=0.5)._discount == "proportional"


# -- 2. build-time messages in the caller's vocabulary -------------------------------------------
def _apply(mechanism, *, delta):
    import apache_beam as beam

    job = bs.PrivacyJob(epsilon=1.0, delta=delta, seed=1)
    p = beam.Pipeline()
    private = p | beam.Create([{"age": 30}]) | job.private(bs.load_schema("adult"))
    return private | mechanism


@pytest.mark.parametrize("make, job_delta, expected", [
    (lambda: bs.PlausibleDeniability(epsilon=1.0, delta=1e-5, rows=5), 1e-5,
     ["(options={'pd_model_fraction': 0.1})", "at most rows=0 fits",
      "a data set of about 5 records, as rows=5 requests", "release fewer rows (rows=...)",
      "use bs.Synthesize(method='independent') or bs.Synthesize(method='privbayes')"]),
    (lambda: bs.PlausibleDeniability(epsilon=1.0, delta=1e-5), 1e-5,
     ["needs a public rows=... (got None)"]),
    (lambda: bs.PlausibleDeniability(epsilon=1.0, delta=1e-5, rows=5,
                                     options={"plausible_test": "deterministic"}), 1e-5,
     ["options={'plausible_test': 'deterministic'} (Privacy Test 1)",
      "pass options={'allow_non_dp': True} to release"]),
    (lambda: bs.SBHG(epsilon=1.0), 0.0, ["the sbhg method (bs.SBHG, bs.Synthesize(method='sbhg')) needs delta > 0",
                                    "pass e.g. delta=1e-06 on a "
                                    "bs.PrivacyJob(epsilon=..., delta=...) that has δ"]),
], ids=["plausible-overspend", "plausible-no-rows", "plausible-non-dp", "sbhg-no-delta"])
def test_api_messages_speak_keywords_not_flags(make, job_delta, expected):
    with pytest.raises((ValueError, bs.BudgetExceededError)) as err:
        _apply(make(), delta=job_delta)
    msg = str(err.value)
    assert " --" not in msg and "(--" not in msg, msg
    for part in expected:
        assert part in msg, (part, msg)


def test_plausible_messages_keep_cli_flags():
    from beamsynth.pipelines.methods.plausible import PlausibleMethod
    from beamsynth.pipelines.methods.privbayes import PrivBayesMethod
    from beamsynth.pipelines.methods.wording import Vocabulary

    cli = Vocabulary.cli(PlausibleMethod)
    assert cli.option("pd_model_fraction", 0.1) == "--pd-model-fraction 0.1"
    assert cli.option("allow_non_dp", True) == "--allow-non-dp"
    assert cli.option("rows", 5) == "--rows 5" and cli.method("sbhg") == "--method sbhg"
    assert Vocabulary.cli(PrivBayesMethod).option("structure_fraction") == "--pb-structure-fraction"


# -- 3. direct-multi workers: no duplicate option warnings, real warnings kept --------------------
def test_direct_multi_preset_mutes_only_the_workers_option_parser():
    import json

    from beamsynth.runners.presets import QUIET_WORKER_STARTUP

    multi = bs.pipeline_options(["--runner", "direct-multi"]).get_all_options()
    assert multi["sdk_harness_log_level_overrides"] == {"apache_beam.options.pipeline_options": "ERROR"}
    assert json.loads(QUIET_WORKER_STARTUP["sdk_harness_log_level_overrides"]) == {
        "apache_beam.options.pipeline_options": "ERROR"}  # never __main__: a user script's logger
    own = bs.pipeline_options(["--runner", "direct-multi",
                               '--sdk_harness_log_level_overrides={"user.step": "INFO"}'])
    assert own.get_all_options()["sdk_harness_log_level_overrides"] == {"user.step": "INFO"}
    for argv in ([], ["--runner", "direct"]):  # one process: no workers to quiet
        assert bs.pipeline_options(argv).get_all_options()["sdk_harness_log_level_overrides"] is None


_WORKER_JOB = '''
import logging, sys
import beamsynth as bs
import apache_beam as beam

_LOG = logging.getLogger(__name__)


def noisy(r):
    _LOG.warning("user warning from __main__")
    logging.getLogger("user.step").warning("user warning from user.step")
    return r


if __name__ == "__main__":
    job = bs.PrivacyJob(epsilon=1.0)
    with beam.Pipeline(options=bs.pipeline_options(["--runner", "direct-multi"])) as p:
        private = p | beam.Create([{"age": 30 + i % 40} for i in range(300)]) | job.private(
            bs.load_schema("adult"))
        private.dead_letters | "Bad" >> beam.Map(lambda r: None)
        private | bs.Count(epsilon=1.0) | beam.Map(noisy)
'''


@pytest.mark.slow  # ~12 s: two worker processes
def test_direct_multi_api_job_prints_no_worker_option_warnings(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "job.py"
    script.write_text(_WORKER_JOB, encoding="utf-8")
    err = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, check=True).stderr
    assert "Discarding unparseable args" not in err, err  # 2 workers x (own + relayed) = 4 before
    assert err.count("user warning from __main__") >= 1, err  # the user's warnings still show
    assert err.count("user warning from user.step") >= 1, err


# -- 4. schema validate prints the cells the mechanisms count ------------------------------------
def test_schema_validate_counts_the_null_cell(tmp_path, capsys):
    from beamsynth.pipelines.cli.main import main

    path = tmp_path / "s.yaml"
    path.write_text("name: s\ncolumns:\n"
                    "- {name: MSP, type: categorical, nullable: true,\n"
                    "   domain: {kind: categorical, values: ['1', '2', '3', '4', '5', '6']}}\n"
                    "- {name: SEX, type: categorical, domain: {kind: categorical, values: ['1', '2']}}\n",
                    encoding="utf-8")
    assert main(["schema", "validate", str(path)]) == 0
    out = capsys.readouterr().out
    shape = bs.load_schema(str(path)).shape  # what marginals, PrivBayes, CatHist allocate
    assert shape == (7, 2)
    assert "2 columns, cells (MSP=7 (6 + null), SEX=2)" in out, out


def test_display_data_counts_the_null_cell():
    from apache_beam.transforms.display import DisplayDataItem

    from beamsynth.pipelines.io.encode import EncodeBlocks
    from beamsynth.transforms.budget import PureDP
    from beamsynth.transforms.synthesis import DPIndependentMarginals

    schema = bs.load_schema({"name": "s", "columns": [
        {"name": "MSP", "type": "categorical", "nullable": True,
         "domain": {"kind": "categorical", "values": ["1", "2", "3", "4", "5", "6"]}},
        {"name": "SEX", "type": "categorical",
         "domain": {"kind": "categorical", "values": ["1", "2"]}}]})
    for step in (DPIndependentMarginals(schema=schema, budget=PureDP(epsilon=1.0), seed=0),
                 EncodeBlocks(schema)):
        item = step.display_data()["declared_cells"]
        assert (item.value if isinstance(item, DisplayDataItem) else item) == 9  # 7 + 2
