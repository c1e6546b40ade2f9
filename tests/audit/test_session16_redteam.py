"""Sixteenth session red team (H77) of the fifteenth session's last commits (after H74's start:
54ca5fc..0e35b3b), with neighbour pairs through the real paths (API ``job.private`` + mechanisms +
``bs.WriteManifest``, Beam YAML, the CLI) and recorded draws. docs/audits.md "Sixteenth session:
red team of the fifteenth session's last commits (H77)" has the numbers and what each test was
checked against (a broken variant it catches).

1. ``release.rows_out`` (54ca5fc, API; Beam YAML's per-window manifests) is the released table's
   size: the declared ``rows`` whatever the input, or the DP count; never a count of the input,
   of a window, of the used records or of the dead letters.
2. Plausible deniability's run-time figures (0a98adb): ``released`` public, ``tested`` /
   ``composed_over_tested`` private, the charged ``C`` a function of the declared ``rows``.
3. The fit's ``refine_margins='alive'`` default (c06f065) reads released tables only: with the
   measuring step given equal exact counts, D and D − 1 write the same bytes through the CLI.
4. ``Column._undo_timestamps``' per-call lookup (4119413): a record reads the same alone and
   inside batches of other records (``Column.encode``, the per-worker memo, API dicts, Arrow).
5. ``p.apply(step, private)`` and its relatives (e735b8b): refused when built, whatever the
   wrapping, and nothing in the graph consumes the exact records.
6. Found and fixed: Beam YAML error rows gave a row's place in its batch as its position when
   ``position_field`` held no integer (6b48d6a); two composites' steps with one label were one
   step to the job (rows_out 40 + 40 for 10 and 30; seeded, one noise stream: 7dbcb7c); two
   Beam YAML synthesis steps with one seed drew the same noise (749d27e).
"""

from __future__ import annotations

import datetime
import json
import random
from pathlib import Path

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from apache_beam.testing import test_pipeline

import beamsynth as bs
from beamsynth.transforms.column_memo import SchemaMemo
from beamsynth.transforms.inputs import KeyLayout, encode_elements
from tests.test_session15_manifest import (  # the toy schema, records on days 0 and 1 of 3
    DAY,
    NAMES,
    SCHEMA,
    SPEC,
    T0,
    WINDOWS,
    _diff,
    _records,
)

pytestmark = pytest.mark.audit

def _neighbours(records: list[dict]) -> dict[str, list[dict]]:
    """D − 1, D + a bad record (rejected), D + a record in the empty day, D + one outside."""
    first = records[0]
    return {"D-1": records[1:], "D+bad": [*records, dict(first, sex="X")],
            "D+empty day": [*records, dict(first, day=2)],
            "D+outside": [*records, dict(first, day=9)]}


def _public(manifest: dict) -> dict:
    release = dict(manifest["release"])
    for key in ("outputs", "versions"):
        release.pop(key, None)
    return release


def _api(folder: Path, records: list[dict], **synth) -> tuple[dict, list[dict]]:
    """One seeded API job over the three declared days: (manifest, synthetic rows)."""
    folder.mkdir()
    job = bs.PrivacyJob(epsilon=synth.get("epsilon", 5.0), delta=synth.get("delta", 0.0), seed=3)
    with test_pipeline.TestPipeline(options=bs.pipeline_options([]), blocking=True) as p:
        private = (p | beam.Create(records)
                   | "Stamp" >> beam.Map(lambda r: beam.window.TimestampedValue(
                       r, T0 + r["day"] * DAY + 60))
                   | job.private(SCHEMA, windows=WINDOWS))
        rows = private | bs.Synthesize(**{"epsilon": 5.0, **synth})
        _ = (rows | beam.Map(lambda r: json.dumps(r._asdict(), sort_keys=True, default=str))
             | beam.io.WriteToText(str(folder / "rows"), shard_name_template=""))
        _ = p | bs.WriteManifest(job=job, path=str(folder / "manifest.json"))
    out = [json.loads(line) for line in (folder / "rows").read_text().splitlines()]
    return json.loads((folder / "manifest.json").read_text()), out


def _per_window(rows: list[dict]) -> dict[str, int]:
    starts = sorted({r["window_start"] for r in rows})
    return {s: sum(r["window_start"] == s for r in rows) for s in starts}


