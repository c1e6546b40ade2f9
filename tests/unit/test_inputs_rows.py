"""The row-major lookup of settled columns (``SchemaMemo.encode_rows``, the JSON-dicts fast path of
``encode_elements``) gives the same codes and dead letters (reasons, positions, element text,
order) as the column-by-column path on a messy input, batch after batch."""

from __future__ import annotations

import random

import numpy as np

from beamsynth.schemas.schema import load_schema
from beamsynth.transforms import inputs
from beamsynth.transforms.column_memo import SchemaMemo
from beamsynth.transforms.inputs import KeyLayout, encode_elements

SCHEMA = load_schema("adult")
BAD_TEXT = [None, "", "?", " ", "Mars", "39.5", "1e1", "-3", "999999999", "male", " Male", "x" * 600]


def _pool(column) -> list[str]:
    if column.type == "integer":  # declared values (the bins' labels are no input values)
        low = column.domain.low
        return [str(v) for v in range(low, min(column.domain.high, low + 80) + 1)]
    return [str(column.domain.decode(i)) for i in range(column.domain.size)]


POOLS = {c.name: _pool(c) for c in SCHEMA.columns}


def _messy(rnd: random.Random, start: int, n: int) -> list[dict]:
    """JSON-like dicts: mostly valid text, some bad text, missing/extra/aliased/unhashable."""
    records = []
    for i in range(start, start + n):
        r = {name: rnd.choice(pool) for name, pool in POOLS.items()}
        r["fnlwgt"] = str(rnd.randint(10_000, 10_400))
        r["line"] = i
        for _ in range(rnd.choice([0] * 12 + [1, 2])):
            r[rnd.choice(SCHEMA.names)] = rnd.choice(BAD_TEXT)
        roll = rnd.random()
        if roll < 0.01:
            del r[rnd.choice(SCHEMA.names)]
        elif roll < 0.02:
            r["comment"] = "extra"
        elif roll < 0.025:
            r["education_num"] = r.pop("education-num")
        elif roll < 0.028:
            r["sex"] = ["Male"]
        records.append(r)
    return records


def _run(memo: SchemaMemo, batches: list[list[dict]]):
    layout = KeyLayout(SCHEMA)
    out = []
    for records in batches:
        encoded, dead = encode_elements(layout, records, source="src", position_field="line",
                                        memo=memo)
        codes = np.concatenate([b.codes for b in encoded]) if encoded else None
        out.append((codes, [(d.source, d.position, d.reason, d.element) for d in dead]))
    return out


def test_row_major_lookup_equals_column_path_on_messy_dicts(monkeypatch):
    rnd = random.Random(11)
    batches = [_messy(rnd, k * 400, 400) for k in range(12)]
    fast = SchemaMemo(SCHEMA)
    taken = []
    encode_rows = fast.encode_rows

    def spy(records, fields):
        done = encode_rows(records, fields)
        taken.append(len(done))
        return done

    fast.encode_rows = spy
    gathered = []
    gather = inputs._RecordColumns.gather
    monkeypatch.setattr(inputs._RecordColumns, "gather",
                        lambda self, names: gathered.append(gather(self, names) or len(self)))
    got = _run(fast, batches)
    slow = SchemaMemo(SCHEMA)
    slow.encode_rows = lambda records, fields: {}  # column by column, as before the fast paths
    monkeypatch.setattr(inputs._RecordColumns, "gather", lambda self, names: None)
    want = _run(slow, batches)
    assert max(gathered) >= len(SCHEMA.columns)  # the one-pass gather ran too
    assert max(taken) >= len(SCHEMA.columns) - 1, taken  # the row-major path ran
    dead_total = 0
    for (codes, dead), (ref_codes, ref_dead) in zip(got, want):
        assert codes.dtype == ref_codes.dtype
        assert np.array_equal(codes, ref_codes)
        assert dead == ref_dead
        dead_total += len(dead)
    rows = sum(len(b) for b in batches)
    assert 100 < dead_total < rows / 2  # messy enough to mean something, most records kept


