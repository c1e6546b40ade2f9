"""Plausible deniability (seed 001), Mechanism 1 and the privacy test as PTransforms (Sections 2, 5).

* :class:`CandidateBatch`, :class:`RejectedCandidates` — the element types;
* :class:`GenerateCandidates` — seeds → candidates (Mechanism 1, Poissonized);
* :class:`PlausibleDeniabilityFilter` — Privacy Test 1 or 2 per candidate, with two outputs:
  the fast path (seed-resampling networks: seed counts per copied-value key joined with the
  candidates, no cross product) and the generic path (any model, against a uniform
  :func:`check_sample` of the seeds); :func:`lookup_counts`; rejection reasons and metrics.

Shapes: seeds ``PCollection[EncodedBatch]`` → ``(shard, codes[r, m])`` → grouped per value shard
→ ``CandidateBatch(codes[c, m], logp[c])``; the filter returns ``{"released":
PCollection[EncodedBatch], "rejected": PCollection[RejectedCandidates]}``.

Privacy (add/remove one record of ``D_S``): candidate generation has no guarantee of its own; the
privacy of what is released comes from Test 2 (Theorem 1, ``ε0 + ln(1 + γ/t)``,
``exp(-ε0(k - t))`` per candidate; :mod:`~beamsynth.transforms.plausible_privacy`), charged for the
whole run as ``(C·ε₁, C·δ₁ + δ_tail)`` by
:func:`~beamsynth.transforms.plausible_privacy.candidate_release_cost` when the pipeline is
built. Every draw comes from the run secret under stable labels: ``(shard, window)`` for the
candidates, ``(batch id, window)`` for the thresholds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np

from beamsynth.schemas.schema import EncodedBatch
from beamsynth.transforms.conventions import display_items, element_types
from beamsynth.transforms.measure import combine_globally, window_labels
from beamsynth.transforms.noise import RandomSource, RunSecret, run_seed
from beamsynth.transforms.plausible_model import PlausibleModel
from beamsynth.transforms.plausible_privacy import (
    count_plausible_generic,
    fast_plausible_counts,
    poisson_counts,
    privacy_test,
)
from beamsynth.transforms.plausible_split import (
    _KeySeedsFn,
    _shard_of,
    _sorted_shard,
    group_keys,
    record_uniforms,
)
from beamsynth.transforms.synthesis import _CountRowsFn

__all__ = [
    "REJECT_BELOW_K",
    "REJECT_NOISY_THRESHOLD",
    "CandidateBatch",
    "GenerateCandidates",
    "PlausibleDeniabilityFilter",
    "RejectedCandidates",
    "check_sample",
]

METRICS_NAMESPACE = "beamsynth"
REJECT_BELOW_K = "fewer_than_k_plausible_seeds"
REJECT_NOISY_THRESHOLD = "below_noisy_threshold"


# =============================================================================================
# Columnar helpers for the fast path
# =============================================================================================
def _unique_counts(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if keys.shape[0] == 0:
        return keys, counts
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    return uniq, np.bincount(inv.ravel(), weights=counts, minlength=uniq.shape[0]).astype(np.int64)


def lookup_counts(table_keys: np.ndarray, table_counts: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Counts of ``keys`` rows in a (keys, counts) table; 0 for absent keys (vectorized)."""
    if keys.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    if table_keys.shape[0] == 0:
        return np.zeros(keys.shape[0], dtype=np.int64)
    allk = np.concatenate([table_keys, keys], axis=0)
    _, inv = np.unique(allk, axis=0, return_inverse=True)
    inv = inv.ravel()
    per_id = np.bincount(inv[: table_keys.shape[0]], weights=table_counts, minlength=int(inv.max()) + 1)
    return per_id[inv[table_keys.shape[0]:]].astype(np.int64)


# =============================================================================================
# Element types
# =============================================================================================
@dataclass(frozen=True)
class CandidateBatch:
    """Candidates ``codes[c, m]`` with ``logp[c] = log Pr{y = M(seed)}`` of their own seed."""

    codes: np.ndarray
    logp: np.ndarray
    batch_id: str = ""

    def __len__(self) -> int:
        return int(self.codes.shape[0])


@dataclass(frozen=True)
class RejectedCandidates:
    """Rejected candidates (dead-letter output): codes, ``k'``, threshold and one reason each."""

    codes: np.ndarray
    kprime: np.ndarray
    reasons: np.ndarray

    def __len__(self) -> int:
        return int(self.codes.shape[0])

    def reason_counts(self) -> dict[str, int]:
        """Number of rejections per reason."""
        vals, cnt = np.unique(self.reasons, return_counts=True)
        return {str(v): int(c) for v, c in zip(vals, cnt)}