# -- 1. rows_out ------------------------------------------------------------------------------------
def test_api_rows_out_is_the_declared_rows_whatever_the_input(tmp_path):
    """rows=40 per declared day: an input with a record in days 1 and 2, a bad record (rejected)
    and one outside every day releases 40 + 40 + 40 rows, the empty third day included, and says
    120 (release.rows_out and the step's entry), never 2 (used), 4 (read) or 1 (rejected). Caught
    on a scratch rows_out read from the used records. The neighbour pairs (public parts equal)
    are the slow test below."""
    records = [*_records(2), dict(_records(1)[0], sex="X"), dict(_records(1)[0], day=9)]
    m, rows = _api(tmp_path / "d", records, method="independent", rows=40)
    assert m["release"]["rows_out"] == len(rows) == 120
    (entry,) = [e for e in m["release"]["details"]["mechanisms"] if "rows_out" in e]
    assert entry["rows_out"] == 120
    assert list(_per_window(rows).values()) == [40, 40, 40]
    days = ["2024-01-01T00:00:00Z", "2024-01-02T00:00:00Z", "2024-01-03T00:00:00Z"]
    assert m["release"]["rows_out_per_window"] == entry["rows_out_per_window"] == dict.fromkeys(
        days, 40)  # 978d860 (H79): per declared window, the empty one included
    op = m["operational"]
    assert (op["rows_read"], op["rows_used"], op["rows_rejected"]) == (4, 2, 2)
    assert "rows_out" not in op


@pytest.mark.slow  # two API runs, 7 s at load 10; the one-run test above runs by default
def test_api_fixed_rows_neighbours_have_equal_public_parts(tmp_path):
    """rows=40 per declared day (one day empty): D and D' (one record fewer, one bad record, one
    record in the empty day, one outside every day) release 40 + 40 + 40 rows each and say 120;
    the public parts are equal, the exact counts differ in operational only."""
    records = _records(300)
    changed = [*records[1:], dict(records[0], sex="X"), dict(records[0], day=2),
               dict(records[0], day=9)]
    a, rows_a = _api(tmp_path / "d", records, method="independent", rows=40)
    b, rows_b = _api(tmp_path / "d2", changed, method="independent", rows=40)
    for m, rows in ((a, rows_a), (b, rows_b)):
        assert m["release"]["rows_out"] == len(rows) == 120
        assert list(_per_window(rows).values()) == [40, 40, 40]
    assert _diff(_public(a), _public(b)) == []
    assert (a["operational"]["rows_used"], b["operational"]["rows_used"]) == (300, 300)
    assert (a["operational"]["rows_rejected"], b["operational"]["rows_rejected"]) == (0, 2)


@pytest.mark.slow  # five API runs, 34-41 s each at load 10; the one-run test above runs by default
@pytest.mark.parametrize("method,delta", [("privbayes", 0.0), ("sbhg", 1e-6)])
def test_api_rows_out_differs_only_by_the_dp_count(tmp_path, method, delta):
    """rows=None (a DP count per declared day): with the seed fixed every count draws the same
    noise, so D − 1 and D + a record in the empty day move rows_out by at most one (the count's
    clamp at 0 may hide it), the bad and the outside record not at all; every other public field
    is equal, rows_out_per_window (978d860) included outside the changed day. Measured
    (privbayes): 592 / 591 / 592 / 592 / 592; sbhg 590 / 589 / 590 / 591 / 590."""
    records = _records(600)
    base, rows = _api(tmp_path / "D", records, method=method, delta=delta)
    assert base["release"]["rows_out"] == len(rows)
    for name, variant in _neighbours(records).items():
        m, out = _api(tmp_path / name, variant, method=method, delta=delta)
        assert m["release"]["rows_out"] == len(out), name
        diffs = _diff(_public(base), _public(m))
        day = {"D-1": "2024-01-01T00:00:00Z", "D+empty day": "2024-01-03T00:00:00Z"}.get(name)
        assert set(diffs) <= {("rows_out",), ("details", "mechanisms", 0, "rows_out"),
                              ("rows_out_per_window", day),
                              ("details", "mechanisms", 0, "rows_out_per_window", day)}, (name, diffs)
        moved = m["release"]["rows_out"] - base["release"]["rows_out"]
        assert moved in {"D-1": (0, -1), "D+empty day": (0, 1)}.get(name, (0,)), (name, moved)
        assert sum(m["release"]["rows_out_per_window"].values()) == m["release"]["rows_out"]


