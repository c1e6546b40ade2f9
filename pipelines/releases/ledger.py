"""A persistent privacy ledger: what every release spent, against which source, exactly once.

The ledger is one SQLite file shared by every release of a portal. Each data source has a budget
policy (a lifetime total, or a rolling window of ``window_days``); a release **reserves** its spend
before any data is read and is refused when the reservation would exceed the policy.

Life of a release (see :func:`beamsynth.pipelines.releases.release.run_release`)::

    reserve()   BEGIN IMMEDIATE: reconcile stale reservations, check the policy, insert
                the release as ``pending`` with its spends            → nothing read yet
    ...         run, write every output into a hidden temp folder
    begin_publish()  the reservation must still be ``pending`` (else nothing is published);
                mark it ``publishing``: from here on it is never refunded while its run may live
    publish     os.rename(temp folder, release folder)  (atomic, same file system)
    commit()    mark the release ``committed``

A crash or SIGKILL can stop this anywhere. :meth:`PrivacyLedger.reconcile` decides what a
``pending`` reservation whose process is gone means, from the file system alone:

* its release folder exists and carries its ``release_id`` → the outputs were published, the spend
  counts: the row becomes ``committed``;
* its release folder exists without any ``release.json`` → an object store's file-by-file publish
  (``release.json`` last) stopped part way, and outputs may be public: ``committed`` too (until
  the ninth session this case was aborted and its spend refunded);
* otherwise nothing was published → the row becomes ``aborted`` and its spend no longer counts, so
  the same night can be run again (exactly once: a second rerun finds the night ``committed``).

``reconcile(force=True)`` (the operator says no release is running) aborts a pending reservation
even if its owner looks alive. Its run, if it was in fact still going, finds the reservation
aborted at :meth:`PrivacyLedger.begin_publish` and publishes nothing; a reservation that had
already begun publishing is committed instead (its outputs may be public at any moment). Until
the ninth session a run force-aborted mid-way still published, and a publish cut short (object
store, killed before ``release.json``) left its tables public under a refunded spend.

A pending reservation whose process is still alive on this host (or on another host, which we
cannot probe) keeps counting: concurrent releases never see each other's budget as free.
Concurrency between processes is handled by SQLite (``BEGIN IMMEDIATE`` and a busy timeout):
reservations are serialized, so two releases cannot both take the last ε.

Composition across releases is basic sequential composition of (ε, δ) on the same source, a
safe upper bound whether or not the nightly data overlap. A lifetime policy bounds the sum over
every release. A rolling policy (``window_days``) renews the budget; that bounds a privacy unit's
ε only if its data leaves the input before the window has passed, so the ledger accepts a window
only together with the config's declaration ``data_retention_days`` (≤ ``window_days``: a record
stays in the nightly input at most that many days). The lifetime total is always reported next to
the window (``ledger show``, ``release.json``).

Every spend records its privacy unit (``record``, or a privacy-id column with the bound on
contributions). ε charged per record and ε charged per person do not add up to one guarantee, so a
source is charged under one unit only: a release charging another unit is refused (declare another
source for it), and a ledger holding several units on one source (written before this rule) shows
them apart and adds nothing across them.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import socket
import sqlite3
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from beamsynth.pipelines.io import filesystem as fs

__all__ = [
    "format_budget",
    "temp_folder",
    "LedgerBudgetExceededError",
    "LedgerError",
    "LedgerPolicy",
    "LedgerSpend",
    "PrivacyLedger",
    "RELEASE_MARKER",
    "format_ledger",
    "format_source",
    "lifetime_text",
    "unit_label",
]

RELEASE_MARKER = "release.json"
"""File inside a published release folder that names its ``release_id``."""

_TOLERANCE = 1e-9
_ZERO = 1e-12  # |ε| below this prints as 0 (a residue of float sums, never a real budget)
RECORD = "record"
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
# columns added after the first ledgers were written (added by ALTER TABLE when missing)
_MIGRATIONS = {
    "sources": (("data_retention_days", "REAL"),),
    "releases": (("publishing", "TEXT"),),  # when the run began publishing (begin_publish)
    "spends": (("privacy_id", "TEXT"), ("max_contributions", "INTEGER")),
}


class LedgerError(ValueError):
    """The ledger refuses an operation (a night already released, a policy change, ...)."""


class LedgerBudgetExceededError(LedgerError):
    """A reservation would exceed a source's budget policy (raised before any data is read)."""


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def _iso(t: _dt.datetime) -> str:
    return t.isoformat(timespec="microseconds")


