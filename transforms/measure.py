"""One-pass measurement of many marginal tables over columnar batches, and their noisy release.

The only place where counts of private records are computed for marginal-based mechanisms.
:class:`MarginalCountsCombineFn` adds an :class:`~beamsynth.schemas.schema.EncodedBatch`
(thousands of rows of cell indices) into dense count arrays, one per requested marginal, and
merges accumulators by adding arrays, so any runner may shard the input. :class:`DPMarginals`
wraps it and adds discrete Laplace noise; its output is a tuple of :class:`NoisyMarginal`, the
typed boundary after which everything (model fitting, consistency, sampling, reports) is
post-processing of DP output.

Privacy (add/remove one privacy unit, each unit contributing at most ``k`` records after
:class:`~beamsynth.transforms.units.BoundContributions`): one marginal table has L1 sensitivity
``k``. Each table ``i`` gets discrete Laplace noise of scale ``k / ε_i`` on **every** cell (empty
cells included), which is ``ε_i``-DP; the set of tables is ``Σ ε_i``-DP by sequential composition.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.transforms.window import GlobalWindow

from beamsynth.schemas.schema import EncodedBatch
from beamsynth.transforms.budget import ApproxDP, PureDP
from beamsynth.transforms.conventions import display_items, element_types
from beamsynth.transforms.noise import (
    RandomSource,
    discrete_gaussian,
    discrete_gaussian_variance,
    discrete_laplace,
    discrete_laplace_scale,
    run_seed,
)
from beamsynth.transforms.windows import CombineDeclaredWindows, check_release_windowing

__all__ = [
    "DPMarginals",
    "MarginalCountsCombineFn",
    "NoisyMarginal",
    "combine_globally",
    "count_marginals",
    "noisy_marginals",
    "gaussian_marginals",
    "window_labels",
]

_SPARSE_FACTOR = 4  # use unique+scatter instead of bincount when the table is this many × rows


@dataclass(frozen=True)
class NoisyMarginal:
    """A released (DP) marginal table: everything downstream consumes only these.

    Attributes:
      columns: column positions in the schema, in table axis order.
      names: column names.
      shape: cells per axis.
      values: noisy integer counts, shape ``shape`` (may be negative before post-processing).
      scale: discrete Laplace scale b = sensitivity / ε used on every cell (``noise`` "discrete
        Gaussian": its σ, ``Δ₂²/(2σ²)``-zCDP, the ρ in ``meta["rho"]``).
      budget: what this table cost.
      sensitivity: L1 sensitivity of the table (= max contributions per unit).
      noise: "discrete Laplace" (default) or "discrete Gaussian".
    """

    columns: tuple[int, ...]
    names: tuple[str, ...]
    shape: tuple[int, ...]
    values: np.ndarray
    scale: float
    budget: ApproxDP
    sensitivity: float = 1.0
    meta: dict[str, Any] = field(default_factory=dict)
    noise: str = "discrete Laplace"

    @property
    def variance(self) -> float:
        """Noise variance per cell: 2q/(1-q)^2 with q = exp(-1/b) (discrete Gaussian: its exact
        variance, ≤ σ²)."""
        if self.noise == "discrete Gaussian":
            return discrete_gaussian_variance(self.scale)
        q = math.exp(-1.0 / self.scale)
        return 2.0 * q / (1.0 - q) ** 2

    def to_dict(self) -> dict[str, Any]:
        """JSON form for release files and reports (noisy values only)."""
        return {
            "columns": list(self.names),
            "shape": list(self.shape),
            "noise": self.noise,
            "scale": self.scale,
            "sensitivity": self.sensitivity,
            **self.budget.to_dict(),
            "values": self.values.ravel().tolist(),
        }


def count_marginals(
    codes: np.ndarray, specs: Sequence[Sequence[int]], shape: Sequence[int]
) -> list[np.ndarray]:
    """Exact dense counts of each marginal ``specs[i]`` (column positions) over a code matrix."""
    out = []
    n = codes.shape[0]
    for cols in specs:
        dims = tuple(int(shape[c]) for c in cols)
        size = math.prod(dims)
        if n == 0:
            out.append(np.zeros(size, dtype=np.int64))
            continue
        if len(cols) == 1:
            flat = codes[:, cols[0]].astype(np.int64, copy=False)
        else:
            flat = np.ravel_multi_index(tuple(codes[:, c].astype(np.int64) for c in cols), dims)
        if size > _SPARSE_FACTOR * n:
            uniq, cnt = np.unique(flat, return_counts=True)
            table = np.zeros(size, dtype=np.int64)
            table[uniq] = cnt
        else:
            table = np.bincount(flat, minlength=size).astype(np.int64, copy=False)
        out.append(table)
    return out


class MarginalCountsCombineFn(beam.CombineFn):
    """Sums dense count tables of several marginals over :class:`EncodedBatch` inputs.

    Accumulator: ``None`` (nothing seen) or a list of flat int64 arrays, one per marginal.
    Output: a tuple of arrays reshaped to each marginal's shape (zeros on empty input).
    """

    def __init__(self, specs: Sequence[Sequence[int]], shape: Sequence[int]) -> None:
        if not specs:
            raise ValueError("at least one marginal must be requested")
        for s in specs:
            if not s or any(not (0 <= c < len(shape)) for c in s) or len(set(s)) != len(s):
                raise ValueError(f"marginal {tuple(s)} must name distinct columns in 0..{len(shape) - 1}")
        self._specs = [tuple(int(c) for c in s) for s in specs]
        self._shape = tuple(int(x) for x in shape)

    def create_accumulator(self) -> list[np.ndarray] | None:
        return None

    def add_input(self, acc: list[np.ndarray] | None, batch: EncodedBatch) -> list[np.ndarray]:
        tables = count_marginals(batch.codes, self._specs, self._shape)
        if acc is None:
            return tables
        for a, t in zip(acc, tables):
            a += t
        return acc

    def merge_accumulators(self, accumulators: Any) -> list[np.ndarray] | None:
        merged: list[np.ndarray] | None = None
        for acc in accumulators:
            if acc is None:
                continue
            if merged is None:
                merged = [a.copy() for a in acc]
            else:
                for m, a in zip(merged, acc):
                    m += a
        return merged

    def extract_output(self, acc: list[np.ndarray] | None) -> tuple[np.ndarray, ...]:
        out = []
        for i, cols in enumerate(self._specs):
            dims = tuple(self._shape[c] for c in cols)
            flat = np.zeros(math.prod(dims), dtype=np.int64) if acc is None else acc[i]
            out.append(flat.reshape(dims))
        return tuple(out)


def noisy_marginals(
    counts: Sequence[np.ndarray],
    *,
    specs: Sequence[Sequence[int]],
    names: Sequence[str],
    budgets: Sequence[ApproxDP],
    sensitivity: float,
    rs: RandomSource,
) -> tuple[NoisyMarginal, ...]:
    """Discrete Laplace noise of scale ``sensitivity/ε_i`` on every cell of table ``i``."""
    out = []
    for i, (table, cols, budget) in enumerate(zip(counts, specs, budgets)):
        scale = discrete_laplace_scale(sensitivity=sensitivity, epsilon=budget.epsilon)
        noisy = table.astype(np.int64) + discrete_laplace(rs.child("marginal", i), scale, table.shape)
        out.append(
            NoisyMarginal(
                columns=tuple(cols),
                names=tuple(names[c] for c in cols),
                shape=tuple(table.shape),
                values=noisy,
                scale=scale,
                budget=budget,
                sensitivity=float(sensitivity),
            )
        )
    return tuple(out)


def gaussian_marginals(
    counts: Sequence[np.ndarray],
    *,
    specs: Sequence[Sequence[int]],
    names: Sequence[str],
    sigmas: Sequence[float],
    rhos: Sequence[float],
    budgets: Sequence[ApproxDP],
    sensitivity: float,
    rs: RandomSource,
) -> tuple[NoisyMarginal, ...]:
    """Discrete Gaussian noise of parameter ``sigmas[i]`` on every cell of table ``i``: one
    table's L2 sensitivity is ``sensitivity`` (a unit's ≤ m records change cells by m in all,
    L2 ≤ L1 = m), so table ``i`` is ``m²/(2σ_i²)`` = ``rhos[i]``-zCDP (the caller checks the
    pair); ``budgets[i]`` is that table's own (ε, δ) for reports."""
    out = []
    for i, (table, cols, sigma, rho, budget) in enumerate(zip(counts, specs, sigmas, rhos, budgets)):
        noisy = table.astype(np.int64) + discrete_gaussian(rs.child("marginal", i), float(sigma),
                                                           table.shape)
        out.append(NoisyMarginal(
            columns=tuple(cols), names=tuple(names[c] for c in cols), shape=tuple(table.shape),
            values=noisy, scale=float(sigma), budget=budget, sensitivity=float(sensitivity),
            meta={"rho": float(rho)}, noise="discrete Gaussian"))
    return tuple(out)