@pytest.mark.slow  # two API runs of plausible deniability, 23 s at load 10
def test_api_plausible_tested_count_stays_private_released_is_public(tmp_path):
    """Plausible deniability over the declared days, D vs D + one record in the empty day: that
    record is a seed there, so 44 candidates are generated and tested in that day and all are
    rejected (fewer than k plausible seeds): tested 126 -> 170, composed_over_tested grows,
    both in operational only; the public part (released 126, released_per_window, the charged
    (C·ε₁, C·δ₁ + δ_tail) with C = 104 from the declared rows 60) is equal."""
    kw = {"method": "plausible", "epsilon": 5000.0, "delta": 1e-6, "rows": 60,
          "options": {"k": 50}}
    records = _records(600)
    a, rows_a = _api(tmp_path / "d", records, **kw)
    b, rows_b = _api(tmp_path / "d1", [*records, dict(records[0], day=2)], **kw)
    assert _diff(_public(a), _public(b)) == []
    assert sorted(map(json.dumps, rows_a)) == sorted(map(json.dumps, rows_b))
    (entry,) = [e for e in a["release"]["details"]["mechanisms"] if "rows_out" in e]
    assert entry["rows_out"] == entry["details"]["released"] == a["release"]["rows_out"] == len(rows_a)
    per_window = {w["window_start"]: w["released"] for w in entry["details"]["released_per_window"]}
    assert a["release"]["rows_out_per_window"] == entry["rows_out_per_window"] == per_window
    charged = entry["details"]["release_guarantee"]["charged"]
    assert (charged["C"], charged["rows"]) == (104, 60)
    step = entry["step"]
    pa_, pb_ = a["operational"]["mechanisms"][step], b["operational"]["mechanisms"][step]
    assert pb_["tested"] > pa_["tested"] and pb_["released"] == pa_["released"]
    assert pb_["composed_over_tested"]["epsilon"] > pa_["composed_over_tested"]["epsilon"]
    private_keys = {"tested", "candidates", "pass_rate", "composed_over_tested", "rejection_reasons"}
    assert private_keys <= _keys(b["operational"])
    assert not private_keys & _keys(b["release"]), private_keys & _keys(b["release"])


def _keys(value) -> set:
    """Every mapping key in a JSON value."""
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


@pytest.mark.slow  # five Beam YAML runs, 38 s at load 10; the API one-run test runs by default
def test_yaml_window_manifests_differ_only_in_the_changed_windows_dp_count(tmp_path):
    """BeamsynthSynthesize privbayes without rows (a DP count per declared day), one manifest per
    day, seed 11: D − 1 changes day 1's rows_out only (by at most one), a bad record or a record
    outside every day none of the public parts (operational: rejected 1 / rows_outside_windows
    1 in every day), a record in the empty day that day's rows_out only (0 -> 1)."""
    records = _records(600)
    base, _ = _yaml_run(tmp_path / "D", records)
    changed = {0: ("D-1",), 2: ("D+empty day",)}
    for name, variant in _neighbours(records).items():
        ms, _ = _yaml_run(tmp_path / name, variant)
        assert len(ms) == 3
        for i, (x, y) in enumerate(zip(base, ms)):
            diffs = _diff(_public(x), _public(y))
            assert set(diffs) <= ({("rows_out",)} if name in changed.get(i, ()) else set()), (
                name, i, diffs)
            assert y["release"]["rows_out"] - x["release"]["rows_out"] in (-1, 0, 1)


def _yaml_run(folder: Path, records: list[dict]) -> tuple[list[dict], list[str]]:
    """The Beam YAML step over the three declared days, rows from a DP count: its manifests."""
    import yaml

    pytest.importorskip("apache_beam.yaml.main", reason="needs apache-beam[yaml]")
    from tests.yaml_helpers import provider, run_yaml

    folder.mkdir()
    (folder / "schema.yaml").write_text(yaml.safe_dump(SPEC))
    cols = [*NAMES, "day"]
    (folder / "in.csv").write_text("\n".join([",".join(cols)] + [
        ",".join(str(r[c]) for c in cols) for r in records]) + "\n")
    run_yaml(folder / "p.yaml", f"""
providers:
  - include: "{provider()}"
pipeline:
  transforms:
    - type: ReadFromCsv
      name: Read
      config: {{path: "{folder / 'in.csv'}", dtype: str, keep_default_na: false, header: 0,
               names: [{", ".join(cols)}]}}
    - type: AssignTimestamps
      name: Time
      input: Read
      config: {{timestamp: "{T0 + 60} + {DAY} * int(day)", language: python}}
    - type: BeamsynthSynthesize
      name: Synth
      input: Time
      config: {{schema: "{folder / 'schema.yaml'}", epsilon: 5.0, method: privbayes, seed: 11,
               manifest: "{folder / 'm.json'}",
               windows: {{start: {T0}, end: {T0 + 3 * DAY}, size: {DAY}}}}}
    - type: WriteToJson
      name: Write
      input: Synth
      config: {{path: "{folder / 'rows'}"}}
""")
    rows = sorted(line for p in sorted(folder.glob("rows*")) for line in p.read_text().splitlines())
    return [json.loads(p.read_text()) for p in sorted(folder.glob("m*.json"))], rows


