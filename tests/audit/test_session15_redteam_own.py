"""Session 15 red team (H74) of the fifteenth session's own changes (35dcfea..HEAD), with neighbour
pairs through the real paths and recorded draws. Each test failed on the code before its fix (the
commit message says how it was checked); docs/audits.md "Fifteenth session: red team of the
session's own changes (H74)" lists what was found clean, with numbers.

1. ``_json_reader_stamp`` (H66, ea4d976/fdf20d3; cached per worker) read text pandas takes for a
   time of day (``"12:30"``, ``"0:00"``, ``"12:30 Jan 2020"``) as that time *today*: pandas
   fills the missing date parts from the wall clock, as for ``now``/``today``, which fdf20d3
   stopped retrying. So a recomputed step on another day encoded the record apart, and through
   the ``lru_cache`` a record's reading depended on whether another record of the same text was
   read first on that worker before midnight (rule 6). Now such text is not retried.
"""

from __future__ import annotations

import datetime
import json

import numpy as np
import pandas as pd
import pytest

import beamsynth as bs

pytestmark = pytest.mark.audit


def _today() -> datetime.date:
    return datetime.datetime.now().date()  # pandas' default date for a time of day (local)


def test_time_of_day_text_is_not_read_as_today_in_date_named_columns():
    """'0:00' beside a declared category of today's date, '12:30' in an epoch-seconds column:
    both were used (today's instant) and would be rejected on another day; now rejected on every
    day. A full date with a time is still read as its instant (guard)."""
    today = _today()
    if (datetime.datetime.now() + datetime.timedelta(seconds=5)).date() != today:
        pytest.skip("too close to midnight")
    schema = bs.load_schema({"name": "clock", "columns": [
        {"name": "date", "type": "categorical",
         "domain": {"kind": "categorical", "values": [today.isoformat(), "2020-01-01 12:30"]}},
        {"name": "created_at", "type": "integer",
         "domain": {"kind": "integer", "low": 0, "high": 4_000_000_000}}]})
    date, created = schema.columns
    codes, _ = date.encode(pd.Series(["0:00", "00:00", "0:00:00", "2020-01-01T12:30"], dtype=object))
    assert codes.tolist()[:3] == [codes[0]] * 3 and codes[0] < 0, codes  # was [0, 0, 0, 1]
    assert codes[3] == 1  # a full date-time is the declared instant, as before
    codes, _ = created.encode(pd.Series(["12:30", "9:30", "12:30 Jan 2020", "1600000000"],
                                        dtype=object))
    assert (np.asarray(codes[:3]) < 0).all(), codes  # today's 12:30 epoch second before
    assert codes[3] == 1_600_000_000


def test_declared_time_of_day_category_is_no_instant():
    """A declared category '12:30' in a date-named column stood for today's 12:30 (pandas'
    parse of the declared text): a record's '<today> 12:30' was that category today only."""
    today = _today()
    if (datetime.datetime.now() + datetime.timedelta(seconds=5)).date() != today:
        pytest.skip("too close to midnight")
    schema = bs.load_schema({"name": "clock", "columns": [
        {"name": "date", "type": "categorical",
         "domain": {"kind": "categorical", "values": ["12:30", "2020-01-01"]}}]})
    (date,) = schema.columns
    codes, _ = date.encode(pd.Series([f"{today.isoformat()} 12:30", "12:30",
                                      pd.Timestamp("2020-01-01")], dtype=object))
    assert codes.tolist() == [codes[0], 0, 1] and codes[0] < 0, codes  # was [0, 0, 1]


# -- H72: run-time choices in the public part of API manifests (neighbours, declared windows) ------
def _public(manifest: dict) -> dict:
    release = dict(manifest["release"])
    for key in ("outputs", "versions"):
        release.pop(key, None)
    return release