def format_budget(value: float) -> str:
    """An ε or δ for people: 6 significant digits, and ``|value| < 1e-12`` (float residue) as 0."""
    v = float(value)
    return "0" if abs(v) < _ZERO else f"{v:.6g}"


def _left(limit: float, spent: float) -> float:
    """What a policy has left: never negative, and a float residue of the sums is exactly 0."""
    v = limit - spent
    return 0.0 if v <= max(_ZERO * 1e-3, _TOLERANCE * limit) else v


def _number_or_none(value: Any, name: str) -> None:
    if value is None:
        return
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not (math.isfinite(value) and value > 0)):
        raise ValueError(f"policy {name} ({value!r}) must be a number > 0")


@dataclass(frozen=True)
class LedgerPolicy:
    """Budget policy of one data source: at most (ε, δ) in total, or per ``window_days`` days.

    A window renews the budget, which bounds a privacy unit's ε only when its data has left the
    input by the time the window has passed: ``window_days`` needs the declaration
    ``data_retention_days`` (≤ ``window_days``), the most days one record stays in the nightly
    input. Then every release that can read a record falls within one window, so the record's
    total is at most the window's (ε, δ). A unit contributing new records for longer is charged
    again in later windows: its cumulative ε is the lifetime total, always reported.
    """

    epsilon: float
    delta: float = 0.0
    window_days: float | None = None
    data_retention_days: float | None = None

    def __post_init__(self) -> None:
        for name, v in (("epsilon", self.epsilon), ("delta", self.delta)):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TypeError(f"policy {name} must be a number, got {v!r}")
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"policy epsilon ({self.epsilon!r}) must be a finite number > 0")
        if not (0 <= self.delta < 1):
            raise ValueError(f"policy delta ({self.delta!r}) must be in [0, 1)")
        _number_or_none(self.window_days, "window_days")
        _number_or_none(self.data_retention_days, "data_retention_days")
        w, r = self.window_days, self.data_retention_days
        if w is not None and r is None:
            raise ValueError(
                f"policy window_days ({w!r}) renews the budget every {w:g} days, which bounds a "
                "privacy unit's ε only if its data has left the nightly input by then; declare "
                f"data_retention_days (at most {w:g}: the most days one record stays in the input), "
                "or drop window_days for a lifetime budget")
        if r is not None and w is None:
            raise ValueError(f"policy data_retention_days ({r!r}) only applies to a rolling "
                             "window: it needs window_days")
        if r is not None and w is not None and r > w:
            raise ValueError(
                f"policy data_retention_days ({r!r}) must be <= window_days ({w!r}): a record still "
                "in the input after its window has passed would be charged again from a renewed "
                "budget")

    @property
    def renews(self) -> bool:
        """Whether the budget renews (a rolling window, declared sound by the data retention)."""
        return self.window_days is not None

    def describe(self) -> str:
        """Human form, e.g. ``lifetime ε=5`` or ``ε=2, δ=1e-06 per 30 days (...)``."""
        amount = f"ε={format_budget(self.epsilon)}" + (
            f", δ={format_budget(self.delta)}" if self.delta else "")
        if self.window_days is None:
            return f"lifetime {amount}"
        keeps = ("no data retention declared" if self.data_retention_days is None else
                 f"input keeps a record at most {self.data_retention_days:g} days")
        return f"{amount} per {self.window_days:g} days ({keeps})"

    def guarantee(self) -> str:
        """What the policy guarantees a privacy unit, for manifests and ``ledger show``."""
        amount = f"ε={format_budget(self.epsilon)}" + (
            f", δ={format_budget(self.delta)}" if self.delta else "")
        if self.window_days is None:
            return (f"every release on this source composes sequentially against a lifetime "
                    f"budget: a privacy unit's total over all releases is at most {amount}")
        if self.data_retention_days is None:  # only reachable by bypassing the validation
            return (f"{amount} per {self.window_days:g} days WITHOUT a data retention declaration: "
                    "no bound on a privacy unit's cumulative ε")
        return (f"the budget renews every {self.window_days:g} days because the release config "
                f"declares that a record stays in the nightly input at most "
                f"{self.data_retention_days:g} days (data_retention_days ≤ window_days): every "
                f"release that can read a record falls within one window, so a record's total is "
                f"at most {amount}. A privacy unit that contributes new records for longer is "
                "charged again in later windows; its cumulative ε is the lifetime total reported "
                "with it, which this policy does not bound")