# -- 3. the fit reads released tables only -----------------------------------------------------------
def test_privbayes_fit_step_takes_the_measurement_only():
    """The Fit step (where refine_margins='alive' combines the refinement's coarse pairs with
    the network's margins) has one input, the measuring step's output, and no side input: it
    cannot read the records, their count or a list made from them. Built only (no run)."""
    job = bs.PrivacyJob(epsilon=5.0, seed=3)
    p = beam.Pipeline()
    private = p | beam.Create(_records(10)) | job.private(SCHEMA)
    _ = private | bs.PrivBayes(epsilon=5.0, rows=10)
    fits = []

    class Visit(beam.pipeline.PipelineVisitor):
        def enter_composite_transform(self, node):
            self.visit_transform(node)

        def visit_transform(self, node):
            if node.full_label.endswith("/Fit"):
                fits.append(node)
    p.visit(Visit())
    assert fits, "no Fit step"
    for node in fits:
        (source,) = node.main_inputs.values()
        fn = getattr(source.producer.transform, "fn", None)
        assert type(fn).__name__ == "PrivBayesMeasureFn", source.producer.full_label
        assert not node.side_inputs
    spends = [s.details or {} for s in job.accountant.spends]
    assert "alive" in [d.get("fit_refine_margins") for d in spends]


@pytest.mark.slow  # three CLI runs, 9 s at load 10; the structural test above runs by default
def test_cli_bytes_equal_when_the_measurement_is_equal(tmp_path, monkeypatch):
    """CLI privbayes (degree 1, 6 refinement pairs, fit_refine_margins 'alive'), --rows 300,
    seed 3: D − 1 with the removed record's cells added back to every exact family table before
    measure_privbayes (so every DP output equals D's) writes D's bytes and D's public manifest,
    with the same 7 recorded noise draws; unpatched, D − 1's bytes differ (the check can fail).
    Anything after the measurement reading the records, n or a list from them would differ."""
    import yaml

    from beamsynth.pipelines.cli.main import main
    from beamsynth.transforms import privbayes_measure as pbm
    from beamsynth.transforms import refine

    records = _records(800)
    removed = [int(c.encode(pd.Series([records[0][c.name]], dtype=object))[0][0])
               for c in SCHEMA.columns]
    measure, laplace, refine_laplace = (pbm.measure_privbayes, pbm.discrete_laplace,
                                        refine.discrete_laplace)

    def run(name: str, data: list[dict], add: list[int] | None) -> tuple[bytes, dict, list]:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "s.yaml").write_text(yaml.safe_dump(SPEC))
        src = folder / "in.csv"
        src.write_text("\n".join([",".join(NAMES)] + [",".join(str(r[c]) for c in NAMES)
                                                     for r in data]) + "\n")
        draws: list = []

        def equalized(counts, families, **kw):
            if add is not None:
                counts = [np.asarray(c).copy() for c in counts]
                for c, f in zip(counts, families):
                    c[tuple(add[i] for i in f)] += 1
            return measure(counts, families, **kw)

        def recorded(draw):
            def wrapper(*args, **kw):
                out = draw(*args, **kw)
                draws.append(np.asarray(out).tolist())
                return out
            return wrapper
        monkeypatch.setattr(pbm, "measure_privbayes", equalized)
        monkeypatch.setattr(pbm, "discrete_laplace", recorded(laplace))
        monkeypatch.setattr(refine, "discrete_laplace", recorded(refine_laplace))
        assert main(["--quiet", "synthesize", str(src), "--schema", str(folder / "s.yaml"),
                     "--epsilon", "5", "--method", "privbayes", "--rows", "300", "--seed", "3",
                     "--output", str(folder / "out.csv")]) == 0
        manifest = json.loads((folder / "out.csv.manifest.json").read_text())
        return (folder / "out.csv").read_bytes(), manifest, draws

    d, d_manifest, d_draws = run("d", records, None)
    e, e_manifest, e_draws = run("d1", records[1:], removed)
    raw, _, raw_draws = run("raw", records[1:], None)
    assert [(s["step"], (s.get("details") or {}).get("fit_refine_margins"))
            for s in d_manifest["release"]["budget"]["spends"]][2] == ("privbayes.marginals", "alive")
    assert "6" in d_manifest["release"]["details"]["method"]["privbayes"]["sizing"]["chosen_refine"]
    assert d == e and _public(d_manifest) == _public(e_manifest)
    assert d_draws == e_draws == raw_draws and len(d_draws) >= 3
    assert d_manifest["operational"]["rows_used"] == e_manifest["operational"]["rows_used"] + 1
    assert raw != d  # unequalized, the exact counts move the output


