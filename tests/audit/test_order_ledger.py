"""Audits of issue 15, weakenings 4 and 5: released file order, ledger windows, public metadata.

Order: a released file's row order must carry nothing of the private input order. For
``plausible`` (the one method that emits records per seed) the same multiset of input records in
two orders — sorted by a latent value ``z`` (order A) and round-robin over ``z`` (order B) — goes
through the real ``run_synthesis`` pipeline with a fixed seed. Two checks:

* structural: the file equals :func:`~beamsynth.transforms.plausible.ordered_release` of its own
  multiset (the order is a function of the released rows and the run's randomness alone), for
  ``D`` in order A and ``D`` plus one record in order B;
* statistical: the share of adjacent rows with the same ``z`` is the same under A and B (measured
  0.245 / 0.244). The input order is erased three times on the way: the split emits each value
  shard sorted (4e869e2), candidates are drawn per value shard over sorted seeds (525b900), and
  :class:`~beamsynth.transforms.plausible.OrderReleased` orders the released rows. The broken
  variant undoes all three (split and candidates per arrival batch in input order, released
  batches written as emitted: the pipeline before those fixes) and measured 0.965 under A and
  0.685 under B. Undoing only the last two (or the first and last) still measured 0.924 / 0.924
  (0.924 / 0.942): one sorting step is enough to hide the input order.

The model-sampling methods (``independent``, ``privbayes``, ``sbhg``) draw from a released model in
(window, shard) order: permuting the input (and reading it in other blocks) gives a byte-identical
file under a fixed seed; so do ``histogram`` (CatHist, sorted by released count) and ``prefixes``
(keys and tree from the released levels).

Ledger windows (second half, no Beam): five nightly releases of ε=1 on the same people under a
1-day window. Without the declaration ``data_retention_days`` the policy is refused; with it the
budget renews and ``ledger show`` still prints the lifetime total ε=5. The broken variant (a
window needing no declaration, ``ledger show`` printing the window only — the behaviour before
the fix) renews silently and shows at most ε=1: the audit reports both. Public outputs of a real
release (``release.json``, ``public/``) are scanned for the operator's paths, host and user name;
the broken ``release.json`` that carried ``name@/absolute/folder`` is caught.
"""

from __future__ import annotations

import datetime as dt
import getpass
import importlib.util
import json
import os
import re
import socket
import sqlite3
import zlib
from pathlib import Path

import apache_beam as beam
import numpy as np
import pandas as pd
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

import beamsynth.pipelines.methods.plausible as plausible_pipeline
import beamsynth.pipelines.releases.ledger as ledger_mod
import beamsynth.pipelines.releases.release as release_mod
from beamsynth.pipelines.methods.synthesize import SynthesisConfig, run_synthesis
from beamsynth.pipelines.releases.config import ReleaseConfigError, load_release_config
from beamsynth.pipelines.releases.ledger import (
    LedgerBudgetExceededError,
    LedgerPolicy,
    LedgerSpend,
    PrivacyLedger,
    format_ledger,
)
from beamsynth.pipelines.releases.release import run_release
from beamsynth.schemas.schema import EncodedBatch, load_schema
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.plausible import (
    CandidateBatch,
    ordered_release,
    poisson_counts,
    record_split_assignments,
)

pytestmark = pytest.mark.audit

OPTIONS = PipelineOptions(["--runner=DirectRunner", "--direct_num_workers=1"])
LEVELS = 40  # values of the latent z (every column has this domain)
PER_LEVEL = 40  # records per z value
SEED = 11
ORDER_SCHEMA_SPEC = {
    "name": "order-audit",
    "columns": [{"name": c, "type": "categorical",
                 "domain": {"kind": "categorical", "values": [f"v{i:02d}" for i in range(LEVELS)]}}
                for c in ("a", "b", "c")],
}
ORDER_SCHEMA = load_schema(ORDER_SCHEMA_SPEC)
PLAUSIBLE = {"k": 10, "gamma": 4.0, "epsilon0": 5.0, "omega": 1, "plausible_t": 1,
             "plausible_split": "0.5,0.2,0.3"}  # the split both order audits were calibrated on


