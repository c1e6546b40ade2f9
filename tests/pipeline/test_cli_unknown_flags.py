"""The CLI refuses options neither it nor Beam knows, before anything is read or spent (issue 16).

A mistyped ``--rowz 10`` used to be forwarded to Beam, which dropped it with a log line, and the
run spent 5% of ε on a DP row count instead of writing 10 rows.
"""

from pathlib import Path

import pandas as pd
import pytest

from beamsynth.pipelines.cli.main import main

ADULT = Path(__file__).resolve().parents[2] / "examples" / "data" / "adult" / "adult.csv"


@pytest.fixture(scope="module")
def small_adult(tmp_path_factory):
    df = pd.read_csv(ADULT, dtype=str, keep_default_na=False).drop(columns=["split"]).head(200)
    path = tmp_path_factory.mktemp("adult") / "adult.csv"
    df.to_csv(path, index=False)
    return path


def _synthesize(inp, out, *extra):
    return ["synthesize", str(inp), "--schema", "adult", "--epsilon", "1", "--output", str(out),
            "--seed", "3", *extra]


def test_typo_exits_2_with_suggestion_and_spends_nothing(small_adult, tmp_path, capsys):
    out = tmp_path / "out.csv"
    assert main(_synthesize(small_adult, out, "--rowz", "10")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("beamsynth synthesize: error: unrecognized option --rowz "
                       "(did you mean --rows?): neither beamsynth nor Beam knows it")
    # nothing ran: no output, no dead letters, no manifest (so no spend recorded anywhere)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_same_command_spelled_right_runs(small_adult, tmp_path):
    # the counterpart of the test above: only the flag differs, and a Beam option passes through
    out = tmp_path / "out.csv"
    assert main(_synthesize(small_adult, out, "--rows", "10", "--runner", "direct",
                            "--direct_running_mode=in_memory", "--quiet")) == 0
    assert len(pd.read_csv(out)) == 10
    assert Path(f"{out}.manifest.json").exists()


@pytest.mark.parametrize("extra, message", [
    (["--direct_num_worker", "2"], "unrecognized option --direct_num_worker (did you mean "
                                   "--direct_num_workers?): neither beamsynth nor Beam knows it"),
    (["--beamsynth_seed=4"], "--beamsynth_seed is a pipeline option for Beam jobs that use "
                             "beamsynth from Python; on the command line use --seed"),
    (["stray"], "unexpected argument 'stray': every argument after the subcommand's own must be a "
                "--option of the subcommand or of Beam"),
])
def test_other_refusals(tmp_path, capsys, extra, message):
    # the input does not exist: a refusal must come before any reading
    args = ["histogram", str(tmp_path / "missing.csv"), "--column", "age", "--domain", "0..9",
            "--epsilon", "1", "--output", str(tmp_path / "h.csv"), *extra]
    assert main(args) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"beamsynth histogram: error: {message}"
    assert list(tmp_path.iterdir()) == []


def test_an_option_of_another_method_is_named_not_silently_ignored(small_adult, tmp_path, capsys):
    # `--target income` with the default --method independent ran without a word (twelfth session)
    out = tmp_path / "out.csv"
    assert main(_synthesize(small_adult, out, "--target", "income", "--pb-noise", "gaussian")) == 0
    err = capsys.readouterr().err
    assert ("beamsynth synthesize: warning: --target is not used by --method independent "
            "(it is an option of --method privbayes)") in err, err
    assert "--pb-noise is not used by --method independent" in err, err
    assert out.exists()  # a warning, not a refusal


def test_options_of_the_chosen_method_and_defaults_are_not_named():
    from beamsynth.pipelines.methods.registry import options_for_other_methods

    # its own options (also shared ones such as --input-rows) and untouched defaults: nothing
    assert options_for_other_methods("privbayes", {"target": "income", "input_rows": 10,
                                                   "k": None, "burn_in": None}) == {}
    # plausible's generator does not read privbayes' flags
    assert options_for_other_methods("plausible", {"degree": 2}) == {"--degree": ["privbayes"]}