# -- 4. a record reads alike alone and in a batch (4119413) -------------------------------------------
DATES = bs.load_schema({"name": "dates", "columns": [
    {"name": "date", "type": "categorical", "domain": {"kind": "categorical", "values": [
        "2020-01", "2020-02-01", "Jan 2021", "2022-03-04 05:06:07", "word"]}},
    {"name": "created_at", "type": "integer",
     "domain": {"kind": "integer", "low": 0, "high": 4_000_000_000}},
    {"name": "updated_at", "type": "float",
     "domain": {"kind": "float", "low": 0, "high": 4e9, "bins": 8}},
]})
_T = pd.Timestamp
_POOLS = {
    "date": [_T("2020-01-01"), _T("2020-02-01"), _T("2021-01-01"), _T("2022-03-04 05:06:07"),
             _T("1999-01-01"), datetime.datetime(2020, 1, 1), np.datetime64("2020-02-01"),
             _T("2020-01-01", tz="UTC"), "2020-01", "2020-01-01", "Jan 2020", "word", "nope", None,
             1, 2.5],
    "created_at": [_T(1_600_000_000, unit="s"), _T(1_600_000_000_000, unit="ms"),
                   _T(1_600_000_000, unit="ms"), _T(40_000_000, unit="s"),
                   datetime.datetime(2020, 9, 13, 12, 26, 40), np.datetime64(1_600_000_000, "s"),
                   "1600000000", "2020-09-13", 1_600_000_000, 12, 1.6e9, None],
    "updated_at": [_T(1_600_000_000.5, unit="s"), _T(1_600_000_000, unit="s"),
                   _T(31_000_000, unit="s"), 1.6e9, "1.6e9", "x", None],
}


def _api_codes(records: list[dict]) -> list:
    """job.private's encoder on dicts (a fresh memo): each record's codes, or 'dead'."""
    rows = [dict(r, pos=i) for i, r in enumerate(records)]
    batches, dead = encode_elements(KeyLayout(DATES), rows, source="t", position_field="pos",
                                    memo=SchemaMemo(DATES))
    gone = {d.position for d in dead}
    codes = iter(np.concatenate([b.codes for b in batches]).tolist() if batches else [])
    return ["dead" if i in gone else tuple(next(codes)) for i in range(len(rows))]


