"""Session 11 (H33): an open-data portal's nightly operator, a simulated week of ``beamsynth release``.

What the week found, each checked here through the CLI as the operator runs it:

1. A night whose input is empty was refused with "pass --allow-empty to release from it anyway",
   an option ``beamsynth release`` does not have (trying it: "unrecognized option --allow-empty (did
   you mean --dataflow_endpoint?)"). The refusal now says what a release does: nothing was spent,
   rerun the night once the input holds records, or skip it; the rerun then publishes.
2. A schema whose domain does not match the data (every row a dead letter) published a table
   built from 0 rows with only "read 2000 rows, rejected 2000" in the progress lines, and nothing
   at all under --quiet; ``beamsynth synthesize`` warns there with the top reasons and the
   dead-letter file. The release now prints that warning per table on the private console, and
   still publishes (whether a release happens never depends on the data: rule 7).
3. The private quality report of that release showed "mean TVD 0.0000" for 1-, 2- and 3-way
   marginals: with no real (or no synthetic) row, both sides' tables are uniform by convention,
   so the report claimed a perfect fit of nothing. It now says the TVD was not computed and why.
4. After a night killed with SIGKILL, ``ledger show`` listed it as ``pending`` and counted its ε
   with no word on what that meant or what to do; ``ledger reconcile`` with nothing to decide
   printed nothing at all. A pending row now says whether its process still runs and, when it has
   ended, to run ``beamsynth ledger reconcile LEDGER`` (or the next release); reconcile says when
   there was nothing to decide.
5. A user preparing a new table ran ``beamsynth schema draft`` on the new CSV itself and got "a
   CSV codebook needs a header with at least 'column' and 'type'" (after parsing every data row),
   with no word that draft never reads data or what to write instead. The header is now judged
   first, and the message shows it and says to write a codebook from the data's documentation.
6. The public report called a histogram table's released categories "20 synthetic rows released"
   (PUMA histogram of 400 ACS records: 20 rows of category, noisy count, no synthetic record). It
   now says "20 categories released".
7. A night refused by a rolling window (``window_days``) said how much was spent and left, not
   when the window would have room again; the operator could only guess when to retry. The
   refusal now names the first time the release fits (the commit time of the spends that must
   leave the window, plus ``window_days``), or says the release alone is larger than the window;
   a lifetime refusal says the budget never renews and what is left for every later release
   (or, for a release spending δ on a source whose policy allows none, that only δ=0 releases can
   charge it: it said "no later release" in the first version of this fix).
8. Starting a night again while its first run was still going was refused with "if that process
   is gone, run `beamsynth ledger reconcile --force`" (no ledger path, and --force aborts runs
   that may be alive). On the same host the run is known to be alive: it now says to wait and
   names ``ledger show LEDGER``; for a run on another host it names ``reconcile --force LEDGER``.
9. ``release --check`` before the first night (no ledger file yet) said "ok: ... the ledger has
   room" without comparing the spends with the policies, and the real run was then refused
   (privbayes with ``pb_noise: auto`` spends δ=1e-9; the policy ``{epsilon: 4.0}`` allows δ=0).
   --check now asks an empty ledger in a temp folder, as the first release's reservation does;
   it still creates no ledger file.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from beamsynth.pipelines.cli.main import main
from beamsynth.pipelines.releases.ledger import (
    LedgerBudgetExceededError,
    LedgerPolicy,
    LedgerSpend,
    PrivacyLedger,
)
from beamsynth.pipelines.releases.report import private_report_html, public_report_html
from beamsynth.schemas.schema import load_schema

ROOT = Path(__file__).resolve().parents[2]
ADULT = ROOT / "examples" / "data" / "adult" / "adult.csv"
needs_adult = pytest.mark.skipif(not ADULT.exists(), reason="examples/data/adult/adult.csv absent")

_CONFIG = """
name: nightly
folder: {root}/rel/nightly-{{date}}
budget: {{epsilon: 1.0}}
ledger: {{path: {root}/ledger.sqlite, policies: {{adult: {{epsilon: 10}}}}}}
seed: 3
demo: true
tables:
  - name: adult
    input: {data}
    schema: {schema}
    epsilon: 1.0
    columns: [age, sex, income]
    formats: [csv]