def _stored_policy(row: sqlite3.Row) -> LedgerPolicy:
    """The policy stored for a source. A window stored without a retention declaration (ledgers
    written before it was required) does not renew: it is read as a lifetime budget."""
    window = row["window_days"]
    retention = row["data_retention_days"] if "data_retention_days" in row.keys() else None
    if window is not None and retention is None:
        return LedgerPolicy(row["epsilon"], row["delta"])
    return LedgerPolicy(row["epsilon"], row["delta"], window, retention)


def unit_label(privacy_id: str | None, max_contributions: int = 1) -> str:
    """The ledger form of a privacy unit: ``record`` or ``COLUMN×k``."""
    return RECORD if privacy_id is None else f"{privacy_id}×{max_contributions}"


def _unit_name(privacy_id: str | None) -> str:
    return RECORD if privacy_id is None else f"privacy id {privacy_id!r}"


@dataclass(frozen=True)
class LedgerSpend:
    """One spend a release reserves against a source, with its privacy unit.

    ``privacy_unit`` is the label (``record`` or ``COLUMN×k``, :func:`unit_label`); a unit other than
    ``record`` also needs ``privacy_id`` (the column) and ``max_contributions`` (k). Spends add up
    only within one unit: the unit is ``record`` or the privacy-id column (k may differ between
    releases: each is ε-DP for adding or removing one person).
    """

    source: str
    privacy_unit: str
    step: str
    epsilon: float
    delta: float
    mechanism: str
    privacy_id: str | None = None
    max_contributions: int = 1

    def __post_init__(self) -> None:
        k = self.max_contributions
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"max_contributions ({k!r}) must be an int >= 1")
        if self.privacy_unit == RECORD and (self.privacy_id is not None or k != 1):
            raise ValueError(f"privacy_unit 'record' takes no privacy_id ({self.privacy_id!r}) "
                             f"and max_contributions 1 (got {k!r})")
        if self.privacy_unit != RECORD and self.privacy_unit != unit_label(self.privacy_id, k):
            raise ValueError(
                f"privacy_unit ({self.privacy_unit!r}) must be 'record' or "
                f"'COLUMN×k' matching privacy_id ({self.privacy_id!r}) and max_contributions ({k!r})")

    @property
    def unit(self) -> str:
        """What spends add up within: ``record``, or ``privacy id 'COLUMN'``."""
        return _unit_name(self.privacy_id)