def test_date_named_values_read_alike_alone_and_in_any_batch():
    """30 random batches of 1-7 values (timestamps of every unit, datetimes, datetime64, text,
    numbers, None) per date-named column: Column.encode and the per-worker memo (warmed with
    another value) give each value its code alone; 20 batches of dicts through job.private's
    encoder and 15 Arrow tables (timestamp columns, units s/ms/us/ns) give each record its codes
    alone. 0 mismatches at 4119413 (also at 300 / 200 / 150 by hand; a lookup that kept a
    previous value's instant would break this)."""
    rnd = random.Random(16)
    for _ in range(30):
        for j, col in enumerate(DATES.columns):
            values = [rnd.choice(_POOLS[col.name]) for _ in range(rnd.randrange(1, 8))]
            alone = [col.encode(pd.Series([v], dtype=object))[0][0] for v in values]
            assert col.encode(pd.Series(values, dtype=object))[0].tolist() == alone, values
            memo = SchemaMemo(DATES)
            memo.encode(j, [rnd.choice(_POOLS[col.name])])
            assert memo.encode(j, values)[0].tolist() == alone, values
    for _ in range(20):
        records = [{c: rnd.choice(v) for c, v in _POOLS.items()} for _ in range(rnd.randrange(2, 8))]
        assert _api_codes(records) == [_api_codes([r])[0] for r in records], records
    stamps = [_T("2020-01-01"), _T("2020-02-01"), _T("2021-01-01"), _T("1999-01-01"), None]
    epochs = [_T(1_600_000_000, unit="s"), _T(1_600_000_000_500, unit="ms"),
              _T(40_000_000, unit="s"), None]

    def arrow(dates, created, units):
        table = pa.table({"date": pa.array(dates, type=pa.timestamp(units[0])),
                          "created_at": pa.array(created, type=pa.timestamp(units[1])),
                          "updated_at": pa.array([1.6e9] * len(dates)),
                          "pos": pa.array(range(len(dates)))})
        batches, dead = encode_elements(KeyLayout(DATES), [table], source="t",
                                        position_field="pos", memo=SchemaMemo(DATES))
        gone = {d.position for d in dead}
        codes = iter(np.concatenate([b.codes for b in batches]).tolist() if batches else [])
        return ["dead" if i in gone else tuple(next(codes)) for i in range(len(dates))]
    for _ in range(15):
        n = rnd.randrange(2, 7)
        dates, created = [rnd.choice(stamps) for _ in range(n)], [rnd.choice(epochs) for _ in range(n)]
        units = (rnd.choice(["s", "ms", "us", "ns"]), rnd.choice(["ms", "us", "ns"]))
        assert arrow(dates, created, units) == [arrow([d], [c], units)[0]
                                                for d, c in zip(dates, created)], (dates, created)


# -- 5. no Beam step reaches the exact records --------------------------------------------------------
class _Inner(beam.PTransform):
    """A composite whose expand applies a Beam step to the private collection it holds."""

    def __init__(self, private, direct: bool) -> None:
        super().__init__()
        self._private, self._direct = private, direct

    def expand(self, pbegin):
        if self._direct:  # pipeline.apply called directly, inside a composite
            return pbegin.pipeline.apply(beam.Map(str), self._private, "Leak")
        return self._private | "Leak" >> beam.Map(str)


_LEAKS = {
    "p.apply": lambda p, q: p.apply(beam.Map(str), q),
    "p.apply in a tuple": lambda p, q: p.apply(beam.Map(str), (q,)),
    "p.apply in a dict": lambda p, q: p.apply(beam.Map(str), {"a": q}),
    "p.apply in a list": lambda p, q: p.apply(beam.Flatten(), [q]),
    "p.apply Flatten tuple": lambda p, q: p.apply(beam.Flatten(), (q,)),
    "p.apply CoGroupByKey": lambda p, q: p.apply(beam.CoGroupByKey(), {"a": q}),
    "with_input_types": lambda p, q: p.apply(beam.Map(str).with_input_types(bs.EncodedBatch), q),
    "labelled": lambda p, q: p.apply("L" >> beam.Map(str), q),
    "__ror__": lambda p, q: beam.Map(str).__ror__(q),
    "__ror__ labelled": lambda p, q: beam.Map(str).__ror__(q, "L"),
    "nested composite |": lambda p, q: p | _Inner(q, direct=False),
    "nested composite apply": lambda p, q: p | _Inner(q, direct=True),
    "AsDict": lambda p, q: p | "One" >> beam.Create([1]) | beam.Map(lambda x, s: x, beam.pvalue.AsDict(q)),
    "AsMultiMap": lambda p, q: p | "One" >> beam.Create([1]) | beam.Map(lambda x, s: x,
                                                              beam.pvalue.AsMultiMap(q)),
    "AsList": lambda p, q: p | "One" >> beam.Create([1]) | beam.Map(lambda x, s: x, beam.pvalue.AsList(q)),
}


def _readers(p: beam.Pipeline, pcoll: beam.PCollection) -> list[str]:
    """Labels of the steps that take ``pcoll`` as a main or side input."""
    found = []

    class Visit(beam.pipeline.PipelineVisitor):
        def enter_composite_transform(self, node):
            self.visit_transform(node)

        def visit_transform(self, node):
            if any(v is pcoll for v in node.main_inputs.values()) or any(
                    getattr(s, "pvalue", None) is pcoll for s in node.side_inputs):
                found.append(node.full_label)
    p.visit(Visit())
    return found