def test_row_major_lookup_equals_schema_encode_columns():
    """Against the schema's own encoder (no memo at all), on records with every field."""
    rnd = random.Random(5)
    memo = SchemaMemo(SCHEMA)
    layout = KeyLayout(SCHEMA)
    for k in range(8):
        records = [{**r, **{n: r.get(n) for n in SCHEMA.names}} for r in _messy(rnd, k * 300, 300)]
        records = [r for r in records if not isinstance(r["sex"], list)
                   and "education_num" not in r and "comment" not in r]
        encoded, dead = encode_elements(layout, records, source="s", memo=memo)
        ref, bad = SCHEMA.encode_columns({n: [r[n] for r in records] for n in SCHEMA.names},
                                         len(records))
        assert np.array_equal(encoded[0].codes, ref.codes)
        assert [d.reason for d in dead] == [why for _, why in bad]


def test_a_miss_falls_back_to_columns_and_backs_off():
    memo = SchemaMemo(SCHEMA)
    layout = KeyLayout(SCHEMA)
    good = {c.name: str(c.domain.decode(0)) for c in SCHEMA.columns}
    names = list(SCHEMA.names)
    assert memo.encode_rows([good], names) == {}  # nothing learned yet: a miss, skip 1 try
    encode_elements(layout, [good], source="s", memo=memo)  # skipped; columns learn the values
    assert not any(c.settled for c in memo.columns)
    encode_elements(layout, [good], source="s", memo=memo)  # column path finds every value
    assert all(c.settled for c in memo.columns)
    done = memo.encode_rows([good, good], names)
    assert sorted(done) == list(range(len(names)))
    for j, (codes, why) in done.items():
        ref_codes, ref_why = memo.encode_records(j, [good, good], names[j])
        assert codes.tolist() == ref_codes.tolist() and why == ref_why


def test_typed_and_aliased_records_equal_column_path(monkeypatch):
    """Avro-like dicts (identifier names, int values), with records that carry both spellings
    of a name or lack a field: the one-pass gather reads what the per-column reader reads."""
    rnd = random.Random(2)
    ints = {c.name for c in SCHEMA.columns if c.type == "integer"}

    def record(i):
        base = _messy(rnd, i, 1)[0]
        r = {}
        for n in SCHEMA.names:
            v = base.get(n, base.get(n.replace("-", "_")))
            if n in ints and isinstance(v, str) and v.isdigit():
                v = int(v)
            elif isinstance(v, list):  # (an unhashable value sends the batch one by one)
                v = "Male"
            r[n.replace("-", "_")] = v
        r["line"] = i
        roll = rnd.random()
        if roll < 0.02 and i // 300 == 4:
            r["capital-gain"] = "lots"  # both spellings: the declared one wins (rejected)
        elif roll < 0.04 and i // 300 in (1, 3):  # a field missing
            del r["hours_per_week"]
        elif roll < 0.05:
            r["age"] = True
        return r

    batches = [[record(k * 300 + i) for i in range(300)] for k in range(6)]
    gathered = []
    gather = inputs._RecordColumns.gather
    monkeypatch.setattr(inputs._RecordColumns, "gather",
                        lambda self, names: gathered.append(gather(self, names) or len(self)))
    got = _run(SchemaMemo(SCHEMA), batches)
    assert max(gathered) >= len(SCHEMA.columns)  # the one-pass gather ran
    slow = SchemaMemo(SCHEMA)
    slow.encode_rows = lambda records, fields: {}
    monkeypatch.setattr(inputs._RecordColumns, "gather", lambda self, names: None)
    want = _run(slow, batches)
    for (codes, dead), (ref_codes, ref_dead) in zip(got, want):
        assert np.array_equal(codes, ref_codes)
        assert dead == ref_dead
    assert sum(len(d) for _, d in got) > 20