def _records() -> list[tuple[int, int, int]]:
    """``PER_LEVEL`` records (z, z, z) per z, one column in ten replaced by a random value."""
    rs = RandomSource(seed=5)
    z = np.repeat(np.arange(LEVELS), PER_LEVEL)
    codes = np.stack([z, z, z], axis=1)
    swap = rs.child("swap").uniform(codes.shape) < 0.1
    codes[swap] = rs.child("value").integers(LEVELS, int(swap.sum()))
    return [tuple(r) for r in codes.tolist()]


def _z(row) -> int:
    return int(np.bincount(row, minlength=LEVELS).argmax())


def _order_a(records):  # sorted by z (the input's natural order)
    return sorted(records, key=lambda r: (_z(r), r))


def _order_b(records):  # round-robin over z: consecutive records have different z
    rank: dict[int, int] = {}
    keyed = []
    for r in _order_a(records):
        rank[_z(r)] = rank.get(_z(r), -1) + 1
        keyed.append(((rank[_z(r)], _z(r)), r))
    return [r for _, r in sorted(keyed)]


def _write(path: Path, records) -> Path:
    path.write_text("a,b,c\n" + "".join(",".join(f"v{v:02d}" for v in r) + "\n" for r in records),
                    encoding="utf-8")
    return path


def _plausible(tmp_path: Path, name: str, records) -> np.ndarray:
    src = _write(tmp_path / f"{name}.csv", records)
    out = tmp_path / f"{name}.out.csv"
    run_synthesis(SynthesisConfig(input=str(src), schema=ORDER_SCHEMA, output=str(out), epsilon=1e5,
                                  delta=1e-6, method="plausible", rows=len(records), seed=SEED,
                                  options=dict(PLAUSIBLE), block_rows=200), OPTIONS)
    df = pd.read_csv(out, dtype=str)
    return np.stack([df[c].str[1:].astype(int).to_numpy() for c in "abc"], axis=1)


def _same_z_share(codes: np.ndarray) -> float:
    """Share of adjacent rows whose latent z (the mode of the row) is the same."""
    z = np.array([_z(r) for r in codes])
    return float(np.mean(z[1:] == z[:-1]))


def _as_ordered_release(codes: np.ndarray) -> np.ndarray:
    parts = ordered_release(codes, shape=ORDER_SCHEMA.shape, shards=16, seed=SEED)
    return np.concatenate([rows for _, rows in parts], axis=0)


class _SeedOrder(beam.PTransform):
    """Broken variant, part 3: released batches written as the privacy test emits them."""

    def __init__(self, **_kw) -> None:
        super().__init__()

    def expand(self, released):
        return released | "AsEmitted" >> beam.Map(lambda b: ("", b))


def _split_per_arrival_batch(batch, key, fractions):
    """One seed batch's records split as they arrived (no value shards, no sort)."""
    part = record_split_assignments(key, batch.codes, fractions)
    for p, tag in enumerate(("seeds", "structure", "params")):
        if (part == p).any():
            sub = EncodedBatch(batch.codes[part == p])
            yield sub if tag == "seeds" else beam.pvalue.TaggedOutput(tag, sub)


class _ArrivalSplit(beam.PTransform):
    """Broken variant, part 1: the split per arrival batch, records kept in input order."""

    def __init__(self, *, fractions, seed, **_kw) -> None:
        super().__init__()
        self._fractions = tuple(fractions)
        self._key = RandomSource(seed=seed).child("plausible.split-key").secret_key()

    def expand(self, batches):
        split = beam.FlatMap(_split_per_arrival_batch, self._key, self._fractions)
        out = batches | "PerArrivalBatch" >> split.with_output_types(EncodedBatch).with_outputs(
            "structure", "params", main="seeds")
        return {"seeds": out.seeds, "structure": out.structure, "params": out.params}


def _candidates_per_arrival_batch(batch, model, rows, n_seeds, *, seed):
    """Candidates of one seed batch as it arrived (no value shards, no sort): seed by seed."""
    rs = RandomSource(seed=seed).child("plausible.candidates", zlib.crc32(batch.codes.tobytes()))
    reps = poisson_counts(rs.child("poisson"), float(rows) / max(int(n_seeds), 1), len(batch))
    y, logp = model.generate(batch.codes[np.repeat(np.arange(len(batch)), reps)], rs.child("generate"))
    yield CandidateBatch(y, logp, f"arrival:{zlib.crc32(batch.codes.tobytes())}")


