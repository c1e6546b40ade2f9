"""The SQLite privacy ledger: policies, exactly-once reservations, reconciliation, concurrency."""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from beamsynth.pipelines.releases.ledger import (
    RELEASE_MARKER,
    LedgerBudgetExceededError,
    LedgerError,
    LedgerPolicy,
    LedgerSpend,
    PrivacyLedger,
    format_budget,
    format_ledger,
    temp_folder,
    unit_label,
)

POLICY = {"src": LedgerPolicy(epsilon=3.0)}


def _spend(eps: float = 1.0, source: str = "src", delta: float = 0.0) -> list[LedgerSpend]:
    return [LedgerSpend(source=source, privacy_unit="record", step="t.marginals", epsilon=eps,
                        delta=delta, mechanism="discrete Laplace")]


def _reserve(ledger: PrivacyLedger, key: str, folder: Path, eps: float = 1.0,
             source: str = "src") -> str:
    return ledger.reserve(run_key=key, name="n", folder=str(folder), spends=_spend(eps, source),
                          policies=POLICY)


def _publish(folder: Path, release_id: str) -> None:
    folder.mkdir(parents=True)
    (folder / RELEASE_MARKER).write_text(json.dumps({"release_id": release_id}))


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _set_owner(ledger: PrivacyLedger, rid: str, pid: int) -> None:
    with sqlite3.connect(ledger.path) as con:
        con.execute("UPDATE releases SET pid = ? WHERE release_id = ?", (pid, rid))


def test_policy_refuses_overspend_and_commit_counts(tmp_path: Path) -> None:
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    for night in range(3):
        rid = _reserve(ledger, f"night{night}", tmp_path / f"n{night}")
        _publish(tmp_path / f"n{night}", rid)
        ledger.commit(rid)
    with pytest.raises(LedgerBudgetExceededError,
                       match=r"needs ε=0.5 but the ledger has already spent ε=3 of its lifetime ε=3"):
        _reserve(ledger, "night3", tmp_path / "n3", eps=0.5)
    assert [r["state"] for r in ledger.releases()] == ["committed"] * 3
    assert ledger.summary()[0]["epsilon_spent"] == pytest.approx(3.0)
    text = format_ledger(ledger)
    assert "spent ε=3 of lifetime ε=3 (ε=0 left)" in text and text.count("committed") == 3


def test_delta_is_budgeted_too(tmp_path: Path) -> None:
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    pol = {"src": LedgerPolicy(epsilon=10.0, delta=1e-6)}
    ledger.reserve(run_key="a", name="n", folder=str(tmp_path / "a"), spends=_spend(1.0, delta=1e-6),
                   policies=pol)
    with pytest.raises(LedgerBudgetExceededError, match="δ") as info:
        ledger.reserve(run_key="b", name="n", folder=str(tmp_path / "b"),
                       spends=_spend(1.0, delta=1e-7), policies=pol)
    assert "(ε=9, δ=0 left)" in str(info.value)  # δ is the limit here: its remainder is named too


def test_pending_reservations_of_live_processes_count(tmp_path: Path) -> None:
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    _reserve(ledger, "a", tmp_path / "a", eps=2.0)  # this process: alive, pending
    with pytest.raises(LedgerBudgetExceededError):
        _reserve(ledger, "b", tmp_path / "b", eps=2.0)
    with pytest.raises(LedgerError, match="is running"):
        _reserve(ledger, "a", tmp_path / "a", eps=0.5)


def test_reconcile_aborts_unpublished_and_commits_published(tmp_path: Path) -> None:
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    lost = _reserve(ledger, "lost", tmp_path / "lost")
    done = _reserve(ledger, "done", tmp_path / "done")
    _publish(tmp_path / "done", done)  # killed after the rename, before commit
    dead = _dead_pid()
    _set_owner(ledger, lost, dead)
    _set_owner(ledger, done, dead)
    assert sorted(ledger.reconcile()) == sorted([(lost, "aborted"), (done, "committed")])
    assert ledger.summary()[0]["epsilon_spent"] == pytest.approx(1.0)
    # the lost night can run again, exactly once; the published one cannot
    again = _reserve(ledger, "lost", tmp_path / "lost")
    ledger.commit(again)
    with pytest.raises(LedgerError, match="already published"):
        _reserve(ledger, "lost", tmp_path / "lost")
    with pytest.raises(LedgerError, match="already published"):
        _reserve(ledger, "done", tmp_path / "done")