@pytest.mark.slow  # 10 s at load 5 (6 s CPU); tests/test_session15_manifest.py::test_neighbours_manifests_differ_only_where_dp_outputs_differ covers the global window
def test_windowed_api_neighbours_differ_only_in_the_changed_windows_choices(tmp_path):
    """D (1,000 + 1,000 records in days 1 and 2, day 3 empty) and D − 1 (one day-1 record
    removed), same seed: the public part (chosen_per_window in window order, the chosen_* totals,
    the windows section, the spends) may differ only in day 1's DP choices; the exact counts
    (999 + 1,000 used) only in operational."""
    from tests.test_session15_manifest import _api, _api_details, _diff, _records

    records = _records()
    large, _ = _api(tmp_path / "d", records, windowed=True)
    small, _ = _api(tmp_path / "d1", records[1:], windowed=True)
    assert large["operational"]["rows_used"] == small["operational"]["rows_used"] + 1 == 2000
    diffs = _diff(_public(small), _public(large))
    sizing = ("details", "mechanisms", 0, "details", "privbayes", "sizing")
    assert all(p[:6] == sizing and (p[6] != "chosen_per_window" or p[7] == 0) for p in diffs), diffs
    per = _api_details(large)["sizing"]["chosen_per_window"]
    assert [w["window_start"] for w in per] == [w["window_start"] for w in
                                               _api_details(small)["sizing"]["chosen_per_window"]]
    text = json.dumps(_public(large))
    assert "rows_hat" not in text and "rows_used" not in text and "999" not in text



@pytest.mark.slow  # 12 s at load 5 (two YAML runs); the API pair above, the global-window pair in
# tests/test_session15_manifest.py (default) covers the choices' fields
def test_windowed_yaml_neighbours_differ_only_in_operational(tmp_path):
    """The Beam YAML step's manifests (one per declared day), D vs D − 1 (a day-1 record removed),
    seed 11: every window's public part identical (day 1's choices are the same DP outputs
    here), operational differs in day 1 only (1,000 vs 999 used)."""
    from tests.test_session15_manifest import DAY, T0, _diff, _records, _yaml

    windows = f", windows: {{start: {T0}, end: {T0 + 3 * DAY}, size: {DAY}}}"
    records = _records()
    large = _yaml(tmp_path / "d", records, 11, windows=windows)
    small = _yaml(tmp_path / "d1", records[1:], 11, windows=windows)
    assert len(large) == len(small) == 3
    for i, (a, b) in enumerate(zip(large, small)):
        assert _diff(_public(b), _public(a)) == [], i
        assert bool(_diff(b["operational"], a["operational"])) == (i == 0), i
        assert "chosen_degree_windows" in a["release"]["details"]["method"]["privbayes"]["sizing"]
    assert large[0]["operational"]["rows_used"] == small[0]["operational"]["rows_used"] + 1

def test_release_manifest_names_the_privbayes_model_that_ran(tmp_path):
    """``beamsynth release`` (a CLI front end) never read the run's counters, so its table
    manifests and release.json lacked the chosen_* fields that privbayes' target/refinement notes
    point at "for every front end" (H72, 8d00950); synthesize's manifest had them. Now the
    release reads them as synthesize does (public: functions of the DP count)."""
    from beamsynth.pipelines.cli.main import main
    from tests.pipeline.test_session11_release_ops import ADULT, _adult, _config

    if not ADULT.exists():
        pytest.skip("examples/data/adult/adult.csv absent")
    data = tmp_path / "adult.csv"
    data.write_text(_adult(800), encoding="utf-8")
    cfg = _config(tmp_path, data)
    cfg.write_text(cfg.read_text(encoding="utf-8").replace(
        "    epsilon: 1.0\n", "    epsilon: 1.0\n    method: privbayes\n"
        "    options: {pb_noise: laplace}\n"), encoding="utf-8")
    assert main(["--quiet", "release", str(cfg), "--date", "2026-03-01"]) == 0
    night = tmp_path / "rel" / "nightly-2026-03-01"
    manifest = json.loads((night / "private" / "adult.manifest.json").read_text())
    sizing = manifest["release"]["details"]["method"]["privbayes"]["sizing"]
    assert sum(sizing["chosen_degree_windows"].values()) == 1, sizing  # KeyError before
    assert "chosen_degree_windows" in (night / "release.json").read_text()
    assert "rows_hat" not in json.dumps(manifest["release"])


