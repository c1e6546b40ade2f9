"""A persistent privacy ledger: what every release spent, against which source, exactly once.

The ledger is one SQLite file shared by every release of a portal. Each data source has a budget
policy (a lifetime total, or a rolling window of ``window_days``); a release **reserves** its spend
before any data is read and is refused when the reservation would exceed the policy.

Life of a release (see :func:`beamsynth.pipelines.release.run_release`)::

    reserve()   BEGIN IMMEDIATE: reconcile stale reservations, check the policy, insert
                the release as ``pending`` with its spends            → nothing read yet
    ...         run, write every output into a hidden temp folder
    publish     os.rename(temp folder, release folder)  (atomic, same file system)
    commit()    mark the release ``committed``

A crash or SIGKILL can stop this anywhere. :meth:`PrivacyLedger.reconcile` decides what a
``pending`` reservation whose process is gone means, from the file system alone:

* its release folder exists and carries its ``release_id`` → the outputs were published, the spend
  counts: the row becomes ``committed``;
* otherwise nothing was published → the row becomes ``aborted`` and its spend no longer counts, so
  the same night can be run again (exactly once: a second rerun finds the night ``committed``).

A pending reservation whose process is still alive on this host (or on another host, which we
cannot probe) keeps counting: concurrent releases never see each other's budget as free.
Concurrency between processes is handled by SQLite (``BEGIN IMMEDIATE`` and a busy timeout):
reservations are serialized, so two releases cannot both take the last ε.

Composition across releases is basic sequential composition of (ε, δ) on the same source, a
safe upper bound whether or not the nightly data overlap.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import shutil
import socket
import sqlite3
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "temp_folder",
    "LedgerBudgetExceededError",
    "LedgerError",
    "LedgerPolicy",
    "LedgerSpend",
    "PrivacyLedger",
    "RELEASE_MARKER",
    "format_ledger",
]

RELEASE_MARKER = "release.json"
"""File inside a published release folder that names its ``release_id``."""

_TOLERANCE = 1e-9
_SCHEMA = """
CREATE TABLE IF NOT EXISTS sources (
    source TEXT PRIMARY KEY,
    epsilon REAL NOT NULL,
    delta REAL NOT NULL,
    window_days REAL,
    created TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS releases (
    release_id TEXT PRIMARY KEY,
    run_key TEXT NOT NULL,
    name TEXT NOT NULL,
    folder TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'committed', 'aborted')),
    created TEXT NOT NULL,
    updated TEXT NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    note TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS releases_run_key ON releases (run_key, state);
CREATE TABLE IF NOT EXISTS spends (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    release_id TEXT NOT NULL REFERENCES releases (release_id),
    source TEXT NOT NULL REFERENCES sources (source),
    privacy_unit TEXT NOT NULL,
    step TEXT NOT NULL,
    epsilon REAL NOT NULL,
    delta REAL NOT NULL,
    mechanism TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS spends_source ON spends (source);
"""


class LedgerError(ValueError):
    """The ledger refuses an operation (a night already released, a policy change, ...)."""


class LedgerBudgetExceededError(LedgerError):
    """A reservation would exceed a source's budget policy (raised before any data is read)."""


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def _iso(t: _dt.datetime) -> str:
    return t.isoformat(timespec="microseconds")


@dataclass(frozen=True)
class LedgerPolicy:
    """Budget policy of one data source: at most (ε, δ) in total, or per ``window_days`` days."""

    epsilon: float
    delta: float = 0.0
    window_days: float | None = None

    def __post_init__(self) -> None:
        for name, v in (("epsilon", self.epsilon), ("delta", self.delta)):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TypeError(f"policy {name} must be a number, got {v!r}")
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"policy epsilon ({self.epsilon!r}) must be a finite number > 0")
        if not (0 <= self.delta < 1):
            raise ValueError(f"policy delta ({self.delta!r}) must be in [0, 1)")
        if self.window_days is not None and (
            isinstance(self.window_days, bool) or not isinstance(self.window_days, (int, float))
            or not (math.isfinite(self.window_days) and self.window_days > 0)
        ):
            raise ValueError(f"policy window_days ({self.window_days!r}) must be a number > 0")

    def describe(self) -> str:
        """Human form, e.g. ``lifetime ε=5`` or ``ε=2, δ=1e-06 per 30 days``."""
        amount = f"ε={self.epsilon:g}" + (f", δ={self.delta:g}" if self.delta else "")
        return f"lifetime {amount}" if self.window_days is None else f"{amount} per {self.window_days:g} days"


