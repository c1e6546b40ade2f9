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

from beamsynth.pipelines.ledger import (
    RELEASE_MARKER,
    LedgerBudgetExceededError,
    LedgerError,
    LedgerPolicy,
    LedgerSpend,
    PrivacyLedger,
    format_ledger,
    temp_folder,
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
    with pytest.raises(LedgerBudgetExceededError, match="δ"):
        ledger.reserve(run_key="b", name="n", folder=str(tmp_path / "b"),
                       spends=_spend(1.0, delta=1e-7), policies=pol)


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


def test_rolling_window_frees_old_spends(tmp_path: Path) -> None:
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    pol = {"src": LedgerPolicy(epsilon=1.0, window_days=30)}
    rid = ledger.reserve(run_key="old", name="n", folder=str(tmp_path / "o"), spends=_spend(1.0),
                         policies=pol)
    ledger.commit(rid)
    with pytest.raises(LedgerBudgetExceededError, match="per 30 days"):
        ledger.reserve(run_key="new", name="n", folder=str(tmp_path / "n"), spends=_spend(1.0),
                       policies=pol)
    with sqlite3.connect(ledger.path) as con:
        con.execute("UPDATE releases SET created = '2000-01-01T00:00:00.000000+00:00'")
    ledger.reserve(run_key="new", name="n", folder=str(tmp_path / "n"), spends=_spend(1.0), policies=pol)


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