def window_labels(window: Any) -> tuple[Any, ...]:
    """Stable identity of a window for seeded randomness (start/end for interval windows)."""
    if window is None or isinstance(window, GlobalWindow):
        return ("global",)
    start = getattr(window, "start", None)
    end = getattr(window, "end", None)
    if start is None or end is None:
        return ("window", repr(window))
    return ("window", int(start.micros), int(end.micros))


class _NoiseMarginalsFn(beam.DoFn):
    """Adds noise to exact tables; randomness from (seed, step, window), never worker order."""

    def __init__(self, *, specs, names, budgets, sensitivity, seed, step):
        self._specs, self._names, self._budgets = specs, names, budgets
        self._sensitivity, self._seed, self._step = sensitivity, seed, step

    def process(self, tables, window=beam.DoFn.WindowParam):
        rs = RandomSource(seed=self._seed).child(self._step, *window_labels(window))
        yield noisy_marginals(
            tables,
            specs=self._specs,
            names=self._names,
            budgets=self._budgets,
            sensitivity=self._sensitivity,
            rs=rs,
        )


def combine_globally(pcoll: beam.PCollection, fn: beam.CombineFn, label: str) -> beam.PCollection:
    """``CombineGlobally`` for a release: exactly one output per release window, data or not.

    Global window: one output, on empty input too (DP must release on empty data). Declared
    windows (:class:`~beamsynth.transforms.windows.DeclaredWindows`): one output per declared
    window (heartbeats; records stamped outside dropped and counted). Any other windowing, or a
    trigger that can fire twice, raises ``ValueError`` when the pipeline is built: a window that
    exists only because a record arrived would make the existence of a release reveal it.
    """
    declared = check_release_windowing(pcoll, label)
    if declared is None:
        return pcoll | label >> beam.CombineGlobally(fn)
    return pcoll | label >> CombineDeclaredWindows(fn, declared)