@dataclass(frozen=True)
class LedgerSpend:
    """One spend a release reserves against a source."""

    source: str
    privacy_unit: str
    step: str
    epsilon: float
    delta: float
    mechanism: str


def temp_folder(folder: str, release_id: str) -> str:
    """Where a release is assembled before its atomic rename to ``folder``."""
    parent, base = os.path.split(os.path.abspath(folder))
    return os.path.join(parent, f".{base}.tmp-{release_id}")


class PrivacyLedger:
    """The SQLite privacy ledger at ``path`` (created on first use).

    Args:
      path: the SQLite file.
      busy_timeout: seconds a writer waits for another release's transaction.
    """

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float = 60.0) -> None:
        if isinstance(busy_timeout, bool) or not isinstance(busy_timeout, (int, float)) or busy_timeout <= 0:
            raise ValueError(f"busy_timeout ({busy_timeout!r}) must be a number > 0")
        self.path = os.fspath(path)
        self._timeout = float(busy_timeout)
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        con = self._connect()
        try:
            con.executescript("BEGIN IMMEDIATE;" + _SCHEMA + "COMMIT;")
        finally:
            con.close()

    # -- plumbing ---------------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(self.path, timeout=self._timeout, isolation_level=None)
        con.row_factory = sqlite3.Row
        con.execute(f"PRAGMA busy_timeout = {int(self._timeout * 1000)}")
        con.execute("PRAGMA foreign_keys = ON")
        con.execute("PRAGMA synchronous = FULL")
        return con

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction taken with BEGIN IMMEDIATE (serializes writers across processes)."""
        con = self._connect()
        try:
            con.execute("BEGIN IMMEDIATE")
            try:
                yield con
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")
        finally:
            con.close()

    # -- policies ---------------------------------------------------------------------------------
    def policy(self, source: str) -> LedgerPolicy | None:
        """The stored policy of ``source`` (None if the source is unknown)."""
        con = self._connect()
        try:
            row = con.execute("SELECT * FROM sources WHERE source = ?", (source,)).fetchone()
        finally:
            con.close()
        return None if row is None else LedgerPolicy(row["epsilon"], row["delta"], row["window_days"])

    @staticmethod
    def _ensure_policy(con: sqlite3.Connection, source: str, policy: LedgerPolicy) -> None:
        row = con.execute("SELECT * FROM sources WHERE source = ?", (source,)).fetchone()
        if row is None:
            con.execute(
                "INSERT INTO sources (source, epsilon, delta, window_days, created) VALUES (?,?,?,?,?)",
                (source, policy.epsilon, policy.delta, policy.window_days, _iso(_now())))
            return
        stored = LedgerPolicy(row["epsilon"], row["delta"], row["window_days"])
        if stored != policy:
            raise LedgerError(
                f"source {source!r} has the policy {stored.describe()} in the ledger, but the "
                f"release asks for {policy.describe()}; a release cannot change a source's policy")

    # -- reconciliation ---------------------------------------------------------------------------
    @staticmethod
    def published_release_id(folder: str) -> str | None:
        """The ``release_id`` recorded in a published release folder (None if not published)."""
        try:
            with open(os.path.join(folder, RELEASE_MARKER), encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            return None
        rid = data.get("release_id") if isinstance(data, dict) else None
        return rid if isinstance(rid, str) else None

    @staticmethod
    def _owner_alive(host: str, pid: int) -> bool:
        if host != socket.gethostname():
            return True  # cannot probe another machine: keep the reservation
        if pid == os.getpid():
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # a zombie (killed, not yet reaped) is dead for our purposes
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
                return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return True

    def _reconcile(self, con: sqlite3.Connection, *, force: bool = False) -> list[tuple[str, str]]:
        decided = []
        for row in con.execute("SELECT * FROM releases WHERE state IN ('pending', 'aborted')").fetchall():
            published = self.published_release_id(row["folder"]) == row["release_id"]
            if row["state"] == "aborted":
                if published:  # force-aborted while still running, then published: it counts
                    con.execute("UPDATE releases SET state = 'committed', updated = ?, note = ? "
                                "WHERE release_id = ?",
                                (_iso(_now()), "published after being aborted: spend counts",
                                 row["release_id"]))
                    decided.append((row["release_id"], "committed"))
                continue
            if published:
                state, note = "committed", "outputs were published before the process ended"
            elif force or not self._owner_alive(row["host"], row["pid"]):
                state, note = "aborted", "process ended before publishing: spend released"
                # outputs computed under a refunded spend must not survive to be published later
                shutil.rmtree(temp_folder(row["folder"], row["release_id"]), ignore_errors=True)
            else:
                continue
            con.execute("UPDATE releases SET state = ?, updated = ?, note = ? WHERE release_id = ?",
                        (state, _iso(_now()), note, row["release_id"]))
            decided.append((row["release_id"], state))
        return decided

    def reconcile(self, *, force: bool = False) -> list[tuple[str, str]]:
        """Decide every stale ``pending`` reservation (see the module docstring).

        ``force=True`` also aborts unpublished reservations whose owner may still be alive (on
        another host): use it only when no release is running. Returns ``(release_id, state)``.
        """
        with self._transaction() as con:
            return self._reconcile(con, force=force)

    # -- spending ---------------------------------------------------------------------------------
    @staticmethod
    def _spent(con: sqlite3.Connection, source: str, policy: LedgerPolicy) -> tuple[float, float]:
        sql = ("SELECT s.epsilon, s.delta FROM spends s JOIN releases r USING (release_id) "
               "WHERE s.source = ? AND r.state IN ('pending', 'committed')")
        params: list[Any] = [source]
        if policy.window_days is not None:
            sql += " AND r.created >= ?"
            params.append(_iso(_now() - _dt.timedelta(days=policy.window_days)))
        rows = con.execute(sql, params).fetchall()
        return math.fsum(r[0] for r in rows), math.fsum(r[1] for r in rows)

    def reserve(
        self,
        *,
        run_key: str,
        name: str,
        folder: str,
        spends: Sequence[LedgerSpend],
        policies: Mapping[str, LedgerPolicy],
    ) -> str:
        """Reserve ``spends`` as a ``pending`` release; returns its ``release_id``.

        Raises :class:`LedgerError` if ``run_key`` is already committed or running, and
        :class:`LedgerBudgetExceededError` if a source's policy would be exceeded. Nothing is
        written when it raises.
        """
        if not spends:
            raise ValueError("a release must reserve at least one spend")
        for s in spends:
            if s.source not in policies:
                raise LedgerError(f"no budget policy for source {s.source!r}")
        folder = os.path.abspath(folder)
        rid = uuid.uuid4().hex
        with self._transaction() as con:
            self._reconcile(con)
            for row in con.execute(
                "SELECT * FROM releases WHERE run_key = ? AND state IN ('pending', 'committed')",
                (run_key,),
            ).fetchall():
                if row["state"] == "committed":
                    raise LedgerError(
                        f"release {run_key!r} was already published ({row['folder']}, release "
                        f"{row['release_id']} committed {row['updated']}); it runs exactly once")
                raise LedgerError(
                    f"release {run_key!r} is running (pid {row['pid']} on {row['host']}, release "
                    f"{row['release_id']}); if that process is gone, run `beamsynth ledger "
                    "reconcile --force`")
            for source in sorted({s.source for s in spends}):
                policy = policies[source]
                self._ensure_policy(con, source, policy)
                eps, delta = self._spent(con, source, policy)
                want_e = math.fsum(s.epsilon for s in spends if s.source == source)
                want_d = math.fsum(s.delta for s in spends if s.source == source)
                if (eps + want_e > policy.epsilon * (1 + _TOLERANCE) + _TOLERANCE * 1e-3
                        or delta + want_d > policy.delta * (1 + _TOLERANCE) + 1e-300):
                    raise LedgerBudgetExceededError(
                        f"source {source!r}: this release needs ε={want_e:g}"
                        + (f", δ={want_d:g}" if want_d else "")
                        + f" but the ledger has already spent ε={eps:g}"
                        + (f", δ={delta:g}" if delta else "")
                        + f" of its {policy.describe()} (ε={max(0.0, policy.epsilon - eps):g} left); "
                        "refused before reading any data")
            now = _iso(_now())
            con.execute(
                "INSERT INTO releases (release_id, run_key, name, folder, state, created, updated, "
                "host, pid) VALUES (?,?,?,?,'pending',?,?,?,?)",
                (rid, run_key, name, folder, now, now, socket.gethostname(), os.getpid()))
            con.executemany(
                "INSERT INTO spends (release_id, source, privacy_unit, step, epsilon, delta, "
                "mechanism) VALUES (?,?,?,?,?,?,?)",
                [(rid, s.source, s.privacy_unit, s.step, float(s.epsilon), float(s.delta),
                  s.mechanism) for s in spends])
        return rid

    def abort(self, release_id: str, reason: str) -> None:
        """Mark a pending release ``aborted`` (nothing was published; its spend is released)."""
        with self._transaction() as con:
            row = con.execute("SELECT state FROM releases WHERE release_id = ?", (release_id,)).fetchone()
            if row is None:
                raise LedgerError(f"unknown release {release_id!r}")
            if row["state"] != "pending":
                raise LedgerError(f"release {release_id!r} is {row['state']}, not pending")
            con.execute("UPDATE releases SET state = 'aborted', updated = ?, note = ? "
                        "WHERE release_id = ?", (_iso(_now()), reason, release_id))

    def commit(self, release_id: str) -> None:
        """Mark a release ``committed`` (call after its folder was published).

        A release that was aborted meanwhile (``reconcile --force`` while it ran) is committed
        all the same: its outputs are public, so its spend must count.
        """
        with self._transaction() as con:
            row = con.execute("SELECT state FROM releases WHERE release_id = ?", (release_id,)).fetchone()
            if row is None:
                raise LedgerError(f"unknown release {release_id!r}")
            if row["state"] == "committed":
                return
            note = "published" if row["state"] == "pending" else "published after being aborted"
            con.execute("UPDATE releases SET state = 'committed', updated = ?, note = ? "
                        "WHERE release_id = ?", (_iso(_now()), note, release_id))

    # -- reading ----------------------------------------------------------------------------------
    def releases(self) -> list[dict[str, Any]]:
        """Every release with its spends, oldest first."""
        con = self._connect()
        try:
            rels = [dict(r) for r in con.execute("SELECT * FROM releases ORDER BY created, release_id")]
            spends = [dict(r) for r in con.execute("SELECT * FROM spends ORDER BY id")]
        finally:
            con.close()
        for r in rels:
            r["spends"] = [s for s in spends if s["release_id"] == r["release_id"]]
        return rels

    def summary(self) -> list[dict[str, Any]]:
        """Per source: policy and (ε, δ) spent by pending and committed releases."""
        con = self._connect()
        try:
            out = []
            for row in con.execute("SELECT * FROM sources ORDER BY source").fetchall():
                policy = LedgerPolicy(row["epsilon"], row["delta"], row["window_days"])
                eps, delta = self._spent(con, row["source"], policy)
                out.append({"source": row["source"], "policy": policy.describe(),
                            "epsilon_limit": policy.epsilon, "delta_limit": policy.delta,
                            "window_days": policy.window_days,
                            "epsilon_spent": eps, "delta_spent": delta})
        finally:
            con.close()
        return out


def format_ledger(ledger: PrivacyLedger) -> str:
    """A plain-text view of the ledger for ``beamsynth ledger show``."""
    lines = [f"ledger {ledger.path}", "", "sources:"]
    summary = ledger.summary()
    if not summary:
        lines.append("  (none)")
    for s in summary:
        left = max(0.0, s["epsilon_limit"] - s["epsilon_spent"])
        lines.append(f"  {s['source']}: spent ε={s['epsilon_spent']:g}"
                     + (f", δ={s['delta_spent']:g}" if s["delta_spent"] else "")
                     + f" of {s['policy']} (ε={left:g} left)")
    lines += ["", "releases:"]
    rels = ledger.releases()
    if not rels:
        lines.append("  (none)")
    for r in rels:
        eps = math.fsum(s["epsilon"] for s in r["spends"])
        delta = math.fsum(s["delta"] for s in r["spends"])
        lines.append(f"  {r['created'][:19]}  {r['state']:<9}  {r['run_key']}  ε={eps:g}"
                     + (f" δ={delta:g}" if delta else "") + f"  {r['folder']}"
                     + (f"  ({r['note']})" if r["note"] and r["state"] != "committed" else ""))
        for s in r["spends"]:
            lines.append(f"      {s['source']} [{s['privacy_unit']}] {s['step']}: ε={s['epsilon']:g}"
                         + (f" δ={s['delta']:g}" if s["delta"] else "") + f" ({s['mechanism']})")
    return "\n".join(lines)
