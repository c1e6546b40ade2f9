"""The one source of randomness in beamsynth.

Every random draw that protects privacy (noise on counts, thresholds, exponential-mechanism
choices, contribution-bounding samples) and every draw of post-processing (synthetic sampling)
comes from a :class:`RandomSource` made here. Nothing else in the package imports ``random`` or
``numpy.random`` directly.

Two modes:

* **secure** (the default, ``seed=None``): a 256-bit run secret (:class:`RunSecret`, ``os.urandom``
  once) keys every stream. A stream's key is ``HMAC-SHA256(secret, labels)`` and its words are the
  AES-256-CTR keystream under that key (``cryptography``, a dependency of apache-beam). Every draw
  is thus a deterministic function of the secret and the stream labels (step, window, shard):
  a runner that retries a bundle or recomputes a side input re-derives exactly the same noise, so
  nothing charged once is ever drawn twice differently. Transforms resolve ``seed=None`` to a run
  secret **once, when the pipeline is built** (:func:`run_seed`), and carry it inside their
  pickled DoFns (the job graph); it is never written to an output, manifest or log
  (``repr`` hides it, and it is not JSON-serialisable). ``RandomSource()`` without a secret draws
  a fresh one: fine in a driver, wrong inside ``process`` (see docs/runners.md).
* **seeded** (``seed=<int>``, for tests and demos only): words come from numpy's Philox
  counter-based generator keyed by SHA-256 of ``(seed, stream labels)``. A stream is identified by
  its labels (step name, shard number, window), never by worker, bundle or arrival order, so a
  seeded pipeline gives identical output on any runner. Seeded output is marked
  "seeded: not for release" in every manifest.

Integer noise for counts is the discrete Laplace (two-sided geometric) law
``P(Z = k) = (1 - q)/(1 + q) · q^|k|`` with ``q = exp(-1/b)``, sampled as the difference of two
i.i.d. geometric variables. Why this is safe in floating point: the released value is an integer
``count + Z``, so there are no low-order float bits to leak (Mironov 2012's attack on textbook
Laplace needs a float output). The geometric draws use inversion ``floor(log(U) / log(q))``;
``log U`` comes from a 53-bit uniform above 2^-20 and from an exact, unbounded exponential tail
below it (:func:`_log_uniform`), so the support is all of the integers and every outcome's
probability is within a relative ``2^-33·b`` of the exact law (float rounding aside). Continuous
Laplace is provided only for internal scores that are never released (e.g. noisy entropies used
to choose a structure).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

__all__ = [
    "RandomSource",
    "RunSecret",
    "run_seed",
    "child_seed",
    "hypergeometric",
    "uniform_below",
    "discrete_laplace",
    "discrete_laplace_cdf",
    "discrete_laplace_pmf",
    "discrete_laplace_scale",
    "discrete_gaussian",
    "discrete_gaussian_pmf",
    "discrete_gaussian_variance",
    "exponential",
    "exponential_mechanism",
    "permute_and_flip",
    "permute_and_flip_probabilities",
    "geometric",
    "laplace_internal",
    "sample_categorical",
    "binomial",
    "gumbel",
    "poisson",
]

_TWO_POW_53 = float(2**53)
_U11, _U12, _U63 = np.uint64(11), np.uint64(12), np.uint64(63)  # shifts of a word
_BELOW_ONE = 1.0 - 2.0**-53  # the largest double below 1


def _derive_key(seed: int, labels: tuple[Hashable, ...]) -> int:
    """128-bit Philox key from SHA-256 of the seed and the stream labels (seeded mode only)."""
    digest = hashlib.sha256(repr((int(seed), labels)).encode("utf-8")).digest()
    return int.from_bytes(digest[:16], "little")


def child_seed(seed: int, *labels: Hashable) -> int:
    """The seed of one named part of a seeded run (a job's step, a release's table): 56 bits of
    SHA-256 of the seed and the part's labels, so two parts never share a noise stream. Seeded
    runs only (tests and demos); secure runs derive every stream from their run secret."""
    digest = hashlib.sha256(repr((seed, *labels)).encode("utf-8")).digest()
    return int.from_bytes(digest[:7], "big")


_SCALAR_TYPES = frozenset({str, int, float, bool, bytes, type(None)})  # exact types: unchanged by _plain


def _plain(label: Any) -> Any:
    """A label with numpy scalars as Python scalars (so ``np.int64(3)`` and ``3`` name one stream)."""
    if type(label) is tuple and all(type(x) in _SCALAR_TYPES for x in label):
        return label  # the common shape (str and int labels): nothing to convert
    if isinstance(label, np.generic):
        return label.item()
    if isinstance(label, tuple):
        return tuple(_plain(x) for x in label)
    return label


class _PhiloxEngine(threading.local):
    """One Philox bit generator per thread, re-keyed for every read (seeded mode only).

    Building a ``np.random.Philox`` costs ~30 µs (it draws OS entropy for a seed sequence it
    does not use when a key is given), more than most draws; a seeded stream therefore keeps only
    its key and its position, and each read sets this thread's generator to (key, block counter)
    and reads on: Philox's words are a pure function of (key, counter), so the words are those of
    a generator built for the stream (``np.random.Philox(key=...)``) and read from its start. No
    generator state is shared between streams or threads; a read runs no other Python code
    between setting the state and drawing.
    """

    def __init__(self) -> None:
        self.gen = np.random.Philox(key=0)
        self.state = self.gen.state  # a template: counter and key arrays are overwritten per read
        self.counter = self.state["state"]["counter"]
        self.key = self.state["state"]["key"]
        self.state["buffer_pos"] = 4  # buffer empty: the next word starts block counter + 1

    def read(self, key: np.ndarray, pos: int, n: int) -> np.ndarray:
        block, skip = divmod(pos, 4)  # 4 words per Philox block; the counter counts blocks drawn
        self.counter[:] = 0
        self.counter[0] = block
        self.key[:] = key
        self.gen.state = self.state
        raw = self.gen.random_raw(skip + n)
        return raw[skip:] if skip else raw


_ENGINE = _PhiloxEngine()
_MASK64 = (1 << 64) - 1


class _KeyedStream:
    """The AES-256-CTR keystream of one stream key: a deterministic sequence of bytes."""

    def __init__(self, key: bytes) -> None:
        self._enc = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()

    def read(self, nbytes: int) -> bytes:
        return self._enc.update(bytes(nbytes))


class RunSecret:
    """The per-run secret of secure mode: 256 bits of OS entropy, drawn once at construction.

    It keys every privacy draw of the transforms that carry it: stream key
    ``HMAC-SHA256(secret, "beamsynth/stream" ‖ repr(labels))``, words from AES-256-CTR under that
    key. Picklable, so DoFns carry it in the job graph and every worker (and every retry) derives
    the same draws; ``repr`` never shows it and it is not JSON-serialisable, so it cannot slip into
    a manifest. Equality compares the secret in constant time.
    """

    __slots__ = ("_key",)

    def __init__(self, key: bytes | None = None) -> None:
        if key is None:
            key = os.urandom(32)
        if not isinstance(key, (bytes, bytearray)) or len(key) < 32:
            raise ValueError(f"a run secret needs at least 32 bytes, got {type(key).__name__}"
                             f" of length {len(key) if isinstance(key, (bytes, bytearray)) else '?'}")
        self._key = bytes(key)

    def stream_key(self, labels: tuple[Hashable, ...]) -> bytes:
        """The 256-bit key of the stream named by ``labels`` (HMAC-SHA256 as a KDF)."""
        msg = b"beamsynth/stream\x00" + repr(_plain(tuple(labels))).encode("utf-8")
        return hmac.digest(self._key, msg, "sha256")

    def stream(self, labels: tuple[Hashable, ...]) -> _KeyedStream:
        """The byte stream named by ``labels``; the same labels always give the same bytes."""
        return _KeyedStream(self.stream_key(labels))

    def __getstate__(self) -> bytes:
        return self._key

    def __setstate__(self, state: bytes) -> None:
        self._key = state

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and hmac.compare_digest(self._key, other._key)  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), hmac.digest(self._key, b"beamsynth/hash", "sha256")[:8]))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(<{8 * len(self._key)}-bit secret, hidden>)"


_SECRET_FACTORY: Callable[[], RunSecret] = RunSecret  # audits swap in a broken variant (faults.py)


def run_seed(seed: int | RunSecret | None) -> int | RunSecret:
    """Resolve a transform's ``seed`` when the pipeline is built, before any data is read.

    ``None`` (secure) becomes a fresh :class:`RunSecret` that the transform then carries into its
    DoFns, so every execution of those DoFns, on any worker and after any retry, makes the same
    draws; an int (tests, demos) and an already resolved secret (handed down by a parent
    transform) pass through. Call it once per transform, in ``__init__``; never in ``process`` or
    ``setup`` (a secret drawn there would differ between executions).
    """
    if seed is None:
        return _SECRET_FACTORY()
    if isinstance(seed, RunSecret):
        return seed
    _check_seed(seed)
    return int(seed)


def _check_seed(seed: Any) -> None:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int or None, got {type(seed).__name__} ({seed!r})")


class RandomSource:
    """A stream of random 64-bit words: keyed by a run secret by default, Philox when seeded.

    Args:
      seed: ``None`` for secure mode with a fresh :class:`RunSecret` (drawn here), a
        :class:`RunSecret` (secure mode keyed by a transform's run secret, see :func:`run_seed`),
        or an int for reproducible streams (tests and demos only).
      labels: identity of this stream (e.g. ``("sample", shard)``).

    A ``RandomSource`` is cheap and picklable: DoFns carry the resolved seed and build child
    streams in ``process`` from element identity (``rs.child("noise", window, shard)``). A
    pickled source restarts its stream.
    """

    def __init__(self, *, seed: int | RunSecret | None = None, labels: Sequence[Hashable] = ()) -> None:
        self._secret: RunSecret | None = None
        self._seed: int | None = None
        if seed is None:
            self._secret = _SECRET_FACTORY()
        elif isinstance(seed, RunSecret):
            self._secret = seed
        else:
            _check_seed(seed)
            self._seed = int(seed)
        self._labels = tuple(labels)
        self._philox_key: np.ndarray | None = None  # seeded: the stream's Philox key, once derived
        self._pos = 0  # seeded: words read so far
        self._stream: _KeyedStream | None = None

    # -- identity ---------------------------------------------------------------------------
    @property
    def seeded(self) -> bool:
        """True when this stream is reproducible (tests and demos only, never for release)."""
        return self._seed is not None

    @property
    def seed(self) -> int | None:
        """The user seed, or None in secure mode."""
        return self._seed

    @property
    def run_secret(self) -> RunSecret | None:
        """The run secret keying this stream (secure mode), or None when seeded."""
        return self._secret

    @property
    def labels(self) -> tuple[Hashable, ...]:
        """The labels identifying this stream."""
        return self._labels

    def child(self, *labels: Hashable) -> RandomSource:
        """An independent sub-stream identified by ``labels`` appended to this stream's labels."""
        out = RandomSource.__new__(RandomSource)  # this stream's seed or secret, already checked
        out._secret, out._seed = self._secret, self._seed
        out._labels = self._labels + labels
        out._philox_key, out._pos, out._stream = None, 0, None
        return out

    def __getstate__(self) -> dict[str, Any]:
        return {"seed": self._seed, "secret": self._secret, "labels": self._labels}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._seed = state["seed"]
        self._secret = state["secret"]
        self._labels = state["labels"]
        self._philox_key = None
        self._pos = 0
        self._stream = None

    def __repr__(self) -> str:
        mode = "secure" if self._seed is None else f"seeded({self._seed})"
        return f"RandomSource({mode}, labels={self._labels!r})"

    # -- primitive ---------------------------------------------------------------------------
    def words(self, n: int) -> np.ndarray:
        """``n`` uniformly random uint64 words."""
        n = int(n)
        if n < 0:
            raise ValueError(f"n ({n}) must be >= 0")
        if self._secret is not None:
            if self._stream is None:
                self._stream = self._secret.stream(self._labels)
            return np.frombuffer(self._stream.read(8 * n), dtype=np.uint64).copy()
        if self._philox_key is None:
            key = _derive_key(self._seed, self._labels)
            self._philox_key = np.array([key & _MASK64, key >> 64], dtype=np.uint64)
        out = _ENGINE.read(self._philox_key, self._pos, n)
        self._pos += n
        return out

    # -- derived uniform draws ---------------------------------------------------------------
    def uniform(self, size: int | tuple[int, ...]) -> np.ndarray:
        """Uniform doubles on the open interval (0, 1), on the 2^-53 grid shifted by half a step.

        Above 1/2, ``w + 0.5`` is not representable and rounds to an even neighbour; for the
        largest word that neighbour is 2^53, i.e. exactly 1.0, which would put
        ``sample_categorical`` one past the last index and make Gumbel draws infinite. That one
        word is mapped to the largest double below 1 instead (its mass, 2^-53, is unchanged).
        """
        shape = (size,) if isinstance(size, (int, np.integer)) else tuple(size)
        n = int(math.prod(shape))  # 1 for shape ()
        w = self.words(n) >> _U11
        u = (w.astype(np.float64) + 0.5) / _TWO_POW_53
        return np.minimum(u, _BELOW_ONE).reshape(shape)

    def integers(self, bound: int, size: int) -> np.ndarray:
        """``size`` uniform integers in ``[0, bound)`` for ``1 <= bound < 2**63`` (rejection sampling)."""
        bound = int(bound)
        if not (1 <= bound < 2**63):
            raise ValueError(f"bound ({bound}) must be in [1, 2**63); use randbelow for larger")
        size = int(size)
        if bound == 1:
            return np.zeros(size, dtype=np.int64)
        bits = (bound - 1).bit_length()
        mask = np.uint64((1 << bits) - 1)
        out = np.empty(size, dtype=np.int64)
        filled = 0
        while filled < size:
            need = size - filled
            cand = self.words(max(16, int(need * 1.3) + 8)) & mask
            cand = cand[cand < np.uint64(bound)][:need]
            out[filled : filled + cand.size] = cand.astype(np.int64)
            filled += cand.size
        return out

    def randbelow(self, bound: int) -> int:
        """One uniform Python int in ``[0, bound)`` for any ``bound >= 1`` (exact, arbitrary size)."""
        bound = int(bound)
        if bound < 1:
            raise ValueError(f"bound ({bound}) must be >= 1")
        bits = (bound - 1).bit_length()
        if bits == 0:
            return 0
        nwords = (bits + 63) // 64
        while True:
            w = self.words(nwords)
            value = 0
            for x in w.tolist():
                value = (value << 64) | int(x)
            value &= (1 << bits) - 1
            if value < bound:
                return value

    def numpy_generator(self) -> np.random.Generator:
        """A numpy Generator seeded from this stream, for post-processing draws only (e.g. Dirichlet)."""
        return np.random.Generator(np.random.PCG64(self.words(4).tolist()))

    def secret_key(self) -> bytes:
        """32 secret bytes (HMAC keys for lazily derived noise): the next words of this stream, so
        a deterministic function of the run secret (or seed) and the labels."""
        return b"".join(int(x).to_bytes(8, "little") for x in self.words(4).tolist())


# -- noise laws --------------------------------------------------------------------------------
_TAIL_BITS = 20  # below u = 2^-20 the 2^-53 grid is too coarse: switch to the exact tail
_LN2 = math.log(2.0)


def _trailing_zero_runs(rs: RandomSource, n: int) -> np.ndarray:
    """``n`` i.i.d. Geometric(1/2) counts (``P(N = k) = 2^-(k+1)``, unbounded): the trailing zero
    bits of fresh random words, continued into the next word while a word is all zeros."""
    zeros = np.zeros(n, dtype=np.int64)
    active = np.arange(n)
    while active.size:
        w = rs.words(active.size)
        empty = w == 0
        low = w[~empty] & (~w[~empty] + np.uint64(1))  # lowest set bit, a power of two
        zeros[active[~empty]] += np.frexp(low.astype(np.float64))[1] - 1
        zeros[active[empty]] += 64
        active = active[empty]
    return zeros


def _fine_uniform(rs: RandomSource, n: int) -> np.ndarray:
    """``n`` uniform doubles on (0, 1) with uniform *relative* resolution near 0.

    The binade is exact: ``U ∈ [2^-(N+1), 2^-N)`` with ``N ~ Geometric(1/2)`` (unbounded), and
    ``U`` is uniform within it on a 2^-52-relative grid (shifted by half a step, so never on a
    binade edge). ``rs.uniform`` stops at 2^-54; this one reaches every positive normal double
    (below 2^-1022, probability 2^-1022, it is clamped to the smallest normal).
    """
    k = _trailing_zero_runs(rs, n)
    f = ((rs.words(n) >> _U12).astype(np.float64) + 0.5) / float(2**52)
    u = np.ldexp(0.5 + 0.5 * f, -np.minimum(k, 1021).astype(np.int32))
    return np.maximum(u, np.finfo(np.float64).tiny)


def _standard_exponential(rs: RandomSource, n: int) -> np.ndarray:
    """``n`` draws of Exp(1) with no upper bound and uniform relative accuracy in both tails.

    ``E = ln2·N + R`` with ``N ~ Geometric(1/2)`` (:func:`_trailing_zero_runs`, unbounded) and
    ``R ~ Exp(1)`` truncated to ``[0, ln 2)``, ``R = -log1p(-V/2)`` with ``V`` from
    :func:`_fine_uniform`, so ``R`` (hence ``E``) comes arbitrarily close to 0 with relative
    accuracy: the integer and fractional parts of ``E / ln 2`` are independent with exactly these
    laws.
    """
    zeros = _trailing_zero_runs(rs, n)
    return zeros * _LN2 - np.log1p(-0.5 * _fine_uniform(rs, n))


def _log_uniform(rs: RandomSource, size: int | tuple[int, ...]) -> np.ndarray:
    """``log U`` for ``U`` uniform on (0, 1), exact in the lower tail.

    ``np.log`` of a 53-bit uniform bounds ``-log U`` by ``54·ln 2`` and quantizes the tail, so
    inversion samplers (geometric, exponential) had a bounded support: ``count + Z`` could take
    values impossible for ``count + 1 + Z`` (a pure-DP violation) and tail probabilities off by
    large factors. Draws with ``u < 2^-20`` (probability exactly 2^-20: the words below 2^33)
    are replaced by ``-20·ln 2 - E`` with ``E ~ Exp(1)`` unbounded (memorylessness:
    ``-log U - 20·ln 2`` given ``U < 2^-20`` is Exp(1)). Other draws are unchanged, so the
    relative error of any outcome's probability stays below ``2^-33/Δ`` for an interval of
    width ``Δ`` in ``-log U``.
    """
    u = rs.uniform(size)
    log_u = np.log(u)
    tail = u < 2.0**-_TAIL_BITS
    m = int(np.count_nonzero(tail))
    if m:
        log_u[tail] = -_TAIL_BITS * _LN2 - _standard_exponential(rs, m)
    return log_u


def discrete_laplace_scale(*, sensitivity: float, epsilon: float) -> float:
    """Scale b = Δ/ε of the discrete Laplace mechanism (ε-DP for integer queries of L1 sensitivity Δ)."""
    if not (sensitivity > 0 and math.isfinite(sensitivity)):
        raise ValueError(f"sensitivity ({sensitivity!r}) must be a finite number > 0")
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon ({epsilon!r}) must be a finite number > 0")
    return float(sensitivity) / float(epsilon)


def geometric(rs: RandomSource, q: float, size: int | tuple[int, ...]) -> np.ndarray:
    """Failures before the first success, ``P(G = k) = (1 - q) q^k`` for k ≥ 0 (0 ≤ q < 1)."""
    if not (0.0 <= q < 1.0):
        raise ValueError(f"q ({q!r}) must be in [0, 1)")
    log_u = _log_uniform(rs, size)
    if q == 0.0:
        return np.zeros(log_u.shape, dtype=np.int64)
    return np.floor(log_u / math.log(q)).astype(np.int64)


def discrete_laplace(rs: RandomSource, scale: float, size: int | tuple[int, ...]) -> np.ndarray:
    """Discrete Laplace noise ``P(Z = k) ∝ exp(-|k| / scale)`` as int64 (two-sided geometric)."""
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale ({scale!r}) must be a finite number > 0")
    q = math.exp(-1.0 / scale)
    return geometric(rs, q, size) - geometric(rs, q, size)


def discrete_laplace_pmf(k: np.ndarray | int, scale: float) -> np.ndarray:
    """Probability mass of the discrete Laplace law at integers ``k`` (for tests and reports)."""
    q = math.exp(-1.0 / scale)
    k = np.abs(np.asarray(k, dtype=np.float64))
    return (1 - q) / (1 + q) * np.power(q, k)


def discrete_laplace_cdf(k: np.ndarray | int, scale: float) -> np.ndarray:
    """``P(Z ≤ k)`` of the discrete Laplace law at integers ``k``."""
    q = math.exp(-1.0 / scale)
    k = np.asarray(k, dtype=np.float64)
    upper = 1.0 - np.power(q, np.abs(k) + 1) / (1 + q)  # k >= 0
    lower = np.power(q, np.abs(k)) / (1 + q)  # k < 0: P(Z <= -m) = q^m / (1+q)
    return np.where(k >= 0, upper, lower)


def discrete_gaussian(rs: RandomSource, sigma: float, size: int | tuple[int, ...]) -> np.ndarray:
    """Discrete Gaussian noise ``P(Z = k) ∝ exp(-k² / (2σ²))`` as int64 (issue 18, zCDP tables).

    Canonne, Kamath & Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020),
    Algorithm 3: ``Y`` discrete Laplace of scale ``t = ⌊σ⌋ + 1`` (:func:`discrete_laplace`,
    unbounded support), kept with probability ``exp(-(|Y| − σ²/t)² / (2σ²))``; rejected draws
    are redrawn from fresh child streams (``("dg", round)``), so the result depends only on
    ``rs``'s labels. The acceptance test is ``log U < −γ`` with ``log U`` from
    :func:`_log_uniform` (exact lower tail, unbounded), so every ``Y`` keeps its probability
    ``exp(−γ)`` (float relative error ~2^-33 at most; the paper's exact Bernoulli(exp(−γ)) uses
    rational arithmetic) and the support is unbounded; a 53-bit uniform ``U < exp(−γ)`` (U ≥
    2^-54) never kept a draw with γ > 37.4, i.e. ``|Z| ≥ σ²/t + 8.65σ``. The released value is
    an integer (no float bits to leak).
    Adding it to an integer query of L2 sensitivity Δ is ``Δ²/(2σ²)``-zCDP (their Thm. 4).
    """
    if not (sigma > 0 and math.isfinite(sigma)):
        raise ValueError(f"sigma ({sigma!r}) must be a finite number > 0")
    shape = (size,) if isinstance(size, (int, np.integer)) else tuple(size)
    n = int(math.prod(shape))  # 1 for shape ()
    t = math.floor(sigma) + 1
    out = np.zeros(n, dtype=np.int64)
    todo = np.arange(n)
    rnd = 0
    while todo.size:
        sub = rs.child("dg", rnd)
        y = discrete_laplace(sub, float(t), todo.size)
        gamma = (np.abs(y) - sigma * sigma / t) ** 2 / (2.0 * sigma * sigma)
        keep = _log_uniform(sub, todo.size) < -gamma
        out[todo[keep]] = y[keep]
        todo = todo[~keep]
        rnd += 1
    return out.reshape(shape)


def discrete_gaussian_pmf(k: np.ndarray | int, sigma: float) -> np.ndarray:
    """Probability mass of the discrete Gaussian law at integers ``k`` (for tests and reports)."""
    width = int(math.ceil(40 * sigma)) + 10
    norm = float(np.exp(-np.arange(-width, width + 1, dtype=np.float64) ** 2 / (2 * sigma * sigma)).sum())
    k = np.asarray(k, dtype=np.float64)
    return np.exp(-k * k / (2 * sigma * sigma)) / norm


def discrete_gaussian_variance(sigma: float) -> float:
    """Variance of the discrete Gaussian law of parameter σ (≤ σ², CKS 2020 Cor. 9)."""
    width = int(math.ceil(40 * sigma)) + 10
    k = np.arange(-width, width + 1, dtype=np.float64)
    return float((k * k * discrete_gaussian_pmf(k, sigma)).sum())


def exponential(rs: RandomSource, rate: float, size: int | tuple[int, ...]) -> np.ndarray:
    """Exponential draws with the given rate (mean 1/rate)."""
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate ({rate!r}) must be a finite number > 0")
    return -_log_uniform(rs, size) / rate


def gumbel(rs: RandomSource, size: int | tuple[int, ...]) -> np.ndarray:
    """Standard Gumbel draws (for the exponential mechanism via Gumbel-max), unbounded both ways.

    ``G = -log E`` with ``E ~ Exp(1)`` from :func:`_standard_exponential`: its upper tail (E near
    0, relative accuracy from :func:`_fine_uniform`) reaches about 709 and its lower tail (E
    unbounded) has no limit. ``-log(-log U)`` of a 53-bit uniform was confined to
    ``[-3.62, 37.4]``, so the exponential mechanism gave candidates behind by a scaled gap above
    about 41 probability exactly 0 instead of about ``e^-gap``.
    """
    shape = (size,) if isinstance(size, (int, np.integer)) else tuple(size)
    n = int(math.prod(shape))  # 1 for shape ()
    return (-np.log(_standard_exponential(rs, n))).reshape(shape)


def laplace_internal(rs: RandomSource, scale: float, size: int | tuple[int, ...]) -> np.ndarray:
    """Continuous Laplace noise, **only** for internal scores that are never released as values.

    Released values must use integer noise (:func:`discrete_laplace`). Scores such as noisy
    entropies feed a structure choice; only the choice is released. Sampled as a random sign
    times ``scale·E``, ``E ~ Exp(1)`` unbounded (:func:`_standard_exponential`); the old inversion
    of a 53-bit uniform stopped at ``37.4·scale``.
    """
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale ({scale!r}) must be a finite number > 0")
    shape = (size,) if isinstance(size, (int, np.integer)) else tuple(size)
    n = int(math.prod(shape))  # 1 for shape ()
    sign = np.where(rs.words(n) >> _U63, 1.0, -1.0)  # the top bit of a fresh word
    return (sign * scale * _standard_exponential(rs, n)).reshape(shape)


def _selection_scores(scores: np.ndarray, epsilon: float, sensitivity: float) -> np.ndarray:
    """Validated scores (1-d, non-empty, float) of a private selection with ε, Δ > 0."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 1 or scores.size == 0:
        raise ValueError(f"scores must be a non-empty 1-d array, got shape {scores.shape}")
    if not (epsilon > 0 and sensitivity > 0):
        raise ValueError(f"epsilon ({epsilon}) and sensitivity ({sensitivity}) must be > 0")
    return scores


def exponential_mechanism(
    rs: RandomSource,
    scores: np.ndarray,
    *,
    epsilon: float,
    sensitivity: float,
    monotonic: bool = False,
) -> int:
    """Pick an index with probability ∝ exp(ε·score / (2Δ)) (ε/Δ when ``monotonic``); ε-DP.

    McSherry & Talwar 2007, sampled exactly with the Gumbel-max trick: argmax of
    ``ε·score/(2Δ) + Gumbel``. Scores must not depend on the data except through a function of
    sensitivity ``Δ`` (add/remove neighbours).
    """
    scores = _selection_scores(scores, epsilon, sensitivity)
    factor = epsilon / (sensitivity if monotonic else 2.0 * sensitivity)
    return int(np.argmax(factor * scores + gumbel(rs, scores.size)))


def permute_and_flip(
    rs: RandomSource,
    scores: np.ndarray,
    *,
    epsilon: float,
    sensitivity: float,
) -> int:
    """Permute-and-flip selection (McKenna & Sheldon, NeurIPS 2020); ε-DP for scores of
    sensitivity ``Δ`` under add/remove neighbours, like the exponential mechanism.

    Candidates are visited in a uniformly random order and candidate ``r`` is accepted with
    probability ``exp(ε·(u_r − u*)/(2Δ))`` (``u*`` the best score, so the walk always stops).
    Sampled exactly and vectorized as report-noisy-max with exponential noise:
    ``argmax_r ε·u_r/(2Δ) + E_r`` with ``E_r ~ Exponential(1)`` i.i.d., which has the same output
    law (Ding, Kifer, Saghaian, Steinke, Wang, Xiao, Zhang, "The permute-and-flip mechanism is
    identical to report-noisy-max with exponential noise", 2021). Its expected score is never
    below the exponential mechanism's at the same ε and can be up to 2× closer to the best.
    """
    scores = _selection_scores(scores, epsilon, sensitivity)
    if not np.all(np.isfinite(scores)):
        raise ValueError("scores must be finite")
    factor = epsilon / (2.0 * sensitivity)
    return int(np.argmax(factor * scores + exponential(rs, 1.0, scores.size)))


def permute_and_flip_probabilities(scores: np.ndarray, *, epsilon: float, sensitivity: float) -> np.ndarray:
    """Exact output law of :func:`permute_and_flip` by enumerating all visiting orders (tests and
    audits; only for a handful of candidates)."""
    import itertools

    u = np.asarray(scores, dtype=np.float64)
    k = u.size
    if k > 8:
        raise ValueError(f"exact enumeration is for at most 8 candidates, got {k}")
    accept = np.exp(epsilon * (u - u.max()) / (2.0 * sensitivity))
    out = np.zeros(k)
    perms = list(itertools.permutations(range(k)))
    for perm in perms:
        alive = 1.0
        for r in perm:
            out[r] += alive * accept[r]
            alive *= 1.0 - accept[r]
    return out / len(perms)


def uniform_below(rs: RandomSource, bounds: np.ndarray) -> np.ndarray:
    """One uniform integer in ``[0, b)`` for each entry ``b`` of ``bounds`` (``1 <= b < 2**53``),
    exact: each draw masks a fresh word to the bit length of ``b - 1`` and rejects values ``>= b``."""
    bounds = np.asarray(bounds, dtype=np.int64)
    if bounds.size and (bounds.min() < 1 or bounds.max() >= 2**53):
        raise ValueError(f"bounds must be in [1, 2**53), got min {bounds.min()} and max {bounds.max()}")
    flat = bounds.ravel()
    bits = np.frexp(np.maximum(flat - 1, 0).astype(np.float64))[1]  # bit length of b - 1
    mask = (np.uint64(1) << bits.astype(np.uint64)) - np.uint64(1)
    out = np.zeros(flat.size, dtype=np.int64)
    active = np.flatnonzero(flat > 1)
    while active.size:
        cand = rs.words(active.size) & mask[active]
        ok = cand < flat[active].astype(np.uint64)
        out[active[ok]] = cand[ok].astype(np.int64)
        active = active[~ok]
    return out.reshape(bounds.shape)


def hypergeometric(rs: RandomSource, good: np.ndarray, bad: np.ndarray, nsample: np.ndarray | int) -> np.ndarray:
    """Exact Hypergeometric draws: good items among ``nsample`` drawn without replacement from an
    urn of ``good`` good and ``bad`` bad items (element-wise over arrays, broadcast).

    Draws one item at a time with exact integer uniforms (:func:`uniform_below`), on the smaller
    side of each urn: ``min(n, total - n)`` draws per entry (``H(g, b, n) = g - H(g, b, total - n)``).
    Replaces numpy's generator in privacy-relevant draws (plausible ``k'``, the proportional
    discount of prefix trees), which now come from the secure source like all other noise.
    """
    good, bad, n = np.broadcast_arrays(np.asarray(good, dtype=np.int64), np.asarray(bad, dtype=np.int64),
                                       np.asarray(nsample, dtype=np.int64))
    if good.size and (good.min() < 0 or bad.min() < 0 or n.min() < 0 or np.any(n > good + bad)):
        raise ValueError("hypergeometric needs good, bad >= 0 and 0 <= nsample <= good + bad")
    total = (good + bad).ravel()
    flip = (2 * n > good + bad).ravel()
    draws = np.where(flip, total - n.ravel(), n.ravel())
    g_left, t_left = good.ravel().copy(), total.copy()
    got = np.zeros(total.size, dtype=np.int64)
    for step in range(int(draws.max()) if draws.size else 0):
        active = np.flatnonzero(draws > step)
        hit = uniform_below(rs, t_left[active]) < g_left[active]
        got[active] += hit
        g_left[active] -= hit
        t_left[active] -= 1
    return np.where(flip, good.ravel() - got, got).reshape(good.shape)


def binomial(rs: RandomSource, n: int, p: float) -> int:
    """One exact-law draw of Binomial(n, p) for any Python int ``n`` (up to 10^30) and 0 ≤ p ≤ 1.

    Inversion of ``U ~ U(0, 1)`` against the pmf from the mode-free recurrence
    ``P(k+1)/P(k) = (n-k)/(k+1) · p/(1-p)`` in log space, started at ``log P(0) = n·log1p(-p)``.
    Both tails are exact and unbounded: a random bit picks the half of ``U`` and ``W ∈ (0, 1/2]``
    its distance to the nearer end, with ``log W`` from :func:`_log_uniform` (exact lower tail);
    the lower half returns the smallest ``k`` with ``P(X ≤ k) ≥ W``, the upper half the smallest
    ``k`` with ``P(X > k) ≤ W`` (the pmf is summed until it is 40 nats below ``W``, so every
    ``k ≤ n`` can come out). A 53-bit ``U`` (≥ 2^-54, ≤ 1 − 2^-54) never gave a ``k`` beyond
    ``P(X > k) ≈ 1.5e-15`` (n = 10^6, p = 7e-6: never above 36), a support that could differ
    between neighbouring ``n``. The expected number of steps is ``n·p + O(sqrt(n·p))``, which is
    why it is used where ``n·p`` is modest (CatHist: ``n·p ≈ -ln ρ``); larger means are split:
    ``Binomial(n, p) = Σ Binomial(n_i, p)`` over chunks whose mean is at most 1e5.
    """
    n = int(n)
    if n < 0:
        raise ValueError(f"n ({n}) must be >= 0")
    if not (0.0 <= p <= 1.0):
        raise ValueError(f"p ({p!r}) must be in [0, 1]")
    if n == 0 or p == 0.0:
        return 0
    if p == 1.0:
        return n
    if p > 0.5:
        return n - binomial(rs, n, 1.0 - p)
    mean = n * p
    if mean > 1e5:
        chunks = int(math.ceil(mean / 1e5))
        base, extra = divmod(n, chunks)
        return sum(binomial(rs, base + (1 if i < extra else 0), p) for i in range(chunks))
    upper, log_w = _two_sided_uniform(rs, 1)
    log_ratio_p = math.log(p) - math.log1p(-p)
    logs = [n * math.log1p(-p)]
    k = 0
    while k < n and (k <= mean or logs[-1] >= log_w[0] - _TAIL_NATS):
        logs.append(logs[-1] + math.log(n - k) - math.log(k + 1) + log_ratio_p)
        k += 1
    return int(_invert_two_sided(np.asarray(logs), upper, log_w)[0])


_TAIL_NATS = 40.0  # a law's pmf is listed until this far below the smallest W (the rest: < W·e^-39)
_POISSON_CHUNK = 1e6  # larger means are drawn as sums of Poisson(mean / c) (table size)


def _two_sided_uniform(rs: RandomSource, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` uniforms ``U`` on (0, 1) as (which half, ``log W``) with ``W = min(U, 1 − U)`` on
    (0, 1/2]: a random bit and ``log W`` from :func:`_log_uniform` (exact, unbounded lower tail),
    so inversion reaches both tails of a law (a 53-bit ``U`` stops 2^-54 from either end)."""
    upper = (rs.words(n) >> _U63).astype(bool)
    return upper, _log_uniform(rs, n) - _LN2


def _invert_two_sided(log_pmf: np.ndarray, upper: np.ndarray, log_w: np.ndarray) -> np.ndarray:
    """Inversion of :func:`_two_sided_uniform` draws against ``log_pmf`` (values 0..J, listed
    until ``_TAIL_NATS`` below the smallest ``W``): the lower half gives the smallest ``k`` with
    ``P(X ≤ k) ≥ W``, the upper half the smallest ``k`` with ``P(X > k) ≤ W``."""
    log_cdf = np.logaddexp.accumulate(log_pmf)
    log_sf = np.append(np.logaddexp.accumulate(log_pmf[::-1])[::-1][1:], -np.inf)  # log P(X > k)
    low = np.minimum(np.searchsorted(log_cdf, log_w, side="left"), log_pmf.size - 1)
    high = np.searchsorted(-log_sf, -log_w, side="left")
    return np.where(upper, high, low).astype(np.int64)


def poisson(rs: RandomSource, lam: float, size: int | tuple[int, ...]) -> np.ndarray:
    """Poisson(``lam``) draws as int64, exact law with unbounded tails.

    Inversion of :func:`_two_sided_uniform` draws (both tails exact) against the pmf
    ``exp(−λ)·λ^k/k!`` listed until past the mean and ``_TAIL_NATS`` below the smallest ``W``;
    ``λ`` above 10^6 is a sum of Poisson(λ/c) draws (same law). A 53-bit uniform (≥ 2^-54,
    ≤ 1 − 2^-54) never gave a draw with ``P(X > k)`` below about 2^-54 (λ = 0.12: never above 10;
    plausible deniability's Poisson(rows/|D_S|) candidates per seed).
    """
    lam = float(lam)
    if not (lam >= 0 and math.isfinite(lam)):
        raise ValueError(f"lam ({lam!r}) must be a finite number >= 0")
    shape = (size,) if isinstance(size, (int, np.integer)) else tuple(size)
    n = int(math.prod(shape))  # 1 for shape ()
    if lam == 0 or n == 0:
        return np.zeros(shape, dtype=np.int64)
    if lam > _POISSON_CHUNK:
        parts = int(math.ceil(lam / _POISSON_CHUNK))
        return sum((poisson(rs.child("part", i), lam / parts, shape) for i in range(parts)),
                   np.zeros(shape, dtype=np.int64))
    upper, log_w = _two_sided_uniform(rs, n)
    floor = float(log_w.min()) - _TAIL_NATS
    top = int(lam + 10 * math.sqrt(lam) + 40)
    while True:
        k = np.arange(top + 1, dtype=np.float64)
        log_fact = np.concatenate(([0.0], np.cumsum(np.log(k[1:]))))
        log_pmf = -lam + k * math.log(lam) - log_fact
        if log_pmf[-1] < floor:
            break
        top *= 2
    return _invert_two_sided(log_pmf, upper, log_w).reshape(shape)


def sample_categorical(rs: RandomSource, probs: np.ndarray, size: int) -> np.ndarray:
    """Post-processing: ``size`` i.i.d. indices drawn from the probability vector ``probs``."""
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 1 or probs.size == 0:
        raise ValueError(f"probs must be a non-empty 1-d array, got shape {probs.shape}")
    if np.any(probs < 0) or not np.all(np.isfinite(probs)):
        raise ValueError("probs must be finite and >= 0")
    total = probs.sum()
    if total <= 0:
        raise ValueError("probs must have a positive sum")
    cdf = np.cumsum(probs / total)
    cdf[-1] = 1.0
    return np.searchsorted(cdf, rs.uniform(size), side="right").astype(np.int64)
