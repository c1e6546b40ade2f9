"""Plausible deniability (seed 001), the random split, value shards and the release order.

* :class:`SplitForPlausible` — records into the disjoint parts seeds ``D_S``, structure ``D_T`` and
  parameters ``D_P`` (Section 3.5), from :func:`unit_split_assignments` (records with privacy
  ids) or :func:`record_split_assignments` (records without: :func:`record_uniforms`,
  :func:`record_ranks`); :func:`split_assignments` is the plain i.i.d. split (benchmarks);
* :func:`group_keys`, :func:`seed_shards` — public value shards: records with equal values share
  a shard, so a shard's draws never depend on batching or arrival order;
* :class:`OrderReleased`, :func:`ordered_release`, :func:`release_order`,
  :func:`release_shards` — the released rows in an order that carries nothing of the input order.

Shapes: :class:`SplitForPlausible` takes ``PCollection[EncodedBatch]`` and returns a dict of three
``PCollection[EncodedBatch]`` (``seeds``, ``structure``, ``params``); records without ids travel as
``(shard, codes[r, m])`` and are grouped per shard. :class:`OrderReleased` takes
``PCollection[EncodedBatch]`` and returns ``(label, EncodedBatch)`` per non-empty shard and window.

Privacy: nothing here spends budget. A unit's part is drawn from ``HMAC(secret key, id)`` (or
``HMAC(secret key, (labels, value, occurrence))`` for a record without id), independent across
units, so the parts compose in parallel and adding or removing a unit adds or removes exactly
its records in one part (rule 6), whatever the batching. The release order is post-processing
of released rows: a function of their multiset and the run secret only (rule 7).
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from typing import Any

import apache_beam as beam
import numpy as np

from beamsynth.schemas.schema import EncodedBatch
from beamsynth.transforms.conventions import display_items, element_types
from beamsynth.transforms.measure import window_labels
from beamsynth.transforms.noise import RandomSource, run_seed
from beamsynth.transforms.plausible_privacy import _BELOW_ONE

__all__ = [
    "OrderReleased",
    "SplitForPlausible",
    "group_keys",
    "ordered_release",
    "release_order",
    "release_shards",
    "seed_shards",
    "split_assignments",
    "unit_split_assignments",
    "record_ranks",
    "record_split_assignments",
    "record_uniforms",
]


# =============================================================================================
# Value keys, value shards and per-record draws
# =============================================================================================
def group_keys(codes: np.ndarray, cols: Sequence[int], shape: Sequence[int]) -> np.ndarray:
    """Collision-free integer keys of the values in ``cols``: ``(n, words)`` uint64 mixed radix."""
    n = codes.shape[0]
    words: list[np.ndarray] = []
    cur = np.zeros(n, dtype=np.uint64)
    radix = 1
    for c in cols:
        s = int(shape[c])
        if radix * s >= 2**63:
            words.append(cur)
            cur = np.zeros(n, dtype=np.uint64)
            radix = 1
        cur = cur * np.uint64(s) + codes[:, c].astype(np.uint64)
        radix *= s
    words.append(cur)
    return np.stack(words, axis=1)


def _shard_of(keys: np.ndarray, shards: int) -> np.ndarray:
    h = np.zeros(keys.shape[0], dtype=np.uint64)
    with np.errstate(over="ignore"):
        for w in range(keys.shape[1]):
            h = (h ^ keys[:, w]) * np.uint64(0x9E3779B97F4A7C15)
            h ^= h >> np.uint64(29)
    return (h % np.uint64(shards)).astype(np.int64)


def split_assignments(rs: RandomSource, n: int, fractions: Sequence[float]) -> np.ndarray:
    """Part index of ``n`` rows: i.i.d. categorical draws with the given fractions (0 = seeds)."""
    cdf = np.cumsum(np.asarray(fractions, dtype=np.float64))
    cdf /= cdf[-1]
    return np.searchsorted(cdf, rs.uniform(n), side="right").astype(np.int64)


def record_ranks(codes: np.ndarray) -> np.ndarray:
    """Occurrence number of each row among the rows equal to it (0, 1, ... in row order)."""
    codes = np.asarray(codes)
    n = codes.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort(codes.T[::-1]) if codes.ndim == 2 and codes.shape[1] else np.arange(n)
    ordered = codes[order].reshape(n, -1)  # equal rows adjacent, in row order (lexsort is stable)
    starts = np.r_[0, np.flatnonzero((ordered[1:] != ordered[:-1]).any(axis=1)) + 1]
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
    return rank


def _hmac_uniforms(key: bytes, messages: Sequence[bytes]) -> np.ndarray:
    """A uniform on (0, 1) per message: the top 53 bits of ``HMAC-SHA256(key, message)``."""
    words = np.frombuffer(b"".join(hmac.digest(key, m, "sha256")[:8] for m in messages), dtype="<u8")
    u = ((words >> np.uint64(11)).astype(np.float64) + 0.5) / float(2**53)
    # the largest word + 0.5 rounds up to 2^53, i.e. u = 1.0: clamp to the largest double below 1
    # as RandomSource.uniform does (its mass, 2^-53, is unchanged)
    return np.minimum(u, _BELOW_ONE)


def record_uniforms(key: bytes, codes: np.ndarray, labels: Sequence[Any] = ()) -> np.ndarray:
    """A uniform per record from ``HMAC(key, (labels, record values, occurrence number))``.

    For records without privacy ids: the ``j``-th copy of a value always gets the same draw, so a
    record's draw depends on its own values and on how many equal records precede it, never on
    its batch or its neighbours. ``codes`` must hold **every** record equal to any of its rows (all
    records of a value shard, :func:`seed_shards`), so the occurrence numbers are global. Adding a
    record then adds one draw and changes none (a stable coupling, rule 6); distinct (value,
    occurrence) pairs get independent draws (PRF under the secret key).
    """
    codes = np.asarray(codes, dtype=np.int64)
    n = codes.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.float64)
    rows = np.ascontiguousarray(np.column_stack([codes, record_ranks(codes)]).astype("<i8"))
    width = 8 * rows.shape[1]
    buf, head = rows.tobytes(), repr(tuple(labels)).encode("utf-8") + b"\x00"
    return _hmac_uniforms(key, [head + buf[i * width:(i + 1) * width] for i in range(n)])


def _parts_from_uniforms(u: np.ndarray, fractions: Sequence[float]) -> np.ndarray:
    cdf = np.cumsum(np.asarray(fractions, dtype=np.float64))
    cdf /= cdf[-1]
    return np.searchsorted(cdf, u, side="right").astype(np.int64)


# =============================================================================================
# Beam: split
# =============================================================================================
def unit_split_assignments(key: bytes, pids: Sequence[Any], fractions: Sequence[float]) -> np.ndarray:
    """Part index per row from ``HMAC(key, privacy id)``: every record of a unit lands in one part.

    The uniform for a unit is the top 53 bits of its HMAC-SHA256 under a secret key shared by all
    workers (a side input), so the split is random, independent across units, and identical for all
    of one unit's records wherever they are processed.
    """
    return _parts_from_uniforms(_hmac_uniforms(key, [str(p).encode("utf-8") for p in pids]), fractions)


def record_split_assignments(key: bytes, codes: np.ndarray, fractions: Sequence[float],
                             labels: Sequence[Any] = ()) -> np.ndarray:
    """Part index per record without a privacy id, from :func:`record_uniforms` (one value shard)."""
    return _parts_from_uniforms(record_uniforms(key, codes, ("plausible.split", *labels)), fractions)


class _RouteSplitFn(beam.DoFn):
    """Batches with privacy ids pass; records without go to ``by_value`` as ``(shard, codes)``."""

    def __init__(self, shards: int) -> None:
        self._shards = shards

    def process(self, batch: EncodedBatch):
        if batch.pids is not None:
            yield batch
            return
        sh = seed_shards(batch.codes, self._shards)
        for s in np.unique(sh).tolist():
            yield beam.pvalue.TaggedOutput("by_value", (s, batch.codes[sh == s]))


def _sorted_shard(parts) -> np.ndarray:
    """All records of a value shard, in canonical (sorted) order: independent of arrival order."""
    codes = np.concatenate(list(parts), axis=0)
    return codes[np.lexsort(codes.T[::-1])] if codes.shape[0] > 1 else codes


class _SplitFn(beam.DoFn):
    """One part per record: per unit (``EncodedBatch`` with ids) or per (value, occurrence) for a
    value shard of records without ids (``(shard, [codes, ...])`` after a ``GroupByKey``)."""

    def __init__(self, fractions: tuple[float, float, float], out_rows: int = 50_000) -> None:
        self._fractions, self._out_rows = fractions, out_rows

    def process(self, element, key: bytes, window=beam.DoFn.WindowParam):
        if isinstance(element, EncodedBatch):  # privacy units: one part per unit (parallel composition)
            codes, pids = element.codes, element.pids
            part = unit_split_assignments(key, pids.tolist(), self._fractions)
        else:  # every record is its own unit: one draw per (value, occurrence), stable under add/remove
            codes, pids = _sorted_shard(element[1]), None
            part = record_split_assignments(key, codes, self._fractions, window_labels(window))
        for p, tag in enumerate(("seeds", "structure", "params")):
            idx = np.flatnonzero(part == p)
            for start in range(0, idx.size, self._out_rows):
                sel = idx[start:start + self._out_rows]
                sub = EncodedBatch(codes[sel], None if pids is None else pids[sel])
                yield sub if tag == "seeds" else beam.pvalue.TaggedOutput(tag, sub)


def _make_split_key(_: Any, seed: int | None) -> bytes:
    return RandomSource(seed=seed).child("plausible.split-key").secret_key()


@element_types(input=EncodedBatch, outputs={"seeds": EncodedBatch, "structure": EncodedBatch,
                                            "params": EncodedBatch})
class SplitForPlausible(beam.PTransform):
    """Random disjoint split of records into seeds / structure / parameters (Section 3.5).

    With privacy ids (``batch.pids``) the part of a unit is drawn from ``HMAC(secret key, id)`` so
    all its records share one part. Without, every record is its own unit: the records are grouped
    into ``shards`` public shards by their values (:func:`seed_shards`, one ``GroupByKey``) and the
    ``j``-th copy of a value draws its part from ``HMAC(secret key, (window, value, j))``
    (:func:`record_split_assignments`). Either way a unit's part depends on nothing but its own
    draw, independent across units, so the mechanisms that follow compose in parallel, and adding
    or removing a unit adds or removes exactly its records in one part (rule 6), whatever the
    batching. Until the ninth session records without ids drew from a stream keyed by their
    batch's content: equal batches got equal splits, and one added record redrew its whole batch
    (``tests/pipeline/test_plausible.py::test_split_without_ids_is_stable_independent_of_batching_and_of_equal_batches``).
    Returns a dict of three ``PCollection[EncodedBatch]``: ``seeds``, ``structure``, ``params``.
    """

    def __init__(self, *, fractions: Sequence[float] = (0.5, 0.2, 0.3), seed: int | None = None,
                 shards: int = 32, label: str | None = None) -> None:
        super().__init__(label)
        fr = tuple(float(f) for f in fractions)
        if len(fr) != 3 or any(not (f > 0) for f in fr):
            raise ValueError(f"fractions ({fractions!r}) must be three numbers > 0 (seeds, structure, params)")
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise ValueError(f"shards ({shards!r}) must be an int >= 1")
        self._fractions, self._seed, self._shards = fr, run_seed(seed), shards

    def display_data(self) -> dict[str, Any]:
        """The public split fractions (no budget: the split is disjoint, parts compose in parallel)."""
        seeds, structure, params = self._fractions
        return display_items(mechanism="random disjoint split (seeds / structure / parameters)",
                             seeds_fraction=seeds, structure_fraction=structure,
                             params_fraction=params, shards=self._shards)

    def expand(self, batches):
        # batches: EncodedBatch
        key = (batches.pipeline | "KeyOnce" >> beam.Create([None])
               | "SplitKey" >> beam.Map(_make_split_key, self._seed))
        # bytes: one secret key for the whole pipeline
        routed = batches | "Route" >> beam.ParDo(_RouteSplitFn(self._shards)).with_outputs(
            "by_value", main="with_ids")
        # with_ids: EncodedBatch with pids; by_value: (shard, codes[r, m]) of records without ids
        grouped = routed.by_value | "GroupByValue" >> beam.GroupByKey()
        # (shard, [codes, ...]): every record without id of the shard and window
        fn = _SplitFn(self._fractions)
        units = routed.with_ids | "AssignUnitParts" >> beam.ParDo(
            fn, beam.pvalue.AsSingleton(key)).with_outputs("structure", "params", main="seeds")
        records = grouped | "AssignRecordParts" >> beam.ParDo(
            fn, beam.pvalue.AsSingleton(key)).with_outputs("structure", "params", main="seeds")
        # seeds / structure / params: EncodedBatch sub-batches
        return {tag: (units[tag], records[tag]) | f"Flatten{tag.capitalize()}" >> beam.Flatten()
                for tag in ("seeds", "structure", "params")}


# =============================================================================================
# Value shards of seed records (candidates, check sample)
# =============================================================================================
def seed_shards(codes: np.ndarray, shards: int) -> np.ndarray:
    """Shard of each seed record from its values alone (equal records share a shard)."""
    codes = np.asarray(codes)
    if codes.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    return _shard_of(codes.astype(np.uint64), shards)


class _KeySeedsFn(beam.DoFn):
    """Seed records → ``(shard, codes)`` per shard present in the batch (shard from the values)."""

    def __init__(self, shards: int) -> None:
        self._shards = shards

    def process(self, batch: EncodedBatch):
        sh = seed_shards(batch.codes, self._shards)
        for s in np.unique(sh).tolist():
            yield s, batch.codes[sh == s]


# =============================================================================================
# Beam: a release order that carries nothing of the input order
# =============================================================================================
def release_shards(codes: np.ndarray, shape: Sequence[int], shards: int) -> np.ndarray:
    """Shard of each released row from its values alone (rows with equal values share a shard)."""
    codes = np.asarray(codes)
    if codes.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    return _shard_of(group_keys(codes, range(len(shape)), shape), shards)


def release_order(codes: np.ndarray, rs: RandomSource) -> np.ndarray:
    """The rows of ``codes`` in an order that depends on their multiset and ``rs`` alone.

    The rows are sorted (lexicographically, column 0 first), then permuted by the ranks of
    ``rs.uniform(n)`` (a uniformly random permutation, reproduced exactly from the same labels on
    a re-execution). So however the rows arrived — in input order, per seed, per batch or per
    worker — the result is the same, and the order adds nothing to what the multiset says.
    Post-processing of released rows: no budget.
    """
    codes = np.asarray(codes)
    if codes.shape[0] <= 1:
        return codes.copy()
    canonical = codes[np.lexsort(codes.T[::-1])]
    return canonical[np.argsort(rs.uniform(canonical.shape[0]), kind="stable")]


def ordered_release(codes: np.ndarray, *, shape: Sequence[int], shards: int, seed: int | None,
                    labels: Sequence[Any] = ("global",)) -> list[tuple[str, np.ndarray]]:
    """Beam-free reference of :class:`OrderReleased` for one window: ``(label, rows)`` per
    non-empty shard, in label order (the order of the single output file)."""
    from beamsynth.transforms.synthesis import shard_label

    codes = np.asarray(codes)
    sh = release_shards(codes, shape, shards)
    out = []
    for s in np.unique(sh).tolist():
        rs = RandomSource(seed=seed).child("plausible.order", s, *labels)
        out.append((shard_label(s, labels), release_order(codes[sh == s], rs)))
    return sorted(out, key=lambda item: item[0])


class _KeyReleasedFn(beam.DoFn):
    """Released rows → ``(shard, rows)`` per shard present in the batch (shard from the values)."""

    def __init__(self, shape: Sequence[int], shards: int) -> None:
        self._shape, self._shards = tuple(shape), shards

    def process(self, batch: EncodedBatch):
        sh = release_shards(batch.codes, self._shape, self._shards)
        for s in np.unique(sh).tolist():
            yield s, batch.codes[sh == s]


class _OrderShardFn(beam.DoFn):
    """Every released row of one shard → ``(label, EncodedBatch)`` in :func:`release_order`."""

    def __init__(self, seed: int | None) -> None:
        self._seed = seed

    def process(self, kv, window=beam.DoFn.WindowParam):
        from beamsynth.transforms.synthesis import shard_label

        shard, parts = kv
        codes = np.concatenate(list(parts), axis=0)
        labels = window_labels(window)
        rs = RandomSource(seed=self._seed).child("plausible.order", shard, *labels)
        yield shard_label(shard, labels), EncodedBatch(release_order(codes, rs))


@element_types(input=EncodedBatch, output=tuple[str, EncodedBatch])
class OrderReleased(beam.PTransform):
    """Released records in an order that depends on neither the input order nor its partitioning.

    The privacy test emits candidates per seed, contiguously and in the order of the seed batch,
    so a file written in that order would mirror the private input order (with ``ω < m`` the
    copied attributes appear in input order). This step re-partitions the released rows by a hash
    of their **values** into ``shards`` public shards, and orders each shard by
    :func:`release_order` (sorted, then a permutation drawn from ``RandomSource`` labelled with the
    shard and the window). The output is then a function of the released multiset and the run's
    randomness only; its label (:func:`~beamsynth.transforms.synthesis.shard_label`: window,
    shard) orders the parts of a single-file write. Post-processing: no budget.

    Input: ``PCollection[EncodedBatch]`` (released rows). Output:
    ``PCollection[tuple[str, EncodedBatch]]``, one element per non-empty shard and window.
    """

    def __init__(self, *, shape: Sequence[int], shards: int = 16, seed: int | None = None,
                 label: str | None = None) -> None:
        super().__init__(label)
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise ValueError(f"shards ({shards!r}) must be an int >= 1")
        self._shape, self._shards, self._seed = tuple(int(s) for s in shape), shards, run_seed(seed)

    def display_data(self) -> dict[str, Any]:
        """Public shard count (post-processing: no budget; no data values)."""
        return display_items(step="order released rows by value shard, then a secret permutation",
                             shards=self._shards, columns=len(self._shape))

    def expand(self, released):
        return (released
                | "KeyByValues" >> beam.ParDo(_KeyReleasedFn(self._shape, self._shards))
                # (shard, codes[r, m]): rows with equal values share a shard
                | "GroupShards" >> beam.GroupByKey()
                # (shard, [codes, ...]): every released row of the shard and window
                | "Order" >> beam.ParDo(_OrderShardFn(self._seed)))
        # (label, EncodedBatch): sorted, then permuted with the (shard, window) stream