def temp_folder(folder: str, release_id: str) -> str:
    """Where a release is assembled before it is published as ``folder`` (any Beam path)."""
    if not fs.is_local(folder):
        parent, base = fs.split(folder.rstrip("/"))
        return fs.join(parent, f".{base}.tmp-{release_id}")
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
        fs.require_local(self.path, "ledger path")  # SQLite: never gs://, s3://, hdfs://, ...
        self._timeout = float(busy_timeout)
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        con = self._connect()
        try:
            con.executescript("BEGIN IMMEDIATE;" + _SCHEMA + "COMMIT;")
        finally:
            con.close()
        with self._transaction() as con:
            for table, columns in _MIGRATIONS.items():
                have = {r["name"] for r in con.execute(f"PRAGMA table_info({table})")}
                for name, kind in columns:
                    if name not in have:
                        con.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")

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
        return None if row is None else _stored_policy(row)

    @staticmethod
    def _ensure_policy(con: sqlite3.Connection, source: str, policy: LedgerPolicy, *,
                       insert: bool = True) -> None:
        row = con.execute("SELECT * FROM sources WHERE source = ?", (source,)).fetchone()
        if row is None:
            if insert:
                con.execute(
                    "INSERT INTO sources (source, epsilon, delta, window_days, data_retention_days, "
                    "created) VALUES (?,?,?,?,?,?)",
                    (source, policy.epsilon, policy.delta, policy.window_days,
                     policy.data_retention_days, _iso(_now())))
            return
        stored = _stored_policy(row)
        if stored != policy:
            raise LedgerError(
                f"source {source!r} has the policy {stored.describe()} in the ledger, but the "
                f"release asks for {policy.describe()}; a release cannot change a source's policy")

    # -- reconciliation ---------------------------------------------------------------------------
    @staticmethod
    def published_release_id(folder: str) -> str | None:
        """The ``release_id`` recorded in a published release folder (None if not published)."""
        try:  # a release folder may live on any Beam file system
            data = json.loads(fs.read_text(fs.join(folder, RELEASE_MARKER)))
        except (OSError, ValueError):  # BeamIOError is an OSError
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
            marker = self.published_release_id(row["folder"])
            published = marker == row["release_id"]
            if row["state"] == "aborted":
                if published:  # force-aborted while still running, then published: it counts
                    con.execute("UPDATE releases SET state = 'committed', updated = ?, note = ? "
                                "WHERE release_id = ?",
                                (_iso(_now()), "published after being aborted: spend counts",
                                 row["release_id"]))
                    decided.append((row["release_id"], "committed"))
                continue
            alive = self._owner_alive(row["host"], row["pid"])
            if published:
                state, note = "committed", "outputs were published before the process ended"
            elif not force and alive:
                continue  # still running: keeps counting as pending
            elif row["publishing"] is not None and alive:  # forced, but it may still be writing
                state, note = "committed", ("began publishing before a forced reconcile: its "
                                            "outputs may be public, spend counts")
            elif marker is None and fs.folder_exists(row["folder"]):
                # an object store publishes file by file, release.json last: a crash in between
                # leaves public outputs without the marker. Count them (conservative: a folder
                # that existed before the run, which the run would have refused, is charged too)
                state, note = "committed", ("partly published (release folder without its "
                                            "release.json) before the process ended: spend counts")
            else:
                state, note = "aborted", "process ended before publishing: spend released"
                # outputs computed under a refunded spend must not survive to be published later
                tmp = temp_folder(row["folder"], row["release_id"])
                fs.delete_quietly([*([] if fs.is_local(tmp) else fs.list_files(tmp)), tmp])
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
    def _spend_rows(con: sqlite3.Connection, source: str) -> list[dict[str, Any]]:
        """Every spend of pending or committed releases on ``source``, with its unit."""
        rows = con.execute(
            "SELECT s.*, r.created AS created, r.updated AS updated, r.state AS state "
            "FROM spends s JOIN releases r USING (release_id) "
            "WHERE s.source = ? AND r.state IN ('pending', 'committed') ORDER BY s.id",
            (source,)).fetchall()
        out = []
        for r in rows:
            d = dict(r)
            if d.get("privacy_id") is None and d["privacy_unit"] != RECORD:  # written before the column
                d["privacy_id"] = d["privacy_unit"].rsplit("×", 1)[0]
            d["unit"] = _unit_name(d.get("privacy_id"))
            out.append(d)
        return out

    @staticmethod
    def _counted(rows: Sequence[Mapping[str, Any]], policy: LedgerPolicy) -> tuple[float, float]:
        """(ε, δ) the policy counts: the rolling window when it renews, else everything.

        A release reads its data between its reservation and its commit, so the window counts a
        committed spend from its commit time (``updated``, never earlier than its last read) and
        a pending one always: every release that read a record within ``data_retention_days``
        of today is counted. (Until the ninth session the reservation time ``created`` was used,
        so a release that ran for ``h`` hours dropped out of the window ``h`` hours too early.)
        """
        if policy.window_days is not None:
            since = _iso(_now() - _dt.timedelta(days=policy.window_days))
            rows = [r for r in rows if r["state"] == "pending" or r["updated"] >= since]
        return math.fsum(r["epsilon"] for r in rows), math.fsum(r["delta"] for r in rows)

    def _check(self, con: sqlite3.Connection, run_key: str, spends: Sequence[LedgerSpend],
               policies: Mapping[str, LedgerPolicy], *, insert_policies: bool) -> None:
        """Every check of a reservation (night not released, one unit per source, budget)."""
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
                f"{row['release_id']}); "
                + (f"it is still running on this host: wait for it to end, then see `beamsynth "
                   f"ledger show {self.path}`" if row["host"] == socket.gethostname() else
                   f"if that process is gone, run `beamsynth ledger reconcile --force {self.path}` "
                   "(only when no release is running)"))
        for source in sorted({s.source for s in spends}):
            policy = policies[source]
            self._ensure_policy(con, source, policy, insert=insert_policies)
            rows = self._spend_rows(con, source)
            have = sorted({r["unit"] for r in rows})
            want = sorted({s.unit for s in spends if s.source == source})
            if len(set(have) | set(want)) > 1:
                raise LedgerError(
                    f"source {source!r}: this release charges per {' and per '.join(want)}"
                    + (f" but the ledger charged it per {' and per '.join(have)}" if have else "")
                    + "; ε spent under different privacy units do not add up to one guarantee, "
                    "so a source is charged under one unit: declare another source (with its own "
                    "policy) for the other unit. Refused before reading any data")
            eps, delta = self._counted(rows, policy)
            want_e = math.fsum(s.epsilon for s in spends if s.source == source)
            want_d = math.fsum(s.delta for s in spends if s.source == source)
            if (eps + want_e > policy.epsilon * (1 + _TOLERANCE) + _TOLERANCE * 1e-3
                    or delta + want_d > policy.delta * (1 + _TOLERANCE) + 1e-300):
                raise LedgerBudgetExceededError(
                    f"source {source!r}: this release needs ε={format_budget(want_e)}"
                    + (f", δ={format_budget(want_d)}" if want_d else "")
                    + f" but the ledger has already spent ε={format_budget(eps)}"
                    + (f", δ={format_budget(delta)}" if delta else "")
                    + f" of its {policy.describe()} "
                    f"(ε={format_budget(_left(policy.epsilon, eps))}"
                    + (f", δ={format_budget(_left(policy.delta, delta))}" if want_d else "")
                    + " left); refused before reading any data"
                    + self._renewal_note(rows, policy, want_e, want_d))

    @staticmethod
    def _renewal_note(rows: Sequence[Mapping[str, Any]], policy: LedgerPolicy, want_e: float,
                      want_d: float) -> str:
        """When a rolling window will have room for ``want_e``/``want_d`` again (what to do next)."""
        if policy.window_days is None:
            left_e = _left(policy.epsilon, math.fsum(r["epsilon"] for r in rows))
            left_d = _left(policy.delta, math.fsum(r["delta"] for r in rows))
            if left_e <= 0:
                return "; a lifetime budget never renews: no later release can charge this source"
            if want_d and left_d <= 0:
                return ("; " + ("its policy allows no δ" if policy.delta == 0 else
                                "its lifetime δ is used up") + ": only releases spending δ=0 "
                        f"(pure-ε mechanisms) can charge this source (ε={format_budget(left_e)} left)")
            return (f"; a lifetime budget never renews: only ε={format_budget(left_e)}"
                    + (f", δ={format_budget(left_d)}" if want_d else "")
                    + " is left for every later release on this source (lower this release's "
                    "budget to fit, or stop releasing it)")
        fits = (lambda e, d: e + want_e <= policy.epsilon * (1 + _TOLERANCE) + _TOLERANCE * 1e-3
                and d + want_d <= policy.delta * (1 + _TOLERANCE) + 1e-300)
        if not fits(0.0, 0.0):
            return (f"; this release alone needs more than the window's {policy.describe()}: "
                    "lower its budget")
        since = _iso(_now() - _dt.timedelta(days=policy.window_days))
        counted = [r for r in rows if r["state"] == "pending" or r["updated"] >= since]
        pending = [r for r in counted if r["state"] == "pending"]
        committed = sorted((r for r in counted if r["state"] != "pending"), key=lambda r: r["updated"])
        for i, r in enumerate(committed):  # spends leave the window in commit order
            rest = pending + committed[i + 1:]
            if fits(math.fsum(x["epsilon"] for x in rest), math.fsum(x["delta"] for x in rest)):
                when = (_dt.datetime.fromisoformat(r["updated"]) + _dt.timedelta(days=policy.window_days)
                        + _dt.timedelta(seconds=1))  # printed to the second: rounded up
                return (f"; the window renews: this release fits from {_iso(when)[:19]} UTC on, "
                        "when the spends committed before it have left the last "
                        f"{policy.window_days:g} days")
        return "; it fits only once the pending releases on this source are decided"

    def check(self, *, run_key: str, spends: Sequence[LedgerSpend],
              policies: Mapping[str, LedgerPolicy]) -> None:
        """Raise what :meth:`reserve` would raise for these spends now, reserving nothing.

        Used by ``release --check`` and before a release opens its inputs: a night already
        published or running, a unit clash or an overspend is reported without writing to the
        ledger (stale reservations are decided as :meth:`reserve` would, then rolled back).
        """
        self._validate_spends(spends, policies)
        con = self._connect()
        try:
            con.execute("BEGIN IMMEDIATE")
            try:
                self._reconcile(con)
                self._check(con, run_key, spends, policies, insert_policies=False)
            finally:
                con.execute("ROLLBACK")
        finally:
            con.close()

    @staticmethod
    def _validate_spends(spends: Sequence[LedgerSpend], policies: Mapping[str, LedgerPolicy]) -> None:
        if not spends:
            raise ValueError("a release must reserve at least one spend")
        for s in spends:
            if s.source not in policies:
                raise LedgerError(f"no budget policy for source {s.source!r}")

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

        Raises :class:`LedgerError` if ``run_key`` is already committed or running, or if a
        source would be charged under two privacy units, and
        :class:`LedgerBudgetExceededError` if a source's policy would be exceeded. Nothing is
        written when it raises.
        """
        self._validate_spends(spends, policies)
        folder = os.path.abspath(folder) if fs.is_local(folder) else folder  # gs://... as given
        rid = uuid.uuid4().hex
        with self._transaction() as con:
            self._reconcile(con)
            self._check(con, run_key, spends, policies, insert_policies=True)
            now = _iso(_now())
            con.execute(
                "INSERT INTO releases (release_id, run_key, name, folder, state, created, updated, "
                "host, pid) VALUES (?,?,?,?,'pending',?,?,?,?)",
                (rid, run_key, name, folder, now, now, socket.gethostname(), os.getpid()))
            con.executemany(
                "INSERT INTO spends (release_id, source, privacy_unit, step, epsilon, delta, "
                "mechanism, privacy_id, max_contributions) VALUES (?,?,?,?,?,?,?,?,?)",
                [(rid, s.source, s.privacy_unit, s.step, float(s.epsilon), float(s.delta),
                  s.mechanism, s.privacy_id, s.max_contributions) for s in spends])
        return rid

    @staticmethod
    def _release_row(con: sqlite3.Connection, release_id: str) -> sqlite3.Row:
        row = con.execute("SELECT * FROM releases WHERE release_id = ?", (release_id,)).fetchone()
        if row is None:
            raise LedgerError(f"unknown release {release_id!r}")
        return row

    def abort(self, release_id: str, reason: str) -> None:
        """Mark a pending release ``aborted`` (nothing was published; its spend is released).
        One that began publishing is refused: its outputs may be public."""
        with self._transaction() as con:
            row = self._release_row(con, release_id)
            if row["state"] != "pending":
                raise LedgerError(f"release {release_id!r} is {row['state']}, not pending")
            if row["publishing"] is not None:
                raise LedgerError(f"release {release_id!r} began publishing at {row['publishing']}; "
                                  "its outputs may be public, so its spend is not released")
            con.execute("UPDATE releases SET state = 'aborted', updated = ?, note = ? "
                        "WHERE release_id = ?", (_iso(_now()), reason, release_id))

    def begin_publish(self, release_id: str) -> None:
        """Claim a reservation for publishing, just before the first output is made public.

        Raises :class:`LedgerError` unless the release is still ``pending``: a reservation
        aborted while its run went on (``reconcile --force``) had its spend refunded, so its
        outputs must never be published. Once claimed, neither :meth:`abort` nor a forced
        reconcile refunds it while its owner may be alive (the module docstring).
        """
        with self._transaction() as con:
            row = self._release_row(con, release_id)
            if row["state"] != "pending":
                raise LedgerError(
                    f"release {release_id!r} was {row['state']} while it ran ({row['note']}), "
                    "e.g. by `beamsynth ledger reconcile --force`; its spend is no longer "
                    "reserved, so nothing was published: run the release again")
            con.execute("UPDATE releases SET publishing = ? WHERE release_id = ?",
                        (_iso(_now()), release_id))

    def commit(self, release_id: str) -> None:
        """Mark a release ``committed`` (call after its folder was published).

        A release that was aborted meanwhile (``reconcile --force`` while it ran) is committed
        all the same: its outputs are public, so its spend must count.
        """
        with self._transaction() as con:
            row = self._release_row(con, release_id)
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
        """Per source: policy, what it counts (``epsilon_spent``/``delta_spent``: the window when it
        renews), what is left, and the lifetime total per privacy unit (pending and committed).

        ``lifetime`` is the total over every release when the source has one privacy unit, and
        ``None`` when a ledger written before the one-unit rule holds several (never added up).
        """
        con = self._connect()
        try:
            out = []
            for row in con.execute("SELECT * FROM sources ORDER BY source").fetchall():
                policy = _stored_policy(row)
                rows = self._spend_rows(con, row["source"])
                eps, delta = self._counted(rows, policy)
                units = []
                for unit in sorted({r["unit"] for r in rows}):
                    mine = [r for r in rows if r["unit"] == unit]
                    units.append({
                        "unit": unit, "privacy_id": mine[0].get("privacy_id"),
                        "max_contributions": sorted({r["max_contributions"] or 1 for r in mine}),
                        "releases": len({r["release_id"] for r in mine}),
                        "epsilon": math.fsum(r["epsilon"] for r in mine),
                        "delta": math.fsum(r["delta"] for r in mine)})
                lifetime = ({"epsilon": units[0]["epsilon"], "delta": units[0]["delta"],
                             "releases": units[0]["releases"]} if len(units) == 1 else
                            {"epsilon": 0.0, "delta": 0.0, "releases": 0} if not units else None)
                out.append({"source": row["source"], "policy": policy.describe(),
                            "epsilon_limit": policy.epsilon, "delta_limit": policy.delta,
                            "window_days": policy.window_days,
                            "data_retention_days": policy.data_retention_days,
                            "renews": policy.renews,
                            "epsilon_spent": eps, "delta_spent": delta,
                            "epsilon_left": _left(policy.epsilon, eps),
                            "delta_left": _left(policy.delta, delta),
                            "lifetime": lifetime, "units": units,
                            "guarantee": policy.guarantee()})
        finally:
            con.close()
        return out


def _amount(eps: float, delta: float) -> str:
    return f"ε={format_budget(eps)}" + (f", δ={format_budget(delta)}" if delta else "")


def format_source(s: Mapping[str, Any]) -> list[str]:
    """Lines of ``ledger show`` for one :meth:`PrivacyLedger.summary` entry."""
    units = s["units"]
    head = f"  {s['source']}"
    if units:
        head += " [" + ", ".join(u["unit"] + ("" if u["privacy_id"] is None else
                                              " ≤" + "/".join(map(str, u["max_contributions"]))
                                              + " records each") for u in units) + "]"
    left = f"(ε={format_budget(s['epsilon_left'])} left)"
    if s["lifetime"] is None:
        lines = [head + f": spends under {len(units)} different privacy units, NOT added up "
                        "(ε per record and ε per person are different guarantees); new releases "
                        "on this source are refused until it is charged under one unit"]
        lines += [f"      {u['unit']}: lifetime total {_amount(u['epsilon'], u['delta'])} over "
                  f"{u['releases']} release(s)" for u in units]
        return lines
    life = s["lifetime"]
    total = (f"lifetime total {_amount(life['epsilon'], life['delta'])} over "
             f"{life['releases']} release(s)")
    if not s["renews"]:
        return [head + f": spent {_amount(s['epsilon_spent'], s['delta_spent'])} of "
                       f"{s['policy']} {left}; {total}"]
    return [head + f": spent {_amount(s['epsilon_spent'], s['delta_spent'])} in the last "
                   f"{s['window_days']:g} days of {s['policy']} {left}; {total} — the budget "
                   "renews only because the config declares that old nights' data has left the "
                   "input; a person who keeps contributing accumulates the lifetime total"]


def lifetime_text(sources: Mapping[str, Mapping[str, Any]]) -> str:
    """One line of lifetime totals from ``release.json``'s ``ledger.sources`` (for reports)."""
    parts = []
    for source, b in sources.items():
        life = b.get("lifetime_total")
        if life is None:
            parts.append(f"{source}: several privacy units, not added up")
            continue
        parts.append(f"{source}: {_amount(life['epsilon'], life['delta'])} over {life['releases']} "
                     f"release(s)" + (" (the budget renews; this total does not)" if b.get("renews")
                                      else ""))
    return "; ".join(parts)