class _ArrivalCandidates(beam.PTransform):
    """Broken variant, part 2: candidates per arrival batch, seed by seed in input order (as
    before 525b900: a stream keyed by the batch's content, no value shards, no sort)."""

    def __init__(self, *, model, rows, n_seeds, seed, **_kw) -> None:
        super().__init__()
        self._side, self._seed = (model, rows, n_seeds), seed

    def expand(self, seeds):
        return seeds | "PerArrivalBatch" >> beam.FlatMap(
            _candidates_per_arrival_batch, *(beam.pvalue.AsSingleton(p) for p in self._side),
            seed=self._seed)


def test_plausible_file_order_is_a_function_of_the_released_rows(tmp_path):
    records = _records()
    a = _plausible(tmp_path, "a", _order_a(records))
    b = _plausible(tmp_path, "b", [(7, 7, 7)] + _order_b(records))  # other order, D + one record
    for got in (a, b):
        assert len(got) > 500
        np.testing.assert_array_equal(got, _as_ordered_release(got))
    # measured (1207 and 1208 rows): 0.245 and 0.244; each share has SD ≈ 0.013, so a false
    # failure needs a gap of > 5 SD of the difference. The broken variant below measured 0.965
    # and 0.685.
    share_a, share_b = _same_z_share(a), _same_z_share(b)
    assert abs(share_a - share_b) < 0.1, (share_a, share_b)


def test_audit_catches_the_per_seed_emission(tmp_path, monkeypatch):
    """The input order carried from the read to the file (split, candidates and release per
    arrival batch, as emitted): measured 0.965 under A and 0.685 under B."""
    monkeypatch.setattr(plausible_pipeline, "SplitForPlausible", _ArrivalSplit)
    monkeypatch.setattr(plausible_pipeline, "GenerateCandidates", _ArrivalCandidates)
    monkeypatch.setattr(plausible_pipeline, "OrderReleased", _SeedOrder)
    records = _records()
    a = _plausible(tmp_path, "a", _order_a(records))
    b = _plausible(tmp_path, "b", [(7, 7, 7)] + _order_b(records))
    share_a, share_b = _same_z_share(a), _same_z_share(b)
    assert share_a - share_b > 0.2, (share_a, share_b)  # the order mirrors the input order
    assert not np.array_equal(a, _as_ordered_release(a))


@pytest.mark.parametrize("method", ["independent", pytest.param("privbayes", marks=pytest.mark.slow),
                                    pytest.param("sbhg", marks=pytest.mark.slow)])
def test_model_sampling_methods_write_the_same_file_for_any_input_order(tmp_path, method):
    records = _records()
    files = []
    for name, order, block in (("a", _order_a(records), 200), ("b", _order_b(records), 70)):
        src = _write(tmp_path / f"{name}.csv", order)  # other order, other blocks
        out = tmp_path / f"{method}-{name}.csv"
        run_synthesis(SynthesisConfig(input=str(src), schema=ORDER_SCHEMA, output=str(out),
                                      epsilon=1.0, delta=1e-6, method=method, rows=300, seed=SEED,
                                      block_rows=block), OPTIONS)
        files.append(out.read_bytes())
    assert files[0] == files[1] and files[0].count(b"\n") == 301


# =============================================================================================
# Ledger windows: cumulative ε visible, renewal only with the declaration; no machine metadata
# =============================================================================================
def _nights(ledger: PrivacyLedger, policy: LedgerPolicy, nights: int, tmp: Path) -> list[str]:
    """One ε=1 release per night on the same people (the input keeps every old record), a day
    apart (the ledger's clock moved back a day after each night); returns what was refused."""
    refused = []
    for n in range(nights):
        try:
            rid = ledger.reserve(run_key=f"night{n}", name="n", folder=str(tmp / f"n{n}"),
                                 spends=[LedgerSpend(source="src", privacy_unit="record", step="t.m",
                                                     epsilon=1.0, delta=0.0, mechanism="m")],
                                 policies={"src": policy})
            ledger.commit(rid)
        except LedgerBudgetExceededError:
            refused.append(f"night{n}")
        with sqlite3.connect(ledger.path) as con:
            for r, created in con.execute("SELECT release_id, created FROM releases").fetchall():
                when = dt.datetime.fromisoformat(created) - dt.timedelta(days=1)
                con.execute("UPDATE releases SET created = ?, updated = ? WHERE release_id = ?",
                            (when.isoformat(timespec="microseconds"),) * 2 + (r,))
    return refused