@pytest.mark.parametrize("leak", list(_LEAKS), ids=list(_LEAKS))
def test_no_beam_step_reaches_the_exact_records(leak):
    """Every variant is refused when built (Beam's own apply finds no PCollection in a private
    collection, whatever wraps it; e735b8b only words the message), nothing is spent, and no
    step was added that reads private.exact_batches() (only job.private's own counter does;
    a scratch variant that applies the step to the exact batches fails here)."""
    job = bs.PrivacyJob(epsilon=1.0, seed=3)
    p = beam.Pipeline()
    private = p | beam.Create(_records(5)) | job.private(SCHEMA)
    before = _readers(p, private.exact_batches())
    assert before == ["MakePrivate(toy)/UsedCounts"], before  # the manifest's exact used count
    with pytest.raises((TypeError, ValueError, NotImplementedError)):
        _LEAKS[leak](p, private)
    assert not job.accountant.spends
    assert _readers(p, private.exact_batches()) == before


# -- 6. Beam YAML error rows: a position or null, never a batch index (3f41e31) -----------------------
def test_yaml_error_row_position_is_null_when_the_position_field_holds_no_integer():
    """With position_field set, a row whose field holds no integer (12.7, text, missing) had its
    place in its BatchElements batch as the error row's position: the same record was row 1, 2
    or 6 in batches of 1, 2 or 6 (batches are sized by timing), where job.private states None
    (rule 8: a source position, never a made-up one). Now None in every batch, for rows the
    judge rejects and rows the encoder rejects; a valid position is kept."""
    from beamsynth.pipelines.yaml_transforms import encode_rows

    schema = bs.load_schema({"name": "t", "columns": [
        {"name": "sex", "type": "categorical", "domain": {"kind": "categorical", "values": ["F", "M"]}},
        {"name": "band", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 5}}]})
    bad = [{"sex": "X", "band": 1, "line": 12.7}, {"sex": "F", "band": 9, "line": "a.csv:3"},
           {"band": 1}, {"sex": "F", "band": 9, "line": 7}]
    for before in (0, 1, 5):
        rows = [{"sex": "F", "band": 1, "line": 3}] * before + bad
        _, rejected = encode_rows(schema, rows, position_field="line")
        rows_of = sorted((r.row for r in rejected), key=lambda r: (r is not None, r or 0))
        assert rows_of == [None, None, None, 7], (before, rejected)
    _, rejected = encode_rows(schema, bad)  # no position_field: the batch index (error rows: null)
    assert sorted(r.row for r in rejected) == [1, 2, 3, 4]


# -- 7. one step name per mechanism of a job (54ca5fc's rows_out, spends, run-time figures) ----------
class _Branch(beam.PTransform):
    """A composite applying ``"Synth" >> bs.Synthesize(...)`` to a private collection it holds."""

    def __init__(self, private, rows: int, label: str = "Synth") -> None:
        super().__init__()
        self._private, self._rows, self._inner = private, rows, label

    def expand(self, pbegin):
        return self._private | self._inner >> bs.Synthesize(epsilon=1.0, method="independent",
                                                             rows=self._rows)


def test_two_composites_inner_steps_with_one_label_are_refused():
    """Two composites (A, B) each applying a step labelled 'Synth' were one step to the job: both
    spent as 'Synth/independent.marginals', and WriteManifest (keyed by the step's label) stated
    rows_out 40 for each and 80 in all where the steps released 10 and 30 (and a PrivBayes or
    plausible step's run-time figures would be the two steps' merged). Seeded, the two steps
    drew the same noise too (job.step_seed(label)): two 'Count' steps over 300 and 250 records
    released 291 and 241, an exact difference, in three runs (secure mode drew apart). The
    second is now refused when built, before it spends; distinct inner labels build."""
    job = bs.PrivacyJob(epsilon=5.0, seed=3)
    p = beam.Pipeline()
    private = p | beam.Create(_records(20)) | job.private(SCHEMA)
    _ = p | "A" >> _Branch(private, 10)
    with pytest.raises(RuntimeError, match="'Synth'.*already"):
        _ = p | "B" >> _Branch(private, 30)
    assert [s.step for s in job.accountant.spends] == ["Synth/independent.marginals"]
    _ = p | "C" >> _Branch(private, 30, label="Synth2")  # its own label: builds
    assert [m["step"] for m in job.mechanisms] == ["Synth", "Synth2"]

    class Counted(beam.PTransform):
        def __init__(self, source) -> None:
            super().__init__()
            self._source = source

        def expand(self, pbegin):
            return self._source | "Count" >> bs.Count(epsilon=0.1)
    other = p | "Other" >> beam.Create(_records(10)) | "Private2" >> job.private(SCHEMA)
    _ = p | "D" >> Counted(private)
    with pytest.raises(RuntimeError, match="'Count'.*already"):
        _ = p | "E" >> Counted(other)  # seeded, it would share the first one's noise