# =============================================================================================
# Beam: candidates
# =============================================================================================
class _GenerateFn(beam.DoFn):
    """Every seed of one value shard → candidates, from the stream ``(shard, window)``.

    The seeds are first put in canonical (sorted) order, so the draws depend on the shard's
    multiset of seeds and the run secret only: two seed batches with equal content (which a
    content-keyed stream made draw alike) are just equal records here, each with its own draws.
    """

    def __init__(self, seed: int | None, max_batch: int) -> None:
        self._seed, self._max_batch = seed, max_batch

    def process(self, kv, model: PlausibleModel, rows: int, n_seeds: int,
                window=beam.DoFn.WindowParam):
        shard, parts = kv
        codes = np.concatenate(list(parts), axis=0)
        codes = codes[np.lexsort(codes.T[::-1])] if codes.shape[0] > 1 else codes
        rs = RandomSource(seed=self._seed).child("plausible.candidates", shard, *window_labels(window))
        lam = float(rows) / max(int(n_seeds), 1)
        reps = poisson_counts(rs.child("poisson"), lam, codes.shape[0])
        idx = np.repeat(np.arange(codes.shape[0]), reps)
        for start in range(0, idx.size, self._max_batch):
            part = idx[start:start + self._max_batch]
            y, logp = model.generate(codes[part], rs.child("generate", start))
            beam.metrics.Metrics.counter(METRICS_NAMESPACE, "plausible_candidates").inc(len(part))
            yield CandidateBatch(y, logp, f"{shard}:{start}")


@element_types(input=EncodedBatch, output=CandidateBatch)
class GenerateCandidates(beam.PTransform):
    """Mechanism 1's generation step, Poissonized and columnar.

    Each seed record yields ``Poisson(rows/|D_S|)`` candidates (:func:`poisson_counts`, from
    ``RandomSource``), so the candidates' seeds are i.i.d. uniform over ``D_S`` and their number is
    ``Poisson(rows)``, independent of the data. Which seeds are used is part of Mechanism 1: the
    privacy of the candidates comes from the test (:func:`candidate_release_cost`), never from
    this step. The invocations must be independent, so the draws are keyed by a stable identity
    that no two seeds share: the seeds are grouped into ``shards`` public shards by their values
    (:func:`seed_shards`) and each shard draws from ``(shard, window)`` over its sorted seeds. Until
    the eighth session each seed *batch* drew from a stream keyed by its content, and two batches
    of equal content drew the same candidates and thresholds
    (``tests/pipeline/test_plausible.py::test_identical_seed_batches_draw_independent_candidates``).
    Input: ``PCollection[EncodedBatch]`` of seeds; side inputs: the model, ``rows`` and ``|D_S|``
    (singletons). Output: ``PCollection[CandidateBatch]`` of at most ``max_batch`` candidates.
    """

    def __init__(self, *, model, rows, n_seeds, seed: int | None = None, max_batch: int = 50_000,
                 shards: int = 32, label: str | None = None) -> None:
        super().__init__(label)
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise ValueError(f"shards ({shards!r}) must be an int >= 1")
        self._model, self._rows, self._n_seeds = model, rows, n_seeds
        self._seed, self._max_batch, self._shards = run_seed(seed), int(max_batch), shards

    def display_data(self) -> dict[str, Any]:
        """Batch size and public shard count only: the candidates' privacy comes from the test."""
        return display_items(mechanism="candidate generation (Mechanism 1, Poissonized)",
                             max_batch=self._max_batch, shards=self._shards)

    def expand(self, seeds):
        return (seeds
                | "KeySeeds" >> beam.ParDo(_KeySeedsFn(self._shards))
                # (shard, codes[r, m]): equal seeds share a shard
                | "GroupSeeds" >> beam.GroupByKey()
                # (shard, [codes, ...]): every seed of the shard and window
                | "Generate" >> beam.ParDo(
                    _GenerateFn(self._seed, self._max_batch), beam.pvalue.AsSingleton(self._model),
                    beam.pvalue.AsSingleton(self._rows), beam.pvalue.AsSingleton(self._n_seeds)))
        # CandidateBatch


# =============================================================================================
# Beam: the privacy test
# =============================================================================================
def _decide(kprime: np.ndarray, *, k: int, epsilon0: float | None, rs: RandomSource):
    passed, _thr = privacy_test(kprime, k=k, epsilon0=epsilon0, rs=rs.child("threshold"))
    reasons = np.where(kprime < k, REJECT_BELOW_K, REJECT_NOISY_THRESHOLD)
    return passed, reasons


