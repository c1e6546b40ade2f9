"""A batch of dicts that fails as a whole (a nested value in a declared column) is split in halves
until the failing records stand alone: the result equals encoding every record alone (codes,
order, dead letters) at about log2(n) batch encodes per failing record, not n one-record encodes
(census KDD JSON with 26 nested values in 50k events: every batch took the per-record path)."""

from __future__ import annotations

import random

import numpy as np

from beamsynth.transforms import inputs
from beamsynth.transforms.column_memo import SchemaMemo
from beamsynth.transforms.inputs import KeyLayout, encode_elements
from tests.unit.test_inputs_rows import SCHEMA, _messy


def _alone(layout: KeyLayout, records: list[dict]):
    """Reference: each record encoded alone, as the old fallback did."""
    codes, dead = [], []
    memo = SchemaMemo(SCHEMA)
    for r in records:
        encoded, d = encode_elements(layout, [r], source="src", position_field="line", memo=memo)
        codes += [b.codes for b in encoded if len(b)]
        dead += [(x.source, x.position, x.reason, x.element) for x in d]
    return np.concatenate(codes), dead


def test_failing_batch_splits_to_the_failing_records(monkeypatch):
    rnd = random.Random(8)
    records = _messy(rnd, 0, 2000)
    for i in (3, 700, 701, 1999):  # nested values: the whole batch raises
        records[i]["workclass"] = {"code": "Private"}
    layout = KeyLayout(SCHEMA)
    calls = []
    encode = inputs._encode_records
    monkeypatch.setattr(inputs, "_encode_records",
                        lambda lay, recs, memo=None, *pos: calls.append(len(recs)) or encode(lay, recs, memo, *pos))
    encoded, dead = encode_elements(layout, records, source="src", position_field="line",
                                    memo=SchemaMemo(SCHEMA))
    got = np.concatenate([b.codes for b in encoded])
    split_calls = len(calls)
    monkeypatch.setattr(inputs, "_encode_records", encode)
    want_codes, want_dead = _alone(layout, records)
    assert got.dtype == want_codes.dtype and np.array_equal(got, want_codes)
    assert [(d.source, d.position, d.reason, d.element) for d in dead] == want_dead
    nested = [d.position for d in dead if "not one value" in d.reason]  # dicts and lists
    assert {3, 700, 701, 1999} <= set(nested) and len(nested) < 20
    assert len(dead) > 20 and len(got) + len(dead) == len(records)
    # at most 2 encodes per failing record and level (log2(2000) < 11), not 2000 + 1
    assert split_calls <= 1 + 2 * 11 * len(nested), (split_calls, len(nested))