@element_types(input=EncodedBatch, output=tuple[NoisyMarginal, ...])
class DPMarginals(beam.PTransform):
    """ε-DP marginal tables of :class:`EncodedBatch` records, measured in one pass.

    Args:
      specs: marginals as tuples of column positions.
      shape: cells per column (``schema.shape``).
      names: column names (``schema.names``).
      budgets: one budget per marginal (pure ε; δ is ignored and must be 0).
      max_contributions: records per privacy unit after bounding (the L1 sensitivity per table).
      seed: ``None`` for secure noise; an int only for tests and demos.
      stream: name of the seeded random stream (distinct measurements in one pipeline must use
        distinct names); the noise of window ``w`` comes from ``(seed, stream, w)``.

    Input: ``PCollection[EncodedBatch]`` (already contribution-bounded).
    Output: one ``tuple[NoisyMarginal, ...]`` (``specs`` order) in the global window, or one per
    declared window (:class:`~beamsynth.transforms.windows.DeclaredWindows`), records or not;
    other windowing is refused when the pipeline is built (:func:`combine_globally`).

    Privacy: see the module docstring (discrete Laplace, ``Σ ε_i``-DP, add/remove neighbours).
    """

    def __init__(
        self,
        *,
        specs: Sequence[Sequence[int]],
        shape: Sequence[int],
        names: Sequence[str],
        budgets: Sequence[ApproxDP],
        max_contributions: int = 1,
        seed: int | None = None,
        stream: str = "marginals",
        label: str | None = None,
    ) -> None:
        super().__init__(label)
        if len(budgets) != len(specs):
            raise ValueError(f"need one budget per marginal: {len(specs)} specs, {len(budgets)} budgets")
        for b in budgets:
            if not isinstance(b, ApproxDP) or b.delta != 0:
                raise ValueError(f"marginal budgets must be pure ε (PureDP), got {b!r}")
        if not isinstance(max_contributions, int) or max_contributions < 1:
            raise ValueError(f"max_contributions ({max_contributions!r}) must be an int >= 1")
        self._fn = MarginalCountsCombineFn(specs, shape)
        self._specs = [tuple(s) for s in specs]
        self._names = list(names)
        self._budgets = [PureDP(epsilon=b.epsilon) for b in budgets]
        self._k = max_contributions
        self._seed = run_seed(seed)  # None → this transform's run secret, drawn at build time
        self._stream = stream

    def display_data(self) -> dict[str, Any]:
        """Mechanism, total ε, δ, noise scales and declared cells (never data values)."""
        shape = self._fn._shape
        cells = [math.prod(shape[c] for c in spec) for spec in self._specs]
        scales = [discrete_laplace_scale(sensitivity=self._k, epsilon=b.epsilon) for b in self._budgets]
        return display_items(
            mechanism="marginal tables (discrete Laplace)", epsilon=sum(b.epsilon for b in self._budgets),
            delta=0.0, marginals=len(self._specs), sensitivity=self._k,
            noise_scale=max(scales) if len(set(scales)) == 1 else f"{min(scales):g} to {max(scales):g}",
            declared_cells=sum(cells))

    def expand(self, batches):
        # batches: EncodedBatch (columnar rows of cell codes)
        tables = combine_globally(batches, self._fn, "CountMarginals")
        # tables: tuple[np.ndarray, ...] exact counts, one per window
        return tables | "AddNoise" >> beam.ParDo(
            _NoiseMarginalsFn(
                specs=self._specs,
                names=self._names,
                budgets=self._budgets,
                sensitivity=float(self._k),
                seed=self._seed,
                step=self._stream,
            )
        )
        # -> tuple[NoisyMarginal, ...]
