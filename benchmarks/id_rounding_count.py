"""What the manifest's rounded-id count (``operational.privacy_ids_rounded``) costs the API's
encoding (H82): ``count_rounded_ids`` against the rule it replaced (a regex and ``int`` per id of
16 or more characters; H79 measured it at 4.3 % of encoding for ids below 10^6, 31 % for ids of
10^18 or more).

``--rows`` dict records (``json.loads`` form: the id as an int, plus three declared columns) are
encoded by ``encode_elements`` in batches of the API's ``DEFAULT_BATCH_ROWS``, under a schema with
a privacy id column (``privacy_ids: rounded``), for ids below 10^6 and ids of 10^18 or more; the
two counts run on the encoded batches' ids in the same run. Prints seconds (medians of
``--repeat``) and each count's share of encoding. Run under ``nice -n 5``::

    nice -n 5 python benchmarks/id_rounding_count.py --rows 1000000 --repeat 3
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import time

_LONG = re.compile(r"[+-]?[0-9]{16,}")


def old_count(pids) -> int:
    """The count before H82 (schemas/schema.py at 4aaf65b): the baseline of this run."""
    if pids is None:
        return 0
    return sum(1 for p in pids if len(p) > 15 and _LONG.fullmatch(p) and abs(int(p)) >= 2**53)


def main(argv: list[str] | None = None) -> int:
    from beamsynth.schemas.schema import count_rounded_ids, load_schema
    from beamsynth.transforms.inputs import (
        DEFAULT_BATCH_ROWS,
        KeyLayout,
        SchemaMemo,
        encode_elements,
    )

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    schema = load_schema({"name": "ids", "privacy_id": "pid", "columns": [
        {"name": "sex", "type": "categorical", "domain": {"kind": "categorical", "values": ["F", "M"]}},
        {"name": "city", "type": "categorical",
         "domain": {"kind": "categorical", "values": ["Oslo", "Rome", "Lima"]}},
        {"name": "band", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 5}}]})
    layout = KeyLayout(schema)
    rnd = random.Random(1)
    print(f"{args.rows:,} dict records, batches of {DEFAULT_BATCH_ROWS:,}, medians of {args.repeat}")
    print(f"{'ids':<12} {'encode s':>9} {'old count s':>12} {'share':>7} {'new count s':>12} "
          f"{'share':>7} {'new/old':>8}")
    for name, low, high in (("< 10^6", 0, 10**6), (">= 10^18", 10**18, 10**19)):
        records = [{"pid": rnd.randrange(low, high), "sex": rnd.choice("FM"),
                    "city": rnd.choice(["Oslo", "Rome", "Lima"]), "band": rnd.randrange(6)}
                   for _ in range(args.rows)]
        enc, old, new = [], [], []
        for _ in range(args.repeat):
            memo = SchemaMemo(schema)
            t0 = time.perf_counter()
            batches = []
            for lo in range(0, len(records), DEFAULT_BATCH_ROWS):
                got, _dead = encode_elements(layout, records[lo:lo + DEFAULT_BATCH_ROWS],
                                             source="bench", memo=memo)
                batches += got
            t1 = time.perf_counter()
            n_old = sum(old_count(b.pids) for b in batches)
            t2 = time.perf_counter()
            n_new = sum(count_rounded_ids(b.pids) for b in batches)
            t3 = time.perf_counter()
            if n_old != n_new:
                raise SystemExit(f"counts differ: {n_old} != {n_new}")
            enc.append(t1 - t0)
            old.append(t2 - t1)
            new.append(t3 - t2)
        e, o, w = (statistics.median(x) for x in (enc, old, new))
        print(f"{name:<12} {e:9.2f} {o:12.3f} {o / e:7.1%} {w:12.3f} {w / e:7.1%} {w / o:8.2f}"
              f"   (rounded: {n_new:,})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
