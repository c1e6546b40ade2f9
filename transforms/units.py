"""Privacy units and contribution bounding.

Without a privacy-id column every record is one privacy unit and nothing needs bounding. With
one, :class:`BoundContributions` keeps at most ``max_contributions`` records per privacy id,
chosen uniformly at random, **before** anything is measured; every mechanism then uses
``max_contributions`` as the number of records one unit can add or remove.

The selection is columnar: batches are split by a stable hash of the id into a fixed number of
shards, each shard is grouped once (``GroupByKey``), and inside a shard the records of each id
are ranked by a random priority. For seeded (test) runs the rows of a shard are first put in a
canonical order (id, then cell codes), so the kept rows do not depend on arrival order or
worker; identical rows of one id are interchangeable, so the canonical order loses nothing.

Windows: grouping happens per window, so the bound holds per window. A unit appearing in ``w``
windows contributes up to ``w · max_contributions`` records across a stream; a release per
window is DP per window (see the streaming notes in the README).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import apache_beam as beam
import numpy as np
import pandas as pd

from beamsynth.schemas.schema import EncodedBatch
from beamsynth.transforms.conventions import display_items, element_types
from beamsynth.transforms.measure import window_labels
from beamsynth.transforms.noise import RandomSource, run_seed

__all__ = ["BoundContributions", "bound_rows", "pid_shards"]

DEFAULT_SHARDS = 64
_OUT_ROWS = 50_000


def pid_shards(pids: np.ndarray, num_shards: int) -> np.ndarray:
    """Stable shard number of each privacy id (pandas' fixed-key SipHash; same on every worker)."""
    h = pd.util.hash_array(np.asarray(pids, dtype=object), categorize=False)
    return (h % np.uint64(num_shards)).astype(np.int64)


def _canonical_order(codes: np.ndarray, pids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(permutation sorting rows by id then codes, factorized ids); ties are identical rows."""
    pid_codes, _ = pd.factorize(pd.Series(pids, dtype=object), sort=True)
    keys = [codes[:, j] for j in range(codes.shape[1] - 1, -1, -1)] + [pid_codes]
    return np.lexsort(keys), pid_codes


def bound_rows(
    codes: np.ndarray, pids: np.ndarray, max_contributions: int, rs: RandomSource
) -> np.ndarray:
    """Row positions kept: at most ``max_contributions`` per id, uniformly at random.

    Rows are first sorted canonically (id, then codes) so that, given ``rs``, the result does
    not depend on input order.
    """
    n = codes.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order, pid_codes = _canonical_order(codes, pids)
    priority = rs.uniform(n)
    sorted_pids = pid_codes[order]
    # rank rows inside each id by priority
    by = np.lexsort((priority, sorted_pids))
    grouped_pids = sorted_pids[by]
    starts = np.r_[0, np.flatnonzero(np.diff(grouped_pids)) + 1]
    rank = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
    keep_sorted = by[rank < max_contributions]
    return np.sort(order[keep_sorted])


class _SplitByShardFn(beam.DoFn):
    def __init__(self, num_shards: int) -> None:
        self._num_shards = num_shards

    def process(self, batch: EncodedBatch) -> Iterable[tuple[int, EncodedBatch]]:
        if batch.pids is None:
            raise ValueError("BoundContributions needs batches with privacy ids (schema privacy_id)")
        shard = pid_shards(batch.pids, self._num_shards)
        for s in np.unique(shard).tolist():
            m = shard == s
            yield s, EncodedBatch(batch.codes[m], batch.pids[m])


class _BoundShardFn(beam.DoFn):
    def __init__(self, max_contributions: int, seed: int | None, step: str) -> None:
        self._k, self._seed, self._step = max_contributions, seed, step

    def process(self, element, window=beam.DoFn.WindowParam) -> Iterable[EncodedBatch]:
        shard, batches = element
        batches = list(batches)
        codes = np.concatenate([b.codes for b in batches])
        pids = np.concatenate([b.pids for b in batches])
        rs = RandomSource(seed=self._seed).child(self._step, shard, *window_labels(window))
        keep = bound_rows(codes, pids, self._k, rs)
        beam.metrics.Metrics.counter("beamsynth", "rows_dropped_by_bound").inc(codes.shape[0] - keep.size)
        codes, pids = codes[keep], pids[keep]
        # emit in canonical order: output batches (content and boundaries) do not depend on the
        # order the grouped batches arrived in, so steps keying randomness on batch content agree
        canon, _ = _canonical_order(codes, pids)
        codes, pids = codes[canon], pids[canon]
        for start in range(0, codes.shape[0], _OUT_ROWS):
            yield EncodedBatch(codes[start : start + _OUT_ROWS], pids[start : start + _OUT_ROWS])


@element_types(input=EncodedBatch, output=EncodedBatch)
class BoundContributions(beam.PTransform):
    """Keep at most ``max_contributions`` records per privacy id (uniformly at random).

    Input and output: ``PCollection[EncodedBatch]`` with ``pids`` set.
    """

    def __init__(
        self,
        *,
        max_contributions: int,
        seed: int | None = None,
        num_shards: int = DEFAULT_SHARDS,
        label: str | None = None,
    ) -> None:
        super().__init__(label)
        if isinstance(max_contributions, bool) or not isinstance(max_contributions, int) or max_contributions < 1:
            raise ValueError(f"max_contributions ({max_contributions!r}) must be an int >= 1")
        if not isinstance(num_shards, int) or num_shards < 1:
            raise ValueError(f"num_shards ({num_shards!r}) must be an int >= 1")
        self._k, self._seed, self._shards = max_contributions, run_seed(seed), num_shards

    def display_data(self) -> dict[str, Any]:
        """The bound and its sharding (no budget: bounding makes the sensitivity k)."""
        return display_items(mechanism="contribution bounding (uniform sample per privacy id)",
                             max_contributions=self._k, shards=self._shards)

    def expand(self, batches):
        return (
            batches
            | "SplitByIdShard" >> beam.ParDo(_SplitByShardFn(self._shards))
            # (shard, EncodedBatch)
            | "GroupShard" >> beam.GroupByKey()
            # (shard, Iterable[EncodedBatch])
            | "KeepK" >> beam.ParDo(_BoundShardFn(self._k, self._seed, "bound"))
            # EncodedBatch with <= k rows per privacy id
        )