def test_aborting_a_killed_release_deletes_its_unpublished_outputs(tmp_path: Path) -> None:
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    rid = _reserve(ledger, "night", tmp_path / "night")
    tmp = Path(temp_folder(str(tmp_path / "night"), rid))
    (tmp / "public").mkdir(parents=True)
    (tmp / "public" / "table.csv").write_text("a,b\n1,2\n")  # finished but never published
    _set_owner(ledger, rid, _dead_pid())
    assert ledger.reconcile() == [(rid, "aborted")]
    assert not tmp.exists()  # the spend was refunded: its outputs must not survive


def test_a_folder_of_another_release_does_not_commit_a_reservation(tmp_path: Path) -> None:
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    rid = _reserve(ledger, "x", tmp_path / "x")
    _publish(tmp_path / "x", "someone-else")
    _set_owner(ledger, rid, _dead_pid())
    assert ledger.reconcile() == [(rid, "aborted")]


def _backdate(ledger: PrivacyLedger, days: float) -> None:
    """Move every release ``days`` into the past (a night of long ago)."""
    import datetime as dt

    with sqlite3.connect(ledger.path) as con:
        for rid, created, updated in con.execute("SELECT release_id, created, updated FROM releases").fetchall():
            when = dt.datetime.fromisoformat(created) - dt.timedelta(days=days)
            done = dt.datetime.fromisoformat(updated) - dt.timedelta(days=days)
            con.execute("UPDATE releases SET created = ?, updated = ? WHERE release_id = ?",
                        (when.isoformat(timespec="microseconds"), done.isoformat(timespec="microseconds"), rid))


