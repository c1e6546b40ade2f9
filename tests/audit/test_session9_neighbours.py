"""Audit (H23): privacy review of the ninth session's new code, through the real paths.

1. PrivBayes refinement sized from the DP count at run time (b1dbbfe): the run may measure
   ``P > P0`` tables at ``ε_meas/P`` each. Found: the spends (and ``bs.WriteManifest``, which is
   assembled before the run, and the plan details) stated the planned ``P0`` picks/tables with
   ``ε/P0`` each and the scale at ``P0``, pointing to a ``chosen_refine`` that only CLI
   ``synthesize`` manifests have: an API manifest said 3 tables at ε 0.0653 (scale 15.3) for a
   run that measured 15 at ε 0.0131 (scale 76.5). Now the spends give ``[min, max]`` over the
   pair counts the run can choose and say where the run's ``P`` is (CLI ``chosen_refine``, the
   Beam counter ``beamsynth/privbayes_refine_pairs_<P>``).
2. ``SplitLate`` on a stream (45493a5): TestStream with records before the watermark, behind it
   in an open window, stamped 1 s before the end, at the watermark exactly at the end, an empty
   window and 30 late records; under the round-robin shard keys, one key and keys by line: the
   same one release per window, each late record one dead letter, never also used. No breach.
   The test fails with the split disabled (late records silently dropped, counted used).
3. Beam's ``Read`` on the DaskRunner (94d3fbb): the read had min(splits, partitions)
   partitions, the splits following the file sizes, and every step after it kept that width, so
   a release's row order (fixed file name) and file count (Beam's default sharding) followed the
   input's size and file layout; neighbours D (just under 1.25 MiB, 1 split) and D + 1 row (2
   splits): 1 vs 2 synthetic files. Fixed: the read always has its planned partitions.
4. Whole floats retried as integer text (d5b3cea): 17 odd values (1.0, 1.00000000000000001,
   -0.0, 1e16, nan, inf, np.float32/64, Decimal, '1.0'/'1' text, 1, True, 2.0, 1.5) in a column
   declaring both '1' and '1.0' and in one declaring '1' only: each value's outcome alone is as
   stated below, and the same beside every other value and itself (and after a memo history,
   checked by hand: 0 of 578 differ). No breach; np.float32(2.0) and Decimal('1.0') are not
   retried (dead where 2.0 / 1.0 are used): consistent per value, not per batch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import apache_beam as beam
import pandas as pd
import pytest
from apache_beam.metrics.metric import MetricsFilter

import beamsynth as bs
from beamsynth.pipelines.cli.main import main

pytestmark = pytest.mark.audit

ROOT = Path(__file__).resolve().parents[2]
ADULT = ROOT / "examples" / "data" / "adult" / "adult.csv"


def _adult_records(n: int) -> list[dict[str, str]]:
    df = pd.read_csv(ADULT, dtype=str, keep_default_na=False, nrows=n)
    return df.to_dict("records")


def _refine_spends(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["step"].rsplit(".", 1)[-1]: s for s in manifest["release"]["budget"]["spends"]
            if ".refine." in s["step"]}


def _within(value: float, span: Any) -> bool:
    low, high = (span, span) if not isinstance(span, list) else span
    return low * (1 - 1e-9) <= value <= high * (1 + 1e-9)


def _api_privbayes(folder: Path, options: dict[str, Any]) -> tuple[dict[str, Any], dict[int, int], int]:
    """Seeded API PrivBayes on 20,000 Adult records without a public input size: (manifest,
    {P: windows} from the run's counters, synthetic rows)."""
    job = bs.PrivacyJob(epsilon=1.0, seed=11)
    schema = bs.load_schema("adult")
    path = folder / "m.json"
    p = beam.Pipeline()
    private = p | beam.Create(_adult_records(20_000), reshuffle=False) | job.private(schema)
    rows = (private | bs.PrivBayes(epsilon=1.0, rows=50, options=options)
            | beam.combiners.Count.Globally())
    _ = rows | beam.Map(lambda n, f=str(folder / "rows.txt"): Path(f).write_text(str(n)))
    _ = p | bs.WriteManifest(job=job, path=str(path))
    result = p.run()
    result.wait_until_finish()
    chosen = {}
    for c in result.metrics().query(MetricsFilter().with_namespace("beamsynth"))["counters"]:
        name = c.key.metric.name
        if name.startswith("privbayes_refine_pairs_"):
            chosen[int(name.rsplit("_", 1)[1])] = c.committed
    manifest = json.loads(path.read_text(encoding="utf-8"))
    return manifest, chosen, int((folder / "rows.txt").read_text())


def test_api_manifest_states_the_refinement_split_the_run_can_use(tmp_path: Path) -> None:
    manifest, chosen, rows = _api_privbayes(tmp_path, {"refine_pairs": 3})
    spends = _refine_spends(manifest)
    sel, meas = spends["selection"], spends["marginals"]
    # the run raised the 3 requested pairs from n̂ (20,000 Adult rows, ε = 1: 11)
    (pairs,) = chosen
    assert pairs > 3 and chosen[pairs] == 1, chosen
    assert _within(pairs, sel["details"]["picks"]) and _within(pairs, meas["details"]["tables"])
    assert _within(sel["epsilon"] / pairs, sel["details"]["epsilon_per_pick"])
    assert _within(meas["epsilon"] / pairs, meas["details"]["epsilon_per_table"])
    assert _within(pairs / meas["epsilon"], meas["details"]["scale"])  # Δ = m = 1
    assert "DP count" in sel["details"]["pairs_note"]
    total = sum(s["epsilon"] for s in manifest["release"]["budget"]["spends"])
    assert total == pytest.approx(1.0)  # P·ε/P: the same total whatever P
    assert rows == 50  # the output's shape never depends on P


def test_cli_manifest_spends_match_the_run_and_chosen_refine(tmp_path: Path) -> None:
    src = tmp_path / "in.csv"
    pd.read_csv(ADULT, dtype=str, keep_default_na=False, nrows=20_000).to_csv(src, index=False)
    outs = {}
    for name, extra in {"raised": ["--pb-refine-pairs", "3"], "default": []}.items():
        out = tmp_path / name / "out.csv"
        out.parent.mkdir()
        assert main(["synthesize", str(src), "--schema", "adult", "--epsilon", "1", "--rows", "40",
                     "--seed", "5", "--method", "privbayes", *extra, "--output", str(out),
                     "--quiet"]) == 0
        outs[name] = (json.loads(Path(f"{out}.manifest.json").read_text("utf-8")),
                      len(out.read_text("utf-8").splitlines()))
    manifest, lines = outs["raised"]
    sizing = manifest["release"]["details"]["method"]["privbayes"]["sizing"]
    spends = _refine_spends(manifest)
    for p, run in sizing["chosen_refine"].items():
        assert _within(int(p), spends["marginals"]["details"]["tables"])
        assert _within(run["epsilon_per_table"], spends["marginals"]["details"]["epsilon_per_table"])
        assert _within(run["epsilon_per_pick"], spends["selection"]["details"]["epsilon_per_pick"])
        assert _within(run["table_scale"], spends["marginals"]["details"]["scale"])
    # Adult's default request (15 = d) cannot be raised: the spends state the one split, no note
    default = _refine_spends(outs["default"][0])
    assert default["marginals"]["details"]["tables"] == 15
    assert "pairs_note" not in default["marginals"]["details"]
    assert lines == outs["default"][1] == 41  # header + 40 rows whatever P


# -- 2. SplitLate on a stream (45493a5, f18665d) ----------------------------------------------------
# A record is late iff it reaches SplitLate's grouping after the watermark passed its window's end;
# Beam's trigger driver marks a pane fired by an arriving element LATE from the output watermark
# alone (not from the key's earlier panes), so the round-robin shard key cannot change a decision.
DAY = 86_400
T0 = 1_704_067_200  # 2024-01-01T00:00:00Z
D1, D2, D3, D4 = (f"2024-01-0{i}T00:00:00Z" for i in (1, 2, 3, 4))
STREAM_SCHEMA = bs.load_schema({"name": "toy", "columns": [
    {"name": "sex", "type": "categorical", "domain": {"kind": "categorical", "values": ["F", "M"]}}]})
LATE_MANY = [(100 + i, "FM"[i % 2], T0 + (i % 3) * DAY + 30 * i) for i in range(30)]


def _event(line: int, sex: str, ts: int) -> Any:
    from apache_beam.transforms import window as beam_window

    return beam_window.TimestampedValue({"sex": sex, "line": line}, ts)


def _stream(late: bool) -> Any:
    """Day 1: line 1 early, lines 2 (behind the watermark, window open) and 3 (stamped 1 s before
    the end) while the watermark is 1 s before the end; the watermark then sits exactly at the
    end: line 4 (day 1, late) and line 5 (day 2, on time) arrive. Day 3 gets nothing. With
    ``late``, 30 records of days 1-3 arrive after every release."""
    from apache_beam.testing import test_stream

    s = (test_stream.TestStream().advance_watermark_to(T0)
         .add_elements([_event(1, "F", T0 + 60)])
         .advance_watermark_to(T0 + DAY - 1)
         .add_elements([_event(2, "M", T0 + 10), _event(3, "F", T0 + DAY - 1)])
         .advance_watermark_to(T0 + DAY)
         .add_elements([_event(4, "M", T0 + DAY - 1), _event(5, "F", T0 + DAY)])
         .advance_watermark_to(T0 + 3 * DAY + 5))
    if late:
        s = s.add_elements([_event(*e) for e in LATE_MANY])
    return s.advance_watermark_to_infinity()


def _late_reason(ts: int) -> str:
    day = (ts - T0) // DAY
    return f"arrived after window [{(D1, D2, D3)[day]}, {(D2, D3, D4)[day]}) was released"


def _stream_outputs(late: bool, folder: Path) -> dict[str, list]:
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    options = PipelineOptions(["--direct_running_mode=in_memory"])
    options.view_as(StandardOptions).streaming = True
    windows = bs.DeclaredWindows(start=T0, end=T0 + 3 * DAY, size=DAY)
    job = bs.PrivacyJob(epsilon=200.0, seed=7)
    folder.mkdir(parents=True)

    def keep(name: str) -> Any:  # the matcher runs on a pickled copy: write what it sees
        def write(items: Any, path: str = str(folder / f"{name}.json")) -> None:
            Path(path).write_text(json.dumps(sorted(map(list, items))), encoding="utf-8")
        return write

    from apache_beam.testing.util import assert_that
    from apache_beam.transforms import window as beam_window

    with beam.Pipeline(options=options) as p:
        private = p | _stream(late) | job.private(STREAM_SCHEMA, position_field="line",
                                                  source="ev", windows=windows)
        glob = beam_window.GlobalWindows()
        assert_that(private.dead_letters | beam.Map(lambda d: (d.position, d.reason)),
                    keep("dead"), label="Dead")
        assert_that(private | bs.Count(epsilon=100.0) | "C" >> beam.Map(tuple)
                    | "GC" >> beam.WindowInto(glob), keep("counts"), label="Counts")
        cells = (private | bs.Marginals(marginals=[("sex",)], epsilon=100.0))["sex"]
        assert_that(cells | "M" >> beam.Map(tuple) | "GM" >> beam.WindowInto(glob),
                    keep("cells"), label="Cells")
        assert_that(tuple(job.count_outputs) | beam.Flatten(), keep("exact"), label="Exact")
    got = {n: [tuple(x) for x in json.loads((folder / f"{n}.json").read_text("utf-8"))]
           for n in ("dead", "counts", "cells", "exact")}
    sums: dict[str, int] = {}
    for _source, field, n in got.pop("exact"):
        sums[field] = sums.get(field, 0) + n
    got["exact"] = sorted(sums.items())
    return got


def _shard_variants() -> dict[str, Any]:
    from beamsynth.transforms import windows as windows_module

    def constant(self: Any, element: Any) -> Any:
        yield 0, element

    def by_line(self: Any, element: Any) -> Any:
        yield hash(element["line"]) % 5, element

    return {"round_robin": None, "one_key": constant, "key_by_line": by_line,
            "module": windows_module}


@pytest.mark.slow
def test_stream_releases_once_per_window_and_late_records_are_dead_letters_once(
        tmp_path: Path) -> None:
    """Neighbours D (no late arrivals) and D + 30 late records, under three shard keyings: every
    window released exactly once (an empty day 3 too) with the same values, the at-the-end arrival
    (line 4) and the 30 late ones dead-lettered exactly once each, never also released."""
    from unittest import mock

    variants = _shard_variants()
    module = variants.pop("module")
    runs = {}
    for name, process in variants.items():
        for late in (False, True):
            if process is None:
                runs[name, late] = _stream_outputs(late, tmp_path / f"{name}{late}")
            else:
                with mock.patch.object(module._ShardFn, "process", process):
                    runs[name, late] = _stream_outputs(late, tmp_path / f"{name}{late}")
    counts = [(D1, 3), (D2, 1), (D3, 0)]
    cells = [(D1, "F", 2), (D1, "M", 1), (D2, "F", 1), (D2, "M", 0), (D3, "F", 0), (D3, "M", 0)]
    for (name, late), got in runs.items():
        dead = [(4, _late_reason(T0 + DAY - 1))] + (
            [(line, _late_reason(ts)) for line, _s, ts in LATE_MANY] if late else [])
        extra = len(LATE_MANY) if late else 0
        assert got == {"dead": sorted(dead), "counts": counts, "cells": cells,
                       "exact": [("encoded", 4), ("read", 5 + extra), ("rejected", 1 + extra),
                                 ("used", 4)]}, (name, late, got)


# -- 4. whole floats retried as integer text (d5b3cea) ----------------------------------------------
WHOLE_SCHEMA = bs.load_schema({"name": "h23w", "columns": [
    {"name": "both", "type": "categorical",
     "domain": {"kind": "categorical", "values": ["1", "1.0", "0", "2"]}},
    {"name": "ints", "type": "categorical",
     "domain": {"kind": "categorical", "values": ["1", "0", "2", "10000000000000000"]}},
]})
WHOLE_POOL = {"1.0": 1.0, "1.00000000000000001": 1.00000000000000001, "-0.0": -0.0, "1e16": 1e16,
              "nan": float("nan"), "inf": float("inf"), "f32_1": None, "f32_2": None,
              "f64_1": None, "dec_1.0": None, "dec_1": None, "text_1.0": "1.0", "text_1": "1",
              "int_1": 1, "true": True, "2.0": 2.0, "1.5": 1.5}
# the outcome alone, per column: code index in the declared values, or None (dead letter); since
# H45 (2d82958) a number whose text is not declared is the declared category of its value, so
# np.float32 2.0 is "2" as np.float64 2.0 was (it was a dead letter, its text "2.0")
WHOLE_ALONE = {
    "both": {"1.0": 1, "1.00000000000000001": 1, "-0.0": 2, "1e16": None, "nan": None,
             "inf": None, "f32_1": 1, "f32_2": 3, "f64_1": 1, "dec_1.0": 1, "dec_1": 0,
             "text_1.0": 1, "text_1": 0, "int_1": 0, "true": None, "2.0": 3, "1.5": None},
    "ints": {"1.0": 0, "1.00000000000000001": 0, "-0.0": 1, "1e16": 3, "nan": None,
             "inf": None, "f32_1": 0, "f32_2": 2, "f64_1": 0, "dec_1.0": None, "dec_1": 0,
             "text_1.0": 0, "text_1": 0, "int_1": 0, "true": None, "2.0": 2, "1.5": None},
}
# since H55 (d8c7376) text a pandas reader would parse as a number is judged by its value as that
# number is: text "1.0" in "ints" is "1" as the float 1.0 is (it was a dead letter); in "both" a
# declared "1.0" still wins


def _whole_pool() -> dict[str, Any]:
    import decimal

    import numpy as np

    return {**WHOLE_POOL, "f32_1": np.float32(1.0), "f32_2": np.float32(2.0),
            "f64_1": np.float64(1.0), "dec_1.0": decimal.Decimal("1.0"),
            "dec_1": decimal.Decimal("1")}


def _whole_outcomes(column: str, values: list[Any]) -> list[Any]:
    """Each value's outcome in one ``encode_elements`` batch (the API's encode): its code in
    ``column`` or ``("dead", reason)``."""
    import numpy as np

    from beamsynth.transforms.column_memo import SchemaMemo
    from beamsynth.transforms.inputs import KeyLayout, encode_elements

    base = {"both": "2", "ints": "2"}
    records = [{**base, column: v, "line": i} for i, v in enumerate(values)]
    enc, dead = encode_elements(KeyLayout(WHOLE_SCHEMA), records, source="s",
                                position_field="line", memo=SchemaMemo(WHOLE_SCHEMA))
    codes = np.concatenate([b.codes for b in enc]).tolist() if enc else []
    reasons = {d.position: d.reason for d in dead}
    col, out, k = WHOLE_SCHEMA.names.index(column), [], 0
    for r in records:
        if r["line"] in reasons:
            out.append(("dead", reasons[r["line"]]))
        else:
            out.append(codes[k][col])
            k += 1
    return out


@pytest.mark.parametrize("column", ["both", "ints"])
def test_whole_floats_are_judged_alone(column: str) -> None:
    """Each value's code/dead letter alone is as expected (a declared '1.0' wins for 1.0; 1e16 is
    its integer text; float32/Decimal are not retried), and equals its outcome beside every other
    value of the pool and beside a copy of itself (rule 6: no batch dependence)."""
    pool = _whole_pool()
    names = list(pool)
    alone = {n: _whole_outcomes(column, [pool[n]])[0] for n in names}
    assert {n: (None if isinstance(o, tuple) else o) for n, o in alone.items()} == WHOLE_ALONE[column]
    bad = []
    for a in names:
        for b in [*names, a]:
            got = _whole_outcomes(column, [pool[a], pool[b]])
            if got[0] != alone[a] or got[1] != alone[b]:
                bad.append((a, b, got, alone[a], alone[b]))
    assert not bad, bad[:5]


# -- 3. Beam's Read on the DaskRunner (94d3fbb) ------------------------------------------------------
MIB = 1 << 20  # the default smallest split (runners/dask_runner.py _MIN_SPLIT_BYTES)
# a file splits in two from 1.25 MiB (Beam's OffsetRange.split folds a last split < 1/4 of it)
TWO_SPLITS = MIB + MIB // 4


def _dask_release(args: list[str], pattern: str, header: list[str], folder: Path) -> dict[str, Any]:
    """ReadFromText → job.private → bs.Count + bs.Synthesize, seeded: each release written once
    with a fixed name (``num_shards=1``, rows in the runner's order, not sorted) and once with
    Beam's default sharding; the manifest's release part."""
    folder.mkdir(parents=True)
    job = bs.PrivacyJob(epsilon=2.0, seed=11)
    with beam.Pipeline(options=bs.pipeline_options(args)) as p:
        private = (p | "Read" >> beam.io.ReadFromText(pattern, skip_header_lines=1)
                   | "Parse" >> beam.Map(lambda line: dict(zip(header, line.split(","))))
                   | job.private(bs.load_schema("adult")))
        outputs = {"count": private | bs.Count(epsilon=0.5),
                   "synthetic": private | bs.Synthesize(epsilon=1.0, rows=3000, shard_rows=500)}
        for name, rows in outputs.items():
            lines = rows | f"Json[{name}]" >> beam.Map(
                lambda r: json.dumps(r._asdict(), sort_keys=True, default=str))
            _ = lines | f"Fixed[{name}]" >> beam.io.WriteToText(
                str(folder / name), num_shards=1, shard_name_template="")
            _ = lines | f"Default[{name}]" >> beam.io.WriteToText(str(folder / "default" / name))
        _ = p | bs.WriteManifest(job=job, path=str(folder / "manifest.json"))
    release = json.loads((folder / "manifest.json").read_text("utf-8"))["release"]
    release.pop("outputs")
    return {"count": (folder / "count").read_bytes(), "synthetic": (folder / "synthetic").read_bytes(),
            "release": release,
            "default_files": sorted(f.name for f in (folder / "default").iterdir())}


@pytest.mark.slow
def test_dask_read_release_shape_does_not_follow_the_input_splits(tmp_path: Path,
                                                                 dask_address: str) -> None:
    """Found: the read's partitions were min(splits, partitions), the splits following the file
    sizes (1 MiB floor), and every step after the read kept that width: the same 3,000 rows as
    one file (1 split) or three (3 splits) gave the synthetic rows in another order under a
    fixed file name and 1 vs 3 synthetic files under Beam's default sharding; neighbours D (a
    file just under 1.25 MiB: 1 split) and D + 1 row (2 splits) gave 1 vs 2 files. Now the read
    always has the partitions it was planned with (empty ones past the splits)."""
    lines = ADULT.read_text(encoding="utf-8").splitlines()
    header, body = lines[0], lines[1:]
    dask = ["--runner", "dask", f"--dask_client_address={dask_address}"]
    (tmp_path / "one").mkdir()
    (tmp_path / "three").mkdir()
    (tmp_path / "one" / "a.csv").write_text("\n".join([header, *body[:3000]]) + "\n", "utf-8")
    for i, (a, b) in enumerate([(0, 500), (500, 2200), (2200, 3000)]):
        (tmp_path / "three" / f"p{i}.csv").write_text("\n".join([header, *body[a:b]]) + "\n",
                                                      "utf-8")
    names = header.split(",")
    one = _dask_release(dask, str(tmp_path / "one" / "*.csv"), names, tmp_path / "r1")
    three = _dask_release(dask, str(tmp_path / "three" / "*.csv"), names, tmp_path / "r3")
    assert one == three
    assert len(one["synthetic"].splitlines()) == 3000
    # neighbours across the size where a file becomes two splits
    size, n = len(header) + 1, 0
    while size + len(body[n]) + 1 < TWO_SPLITS:
        size, n = size + len(body[n]) + 1, n + 1
    for name, rows in {"d": body[:n], "d1": body[:n + 1]}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "in.csv").write_text("\n".join([header, *rows]) + "\n", "utf-8")
    sizes = [(tmp_path / name / "in.csv").stat().st_size for name in ("d", "d1")]
    assert sizes[0] < TWO_SPLITS <= sizes[1], sizes
    d = _dask_release(dask, str(tmp_path / "d" / "in.csv"), names, tmp_path / "rd")
    d1 = _dask_release(dask, str(tmp_path / "d1" / "in.csv"), names, tmp_path / "rd1")
    assert d["default_files"] == d1["default_files"], (d["default_files"], d1["default_files"])
    assert d["release"]["budget"] == d1["release"]["budget"]