def _ledger_problems(tmp: Path) -> list[str]:
    """What the audit finds wrong with the ledger, run as an operator would misuse it: a window of
    1 day (ε=1) over nightly data that never leaves the input, 5 nights of ε=1."""
    problems = []
    try:
        policy = LedgerPolicy(epsilon=1.0, window_days=1)  # no retention declared
    except ValueError as exc:
        assert "data_retention_days" in str(exc)
    else:
        ledger = PrivacyLedger(tmp / "undeclared.sqlite")
        if not _nights(ledger, policy, 5, tmp):
            problems.append("the budget renewed without a declaration that old data left the input")
    # declared (the operator says each record stays one night): renewal is allowed, and what the
    # same people would accumulate if the declaration were wrong must still be visible
    ledger = PrivacyLedger(tmp / "declared.sqlite")
    assert _nights(ledger, LedgerPolicy(epsilon=1.0, window_days=1, data_retention_days=1), 5, tmp) == []
    shown = format_ledger(ledger)
    largest = max(float(x) for x in re.findall(r"ε=([0-9.e+-]+)", shown))
    if largest < 5.0:
        problems.append(f"ledger show hides the cumulative ε=5 (largest shown: {largest:g})")
    return problems


def test_ledger_renews_only_when_declared_and_shows_the_lifetime_total(tmp_path):
    assert _ledger_problems(tmp_path) == []


def test_audit_catches_a_silent_rolling_window(tmp_path, monkeypatch):
    """The broken variant: a window needs no declaration and `ledger show` prints the window only."""
    monkeypatch.setattr(LedgerPolicy, "__post_init__", lambda self: None)
    monkeypatch.setattr(ledger_mod, "_stored_policy", lambda row: LedgerPolicy(
        row["epsilon"], row["delta"], row["window_days"], row["data_retention_days"]))
    monkeypatch.setattr(ledger_mod, "format_source", lambda s: [
        f"  {s['source']}: spent ε={s['epsilon_spent']:g} of {s['policy']} "
        f"(ε={s['epsilon_left']:g} left)"])
    assert _ledger_problems(tmp_path) == [
        "the budget renewed without a declaration that old data left the input",
        "ledger show hides the cumulative ε=5 (largest shown: 1)"]


def test_a_window_without_declaration_is_refused_when_the_config_is_loaded(tmp_path):
    src = _write(tmp_path / "in.csv", _records()[:10])
    config = {"name": "n", "folder": str(tmp_path / "out-{date}"), "budget": {"epsilon": 1.0},
              "ledger": {"path": str(tmp_path / "l.sqlite"),
                         "policies": {"src": {"epsilon": 1.0, "window_days": 30}}},
              "tables": [{"name": "t", "input": str(src), "schema": ORDER_SCHEMA_SPEC, "epsilon": 1.0}],
              "reports": {"private": False, "public": False}}
    with pytest.raises(ReleaseConfigError, match=r"ledger\.policies\.src\.window_days: .*declare "
                                                 r"data_retention_days"):
        load_release_config(config)
    config["ledger"]["policies"]["src"]["data_retention_days"] = 7
    assert load_release_config(config).policies["src"].renews


# -- public outputs of a release carry nothing of the operator's machine ------------------------
def _machine_strings(*paths: Path) -> set[str]:
    found = {socket.gethostname(), str(Path.home()), os.getcwd()}
    found |= {str(p.resolve()) for p in paths} | {str(p) for p in paths}
    user = getpass.getuser()
    if len(user) >= 5:  # short names (root) are ordinary words in a report
        found.add(user)
    return {s for s in found if len(s) > 1 and s != "/"}