def test_rolling_window_frees_old_spends_and_shows_the_lifetime_total(tmp_path: Path) -> None:
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    pol = {"src": LedgerPolicy(epsilon=1.0, window_days=30, data_retention_days=7)}
    rid = ledger.reserve(run_key="old", name="n", folder=str(tmp_path / "o"), spends=_spend(1.0),
                         policies=pol)
    ledger.commit(rid)
    with pytest.raises(LedgerBudgetExceededError, match="per 30 days"):
        ledger.reserve(run_key="new", name="n", folder=str(tmp_path / "n"), spends=_spend(1.0),
                       policies=pol)
    _backdate(ledger, 31)
    ledger.reserve(run_key="new", name="n", folder=str(tmp_path / "n"), spends=_spend(1.0), policies=pol)
    (s,) = ledger.summary()
    assert s["epsilon_spent"] == pytest.approx(1.0) and s["epsilon_left"] == 0
    assert s["lifetime"] == {"epsilon": pytest.approx(2.0), "delta": 0.0, "releases": 2}
    text = format_ledger(ledger)
    assert "spent ε=1 in the last 30 days of ε=1 per 30 days (input keeps a record at most 7 days)" in text
    assert "lifetime total ε=2 over 2 release(s)" in text and "renews only because" in text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"window_days": 30}, r"window_days \(30\) renews .* declare data_retention_days \(at most 30"),
     ({"window_days": 30, "data_retention_days": 31},
      r"data_retention_days \(31\) must be <= window_days \(30\)"),
     ({"data_retention_days": 3}, r"data_retention_days \(3\) only applies to a rolling window"),
     ({"window_days": 30, "data_retention_days": 0}, r"data_retention_days \(0\) must be a number > 0")],
)
def test_renewal_needs_a_data_retention_declaration(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LedgerPolicy(epsilon=1.0, **kwargs)


def test_a_stored_window_without_declaration_no_longer_renews(tmp_path: Path) -> None:
    """A ledger written before the declaration existed: its window is read as a lifetime budget."""
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    with sqlite3.connect(ledger.path) as con:
        con.execute("INSERT INTO sources (source, epsilon, delta, window_days, created) "
                    "VALUES ('src', 1.0, 0.0, 30, '2000-01-01T00:00:00+00:00')")
    assert ledger.policy("src") == LedgerPolicy(epsilon=1.0)
    rid = ledger.reserve(run_key="a", name="n", folder=str(tmp_path / "a"), spends=_spend(1.0),
                         policies={"src": LedgerPolicy(epsilon=1.0)})
    ledger.commit(rid)
    _backdate(ledger, 365)
    with pytest.raises(LedgerBudgetExceededError, match="of its lifetime ε=1"):
        ledger.reserve(run_key="b", name="n", folder=str(tmp_path / "b"), spends=_spend(0.5),
                       policies={"src": LedgerPolicy(epsilon=1.0)})


def _unit_spend(eps: float, pid: str | None, k: int = 1) -> list[LedgerSpend]:
    return [LedgerSpend(source="src", privacy_unit=unit_label(pid, k), step="t.m", epsilon=eps,
                        delta=0.0, mechanism="m", privacy_id=pid, max_contributions=k)]


def test_a_source_is_charged_under_one_privacy_unit(tmp_path: Path) -> None:
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    pol = {"src": LedgerPolicy(epsilon=10.0)}
    ledger.commit(ledger.reserve(run_key="a", name="n", folder=str(tmp_path / "a"),
                                 spends=_unit_spend(1.0, "pid", 3), policies=pol))
    # another bound on contributions of the same person: each release is ε-DP per person, they add
    ledger.commit(ledger.reserve(run_key="b", name="n", folder=str(tmp_path / "b"),
                                 spends=_unit_spend(1.0, "pid", 5), policies=pol))
    for pid in (None, "household"):
        with pytest.raises(LedgerError, match=r"different privacy units do not add up"):
            ledger.reserve(run_key="c", name="n", folder=str(tmp_path / "c"),
                           spends=_unit_spend(1.0, pid), policies=pol)
    with pytest.raises(LedgerError, match=r"per privacy id 'pid' and per record"):  # one release
        ledger.reserve(run_key="c", name="n", folder=str(tmp_path / "c"),
                       spends=_unit_spend(1.0, "pid") + _unit_spend(1.0, None), policies=pol)
    (s,) = ledger.summary()
    assert [u["unit"] for u in s["units"]] == ["privacy id 'pid'"]
    assert s["units"][0]["max_contributions"] == [3, 5] and s["lifetime"]["epsilon"] == 2.0
    assert "src [privacy id 'pid' ≤3/5 records each]: spent ε=2 of lifetime ε=10" in format_ledger(ledger)


def test_a_ledger_mixing_units_adds_nothing_across_them(tmp_path: Path) -> None:
    """Spends written before the one-unit rule (legacy rows): shown per unit, never summed."""
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    pol = {"src": LedgerPolicy(epsilon=10.0)}
    ledger.commit(ledger.reserve(run_key="a", name="n", folder=str(tmp_path / "a"),
                                 spends=_unit_spend(1.0, None), policies=pol))
    with sqlite3.connect(ledger.path) as con:  # a legacy row: unit label only, no privacy_id
        rid = con.execute("SELECT release_id FROM releases").fetchone()[0]
        con.execute("INSERT INTO spends (release_id, source, privacy_unit, step, epsilon, delta, "
                    "mechanism) VALUES (?, 'src', 'pid×2', 't.x', 2.0, 0.0, 'm')", (rid,))
    (s,) = ledger.summary()
    assert s["lifetime"] is None and [u["epsilon"] for u in s["units"]] == [2.0, 1.0]
    text = format_ledger(ledger)
    assert "NOT added up" in text and "record: lifetime total ε=1" in text
    assert "privacy id 'pid': lifetime total ε=2" in text and "(several privacy units" in text
    with pytest.raises(LedgerError, match="different privacy units"):
        ledger.reserve(run_key="b", name="n", folder=str(tmp_path / "b"),
                       spends=_unit_spend(0.1, None), policies=pol)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"privacy_unit": "record", "privacy_id": "pid"}, "privacy_unit 'record' takes no privacy_id"),
    ({"privacy_unit": "pid×3"}, r"must be 'record' or 'COLUMN×k' matching privacy_id \(None\)"),
    ({"privacy_unit": "pid×3", "privacy_id": "pid", "max_contributions": 2}, "matching privacy_id"),
    ({"privacy_unit": "record", "max_contributions": 0}, r"max_contributions \(0\) must be an int"),
])
def test_spend_unit_validation(kwargs: dict, message: str) -> None:
    base = {"source": "s", "step": "x", "epsilon": 1.0, "delta": 0.0, "mechanism": "m"}
    with pytest.raises(ValueError, match=message):
        LedgerSpend(**base, **kwargs)


def test_budgets_print_rounded(tmp_path: Path) -> None:
    assert [format_budget(x) for x in (4.440892098500626e-16, -1e-13, 0.1 + 0.2, 2.0, 1e-6)] == \
        ["0", "0", "0.3", "2", "1e-06"]
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    pol = {"src": LedgerPolicy(epsilon=0.3)}
    for i, eps in enumerate((0.1, 0.2)):
        ledger.commit(ledger.reserve(run_key=f"r{i}", name="n", folder=str(tmp_path / f"r{i}"),
                                     spends=_spend(eps), policies=pol))
    assert ledger.summary()[0]["epsilon_left"] == 0.0
    text = format_ledger(ledger)
    assert "spent ε=0.3 of lifetime ε=0.3 (ε=0 left)" in text and "e-1" not in text


