"""Plausible deniability (seed 001), the seed-based generative models, Beam-free (Sections 3.1-3.4).

* :class:`PlausibleModel` — what the privacy test needs of a model: ``generate(seeds, rs)`` →
  candidates ``y[c, m]`` and ``log Pr{y = M(seed)}[c]``; ``log_prob(y, d)`` → a
  ``[len(y), len(d)]`` matrix; ``copied_columns()`` for the fast path;
* :class:`PerturbationModel` — a public, data-free model for the generic path;
* :class:`SeedResamplingNetwork` — the Bayesian network as the generator of Section 3.2
  (equations 2 and 3): ``Pr{y = M(d)} = 1[y_C = d_C]·Π_{resampled i} P(y_i | y_Π_i)``;
  :class:`PlausibleBayesNet` (the paper's network, Section 3.4) and :class:`NetworkGenerator`
  (explicit tables);
* :func:`choose_parents`, :func:`fit_network_generator` — a :class:`NetworkGenerator` fitted to a
  weighted sample of a released model (used by
  :func:`~beamsynth.transforms.plausible_learn.privbayes_generator`).

Shapes: codes are int64 arrays ``[rows, m]`` of declared cell indexes; a conditional is a
``[parent configuration, value]`` array in ``np.ravel_multi_index`` order of the parents.

Privacy: :class:`PlausibleBayesNet` holds the **exact** parameter counts of ``D_P`` and a secret
HMAC key, so it stays a side input and is never written; every conditional it uses is
``Dir(α + max(0, n_{i,pa} + Z))`` with ``Z`` discrete Laplace of scale ``m·c/ε`` per cell (one
table per attribute, each record in one cell per table: ε-DP by sequential composition over the
``m`` tables, accounted by :class:`~beamsynth.transforms.plausible_learn.DPPlausibleBayesNet`).
:class:`NetworkGenerator` and the fitting functions read only released models: post-processing,
no budget. :class:`PerturbationModel` learns nothing from data.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from beamsynth.transforms.noise import RandomSource, RunSecret, discrete_laplace
from beamsynth.transforms.plausible_structure import PlausibleStructure
from beamsynth.transforms.synthesis import SynthesisModel

__all__ = [
    "GENERATOR_MAX_CELLS",
    "GENERATOR_MAX_CONFIGS",
    "GENERATOR_MAX_PARENTS",
    "GENERATOR_POOL_ROWS",
    "NetworkGenerator",
    "SeedResamplingNetwork",
    "choose_parents",
    "fit_network_generator",
    "PlausibleBayesNet",
    "PlausibleModel",
    "PerturbationModel",
]

GENERATOR_POOL_ROWS = 100_000  # Adult ε=1, seeds 1-3: same accuracy/AUC as 200,000 (0.816/0.855), 2.7x faster
GENERATOR_MAX_PARENTS = 3
GENERATOR_MAX_CONFIGS = 2_000
GENERATOR_MAX_CELLS = 1_000_000  # a fitted conditional table never exceeds this many cells
_SMALL_CARD = 32  # conditionals with at most this many cells are inverted with one comparison


# =============================================================================================
# The models
# =============================================================================================
class PlausibleModel(SynthesisModel):
    """A generative model usable by the privacy test: ``Pr{y = M(d)}`` for any seed ``d``.

    Subclasses implement :meth:`generate` and :meth:`log_prob` (natural log, ``-inf`` for 0),
    vectorized over batches. Models whose probability factorises as ``1[d_C = y_C]·q(y)`` also
    return the copied columns ``C`` from :meth:`copied_columns` and enable the fast path.
    """

    @abstractmethod
    def generate(self, seeds: np.ndarray, rs: RandomSource) -> tuple[np.ndarray, np.ndarray]:
        """Candidates ``y`` (one per seed row) and ``log Pr{y = M(seed)}``."""

    @abstractmethod
    def log_prob(self, y: np.ndarray, d: np.ndarray) -> np.ndarray:
        """``log Pr{y_a = M(d_b)}`` as a ``(len(y), len(d))`` matrix."""

    def copied_columns(self) -> tuple[int, ...] | None:
        """Columns copied from the seed when ``Pr{y=M(d)} = 1[d_C = y_C]·q(y)``; ``None`` otherwise."""
        return None


class PerturbationModel(PlausibleModel):
    """A public (data-free) seed model for the generic path: each attribute is kept with
    probability ``1 - p`` or replaced by a uniform value of its declared domain.

    ``Pr{y = M(d)} = Π_i ((1-p)·1[y_i = d_i] + p/|X_i|)``: it depends on which attributes differ,
    so seeds fall into different γ-intervals and the pass rate depends on γ (unlike the
    seed-resampling network). It learns nothing from data, so it costs no budget.
    """

    def __init__(self, *, shape: Sequence[int], p: float) -> None:
        if not (0.0 < p <= 1.0):
            raise ValueError(f"p ({p!r}) must be in (0, 1]")
        self._shape = tuple(int(s) for s in shape)
        self._p = float(p)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    def _factors(self) -> tuple[np.ndarray, np.ndarray]:
        card = np.asarray(self._shape, dtype=np.float64)
        return np.log((1 - self._p) + self._p / card), np.log(self._p / card)

    def generate(self, seeds: np.ndarray, rs: RandomSource) -> tuple[np.ndarray, np.ndarray]:
        y = np.array(seeds, dtype=np.int64, copy=True)
        for i, card in enumerate(self._shape):
            swap = rs.child("swap", i).uniform(len(y)) < self._p
            y[swap, i] = rs.child("value", i).integers(card, int(swap.sum()))
        return y, self._own_logp(y, seeds)

    def _own_logp(self, y: np.ndarray, d: np.ndarray) -> np.ndarray:
        same, diff = self._factors()
        return np.where(y == d, same[None, :], diff[None, :]).sum(axis=1)

    def log_prob(self, y: np.ndarray, d: np.ndarray) -> np.ndarray:
        same, diff = self._factors()
        eq = y[:, None, :] == d[None, :, :]
        return np.where(eq, same, diff).sum(axis=2)

    def sample_codes(self, n: int, rs: RandomSource) -> np.ndarray:
        """Uniform rows (the model has no data-free seed; used only through :meth:`generate`)."""
        return np.stack([rs.child("uniform", i).integers(c, n) for i, c in enumerate(self._shape)], axis=1)


def _hmac_seed(key: bytes, *labels: Any) -> int:
    msg = repr(labels).encode("utf-8")
    return int.from_bytes(hmac.new(key, msg, hashlib.sha256).digest(), "little")


class SeedResamplingNetwork(PlausibleModel):
    """A Bayesian network used as the seed-based generator of Section 3.2 (equations 2 and 3).

    The attributes follow a topological ``order`` of the DAG (``structure.parents``); a candidate
    copies the first ``m − ω`` attributes of that order from its seed and resamples the last ``ω``
    one after the other from ``P(X_i | Π_i)``, the parents taking the candidate's current values
    (copied or already resampled). So, for any record ``d``::

        Pr{y = M(d)} = 1[y_C = d_C] · Π_{i resampled} P(y_i | y_{Π_i})

    with ``C`` the copied attributes: every record agreeing with ``y`` on ``C`` is an equally likely
    seed, which the privacy test's fast path exploits (:meth:`copied_columns`). Subclasses provide
    the conditionals (:meth:`conditional_rows`); any DP model whose conditionals are post-processing
    of its release can be plugged in (:class:`PlausibleBayesNet`: the paper's own network;
    :class:`NetworkGenerator`: explicit tables, e.g. fitted to a PrivBayes model by
    :func:`fit_network_generator`).
    """

    _structure: PlausibleStructure
    _shape: tuple[int, ...]
    _omega: int

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def structure(self) -> PlausibleStructure:
        """The DAG and its topological (resampling) order."""
        return self._structure

    @property
    def omega(self) -> int:
        """Number of resampled attributes."""
        return self._omega

    def copied_columns(self) -> tuple[int, ...]:
        return tuple(sorted(self._structure.order[: len(self._shape) - self._omega]))

    def resampled_columns(self) -> tuple[int, ...]:
        """Resampled columns in generation (topological) order."""
        return self._structure.order[len(self._shape) - self._omega:]

    def config_index(self, i: int, codes: np.ndarray) -> np.ndarray:
        """Index of each row's parent configuration for attribute ``i``."""
        ps = self._structure.parents[i]
        if not ps:
            return np.zeros(codes.shape[0], dtype=np.int64)
        return np.ravel_multi_index(tuple(codes[:, j] for j in ps), tuple(self._shape[j] for j in ps)).astype(np.int64)

    @abstractmethod
    def conditional_rows(self, i: int, configs: np.ndarray) -> np.ndarray:
        """``P(X_i | pa = config)`` as one probability row per entry of ``configs``."""

    def _draw(self, i: int, y: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Inversion of each row's conditional CDF at ``u`` (scaled by the row total): the value
        and its probability. Works per distinct parent configuration, so memory is
        ``O(configurations·cells + rows)``, never ``rows × cells``."""
        uniq, inv = np.unique(self.config_index(i, y), return_inverse=True)
        inv = inv.ravel()
        probs = self.conditional_rows(i, uniq)
        cdf = np.cumsum(probs, axis=1)
        target = u * cdf[inv, -1]
        card = probs.shape[1]
        if card <= _SMALL_CARD:
            v = (cdf[inv] < target[:, None]).sum(axis=1)
        else:  # the same count of CDF entries below the target, by binary search per configuration
            v = np.empty(inv.size, dtype=np.int64)
            order = np.argsort(inv, kind="stable")
            bounds = np.searchsorted(inv[order], np.arange(uniq.size + 1))
            for r in range(uniq.size):
                idx = order[bounds[r]:bounds[r + 1]]
                v[idx] = np.searchsorted(cdf[r], target[idx], side="left")
        v = np.minimum(v, card - 1)
        return v, probs[inv, v]

    def generate(self, seeds: np.ndarray, rs: RandomSource) -> tuple[np.ndarray, np.ndarray]:
        y = np.array(seeds, dtype=np.int64, copy=True)
        logp = np.zeros(y.shape[0], dtype=np.float64)
        if y.shape[0] == 0:
            return y, logp
        for i in self.resampled_columns():
            v, p = self._draw(i, y, rs.child("resample", i).uniform(y.shape[0]))
            y[:, i] = v
            logp += np.log(p)
        return y, logp

    def log_q(self, y: np.ndarray) -> np.ndarray:
        """``log Π_{resampled i} P(y_i | y_PA(i))``: the seed-independent factor of ``Pr{y = M(d)}``."""
        out = np.zeros(y.shape[0], dtype=np.float64)
        for i in self.resampled_columns():
            uniq, inv = np.unique(self.config_index(i, y), return_inverse=True)
            out += np.log(self.conditional_rows(i, uniq)[inv.ravel(), y[:, i]])
        return out

    def log_prob(self, y: np.ndarray, d: np.ndarray) -> np.ndarray:
        cols = list(self.copied_columns())
        q = self.log_q(y)
        match = np.all(y[:, None, cols] == d[None, :, cols], axis=2) if cols else np.ones((len(y), len(d)), bool)
        return np.where(match, q[:, None], -np.inf)

    def sample_codes(self, n: int, rs: RandomSource) -> np.ndarray:
        """Forward sampling of ``n`` rows from scratch (no seed): the network as a plain model."""
        out = np.zeros((n, len(self._shape)), dtype=np.int64)
        for i in self._structure.order:
            out[:, i] = self._draw(i, out, rs.child("forward", i).uniform(n))[0]
        return out


class PlausibleBayesNet(SeedResamplingNetwork):
    """Bayesian network with lazily noised, Dirichlet-sampled conditionals (Section 3.4).

    Holds the **exact** parameter counts of ``D_P`` and the secret HMAC key, so it must stay inside
    the pipeline (it is a side input, never written). Every conditional ``P(X_i | pa)`` it uses is
    ``Dir(α + max(0, n_{i,pa} + Z))`` with ``Z`` discrete Laplace of scale ``m/ε_P`` per cell; ``Z``
    and the Dirichlet draw come from a :class:`RandomSource` seeded by ``HMAC(key, (i, pa))``, so
    every worker derives the same conditional for the same configuration, but nobody without the
    key can recompute (and subtract) the noise. Configurations are noised when first needed.
    """

    def __init__(self, *, structure: PlausibleStructure, shape: Sequence[int], counts: Sequence[np.ndarray],
                 noise_scale: float, alpha: float, omega: int, key: bytes) -> None:
        self._structure = structure
        self._shape = tuple(int(s) for s in shape)
        m = len(self._shape)
        if not (1 <= omega <= m):
            raise ValueError(f"omega ({omega!r}) must be in [1, {m}]")
        if len(key) < 16:
            raise ValueError("the HMAC key must have at least 16 bytes")
        self._counts = [np.asarray(c, dtype=np.int64).reshape(-1, self._shape[i]) for i, c in enumerate(counts)]
        self._scale = float(noise_scale)
        self._alpha = float(alpha)
        self._omega = int(omega)
        self._key = bytes(key)
        self._cache: list[np.ndarray | None] = [None] * m
        self._filled: list[np.ndarray | None] = [None] * m

    # -- pickling: drop caches (they are re-derived identically from the key) ---------------------
    def __getstate__(self) -> dict[str, Any]:
        st = dict(self.__dict__)
        st["_cache"] = [None] * len(self._shape)
        st["_filled"] = [None] * len(self._shape)
        return st

    def with_omega(self, omega: int) -> PlausibleBayesNet:
        """The same network resampling ``omega`` attributes (post-processing)."""
        return PlausibleBayesNet(structure=self._structure, shape=self._shape, counts=self._counts,
                                 noise_scale=self._scale, alpha=self._alpha, omega=omega, key=self._key)

    def describe(self) -> dict[str, Any]:
        return {"model": "plausible Bayesian network", "omega": self._omega,
                "structure": self._structure.to_dict(), "dirichlet_alpha": self._alpha,
                "noise_scale": self._scale}

    def conditional_rows(self, i: int, configs: np.ndarray) -> np.ndarray:
        """``P(X_i | pa = config)`` rows for each config index (lazily derived and cached)."""
        table = self._counts[i]
        if self._cache[i] is None:
            self._cache[i] = np.zeros(table.shape, dtype=np.float64)
            self._filled[i] = np.zeros(table.shape[0], dtype=bool)
        cache, filled = self._cache[i], self._filled[i]
        missing = np.unique(configs[~filled[configs]])
        for cfg in missing.tolist():
            # a secure keyed stream (AES-CTR, not Philox) under HMAC(model key, (i, pa))
            key = _hmac_seed(self._key, "plausible.params", i, int(cfg)).to_bytes(32, "little")
            rs = RandomSource(seed=RunSecret(key))
            noisy = table[cfg] + discrete_laplace(rs.child("noise"), self._scale, table.shape[1])
            conc = self._alpha + np.clip(noisy, 0, None).astype(np.float64)
            p = rs.child("dirichlet").numpy_generator().dirichlet(conc)
            p = np.clip(p, 1e-300, None)
            cache[cfg] = p / p.sum()
            filled[cfg] = True
        return cache[configs]


class NetworkGenerator(SeedResamplingNetwork):
    """A seed-resampling Bayesian network with explicit conditional tables (post-processing only).

    ``conditionals[i]`` is ``P(X_i | Π_i)`` as a ``[parent configuration, value]`` array over the
    declared cells (configurations in ``np.ravel_multi_index`` order of ``structure.parents[i]``),
    every row a probability vector with no zero entry. ``structure.order`` must be topological.
    Holds no data and no key: it is a function of a released model, so it may be written.
    """

    def __init__(self, *, structure: PlausibleStructure, shape: Sequence[int],
                 conditionals: Sequence[np.ndarray], omega: int, source: str = "explicit tables") -> None:
        self._structure = structure
        self._shape = tuple(int(s) for s in shape)
        m = len(self._shape)
        if isinstance(omega, bool) or not isinstance(omega, int) or not 1 <= omega <= m:
            raise ValueError(f"omega ({omega!r}) must be an int in [1, {m}]")
        if sorted(structure.order) != list(range(m)) or len(structure.parents) != m:
            raise ValueError(f"structure {structure!r} must order and parent each of the {m} columns once")
        pos = {c: r for r, c in enumerate(structure.order)}
        for i, ps in enumerate(structure.parents):
            if any(pos[p] >= pos[i] for p in ps):
                raise ValueError(f"order {structure.order!r} is not topological: column {i} has parents {ps!r}")
        if len(conditionals) != m:
            raise ValueError(f"need {m} conditionals, got {len(conditionals)}")
        self._cond = []
        for i, c in enumerate(conditionals):
            c = np.asarray(c, dtype=np.float64)
            want = (math.prod(self._shape[p] for p in structure.parents[i]), self._shape[i])
            if c.shape != want:
                raise ValueError(f"conditional of column {i} has shape {c.shape}, expected {want}")
            if not (np.all(c > 0) and np.allclose(c.sum(axis=1), 1.0, atol=1e-9)):
                raise ValueError(f"conditional of column {i} must have positive rows summing to 1")
            self._cond.append(c)
        self._omega = int(omega)
        self._source = str(source)

    def conditional_rows(self, i: int, configs: np.ndarray) -> np.ndarray:
        return self._cond[i][configs]

    def conditional(self, i: int) -> np.ndarray:
        """``P(X_i | Π_i)`` as ``[configuration, value]`` rows."""
        return self._cond[i].copy()

    def with_omega(self, omega: int) -> NetworkGenerator:
        """The same network resampling ``omega`` attributes (post-processing)."""
        return NetworkGenerator(structure=self._structure, shape=self._shape, conditionals=self._cond,
                                omega=omega, source=self._source)

    def describe(self) -> dict[str, Any]:
        return {"model": "seed-resampling network", "source": self._source, "omega": self._omega,
                "structure": self._structure.to_dict(),
                "copied": list(self.copied_columns()), "resampled": list(self.resampled_columns())}


def _weighted_entropy(keys: np.ndarray, card: int, x: np.ndarray, w: np.ndarray) -> tuple[float, int]:
    """``H(X | K)`` in nats of a weighted sample and the number of configurations of ``K`` used."""
    joint = np.bincount(keys * card + x, weights=w)
    joint = joint[joint > 0]
    configs = np.bincount(keys, weights=w)
    configs = configs[configs > 0]
    return float(np.sum(configs * np.log(configs)) - np.sum(joint * np.log(joint))) / float(w.sum()), configs.size


def choose_parents(pool: np.ndarray, weights: np.ndarray, *, shape: Sequence[int], column: int,
                   candidates: Sequence[int], max_parents: int, max_configs: int,
                   max_cells: int = GENERATOR_MAX_CELLS) -> tuple[int, ...]:
    """Greedy parents of ``column`` among ``candidates`` for a weighted sample (post-processing).

    Adds, while it pays, the candidate with the largest drop of ``H(X | Π)`` minus a BIC penalty
    ``(new free parameters)·ln(N)/(2N)`` (``N`` the sample's effective size), keeping the number
    of parent configurations ≤ ``max_configs`` and the table (configurations × cells) ≤
    ``max_cells`` (declared sizes). Reads only ``pool`` (records sampled from a DP model) and its
    weights.
    """
    w = np.asarray(weights, dtype=np.float64)
    n_eff = float(w.sum() ** 2 / max(float(np.sum(w * w)), 1e-300))
    pen = math.log(max(n_eff, 2.0)) / (2.0 * max(n_eff, 2.0))
    card = int(shape[column])
    x = pool[:, column].astype(np.int64)
    chosen: list[int] = []
    keys = np.zeros(pool.shape[0], dtype=np.int64)
    configs = 1
    h, _ = _weighted_entropy(keys, card, x, w)
    while len(chosen) < max_parents:
        best = None
        for j in candidates:
            if j in chosen or configs * int(shape[j]) > max_configs or \
                    configs * int(shape[j]) * card > max_cells:
                continue
            k2 = keys * int(shape[j]) + pool[:, j].astype(np.int64)
            h2, used = _weighted_entropy(k2, card, x, w)
            gain = (h - h2) - pen * (card - 1) * (configs * int(shape[j]) - configs)
            if gain > 1e-12 and (best is None or gain > best[0]):
                best = (gain, j, h2, k2)
        if best is None:
            break
        _, j, h, keys = best
        chosen.append(j)
        configs *= int(shape[j])
    return tuple(chosen)


def fit_network_generator(pool: np.ndarray, weights: np.ndarray | None, *, shape: Sequence[int], omega: int,
                          order: Sequence[int], max_parents: int = 3, max_configs: int = 2000,
                          prior_rows: float = 1.0, source: str = "weighted sample of a DP model") -> NetworkGenerator:
    """A :class:`NetworkGenerator` fitted to a weighted sample drawn from a released DP model.

    ``order`` is the resampling order (its first ``m − ω`` columns are copied from seeds, the
    rest resampled in that order); each column's parents are chosen among the columns before it
    (:func:`choose_parents`), and ``P(X | π) = (W(x, π) + a·P(x)) / (W(π) + a)`` with ``a =
    prior_rows`` (weights scaled to mean 1, so ``a`` counts sample rows): every row positive,
    configurations the sample never reaches fall back on the marginal. Post-processing of the
    model: no budget, no access to private records.
    """
    pool = np.asarray(pool, dtype=np.int64)
    m = len(shape)
    order = tuple(int(c) for c in order)
    if sorted(order) != list(range(m)):
        raise ValueError(f"order ({order!r}) must list each of the {m} columns once")
    w = np.ones(pool.shape[0]) if weights is None else np.asarray(weights, dtype=np.float64)
    if pool.shape[0] == 0 or not w.sum() > 0:
        raise ValueError("the sample must have at least one row of positive weight")
    w = w * (w.size / w.sum())
    parents: list[tuple[int, ...]] = [()] * m
    conds: list[np.ndarray] = [np.zeros(0)] * m
    for r, i in enumerate(order):
        ps = choose_parents(pool, w, shape=shape, column=i, candidates=order[:r], max_parents=max_parents,
                            max_configs=max_configs) if r else ()
        ps = tuple(sorted(ps))
        parents[i] = ps
        card = int(shape[i])
        n_cfg = math.prod(int(shape[p]) for p in ps)
        cfg = (np.ravel_multi_index(tuple(pool[:, p] for p in ps), tuple(int(shape[p]) for p in ps))
               if ps else np.zeros(pool.shape[0], dtype=np.int64))
        joint = np.bincount(cfg * card + pool[:, i], weights=w, minlength=n_cfg * card).reshape(n_cfg, card)
        marg = joint.sum(axis=0) + 1e-9
        marg = marg / marg.sum()
        cond = joint + prior_rows * marg[None, :]
        conds[i] = cond / cond.sum(axis=1, keepdims=True)
    structure = PlausibleStructure(parents=tuple(parents), order=order)
    return NetworkGenerator(structure=structure, shape=shape, conditionals=conds, omega=omega, source=source)