def _leaks(public: dict[str, bytes], secrets: set[str]) -> list[str]:
    """``file: string`` for each machine string found as a whole token (images left out: a short
    host name is a substring of any long base64 text)."""
    found = []
    for name, data in public.items():
        text = re.sub(rb"data:image/[a-z]+;base64,[A-Za-z0-9+/=]+", b"", data)
        found += [f"{name}: {s!r}" for s in secrets
                  if re.search(rb"(?<![A-Za-z0-9_.-])" + re.escape(s.encode("utf-8"))
                               + rb"(?![A-Za-z0-9_-])", text)]
    return sorted(found)


ADULT = Path(__file__).resolve().parents[2] / "examples" / "data" / "adult" / "adult.csv"


@pytest.mark.skipif(not ADULT.exists(), reason="examples/data/adult/adult.csv is not in this checkout")
@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("matplotlib", "sklearn")),
                    reason="the public report needs matplotlib and scikit-learn")
def test_public_outputs_of_a_release_name_no_path_host_or_user(tmp_path, monkeypatch):
    data = tmp_path / "in" / "adult.csv"
    data.parent.mkdir()
    data.write_text("".join(ADULT.read_text(encoding="utf-8").splitlines(keepends=True)[:301]),
                    encoding="utf-8")
    cfg_path = tmp_path / "cfg" / "release.yaml"
    cfg_path.parent.mkdir()
    cfg_path.write_text(
        f"name: audit\nfolder: {tmp_path}/rel/audit-{{date}}\nbudget: {{epsilon: 1.0}}\n"
        f"ledger: {{path: {tmp_path}/ledger/l.sqlite, policies: {{adult: {{epsilon: 5}}}}}}\n"
        f"tables:\n  - {{name: adult, input: {data}, schema: adult, epsilon: 1.0, formats: [csv, jsonl]}}\n"
        "reports: {private: false, public: true, target: income}\n", encoding="utf-8")
    cfg = load_release_config(cfg_path, date="2026-04-01")
    release = run_release(cfg, OPTIONS)
    folder = Path(cfg.folder)
    public = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
              if p.is_file() and not p.relative_to(folder).as_posix().startswith("private/")}
    assert {"release.json", "public/adult.csv", "public/adult.jsonl", "public/report.html"} <= set(public)
    secrets = _machine_strings(tmp_path, data, cfg_path, Path(cfg.ledger_path), folder)
    assert _leaks(public, secrets) == []
    assert release["ledger"]["night"] == "audit@audit-2026-04-01"
    # the broken variant: release.json naming the night by its run key (name@absolute folder)
    monkeypatch.setattr(release_mod, "public_night", release_mod.run_key)
    doc = json.dumps(release_mod._release_document(cfg, "x", {}, [])).encode("utf-8")
    assert f"release.json: {str(folder)!r}" in _leaks({"release.json": doc}, secrets)


@pytest.mark.parametrize("command", ["histogram", "prefixes"])
def test_histogram_and_prefix_files_do_not_depend_on_the_input_order(tmp_path, command):
    from beamsynth.pipelines.cli.main import main

    words = tmp_path / "words.txt"
    words.write_text("".join(f"v{i:02d}\n" for i in range(LEVELS)), encoding="utf-8")
    records = _records()
    files = []
    for name, order in (("a", _order_a(records)), ("b", _order_b(records))):
        src = _write(tmp_path / f"{name}.csv", order)
        out = tmp_path / f"{command}-{name}.csv"
        args = (["histogram", str(src), "--column", "a", "--domain", f"words:{words}",
                 "--tolerance", "0.001"] if command == "histogram" else
                ["prefixes", str(src), "--kind", "text", "--column", "a", "--max-length", "3",
                 "--method", "improved"])
        assert main(["--quiet", *args, "--epsilon", "2", "--output", str(out), "--seed", str(SEED),
                     "--runner=DirectRunner"]) == 0
        files.append([out.read_bytes()] + ([Path(f"{out}.tree.csv").read_bytes()]
                                           if command == "prefixes" else []))
    assert files[0] == files[1] and files[0][0].count(b"\n") > 10