def test_check_reports_a_published_night_and_reserves_nothing(tmp_path: Path) -> None:
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    ledger.check(run_key="a", spends=_spend(1.0), policies=POLICY)  # room, nothing written
    assert ledger.releases() == [] and ledger.summary() == []
    rid = _reserve(ledger, "a", tmp_path / "a")
    with pytest.raises(LedgerError, match="is running"):
        ledger.check(run_key="a", spends=_spend(1.0), policies=POLICY)
    ledger.commit(rid)
    with pytest.raises(LedgerError, match="already published"):
        ledger.check(run_key="a", spends=_spend(1.0), policies=POLICY)
    with pytest.raises(LedgerBudgetExceededError, match="needs ε=2.5"):
        ledger.check(run_key="b", spends=_spend(2.5), policies=POLICY)
    assert len(ledger.releases()) == 1


def test_policy_cannot_be_changed_by_a_release(tmp_path: Path) -> None:
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    _reserve(ledger, "a", tmp_path / "a")
    with pytest.raises(LedgerError, match="cannot change a source's policy"):
        ledger.reserve(run_key="b", name="n", folder=str(tmp_path / "b"), spends=_spend(),
                       policies={"src": LedgerPolicy(epsilon=100.0)})


def test_failed_reservation_writes_nothing(tmp_path: Path) -> None:
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    with pytest.raises(LedgerError, match="no budget policy"):
        _reserve(ledger, "a", tmp_path / "a", source="other")
    with pytest.raises(LedgerBudgetExceededError):
        _reserve(ledger, "a", tmp_path / "a", eps=5.0)
    assert ledger.releases() == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"epsilon": 0}, r"policy epsilon \(0\) must be a finite number > 0"),
     ({"epsilon": 1, "delta": 1}, r"policy delta \(1\) must be in \[0, 1\)"),
     ({"epsilon": 1, "window_days": -2}, r"policy window_days \(-2\) must be a number > 0"),
     ({"epsilon": "1"}, "policy epsilon must be a number, got '1'")],
)
def test_policy_validation(kwargs: dict, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        LedgerPolicy(**kwargs)


def _race(args: tuple[str, str, int]) -> str:
    path, folder, i = args
    ledger = PrivacyLedger(path)
    try:
        rid = ledger.reserve(run_key=f"r{i}", name="n", folder=f"{folder}/{i}", spends=_spend(1.0),
                             policies=POLICY)
    except LedgerBudgetExceededError:
        return "refused"
    ledger.commit(rid)
    return "committed"


def test_concurrent_releases_never_overspend(tmp_path: Path) -> None:
    path = str(tmp_path / "l.sqlite")
    PrivacyLedger(path)
    ctx = multiprocessing.get_context("spawn" if sys.platform == "darwin" else "fork")
    with ctx.Pool(6) as pool:
        results = pool.map(_race, [(path, str(tmp_path), i) for i in range(6)])
    assert sorted(results) == ["committed"] * 3 + ["refused"] * 3
    assert PrivacyLedger(path).summary()[0]["epsilon_spent"] == pytest.approx(3.0)
    assert os.path.exists(path)


def test_a_force_aborted_release_that_publishes_still_counts(tmp_path: Path) -> None:
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    running = _reserve(ledger, "a", tmp_path / "a")
    crashed = _reserve(ledger, "b", tmp_path / "b")
    assert sorted(s for _, s in ledger.reconcile(force=True)) == ["aborted", "aborted"]
    assert ledger.summary()[0]["epsilon_spent"] == 0
    _publish(tmp_path / "a", running)
    ledger.commit(running)  # the run finished after all: its outputs are public
    _publish(tmp_path / "b", crashed)  # published, then killed before commit
    assert ledger.reconcile() == [(crashed, "committed")]
    assert ledger.summary()[0]["epsilon_spent"] == pytest.approx(2.0)
    with pytest.raises(LedgerError, match="is committed, not pending"):
        ledger.abort(running, "too late")


def _testfs_release(tmp_path: Path, monkeypatch):
    """A one-table release (CatHist of Adult's sex, ε=1) into ``testfs://rel/night-2026-11-27``
    (an object store: published file by file, ``release.json`` last) → (config, store folder)."""
    import pandas as pd

    from beamsynth.pipelines.releases.config import load_release_config
    from tests.unit.test_filesystems_writes import ADULT, SCHEME, PrefixFileSystem

    store = tmp_path / "store"
    store.mkdir()
    monkeypatch.setattr(PrefixFileSystem, "ROOT", str(store))
    data = tmp_path / "adult.csv"
    pd.read_csv(ADULT, nrows=300, dtype=str, keep_default_na=False).to_csv(data, index=False)
    config = tmp_path / "release.yaml"
    config.write_text(f"""
name: night
folder: {SCHEME}://rel/night-{{date}}
budget: {{epsilon: 1.0}}
ledger: {{path: {tmp_path}/ledger.sqlite, policies: {{adult: {{epsilon: 10}}}}}}
tables:
  - {{name: sex, kind: histogram, input: {data}, schema: adult, column: sex, tolerance: 0.01,
      epsilon: 1.0}}
reports: {{private: false, public: false}}
""")
    return load_release_config(str(config), date="2026-11-27"), store / "rel/night-2026-11-27"


class _Killed(BaseException):
    """A SIGKILL stand-in: not an ``Exception``, so no handler of the run catches it."""


def _crash_on_marker(monkeypatch, before_each=None) -> None:
    """Object-store renames that die on the release's marker (killed while publishing);
    ``before_each()`` runs before every rename into the release folder (the publish)."""
    from beamsynth.pipelines.io import filesystem as fs

    rename = fs.FileSystems.rename

    def crash_on_marker(sources, destinations):
        if before_each is not None and any("/night-2026-11-27/" in d for d in destinations):
            before_each()
        if any(d.endswith(f"/night-2026-11-27/{RELEASE_MARKER}") for d in destinations):
            raise _Killed("killed while publishing")
        return rename(sources, destinations)

    monkeypatch.setattr(fs.FileSystems, "rename", crash_on_marker)


def _settle_after_the_crash(ledger: PrivacyLedger) -> dict:
    """The killed run's process is gone: reconcile, return its row."""
    (row,) = ledger.releases()
    _set_owner(ledger, row["release_id"], _dead_pid())
    ledger.reconcile()
    (row,) = ledger.releases()
    return row


def test_a_partly_published_release_still_counts(tmp_path: Path, monkeypatch) -> None:
    """On an object store a release folder is published file by file, ``release.json`` last. A
    crash (or SIGKILL) after the tables were moved but before the marker left the tables public
    while ``reconcile`` found no marker and *aborted* the reservation: the spend was refunded
    for outputs anyone could read (and the night could not be rerun to be charged: its folder
    exists). Through the real ``run_release`` on a ``testfs://`` folder, crash on the marker's
    rename: the reservation must stay charged."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from beamsynth.pipelines.releases.release import run_release

    cfg, folder = _testfs_release(tmp_path, monkeypatch)
    _crash_on_marker(monkeypatch)
    with pytest.raises(_Killed):
        run_release(cfg, PipelineOptions([]))
    assert (folder / "public/sex.csv").exists()  # public, no marker
    assert not (folder / RELEASE_MARKER).exists()
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    row = _settle_after_the_crash(ledger)
    assert row["state"] == "committed"
    assert ledger.summary()[0]["epsilon_spent"] == pytest.approx(1.0)
    with pytest.raises(LedgerError, match="already published"):
        ledger.check(run_key=row["run_key"], spends=_spend(0.1, "adult"),
                     policies={"adult": LedgerPolicy(epsilon=10)})


def test_a_release_force_aborted_while_it_runs_does_not_publish(tmp_path: Path, monkeypatch) -> None:
    """``ledger reconcile --force`` while the run was still going (its owner looked dead, or ran
    on another host) aborted the reservation and refunded its ε; the run went on and published.
    Fully published, ``commit`` charged it again, but a publish cut short (object store, killed
    before ``release.json``) left the tables public under the refund (HEAD before this test:
    public/sex.csv readable, row 'aborted', ε spent 0), and until the run committed its ε was
    free for other releases. Now the run claims its reservation before publishing and refuses to
    publish an aborted one: nothing public, the refund stands."""
    from apache_beam.options.pipeline_options import PipelineOptions

    import beamsynth.pipelines.releases.release as release_mod

    cfg, folder = _testfs_release(tmp_path, monkeypatch)
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    run_table = release_mod._run_histogram_table

    def force_abort_then_run(*args, **kw):  # the operator's `reconcile --force` mid-run
        assert [s for _, s in ledger.reconcile(force=True)] == ["aborted"]
        return run_table(*args, **kw)

    monkeypatch.setattr(release_mod, "_run_histogram_table", force_abort_then_run)
    _crash_on_marker(monkeypatch)
    with pytest.raises(LedgerError, match="aborted"):
        release_mod.run_release(cfg, PipelineOptions([]))
    assert not folder.exists()  # nothing published
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".night")]  # temp gone
    row = _settle_after_the_crash(ledger)
    assert row["state"] == "aborted" and ledger.summary()[0]["epsilon_spent"] == 0


def test_a_force_abort_during_the_publish_does_not_refund(tmp_path: Path, monkeypatch) -> None:
    """The other order: the run has begun publishing when ``reconcile --force`` comes. Its
    outputs may be public at any moment, so the forced reconcile charges it (never a refund),
    and after a crash before ``release.json`` the spend still counts."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from beamsynth.pipelines.releases.release import run_release

    cfg, folder = _testfs_release(tmp_path, monkeypatch)
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    forced: list = []
    _crash_on_marker(monkeypatch, lambda: forced or forced.append(ledger.reconcile(force=True)))
    with pytest.raises(_Killed):
        run_release(cfg, PipelineOptions([]))
    assert [s for _, s in forced[0]] == ["committed"]
    assert (folder / "public/sex.csv").exists() and not (folder / RELEASE_MARKER).exists()
    row = _settle_after_the_crash(ledger)
    assert row["state"] == "committed" and ledger.summary()[0]["epsilon_spent"] == pytest.approx(1.0)


def test_a_rolling_window_counts_a_release_from_when_it_read_its_data(tmp_path: Path) -> None:
    """The window counted a spend from its reservation (``created``), but a release reads its
    data after reserving, until it commits. With window = retention = 30 days, a night reserved
    30.5 days ago that ran for 2 days read records that entered up to 28.5 days ago and are still
    in today's input; not counting it let today's release spend the whole ε on them again (2ε on
    one record). Now a committed spend counts from its commit (``updated``), a pending one always."""
    import datetime as dt

    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    pol = {"src": LedgerPolicy(epsilon=1.0, window_days=30, data_retention_days=30)}
    rid = ledger.reserve(run_key="old", name="n", folder=str(tmp_path / "o"), spends=_spend(1.0),
                         policies=pol)
    ledger.commit(rid)
    now = dt.datetime.now(dt.timezone.utc)
    with sqlite3.connect(ledger.path) as con:
        con.execute("UPDATE releases SET created = ?, updated = ? WHERE release_id = ?",
                    ((now - dt.timedelta(days=30.5)).isoformat(timespec="microseconds"),
                     (now - dt.timedelta(days=28.5)).isoformat(timespec="microseconds"), rid))
    with pytest.raises(LedgerBudgetExceededError, match="per 30 days"):
        ledger.reserve(run_key="new", name="n", folder=str(tmp_path / "n"), spends=_spend(1.0),
                       policies=pol)
    with sqlite3.connect(ledger.path) as con:  # committed 30.5 days ago: its readers are gone
        con.execute("UPDATE releases SET updated = created WHERE release_id = ?", (rid,))
    ledger.reserve(run_key="new", name="n", folder=str(tmp_path / "n"), spends=_spend(1.0), policies=pol)


def test_begin_publish_claims_a_pending_reservation_only(tmp_path: Path) -> None:
    """``begin_publish`` refuses an aborted reservation; once claimed, ``abort`` and a forced
    reconcile never refund it while its owner may live; a dead owner that published nothing
    (no folder) is aborted as before."""
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    aborted = _reserve(ledger, "a", tmp_path / "a")
    ledger.reconcile(force=True)
    with pytest.raises(LedgerError, match="was aborted while it ran"):
        ledger.begin_publish(aborted)
    live, dead = _reserve(ledger, "b", tmp_path / "b"), _reserve(ledger, "c", tmp_path / "c")
    ledger.begin_publish(live)
    ledger.begin_publish(dead)
    with pytest.raises(LedgerError, match="began publishing"):
        ledger.abort(live, "failed")
    _set_owner(ledger, dead, _dead_pid())
    assert sorted(ledger.reconcile(force=True)) == sorted([(live, "committed"), (dead, "aborted")])
    assert ledger.summary()[0]["epsilon_spent"] == pytest.approx(1.0)
