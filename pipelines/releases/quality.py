"""Quality metrics for synthetic data (Beam-free, evaluation only: no privacy guarantee).

These functions compare a real table with a synthetic one **over the declared domains of a
schema**: both sides are encoded with the schema (numeric columns land in their declared bins),
marginal tables are computed over every declared cell, and the distance is the total variation
distance ``TVD(p, q) = ½·Σ|p − q|`` of the normalized tables (0 = identical, 1 = disjoint).

* :func:`encode_frame` — a pandas DataFrame of raw/decoded values → ``(n, columns)`` code matrix
  (rows with values outside the declared domain are dropped and counted).
* :func:`marginal_table` / :func:`tvd` — one normalized table / one distance.
* :func:`marginal_tvds` — TVD for all 1-way, all 2-way and ``n_three_way`` seeded random 3-way
  marginals (:func:`random_marginals` selects them from a :class:`RandomSource` seed, so the same
  seed evaluates the same marginals for every method compared).
* :func:`ml_efficacy` — train on synthetic / test on real: gradient boosting accuracy and AUC for
  a binary target (scikit-learn is imported lazily; it is a test/benchmark dependency only).

Evaluation reads the real data in the clear: use it in benchmarks and tests, never in a release.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from beamsynth.schemas.schema import Schema
from beamsynth.transforms.measure import count_marginals
from beamsynth.transforms.noise import RandomSource

__all__ = [
    "QualityReport",
    "as_codes",
    "encode_frame",
    "marginal_table",
    "marginal_tvds",
    "ml_efficacy",
    "quality_report",
    "random_marginals",
    "tvd",
]


def encode_frame(schema: Schema, frame: pd.DataFrame) -> tuple[np.ndarray, int]:
    """Encode a DataFrame's declared columns into cell codes.

    Values are read as strings (numbers and the schema's null tokens included), so a frame read
    with ``dtype=str, keep_default_na=False`` and one produced by the synthesizer encode alike.
    Returns ``(codes, dropped)`` where ``codes`` is ``(rows kept, columns)`` int64 and ``dropped``
    counts rows with a value outside the declared domain (or a null in a non-nullable column).
    """
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"frame must be a pandas DataFrame, got {type(frame).__name__}")
    missing = [n for n in schema.names if n not in frame.columns]
    if missing:
        raise ValueError(f"frame lacks declared column(s) {missing}; it has {list(frame.columns)}")
    n = len(frame)
    columns = {}
    for c in schema.columns:
        s = frame[c.name]
        # None/NaN stay null; everything else as the text a CSV would hold
        values = s.astype(object).where(s.notna(), None).map(lambda v: v if v is None else str(v))
        columns[c.name] = values.reset_index(drop=True)
    batch, bad = schema.encode_columns(columns, n)
    return batch.codes.astype(np.int64, copy=False), len(bad)


def as_codes(schema: Schema, data: pd.DataFrame | np.ndarray) -> np.ndarray:
    """A code matrix from either a code matrix (checked against the schema) or a DataFrame."""
    if isinstance(data, pd.DataFrame):
        return encode_frame(schema, data)[0]
    codes = np.asarray(data)
    shape = schema.shape
    if codes.ndim != 2 or codes.shape[1] != len(shape):
        raise ValueError(f"code matrix must have shape (rows, {len(shape)}), got {codes.shape}")
    if codes.size and (codes.min() < 0 or np.any(codes.max(axis=0) >= np.asarray(shape))):
        raise ValueError(f"codes outside the declared cells {shape}")
    return codes.astype(np.int64, copy=False)


def marginal_table(codes: np.ndarray, shape: Sequence[int], cols: Sequence[int]) -> np.ndarray:
    """Normalized marginal over columns ``cols`` (flat, every declared cell; uniform if empty)."""
    table = count_marginals(np.asarray(codes), [tuple(cols)], shape)[0].astype(np.float64)
    total = table.sum()
    if total <= 0:
        return np.full(table.size, 1.0 / table.size)
    return table / total


def tvd(p: np.ndarray, q: np.ndarray) -> float:
    """Total variation distance ½·‖p − q‖₁ of two distributions (normalized here if needed)."""
    p = np.asarray(p, dtype=np.float64).ravel()
    q = np.asarray(q, dtype=np.float64).ravel()
    if p.shape != q.shape:
        raise ValueError(f"tables differ in size: {p.size} vs {q.size}")
    ps, qs = p.sum(), q.sum()
    if ps <= 0 or qs <= 0:
        raise ValueError("both tables need a positive total")
    return 0.5 * float(np.abs(p / ps - q / qs).sum())


def random_marginals(n_columns: int, way: int, count: int, *, seed: int = 0) -> list[tuple[int, ...]]:
    """``count`` distinct ``way``-column subsets chosen at random from ``seed`` (all if fewer exist).

    Selection uses ``RandomSource(seed).child("quality", way)``, so it depends only on the seed
    and the number of columns: every method in a comparison is scored on the same marginals.
    """
    if way < 1 or way > n_columns:
        raise ValueError(f"way ({way}) must be in [1, {n_columns}]")
    if count < 0:
        raise ValueError(f"count ({count}) must be >= 0")
    total = math.comb(n_columns, way)
    if count >= total:
        return list(itertools.combinations(range(n_columns), way))
    gen = RandomSource(seed=seed).child("quality", way).numpy_generator()
    chosen: set[tuple[int, ...]] = set()
    while len(chosen) < count:
        chosen.add(tuple(sorted(int(x) for x in gen.choice(n_columns, size=way, replace=False))))
    return sorted(chosen)


def marginal_tvds(
    real: np.ndarray, synth: np.ndarray, shape: Sequence[int], specs: Sequence[Sequence[int]]
) -> list[float]:
    """TVD of each marginal in ``specs`` between two code matrices over declared cells."""
    real_t = count_marginals(np.asarray(real), [tuple(s) for s in specs], shape)
    synth_t = count_marginals(np.asarray(synth), [tuple(s) for s in specs], shape)
    out = []
    for a, b in zip(real_t, synth_t):
        a = a.astype(np.float64)
        b = b.astype(np.float64)
        if a.sum() <= 0 or b.sum() <= 0:
            out.append(1.0 if a.sum() != b.sum() else 0.0)
        else:
            out.append(tvd(a, b))
    return out


@dataclass
class QualityReport:
    """Average TVD per marginal order, and the per-marginal values behind them."""

    tvd1: float
    tvd2: float
    tvd3: float
    per_marginal: dict[tuple[int, ...], float] = field(default_factory=dict)
    rows_real: int = 0
    rows_synthetic: int = 0
    dropped_synthetic: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Summary without the per-marginal detail."""
        return {
            "tvd1": self.tvd1,
            "tvd2": self.tvd2,
            "tvd3": self.tvd3,
            "rows_real": self.rows_real,
            "rows_synthetic": self.rows_synthetic,
            "dropped_synthetic": self.dropped_synthetic,
        }


def quality_report(
    schema: Schema,
    real: pd.DataFrame | np.ndarray,
    synthetic: pd.DataFrame | np.ndarray,
    *,
    n_three_way: int = 100,
    seed: int = 0,
) -> QualityReport:
    """Average TVD over all 1-way, all 2-way and ``n_three_way`` random 3-way marginals.

    ``real``/``synthetic`` are DataFrames of values (encoded with ``schema``) or code matrices.
    """
    if not isinstance(schema, Schema):
        raise TypeError(f"schema must be a Schema, got {type(schema).__name__}")
    if not isinstance(n_three_way, int) or n_three_way < 0:
        raise ValueError(f"n_three_way ({n_three_way!r}) must be an int >= 0")
    dropped = 0
    if isinstance(synthetic, pd.DataFrame):
        synth_codes, dropped = encode_frame(schema, synthetic)
    else:
        synth_codes = as_codes(schema, synthetic)
    real_codes = as_codes(schema, real)
    shape = schema.shape
    d = len(shape)
    one = [(j,) for j in range(d)]
    two = list(itertools.combinations(range(d), 2))
    three = random_marginals(d, 3, n_three_way, seed=seed) if d >= 3 and n_three_way else []
    specs = one + two + three
    values = marginal_tvds(real_codes, synth_codes, shape, specs)
    per = dict(zip(specs, values))

    def mean(group: list[tuple[int, ...]]) -> float:
        return float(np.mean([per[s] for s in group])) if group else float("nan")

    return QualityReport(
        tvd1=mean(one), tvd2=mean(two), tvd3=mean(three), per_marginal=per,
        rows_real=int(real_codes.shape[0]), rows_synthetic=int(synth_codes.shape[0]),
        dropped_synthetic=int(dropped),
    )


def ml_efficacy(
    schema: Schema,
    train: pd.DataFrame | np.ndarray,
    test: pd.DataFrame | np.ndarray,
    *,
    target: str,
    positive: str | None = None,
    seed: int = 0,
) -> dict[str, float]:
    """Train on ``train`` (e.g. synthetic), test on ``test`` (real): accuracy and ROC AUC.

    Features are the schema's cell codes of every other column (numeric columns as their declared
    bin index, an ordinal feature; categorical columns of at most 255 cells declared categorical
    to the model), the classifier scikit-learn's
    ``HistGradientBoostingClassifier`` (default settings, ``random_state=seed``). ``target`` must
    be a binary column (2 cells, or 3 with null; null rows are dropped); ``positive`` names the
    positive class value (default: the target's second declared value). A training set with a
    single class predicts that class (AUC 0.5).
    """
    from sklearn.ensemble import HistGradientBoostingClassifier  # lazy: benchmark/test dependency
    from sklearn.metrics import accuracy_score, roc_auc_score

    col = schema.column(target)
    t = schema.index(target)
    if col.domain.size != 2:
        raise ValueError(f"target {target!r} must have 2 declared values, has {col.domain.size}")
    pos = 1 if positive is None else col.domain.encode(positive)
    if pos not in (0, 1):
        raise ValueError(f"positive ({positive!r}) is not a declared value of {target!r}")
    tr = as_codes(schema, train)
    te = as_codes(schema, test)
    tr = tr[tr[:, t] < 2]
    te = te[te[:, t] < 2]
    if te.shape[0] == 0:
        raise ValueError("the test set has no rows with a non-null target")
    feats = [j for j in range(tr.shape[1]) if j != t]
    y_tr = (tr[:, t] == pos).astype(int)
    y_te = (te[:, t] == pos).astype(int)
    if tr.shape[0] == 0 or np.unique(y_tr).size < 2:
        const = int(y_tr[0]) if tr.shape[0] else 0
        return {"accuracy": float(np.mean(y_te == const)), "auc": 0.5}
    cat = [schema.columns[j].type == "categorical" and schema.columns[j].cells <= 255 for j in feats]
    clf = HistGradientBoostingClassifier(random_state=seed, categorical_features=cat or None)
    clf.fit(tr[:, feats], y_tr)
    proba = clf.predict_proba(te[:, feats])[:, 1]
    acc = accuracy_score(y_te, (proba >= 0.5).astype(int))
    auc = roc_auc_score(y_te, proba) if np.unique(y_te).size == 2 else float("nan")
    return {"accuracy": float(acc), "auc": float(auc)}