def _emit(codes: np.ndarray, kprime: np.ndarray, passed: np.ndarray, reasons: np.ndarray):
    ok = np.flatnonzero(passed)
    bad = np.flatnonzero(~passed)
    beam.metrics.Metrics.counter(METRICS_NAMESPACE, "plausible_tested").inc(int(passed.size))
    beam.metrics.Metrics.counter(METRICS_NAMESPACE, "plausible_released").inc(int(ok.size))
    if ok.size:
        yield EncodedBatch(codes[ok])
    if bad.size:
        rej = RejectedCandidates(codes[bad], kprime[bad], reasons[bad])
        for reason, cnt in rej.reason_counts().items():
            beam.metrics.Metrics.counter(METRICS_NAMESPACE, f"plausible_rejected_{reason}").inc(cnt)
        yield beam.pvalue.TaggedOutput("rejected", rej)


class _GenericTestFn(beam.DoFn):
    """Candidates vs a uniform random sample (size ≤ max_check) of the seed data."""

    def __init__(self, *, k, gamma, epsilon0, max_plausible, seed, chunk=2_000_000):
        self._k, self._gamma, self._eps0, self._maxp = k, gamma, epsilon0, max_plausible
        self._seed, self._chunk = seed, chunk

    def process(self, cands: CandidateBatch, model: PlausibleModel, sample: np.ndarray,
                window=beam.DoFn.WindowParam):
        rs = RandomSource(seed=self._seed).child("plausible.test", cands.batch_id, *window_labels(window))
        step = max(1, self._chunk // max(sample.shape[0], 1))
        kp = np.zeros(len(cands), dtype=np.int64)
        for s in range(0, len(cands), step):
            y = cands.codes[s:s + step]
            mat = model.log_prob(y, sample) if sample.shape[0] else np.full((len(y), 0), -np.inf)
            kp[s:s + step] = count_plausible_generic(cands.logp[s:s + step], mat, self._gamma, self._maxp)
        passed, reasons = _decide(kp, k=self._k, epsilon0=self._eps0, rs=rs)
        yield from _emit(cands.codes, kp, passed, reasons)


class _CheckTagsFn(beam.DoFn):
    """One value shard of seed records → ``(tags, codes)`` of its ``size`` smallest tags.

    Tags are :func:`record_uniforms` under a key of the stream ``("plausible.check-sample",
    window)``: a record's tag depends on its values and occurrence number only, so the sample
    does not depend on the batching and adding a record changes it by at most that record in and
    one out.
    """

    def __init__(self, size: int, seed: int | None) -> None:
        self._size, self._seed = size, seed

    def process(self, kv, window=beam.DoFn.WindowParam):
        codes = _sorted_shard(kv[1])
        key = RandomSource(seed=self._seed).child("plausible.check-sample", *window_labels(window)).secret_key()
        yield _ReservoirFn.smallest(record_uniforms(key, codes), codes, self._size)


class _ReservoirFn(beam.CombineFn):
    """Uniform sample without replacement of ≤ size rows: keep the rows with the smallest tags."""

    def __init__(self, size: int) -> None:
        self._size = size

    @staticmethod
    def smallest(tags: np.ndarray, rows: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``size`` rows with the smallest tags (all of them if fewer)."""
        if tags.size > size:
            keep = np.argpartition(tags, size - 1)[:size]
            return tags[keep], rows[keep]
        return tags, rows

    def create_accumulator(self):
        return (np.zeros(0), None)

    def add_input(self, acc, tagged):
        return self._merge([acc, tagged])

    def _merge(self, accs):
        tags = [a[0] for a in accs if a[1] is not None]
        rows = [a[1] for a in accs if a[1] is not None]
        if not rows:
            return (np.zeros(0), None)
        return self.smallest(np.concatenate(tags), np.concatenate(rows, axis=0), self._size)

    def merge_accumulators(self, accs):
        return self._merge(list(accs))

    def extract_output(self, acc):
        if acc[1] is None:
            return None
        return acc[1][np.argsort(acc[0], kind="stable")]  # by tag: independent of merge order


def check_sample(records, *, size: int, seed: int | RunSecret | None, shards: int = 32, label: str = "CheckSample"):
    """Uniform sample of ≤ ``size`` records (``PCollection[EncodedBatch]``) per window, as one
    ``np.ndarray`` (or ``None`` when there are no records): value shards → smallest tags per
    shard → smallest overall (:class:`_CheckTagsFn`)."""
    tagged = (records
              | f"{label}Key" >> beam.ParDo(_KeySeedsFn(shards))
              # (shard, codes[r, m])
              | f"{label}Group" >> beam.GroupByKey()
              # (shard, [codes, ...])
              | f"{label}Tags" >> beam.ParDo(_CheckTagsFn(size, seed)))
    # (tags[t], codes[t, m]) of the t ≤ size smallest tags of a shard
    return combine_globally(tagged, _ReservoirFn(size), label)


class _KeyCountsFn(beam.DoFn):
    """Seed records → (shard, (copied-value keys, counts)) per shard present in the batch."""

    def __init__(self, shards: int) -> None:
        self._shards = shards

    def process(self, batch: EncodedBatch, model: PlausibleModel):
        keys = group_keys(batch.codes, model.copied_columns(), model.shape)
        uk, cnt = _unique_counts(keys, np.ones(keys.shape[0], dtype=np.int64))
        sh = _shard_of(uk, self._shards)
        for s in np.unique(sh).tolist():
            sel = sh == s
            yield s, (uk[sel], cnt[sel])


class _MergeKeyCountsFn(beam.CombineFn):
    def create_accumulator(self):
        return []

    def add_input(self, acc, kc):
        acc.append(kc)
        if len(acc) > 16:
            acc = [self._merge(acc)]
        return acc

    @staticmethod
    def _merge(parts):
        parts = [p for p in parts if p is not None and p[0].shape[0]]
        if not parts:
            return None
        keys = np.concatenate([p[0] for p in parts], axis=0)
        counts = np.concatenate([p[1] for p in parts])
        return _unique_counts(keys, counts)

    def merge_accumulators(self, accs):
        return [self._merge([p for a in accs for p in a])]

    def extract_output(self, acc):
        return self._merge(acc)


class _KeyCandidatesFn(beam.DoFn):
    """Candidates → (shard, (sub-batch, copied-value keys)) per shard present in the batch."""

    def __init__(self, shards: int) -> None:
        self._shards = shards

    def process(self, cands: CandidateBatch, model: PlausibleModel):
        keys = group_keys(cands.codes, model.copied_columns(), model.shape)
        sh = _shard_of(keys, self._shards)
        for s in np.unique(sh).tolist():
            sel = np.flatnonzero(sh == s)
            yield s, (CandidateBatch(cands.codes[sel], cands.logp[sel], f"{cands.batch_id}:{s}"), keys[sel])


class _FastTestFn(beam.DoFn):
    """Per shard: look candidates' copied values up in the seed counts; no cross product."""

    def __init__(self, *, k, epsilon0, max_plausible, max_check, seed):
        self._k, self._eps0, self._maxp, self._maxc, self._seed = k, epsilon0, max_plausible, max_check, seed

    def process(self, kv, n_seeds: int, window=beam.DoFn.WindowParam):
        shard, grouped = kv
        tables = [t for t in grouped["counts"] if t is not None]
        tk = np.concatenate([t[0] for t in tables], axis=0) if tables else np.zeros((0, 1), np.uint64)
        tc = np.concatenate([t[1] for t in tables]) if tables else np.zeros(0, np.int64)
        for cands, keys in grouped["candidates"]:
            rs = RandomSource(seed=self._seed).child("plausible.test", cands.batch_id, *window_labels(window))
            kp = fast_plausible_counts(lookup_counts(tk, tc, keys), n_seeds=n_seeds, max_check=self._maxc,
                                       max_plausible=self._maxp, rs=rs.child("check"))
            passed, reasons = _decide(kp, k=self._k, epsilon0=self._eps0, rs=rs)
            yield from _emit(cands.codes, kp, passed, reasons)


@element_types(input=CandidateBatch, outputs={"released": EncodedBatch,
                                             "rejected": RejectedCandidates})
class PlausibleDeniabilityFilter(beam.PTransform):
    """Privacy Test 1 or 2 over candidate batches; outputs ``released`` and ``rejected``.

    Input: ``PCollection[CandidateBatch]``; constructor takes the seed records
    (``PCollection[EncodedBatch]``, the data ``D`` of the test) and the model (singleton
    ``PCollection[PlausibleModel]``). Output: ``{"released": PCollection[EncodedBatch],
    "rejected": PCollection[RejectedCandidates]}``.

    Test 1 (``epsilon0=None``): pass iff ``k' ≥ k`` — (k, γ)-plausible deniability, no DP.
    Test 2: pass iff ``k' ≥ k + Lap(1/ε0)`` (fresh noise per candidate); releasing one candidate is
    ``(ε0 + ln(1 + γ/t), exp(-ε0·(k-t)))``-DP for any ``1 ≤ t < k`` (Theorem 1, Section 2.3,
    add/remove one seed record; :func:`theorem1_guarantee`). ``max_plausible``/``max_check_plausible``
    stop the count early (speed and pass rate only, not privacy; Section 5).

    ``fast_path=True`` requires a model with :meth:`PlausibleModel.copied_columns`: seed counts per
    copied-value key (``CombinePerKey`` on hashed shards) are joined with candidates by
    ``CoGroupByKey``; otherwise every candidate is compared with one uniform sample of
    ``max_check_plausible`` seed records (generic path, any :class:`PlausibleModel`).
    """

    def __init__(self, *, records, model, k: int, gamma: float, epsilon0: float | None,
                 max_plausible: int | None = None, max_check_plausible: int | None = None,
                 fast_path: bool = True, shards: int = 16, seed: int | None = None,
                 label: str | None = None) -> None:
        super().__init__(label)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k ({k!r}) must be an int >= 1")
        if not (isinstance(gamma, (int, float)) and gamma > 1 and math.isfinite(gamma)):
            raise ValueError(f"gamma ({gamma!r}) must be a finite number > 1")
        if epsilon0 is not None and not (epsilon0 > 0 and math.isfinite(epsilon0)):
            raise ValueError(f"epsilon0 ({epsilon0!r}) must be a finite number > 0 or None (Test 1)")
        if max_plausible is not None and (not isinstance(max_plausible, int) or max_plausible < k):
            raise ValueError(f"max_plausible ({max_plausible!r}) must be an int >= k ({k}) or None")
        if max_check_plausible is not None and (not isinstance(max_check_plausible, int) or max_check_plausible < 1):
            raise ValueError(f"max_check_plausible ({max_check_plausible!r}) must be an int >= 1 or None")
        if not (isinstance(shards, int) and shards >= 1):
            raise ValueError(f"shards ({shards!r}) must be an int >= 1")
        self._records, self._model = records, model
        self._k, self._gamma, self._eps0 = k, float(gamma), epsilon0
        self._maxp, self._maxc = max_plausible, max_check_plausible
        self._fast, self._shards, self._seed = fast_path, shards, run_seed(seed)

    def display_data(self) -> dict[str, Any]:
        """Test parameters (never data values)."""
        return display_items(
            mechanism="plausible-deniability privacy test", k=self._k, gamma=self._gamma,
            test="deterministic (Test 1)" if self._eps0 is None else f"randomized, epsilon0={self._eps0}",
            epsilon0=self._eps0, path="fast" if self._fast else "generic",
            max_plausible=self._maxp, max_check_plausible=self._maxc)

    def expand(self, candidates):
        model = beam.pvalue.AsSingleton(self._model)
        if not self._fast:
            if self._maxc is None:
                raise ValueError("the generic path needs max_check_plausible (the sample size)")
            sample = check_sample(self._records, size=self._maxc, seed=self._seed)
            # np.ndarray (≤ max_check, m) | None
            sample = sample | "SampleOrEmpty" >> beam.Map(lambda s: np.zeros((0, 0), np.int64) if s is None else s)
            out = candidates | "TestGeneric" >> beam.ParDo(
                _GenericTestFn(k=self._k, gamma=self._gamma, epsilon0=self._eps0,
                               max_plausible=self._maxp, seed=self._seed),
                model, beam.pvalue.AsSingleton(sample)).with_outputs("rejected", main="released")
            return {"released": out.released, "rejected": out.rejected}
        n_seeds = combine_globally(self._records, _CountRowsFn(), "CountSeeds")
        # int |D_S|
        counts = (self._records
                  | "KeySeeds" >> beam.ParDo(_KeyCountsFn(self._shards), model)
                  # (shard, (keys[u, w] uint64, counts[u]))
                  | "MergeSeedCounts" >> beam.CombinePerKey(_MergeKeyCountsFn()))
        # (shard, (keys, counts) | None)
        keyed = candidates | "KeyCandidates" >> beam.ParDo(_KeyCandidatesFn(self._shards), model)
        # (shard, (CandidateBatch, keys))
        joined = {"counts": counts, "candidates": keyed} | "JoinByCopiedValues" >> beam.CoGroupByKey()
        # (shard, {"counts": [...], "candidates": [...]})
        out = joined | "TestFast" >> beam.ParDo(
            _FastTestFn(k=self._k, epsilon0=self._eps0, max_plausible=self._maxp, max_check=self._maxc,
                        seed=self._seed), beam.pvalue.AsSingleton(n_seeds)).with_outputs("rejected", main="released")
        return {"released": out.released, "rejected": out.rejected}