def _zone_probe() -> list:
    from beamsynth.schemas import schema as schema_module

    schema_module._json_reader_stamp.cache_clear()  # per process: read again in this zone
    schema_module._declared_instants.cache_clear()
    schema = bs.load_schema({"name": "tz", "columns": [
        {"name": "created_at", "type": "integer",
         "domain": {"kind": "integer", "low": 1_500_000_000, "high": 1_700_000_000, "bins": 10}},
        {"name": "date", "type": "categorical",
         "domain": {"kind": "categorical", "values": ["2020-01-01 12:30 CET", "2020-01-01 12:30"]}}]})
    at, date = schema.columns
    texts = ["2020-01-01 12:30 CET", "2020-01-01 12:30 JST", "2020-01-01 12:30 +0100",
             "2020-01-01T12:30Z"]
    out = []
    for column, values in ((at, texts), (date, texts[:1] + ["2020-01-01T12:30"])):
        try:
            out.append(column.encode(pd.Series(values, dtype=object))[0].tolist())
        except Exception as exc:  # noqa: BLE001 - what the old code did in Europe/Berlin
            out.append(type(exc).__name__)
    return out


def test_zone_named_text_reads_alike_on_every_machine(monkeypatch):
    """'2020-01-01 12:30 CET' in a date-named column: pandas drops an unknown zone name (12:30
    naive on a UTC machine), takes the local zone where it is the machine's (12:30+09:00 for JST
    in Tokyo) and raised AttributeError in Europe/Berlin, which failed the CLI run ('while running
    Read/EncodeRows/Encode/ParDo(_EncodeFn)'; rule 8) where a UTC machine used the row. Now such
    text is no instant anywhere (rejected as declared); offsets and Z still are. The declared
    category spelled with a zone name stands for no instant either."""
    import time

    outs = {}
    try:
        for tz in ("UTC", "Europe/Berlin", "Asia/Tokyo"):
            monkeypatch.setenv("TZ", tz)
            time.tzset()
            outs[tz] = _zone_probe()
    finally:
        monkeypatch.undo()
        time.tzset()
        _zone_probe()  # the caches hold this machine's readings again
    assert outs["UTC"] == outs["Europe/Berlin"] == outs["Asia/Tokyo"], outs
    codes, dates = outs["UTC"]
    assert codes[0] < 0 and codes[1] < 0 and codes[2] >= 0 and codes[3] >= 0, codes
    assert dates == [0, 1], dates  # the declared spelling as text; the ISO text its instant


def test_datetime_columns_read_no_wall_clock():
    """A declared datetime column read 'now' and 'today' (pandas' ISO 8601 parser) as the wall
    clock: used in today's cell while the declared range covers it, another cell (or rejected)
    when the step is recomputed later. fdf20d3 stopped that for date-named columns only."""
    today = _today()
    if (datetime.datetime.now() + datetime.timedelta(seconds=5)).date() != today:
        pytest.skip("too close to midnight")
    start, end = today - datetime.timedelta(days=1), today + datetime.timedelta(days=1)
    schema = bs.load_schema({"name": "clock", "columns": [
        {"name": "seen", "type": "datetime", "domain": {
            "kind": "datetime", "start": start.isoformat(), "end": end.isoformat(),
            "granularity": "day"}}]})
    (seen,) = schema.columns
    codes, reasons = seen.encode(pd.Series(["now", "today", start.isoformat(), "NOW"],
                                           dtype=object))
    assert codes[0] < 0 and codes[1] < 0 and sorted(reasons) == [0, 1, 3], (codes, reasons)
    assert codes[2] == 0  # was [1, 1, 0, -2]: 'now'/'today' in today's cell