# -- 8. Beam YAML: two synthesis steps of one job, one seed ------------------------------------------
@pytest.mark.parametrize("seeds,refused", [((7, 7), True), ((7, 8), False), ((None, None), False)])
def test_yaml_synthesis_steps_of_one_job_with_one_seed_are_refused(seeds, refused):
    """Two BeamsynthSynthesize steps of one pipeline (job_budget) with seed: 7 each drew the same
    noise: over 300 and 250 records their DP counts released 297 and 247 rows, the exact
    difference (seeds 7 and 8: 297 and 263). The API and the statistics steps mix the step's
    label into a job seed; this step takes its seed as given (the CLI's), so a repeated seed is
    now refused when built. Seeded output is never for release, but it must not be exact."""
    from tests.yaml_helpers import build, provider

    steps = [{"type": "BeamsynthSynthesize", "name": name, "input": "Rows",
              "config": {"schema": "adult", "epsilon": 0.5, "job_budget": {"epsilon": 1.0},
                         **({} if seed is None else {"seed": seed})}}
             for name, seed in zip(("First", "Second"), seeds)]
    spec = {"providers": [{"include": provider()}], "pipeline": {"transforms": [
        {"type": "Create", "name": "Rows", "config": {"elements": [{"age": "30"}]}}, *steps]}}
    if refused:
        with pytest.raises(ValueError, match=r"Second'.*seed 7 is also step 'First''s"):
            build(spec)
    else:
        build(spec)


# -- 9. a seeded (demo) release's tables shared one seed (closed by the lead: release.table_seed) ----
@pytest.mark.slow  # one two-table release, 10 s at load 6
def test_demo_release_tables_draw_apart(tmp_path):
    """A demo release (seed 3, demo: true) with two tables over 300 and 250 Adult records
    released 323 and 273 rows: the same +23 on both DP counts, so the difference is exact.
    Seeded releases are marked not for release; still no two tables of one release should
    share a stream (the API and the statistics steps mix in the step's label)."""
    from beamsynth.pipelines.cli.main import main
    from tests.pipeline.test_session11_release_ops import ADULT

    if not ADULT.exists():
        pytest.skip("examples/data/adult/adult.csv absent")
    lines = ADULT.read_text(encoding="utf-8").splitlines()
    (tmp_path / "a.csv").write_text("\n".join(lines[:301]) + "\n")
    (tmp_path / "b.csv").write_text("\n".join(lines[:251]) + "\n")
    tables = "".join(f"""
  - name: {t}
    input: {tmp_path / (t + '.csv')}
    schema: adult
    epsilon: 1.0
    columns: [age, sex, income]
    formats: [csv]""" for t in ("a", "b"))
    (tmp_path / "r.yaml").write_text(f"""
name: nightly
folder: {tmp_path}/rel/nightly-{{date}}
budget: {{epsilon: 2.0}}
ledger: {{path: {tmp_path}/ledger.sqlite, policies: {{adult: {{epsilon: 10}}}}}}
seed: 3
demo: true
tables:{tables}
reports: {{private: false, public: false}}
""")
    assert main(["--quiet", "release", str(tmp_path / "r.yaml"), "--date", "2026-03-01"]) == 0
    private = tmp_path / "rel" / "nightly-2026-03-01" / "private"
    out = [json.loads((private / f"{t}.manifest.json").read_text()) for t in ("a", "b")]
    assert [m["operational"]["rows_used"] for m in out] == [300, 250]
    noise = [m["release"]["rows_out"] - m["operational"]["rows_used"] for m in out]
    assert noise[0] != noise[1], noise  # 23 and 23 before table_seed
    seeds = [m["release"]["seed"] for m in out]
    assert len(set(seeds)) == 2 and 3 not in seeds, seeds
    # each table's manifest states its own seed (release.table_seed: the release seed and the
    # table's name)
    from beamsynth.pipelines.releases.config import load_release_config
    from beamsynth.pipelines.releases.release import table_seed

    cfg = load_release_config(str(tmp_path / "r.yaml"))
    assert seeds == [table_seed(cfg, t) for t in cfg.tables]