reports: {{private: {private}, public: false}}
"""


def _adult(n: int) -> str:
    lines = ADULT.read_text(encoding="utf-8").splitlines()
    return "\n".join(lines[:n + 1]) + "\n"


def _config(tmp_path: Path, data: Path, *, schema: str = "adult", private: bool = False) -> Path:
    cfg = tmp_path / "release.yaml"
    cfg.write_text(_CONFIG.format(root=tmp_path, data=data, schema=schema,
                                  private=str(private).lower()), encoding="utf-8")
    return cfg


def _states(tmp_path: Path) -> list[str]:
    con = sqlite3.connect(tmp_path / "ledger.sqlite")
    try:
        return [r[0] for r in con.execute("SELECT state FROM releases ORDER BY created")]
    finally:
        con.close()


@needs_adult
def test_an_empty_night_says_what_a_release_can_do(tmp_path, capsys):
    data = tmp_path / "adult.csv"
    data.write_text(_adult(0), encoding="utf-8")  # header only: nothing came in tonight
    cfg = _config(tmp_path, data)
    rc = main(["--quiet", "release", str(cfg), "--date", "2026-03-03"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "--allow-empty" not in err, err  # beamsynth release has no such option
    assert "nothing was spent" in err and "rerun this night" in err, err
    assert _states(tmp_path) == ["aborted"]
    assert not (tmp_path / "rel" / "nightly-2026-03-03").exists()
    data.write_text(_adult(60), encoding="utf-8")  # the night's rows arrive: the rerun publishes
    assert main(["--quiet", "release", str(cfg), "--date", "2026-03-03"]) == 0
    assert _states(tmp_path) == ["aborted", "committed"]
    assert json.loads((tmp_path / "rel" / "nightly-2026-03-03" / "release.json").read_text())["name"] == "nightly"


@needs_adult
def test_a_release_warns_when_most_rows_are_dead_letters(tmp_path, capsys):
    data = tmp_path / "adult.csv"  # the night's export wrote sex as M/F: outside the declared domain
    data.write_text(_adult(80).replace(",Male,", ",M,").replace(",Female,", ",F,"), encoding="utf-8")
    cfg = _config(tmp_path, data)
    assert main(["--quiet", "release", str(cfg), "--date", "2026-03-04"]) == 0  # published anyway
    err = capsys.readouterr().err
    folder = tmp_path / "rel" / "nightly-2026-03-04"
    op = json.loads((folder / "private" / "adult.manifest.json").read_text())["operational"]
    assert (op["rows_read"], op["rows_rejected"]) == (80, 80)
    assert "table adult: warning: 80 of 80 rows (100.0%) were rejected" in err, err
    assert "column 'sex'" in err and str(folder / "private" / "adult.rejected.jsonl") in err, err
    assert "--warn-rejected" not in err  # an option the release does not have
    data.write_text(_adult(80), encoding="utf-8")  # a clean night: no warning
    assert main(["--quiet", "release", str(cfg), "--date", "2026-03-05"]) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("real_rows, synth_rows, missing", [
    (0, 0, "no real and no synthetic rows"), (0, 30, "no real rows"), (30, 0, "no synthetic rows")])
def test_the_private_report_claims_no_fit_without_rows(real_rows, synth_rows, missing):
    pytest.importorskip("matplotlib")
    schema = load_schema("adult").select(["age", "sex", "income"])
    real = np.zeros((real_rows, 3), dtype=np.int64)  # codes of the records the release used
    synth = pd.DataFrame({"age": ["40"] * synth_rows, "sex": ["Male"] * synth_rows,
                          "income": ["<=50K"] * synth_rows})
    page = private_report_html(schema, real, synth, real_dropped=80 if real_rows == 0 else 0)
    assert f"TVD not computed: {missing} to compare" in page
    assert "mean TVD" not in page


def test_ledger_show_says_what_to_do_about_a_killed_night(tmp_path, capsys):
    path = tmp_path / "ledger.sqlite"
    ledger = PrivacyLedger(path)
    spend = [LedgerSpend(source="adult", privacy_unit="record", step="adult.marginals", epsilon=0.8,
                         delta=0.0, mechanism="discrete Laplace")]
    rid = ledger.reserve(run_key="nightly@/x/n-04", name="nightly", folder=str(tmp_path / "n-04"),
                         spends=spend, policies={"adult": LedgerPolicy(epsilon=4.0)})
    assert main(["ledger", "show", str(path)]) == 0  # this process holds it: still running
    assert f"(running: process {ledger.releases()[0]['pid']}" in capsys.readouterr().out
    proc = subprocess.Popen([sys.executable, "-c", "pass"])  # the night's process, killed
    proc.wait()
    with sqlite3.connect(path) as con:
        con.execute("UPDATE releases SET pid = ? WHERE release_id = ?", (proc.pid, rid))
    assert main(["ledger", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"its process {proc.pid} has ended without finishing" in out, out
    assert f"beamsynth ledger reconcile {path}" in out
    assert main(["ledger", "reconcile", str(path)]) == 0
    assert capsys.readouterr().out == f"{rid}: aborted\n"
    assert main(["ledger", "reconcile", str(path)]) == 0
    assert capsys.readouterr().out.startswith("nothing to decide: no pending reservation of an ended run")


def test_schema_draft_on_the_data_itself_says_what_draft_reads(tmp_path, capsys):
    data = tmp_path / "new_table.csv"
    data.write_text("PUMA,AGEP,SEX\n01-01301,18,2\n01-01301,27,1\n", encoding="utf-8")
    assert main(["schema", "draft", str(data), "--output", str(tmp_path / "s.yaml")]) == 2
    err = capsys.readouterr().err
    assert "its header is ['PUMA', 'AGEP', 'SEX']" in err, err
    assert "never the data" in err and "docs/schema-guide.md" in err
    assert "01-01301" not in err  # no value of a data row is echoed
    assert not (tmp_path / "s.yaml").exists()
    codebook = tmp_path / "codebook.csv"
    codebook.write_text("column,type\n", encoding="utf-8")  # a header without rows
    assert main(["schema", "draft", str(codebook)]) == 2
    assert "the CSV codebook lists no column" in capsys.readouterr().err


def test_the_public_report_calls_histogram_rows_categories():
    spend = {"step": "cathist.PUMA", "mechanism": "CatHist: discrete Laplace on every declared bin",
             "epsilon": 0.5, "delta": 0.0, "details": {"scale": 2.0, "sensitivity": 1}}
    table = {"source": "acs", "command": "histogram", "method": "cathist", "rows_out": 20,
             "privacy_unit": {"privacy_id": None, "max_contributions": 1},
             "randomness": "seeded: not for release", "budget": {"spends": [spend]}}
    release = {"name": "portal", "release_id": "x", "created": "2026-03-02",
               "budget": {"epsilon": 0.5, "delta": 0.0}, "spent": {"epsilon": 0.5, "delta": 0.0},
               "tables": {"puma": table}}
    page = public_report_html(release, {}, {})  # no histogram frame: no plot needed here
    assert "20 categories released" in page and "synthetic rows" not in page
    table.update(command="release", method="privbayes")
    assert "20 synthetic rows released" in public_report_html(release, {}, {})


def test_a_rolling_window_refusal_says_when_the_night_fits(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    policy = {"acs": LedgerPolicy(epsilon=1.0, window_days=2, data_retention_days=1)}

    def spend(eps: float) -> list[LedgerSpend]:
        return [LedgerSpend(source="acs", privacy_unit="record", step="puma.cathist.PUMA",
                            epsilon=eps, delta=0.0, mechanism="CatHist")]

    for night, eps, committed in ((1, 0.4, "2026-03-01T10:00:00+00:00"),
                                  (2, 0.4, "2026-03-02T09:30:00+00:00")):
        rid = ledger.reserve(run_key=f"n@{night}", name="n", folder=str(tmp_path / str(night)),
                             spends=spend(eps), policies=policy)
        ledger.begin_publish(rid)
        ledger.commit(rid)
        with sqlite3.connect(ledger.path) as con:  # as if committed on those days, within 2 days
            con.execute("UPDATE releases SET updated = ? WHERE release_id = ?", (committed, rid))
    import beamsynth.pipelines.releases.ledger as ledger_module

    now = ledger_module._dt.datetime(2026, 3, 2, 12, 0, tzinfo=ledger_module._dt.timezone.utc)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ledger_module, "_now", lambda: now)
        with pytest.raises(LedgerBudgetExceededError) as exc:  # needs night 1's 0.4 to leave
            ledger.check(run_key="n@3", spends=spend(0.4), policies=policy)
        assert "fits from 2026-03-03T10:00:01 UTC on" in str(exc.value), str(exc.value)
        with pytest.raises(LedgerBudgetExceededError) as exc:  # needs both to leave
            ledger.check(run_key="n@3", spends=spend(0.7), policies=policy)
        assert "fits from 2026-03-04T09:30:01 UTC on" in str(exc.value), str(exc.value)
        with pytest.raises(LedgerBudgetExceededError) as exc:
            ledger.check(run_key="n@3", spends=spend(1.5), policies=policy)
        assert "this release alone needs more than the window's" in str(exc.value)


def test_a_night_started_twice_says_to_wait(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    spend = [LedgerSpend(source="adult", privacy_unit="record", step="adult.marginals", epsilon=0.8,
                         delta=0.0, mechanism="discrete Laplace")]
    policy = {"adult": LedgerPolicy(epsilon=4.0)}
    rid = ledger.reserve(run_key="n@05", name="n", folder=str(tmp_path / "n-05"), spends=spend,
                         policies=policy)  # held by this (live) process
    with pytest.raises(Exception) as exc:
        ledger.check(run_key="n@05", spends=spend, policies=policy)
    assert f"still running on this host: wait for it to end, then see `beamsynth ledger show {ledger.path}`" \
        in str(exc.value), str(exc.value)
    assert "--force" not in str(exc.value)
    with sqlite3.connect(ledger.path) as con:
        con.execute("UPDATE releases SET host = 'worker-7' WHERE release_id = ?", (rid,))
    with pytest.raises(Exception) as exc:
        ledger.check(run_key="n@05", spends=spend, policies=policy)
    assert f"`beamsynth ledger reconcile --force {ledger.path}`" in str(exc.value), str(exc.value)


def test_a_lifetime_refusal_says_it_never_renews(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    policy = {"adult": LedgerPolicy(epsilon=4.0)}

    def spend(eps: float) -> list[LedgerSpend]:
        return [LedgerSpend(source="adult", privacy_unit="record", step="adult.marginals",
                            epsilon=eps, delta=0.0, mechanism="discrete Laplace")]

    for night in range(4):  # 4 × 0.9 = 3.6 of 4
        rid = ledger.reserve(run_key=f"n@{night}", name="n", folder=str(tmp_path / str(night)),
                             spends=spend(0.9), policies=policy)
        ledger.begin_publish(rid)
        ledger.commit(rid)
    with pytest.raises(LedgerBudgetExceededError) as exc:
        ledger.check(run_key="n@4", spends=spend(0.9), policies=policy)
    assert ("a lifetime budget never renews: only ε=0.4 is left for every later release on this "
            "source (lower this release's budget to fit, or stop releasing it)") in str(exc.value)
    rid = ledger.reserve(run_key="n@4", name="n", folder=str(tmp_path / "4"), spends=spend(0.4),
                         policies=policy)
    ledger.begin_publish(rid)
    ledger.commit(rid)
    with pytest.raises(LedgerBudgetExceededError) as exc:
        ledger.check(run_key="n@5", spends=spend(0.9), policies=policy)
    assert "a lifetime budget never renews: no later release can charge this source" in str(exc.value)


@needs_adult
def test_check_before_the_first_night_compares_spends_with_the_policies(tmp_path, capsys):
    data = tmp_path / "adult.csv"
    data.write_text(_adult(60), encoding="utf-8")
    cfg = _config(tmp_path, data)
    text = cfg.read_text(encoding="utf-8")
    cfg.write_text(text.replace("{epsilon: 10}", "{epsilon: 0.5}"), encoding="utf-8")  # < the night's 1.0
    assert main(["release", str(cfg), "--date", "2026-03-01", "--check"]) == 2
    err = capsys.readouterr().err
    assert "cannot run: source 'adult': this release needs ε=1" in err, err
    assert not (tmp_path / "ledger.sqlite").exists()  # --check writes nothing
    assert main(["--quiet", "release", str(cfg), "--date", "2026-03-01"]) == 2  # as the run does
    cfg.write_text(text.replace("budget: {epsilon: 1.0}", "budget: {epsilon: 1.0, delta: 1e-9}")
                   .replace("    epsilon: 1.0\n", "    epsilon: 1.0\n    delta: 1e-9\n"
                            "    method: privbayes\n    options: {pb_noise: gaussian}\n"), encoding="utf-8")
    (tmp_path / "ledger.sqlite").unlink(missing_ok=True)
    assert main(["release", str(cfg), "--date", "2026-03-01", "--check"]) == 2
    err = capsys.readouterr().err
    assert ("its policy allows no δ: only releases spending δ=0 (pure-ε mechanisms) can charge this "
            "source (ε=10 left)") in err, err