def _pending_note(r: Mapping[str, Any], path: str) -> str:
    """What a ``pending`` row of ``ledger show`` means and, for a run that is gone, what to do."""
    if PrivacyLedger._owner_alive(r["host"], r["pid"]):
        return f"  (running: process {r['pid']} on {r['host']}; its spend counts until it ends)"
    return (f"  (its process {r['pid']} has ended without finishing; its spend counts until "
            f"`beamsynth ledger reconcile {path}` or the next release decides it)")


def format_ledger(ledger: PrivacyLedger) -> str:
    """A plain-text view of the ledger for ``beamsynth ledger show`` (budgets to 6 digits)."""
    lines = [f"ledger {ledger.path}", "", "sources:"]
    summary = ledger.summary()
    if not summary:
        lines.append("  (none)")
    for s in summary:
        lines += format_source(s)
    lines += ["", "releases:"]
    rels = ledger.releases()
    if not rels:
        lines.append("  (none)")
    for r in rels:
        units = {_unit_name(s.get("privacy_id") if s.get("privacy_id") is not None or
                            s["privacy_unit"] == RECORD else s["privacy_unit"].rsplit("×", 1)[0])
                 for s in r["spends"]}
        total = (_amount(math.fsum(s["epsilon"] for s in r["spends"]),
                         math.fsum(s["delta"] for s in r["spends"])).replace(", ", " ")
                 if len(units) <= 1 else "(several privacy units, not added up)")
        lines.append(f"  {r['created'][:19]}  {r['state']:<9}  {r['run_key']}  {total}"
                     f"  {r['folder']}"
                     + (f"  ({r['note']})" if r["note"] and r["state"] != "committed" else "")
                     + (_pending_note(r, ledger.path) if r["state"] == "pending" else ""))
        for s in r["spends"]:
            lines.append(f"      {s['source']} [{s['privacy_unit']}] {s['step']}: "
                         f"ε={format_budget(s['epsilon'])}"
                         + (f" δ={format_budget(s['delta'])}" if s["delta"] else "")
                         + f" ({s['mechanism']})")
    return "\n".join(lines)
