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
