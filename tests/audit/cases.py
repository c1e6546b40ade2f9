"""The audit registry: every mechanism (and every deliberately broken variant) as an AuditCase.

Adding a mechanism is a few lines: write ``run(dataset, rs) -> release`` calling its Beam-free
core, reuse or write hard pairs, pick a statistic, and call :func:`register`. Broken variants go
through :func:`register_broken`; the same audit must catch them (tests/audit/test_privacy_audit.py).

Convention: ``pairs[0]`` is the tightest pair of a case; the fast audit runs it with ``runs``
executions per side and the other pairs with a tenth of that.

Datasets are :class:`Records` (raw column values as read from a file, plus privacy ids); the
mechanisms encode them with the declared :data:`SCHEMA` exactly as the pipeline does.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from apache_beam.transforms.window import GlobalWindow

from beamsynth.schemas.schema import EncodedBatch, Schema, load_schema
from beamsynth.transforms.audit import AuditCase, NeighbourPair
from beamsynth.transforms.budget import ApproxDP, PureDP
from beamsynth.transforms.measure import MarginalCountsCombineFn, NoisyMarginal, noisy_marginals
from beamsynth.transforms.noise import RandomSource, discrete_laplace, discrete_laplace_scale
from beamsynth.transforms.synthesis import IndependentModel, NoisyCount, _NoiseCountFn
from beamsynth.transforms.units import bound_rows

__all__ = ["AUDITS", "BROKEN", "SCHEMA", "Records", "register", "register_broken"]

EPSILON = 1.0
K = 2  # max contributions per privacy unit in the bounded cases
HEAVY = 25  # records of the heavy privacy unit

# Declared, data-independent: color has a catch-all for out-of-domain values, age is binned.
SCHEMA: Schema = load_schema({
    "name": "audit",
    "privacy_id": "pid",
    "columns": [
        {"name": "color", "type": "categorical", "on_out_of_domain": "other",
         "domain": {"kind": "categorical", "values": ["red", "green", "blue"], "other": "OTHER"}},
        {"name": "age", "type": "integer",
         "domain": {"kind": "integer", "low": 0, "high": 99, "edges": [0, 20, 40, 60, 80, 100]}},
        {"name": "city", "type": "categorical",
         "domain": {"kind": "categorical", "values": ["x", "y"]}},
    ],
})
SPECS: tuple[tuple[int, ...], ...] = ((0,), (1,), (0, 1))


@dataclass(eq=False)
class Records:
    """Raw rows (column → values) and their privacy ids; encodes once per schema (deterministic)."""

    columns: dict[str, list[Any]]
    _cache: dict[str, EncodedBatch] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def plus(self, rows: list[dict[str, Any]]) -> Records:
        """A copy with ``rows`` appended (the neighbour with one more unit)."""
        cols = {k: list(v) + [r[k] for r in rows] for k, v in self.columns.items()}
        return Records(cols)

    def encoded(self, schema: Schema = SCHEMA) -> EncodedBatch:
        """Encoded good rows (rejected rows dropped, as the pipeline's dead letter does)."""
        if schema.name not in self._cache:
            self._cache[schema.name] = schema.encode_columns(self.columns, len(self))[0]
        return self._cache[schema.name]


def _base_records() -> Records:
    rows = [("red", 30, "x"), ("green", 45, "y"), ("blue", 12, "x"), ("red", 71, "y"),
            ("green", 33, "x"), ("red", 90, "x")]
    return Records({"color": [r[0] for r in rows], "age": [r[1] for r in rows],
                    "city": [r[2] for r in rows], "pid": [f"p{i}" for i in range(len(rows))]})


def _row(color: Any, age: Any, city: Any, pid: str) -> dict[str, Any]:
    return {"color": color, "age": age, "city": city, "pid": pid}


BASE = _base_records()
# Hard pairs: the added unit lands in cells of every measured table; extreme and catch-all values.
PAIRS: tuple[NeighbourPair, ...] = (
    NeighbourPair("add one unit (worst case: existing cell)", BASE, BASE.plus([_row("red", 30, "x", "new")]),
                  {"row": ("red", 30)}),
    NeighbourPair("add one unit (edge values, empty cell)", BASE, BASE.plus([_row("blue", 99, "y", "new")]),
                  {"row": ("blue", 99)}),
    NeighbourPair("add one unit (out-of-domain → catch-all)", BASE,
                  BASE.plus([_row("purple\x00☃", 0, "x", "new")]), {"row": ("OTHER", 0)}),
    NeighbourPair("add one unit to an empty dataset", Records(
        {"color": [], "age": [], "city": [], "pid": []}), Records(
        {"color": ["green"], "age": [50], "city": ["y"], "pid": ["only"]}), {"row": ("green", 50)}),
    NeighbourPair("add one unit whose row is rejected (city out of domain)", BASE,
                  BASE.plus([_row("red", 30, "zzz", "new")]), {"row": ("red", 30)}),
)
HEAVY_PAIRS: tuple[NeighbourPair, ...] = (
    NeighbourPair(f"add a heavy unit ({HEAVY} identical records)", BASE,
                  BASE.plus([_row("red", 30, "x", "heavy")] * HEAVY), {"row": ("red", 30)}),
    NeighbourPair(f"add a heavy unit ({HEAVY} records, 3 cells)", BASE,
                  BASE.plus([_row(c, 30, "x", "heavy") for c in ("red", "green", "blue") * (HEAVY // 3)]),
                  {"row": ("red", 30)}),
)

AUDITS: dict[str, AuditCase] = {}
BROKEN: dict[str, AuditCase] = {}


def register(case: AuditCase) -> AuditCase:
    """Add a real mechanism to the audit."""
    AUDITS[case.name] = case
    return case


def register_broken(case: AuditCase) -> AuditCase:
    """Add a deliberately broken variant (the audit must catch it)."""
    if not case.broken:
        raise ValueError(f"broken case {case.name!r} must say what it breaks")
    BROKEN[case.name] = case
    return case


# -- helpers ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=64)
def _cell_codes(row: tuple[Any, Any]) -> tuple[int, int]:
    color = SCHEMA.columns[0].encode([row[0]])[0][0]
    age = SCHEMA.columns[1].encode([row[1]])[0][0]
    return int(color), int(age)


@functools.lru_cache(maxsize=64)
def _row_codes(row: tuple[Any, Any], city: str) -> tuple[int, int, int]:
    """The codes of an added row (colour, age, city): the auditor's knowledge, encoded once (a
    column's ``encode`` took ~5 ms, called per run by the PrivBayes statistics before)."""
    return _cell_codes(row) + (int(SCHEMA.columns[2].encode([city])[0][0]),)


@functools.lru_cache(maxsize=64)
def exact_tables(data: Records, specs=SPECS, k: int | None = K) -> tuple[np.ndarray, ...]:
    """Exact marginal counts through the production CombineFn (after bounding to ``k`` if set)."""
    batch = data.encoded()
    codes = batch.codes
    if k is not None and len(batch):
        # bounding keeps every row of a unit with <= k rows, so the base counts are exact
        keep = bound_rows(codes, batch.pids, k, RandomSource(seed=0))
        codes = codes[keep]
    fn = MarginalCountsCombineFn(specs, SCHEMA.shape)
    return fn.extract_output(fn.add_input(fn.create_accumulator(), EncodedBatch(codes, None)))


def _marginal_stat(release: tuple[NoisyMarginal, ...], pair: NeighbourPair) -> float:
    """min over the tables of (noisy count − exact count on ``smaller``) at the added row's cells."""
    color, age = _cell_codes(pair.context["row"])
    base = exact_tables(pair.smaller)
    cells = ((color,), (age,), (color, age))
    return float(min(int(m.values[c]) - int(b[c]) for m, b, c in zip(release, base, cells)))


def _marginal_stats(values: list[np.ndarray], pair: NeighbourPair) -> np.ndarray:
    """Vectorized :func:`_marginal_stat` over a leading runs axis."""
    color, age = _cell_codes(pair.context["row"])
    base = exact_tables(pair.smaller)
    cells = ((color,), (age,), (color, age))
    per_table = [v[(slice(None), *c)] - int(b[c]) for v, b, c in zip(values, base, cells)]
    return np.min(np.stack(per_table), axis=0).astype(np.float64)


def _bound_is_fixed(batch: EncodedBatch, k: int) -> bool:
    """True when bounding to k keeps the same multiset of rows whatever its randomness:
    every unit with more than k rows has identical rows."""
    order = np.argsort(batch.pids, kind="stable")
    pids, codes = batch.pids[order], batch.codes[order]
    starts = np.r_[0, np.flatnonzero(pids[1:] != pids[:-1]) + 1, len(pids)]
    return all(e - s <= k or bool(np.all(codes[s:e] == codes[s])) for s, e in zip(starts[:-1], starts[1:]))


def _count_tables(codes: np.ndarray, specs) -> tuple[np.ndarray, ...]:
    fn = MarginalCountsCombineFn(specs, SCHEMA.shape)
    return fn.extract_output(fn.add_input(fn.create_accumulator(), EncodedBatch(codes, None)))


def bounded_tables(data: Records, runs: int, rs: RandomSource, *, k: int, bound: bool,
                   specs) -> list[np.ndarray]:
    """Exact tables of ``runs`` executions (leading runs axis), bounding drawn per run unless
    its outcome is fixed (then computed once: same law, much faster)."""
    batch = data.encoded()
    if not bound or not len(batch) or _bound_is_fixed(batch, k):
        codes = batch.codes
        if bound and len(batch):
            codes = codes[bound_rows(codes, batch.pids, k, rs.child("bound"))]
        return [np.broadcast_to(t, (runs, *t.shape)) for t in _count_tables(codes, specs)]
    per_run = [_count_tables(batch.codes[bound_rows(batch.codes, batch.pids, k, rs.child("bound", i))], specs)
               for i in range(runs)]
    return [np.stack([r[j] for r in per_run]) for j in range(len(specs))]


def batch_marginals(data: Records, pair: NeighbourPair, runs: int, rs: RandomSource, *,
                    k: int = K, bound: bool = True, noise_factor: float = 1.0) -> np.ndarray:
    """:func:`run_marginals` vectorized over runs (the same noisy_marginals on stacked tables)."""
    tables = bounded_tables(data, runs, rs, k=k, bound=bound, specs=SPECS)
    budgets = list(PureDP(epsilon=EPSILON).split({str(s): 1.0 for s in SPECS}).values())
    ms = noisy_marginals(tables, specs=SPECS, names=SCHEMA.names, budgets=budgets,
                         sensitivity=k * noise_factor, rs=rs.child("noise"))
    return _marginal_stats([m.values for m in ms], pair)


def _public_marginals(release: tuple[NoisyMarginal, ...]) -> Any:
    return [(m.columns, m.names, m.shape, m.values.shape, m.scale, m.budget, m.sensitivity, m.meta)
            for m in release]


# -- marginals (transforms/measure.py) --------------------------------------------------------------
def run_marginals(data: Records, rs: RandomSource, *, k: int = K, bound: bool = True,
                  noise_factor: float = 1.0) -> tuple[NoisyMarginal, ...]:
    """The marginal mechanism core: bound to k per unit, count (CombineFn), discrete Laplace.

    ``bound=False`` and ``noise_factor=0.5`` are the broken variants.
    """
    batch = data.encoded()
    codes = batch.codes
    if bound and len(batch):
        codes = codes[bound_rows(codes, batch.pids, k, rs.child("bound"))]
    fn = MarginalCountsCombineFn(SPECS, SCHEMA.shape)
    tables = fn.extract_output(fn.add_input(fn.create_accumulator(), EncodedBatch(codes, None)))
    budgets = list(PureDP(epsilon=EPSILON).split({str(s): 1.0 for s in SPECS}).values())
    return noisy_marginals(tables, specs=SPECS, names=SCHEMA.names, budgets=budgets,
                           sensitivity=k * noise_factor, rs=rs.child("noise"))


MARGINAL_THRESHOLDS = tuple(range(-2, 7))
register(AuditCase(
    name="marginals", epsilon=EPSILON, delta=0.0, run=run_marginals, pairs=HEAVY_PAIRS + PAIRS,
    statistic=_marginal_stat, thresholds=MARGINAL_THRESHOLDS, public=_public_marginals,
    batch=batch_marginals, runs=20_000, slow_runs=200_000,
))
register_broken(AuditCase(
    name="marginals: noise halved", epsilon=EPSILON, delta=0.0,
    run=lambda d, rs: run_marginals(d, rs, noise_factor=0.5), pairs=HEAVY_PAIRS[:1],
    statistic=_marginal_stat, thresholds=MARGINAL_THRESHOLDS, public=_public_marginals,
    batch=lambda d, p, n, rs: batch_marginals(d, p, n, rs, noise_factor=0.5), runs=20_000,
    broken="discrete Laplace scale k/(2ε) instead of k/ε",
))
register_broken(AuditCase(
    name="marginals: missing contribution bound", epsilon=EPSILON, delta=0.0,
    run=lambda d, rs: run_marginals(d, rs, bound=False), pairs=HEAVY_PAIRS[:1],
    statistic=_marginal_stat, thresholds=MARGINAL_THRESHOLDS, public=_public_marginals,
    batch=lambda d, p, n, rs: batch_marginals(d, p, n, rs, bound=False), runs=20_000,
    broken="no BoundContributions: a heavy unit moves counts by 25, not k=2",
))


# -- a data-derived domain (broken on purpose: DataSynthesizer's weakness, seed 004) --------------
@dataclass(frozen=True)
class DerivedHistogram:
    """Release of the broken variant: categories read off the data, with noisy counts."""

    categories: tuple[str, ...]
    values: np.ndarray


def run_derived_domain(data: Records, rs: RandomSource) -> DerivedHistogram:
    """Noisy histogram of ``color`` over the categories **seen in the data** (not declared)."""
    cats = tuple(sorted({str(v) for v in data.columns["color"]}))
    counts = np.array([sum(1 for v in data.columns["color"] if str(v) == c) for c in cats], np.int64)
    scale = discrete_laplace_scale(sensitivity=1, epsilon=EPSILON)
    return DerivedHistogram(cats, counts + discrete_laplace(rs, scale, counts.shape))


register_broken(AuditCase(
    name="histogram: data-derived domain", epsilon=EPSILON, delta=0.0, run=run_derived_domain,
    pairs=(PAIRS[2],), statistic=lambda r, _p: float(len(r.categories)), thresholds=(4, 5),
    public=lambda r: r.categories, broken="category list read off the data (active domain)",
))


# -- the DP row count (transforms/synthesis.py DPCount) ---------------------------------------------
def run_count(data: Records, rs: RandomSource, *, k: int = K, bound: bool = True,
              noise_factor: float = 1.0) -> NoisyCount:
    """DPCount's core: bound to k per unit, count rows, then its noise DoFn (seed from ``rs``)."""
    batch = data.encoded()
    n = len(batch)
    if bound and n:
        n = int(bound_rows(batch.codes, batch.pids, k, rs.child("bound")).size)
    seed = int(rs.child("count").words(1)[0] >> np.uint64(2))
    fn = _NoiseCountFn(PureDP(epsilon=EPSILON), k * noise_factor, seed, "count")
    return next(iter(fn.process(n, window=GlobalWindow())))


def _count_stat(release: NoisyCount, pair: NeighbourPair) -> float:
    return float(release.value - len(pair.smaller.encoded()))


def batch_count(data: Records, pair: NeighbourPair, runs: int, rs: RandomSource, *, k: int = K,
                bound: bool = True, noise_factor: float = 1.0) -> np.ndarray:
    """:func:`run_count` vectorized over runs (same bounding, same scale formula and noise)."""
    n = bounded_tables(data, runs, rs, k=k, bound=bound, specs=((2,),))[0].sum(axis=1)
    scale = discrete_laplace_scale(sensitivity=k * noise_factor, epsilon=EPSILON)
    return (n + discrete_laplace(rs.child("count"), scale, runs) - len(pair.smaller.encoded())).astype(float)


COUNT_THRESHOLDS = tuple(range(-2, 7))
register(AuditCase(
    name="dp_count", epsilon=EPSILON, delta=0.0, run=run_count, pairs=HEAVY_PAIRS + (PAIRS[0], PAIRS[3]),
    statistic=_count_stat, thresholds=COUNT_THRESHOLDS, batch=batch_count, runs=20_000,
    slow_runs=400_000, public=lambda r: (r.scale, r.budget),
))
register_broken(AuditCase(
    name="dp_count: noise halved", epsilon=EPSILON, delta=0.0,
    run=lambda d, rs: run_count(d, rs, noise_factor=0.5), pairs=HEAVY_PAIRS[:1],
    statistic=_count_stat, thresholds=COUNT_THRESHOLDS, public=lambda r: (r.scale, r.budget),
    batch=lambda d, p, n, rs: batch_count(d, p, n, rs, noise_factor=0.5), runs=20_000,
    broken="discrete Laplace scale k/(2ε) instead of k/ε",
))
register_broken(AuditCase(
    name="dp_count: missing contribution bound", epsilon=EPSILON, delta=0.0,
    run=lambda d, rs: run_count(d, rs, bound=False), pairs=HEAVY_PAIRS[:1],
    statistic=_count_stat, thresholds=COUNT_THRESHOLDS, public=lambda r: (r.scale, r.budget),
    batch=lambda d, p, n, rs: batch_count(d, p, n, rs, bound=False), runs=20_000,
    broken="no contribution bound: the heavy unit adds 25 rows, the noise assumes k=2",
))


# -- the independent synthesizer (noisy 1-way marginals → IndependentModel → sample) --------------
SYNTH_ROWS = 12


def run_independent(data: Records, rs: RandomSource, *, noise_factor: float = 1.0) -> np.ndarray:
    """The ``independent`` method's core: 1-way noisy marginals, fit, sample SYNTH_ROWS rows."""
    batch = data.encoded()
    codes = batch.codes
    if len(batch):
        codes = codes[bound_rows(codes, batch.pids, K, rs.child("bound"))]
    specs = [(j,) for j in range(len(SCHEMA.columns))]
    fn = MarginalCountsCombineFn(specs, SCHEMA.shape)
    tables = fn.extract_output(fn.add_input(fn.create_accumulator(), EncodedBatch(codes, None)))
    per_col = PureDP(epsilon=EPSILON).split({c.name: 1.0 for c in SCHEMA.columns})
    ms = noisy_marginals(tables, specs=specs, names=SCHEMA.names,
                         budgets=[per_col[c.name] for c in SCHEMA.columns],
                         sensitivity=K * noise_factor, rs=rs.child("noise"))
    return IndependentModel(ms, SCHEMA.shape).sample_codes(SYNTH_ROWS, rs.child("sample"))


def _synth_stat(release: np.ndarray, pair: NeighbourPair) -> float:
    color, _ = _cell_codes(pair.context["row"])
    return float(np.sum(release[:, 0] == color))


register(AuditCase(
    name="independent", epsilon=EPSILON, delta=0.0, run=run_independent,
    pairs=(HEAVY_PAIRS[0],), statistic=_synth_stat, thresholds=tuple(range(2, SYNTH_ROWS + 1, 2)),
    runs=600, slow_runs=6000, public=lambda r: r.shape,
))


# -- CatHist (transforms/cathist.py): declared domain, threshold τ, simulated empty bins ----------
@dataclass(eq=False)
class Cells:
    """One encoded categorical column (cell per record) with privacy ids."""

    cells: np.ndarray
    pids: np.ndarray

    def plus(self, cells: list[int], pid: str) -> Cells:
        """A copy with one more unit holding ``cells``."""
        return Cells(np.r_[self.cells, np.asarray(cells, np.int64)],
                     np.r_[self.pids, np.array([pid] * len(cells), dtype=object)])


def _cathist_setup() -> tuple[Any, Any]:
    from beamsynth.schemas.domains import CategoricalDomain
    from beamsynth.transforms.cathist import plan_cathist

    domain = CategoricalDomain([f"w{i:03d}" for i in range(20)])
    return domain, plan_cathist(epsilon=EPSILON, tolerance=0.05, domain_size=domain.size,
                                max_contributions=K)


def run_cathist(data: Cells, rs: RandomSource, *, active_only: bool = False) -> Any:
    """CatHist's core: bound to k per unit, exact value counts, :func:`release_histogram`.

    ``active_only=True`` is the broken variant of seed 000's Theorem 2.2: noisy counts of the
    values present, thresholded, and no simulated empty bins (the output reveals the data's
    active domain).
    """
    cells = data.cells
    if cells.size:
        cells = cells[bound_rows(cells[:, None], data.pids, K, rs.child("bound"))]
    return _cathist_release(cells, rs, active_only=active_only)


def _cathist_release(cells: np.ndarray, rs: RandomSource, *, active_only: bool) -> Any:
    from beamsynth.transforms.cathist import ReleasedHistogram, count_values, release_histogram

    domain, plan = _cathist_setup()
    present, counts = count_values(cells)
    if active_only:
        noisy = counts + discrete_laplace(rs.child("active"), plan.scale, counts.size)
        keep = noisy >= plan.tau
        return ReleasedHistogram(present[keep], noisy[keep], plan)
    return release_histogram(present, counts, plan=plan, domain=domain, rs=rs.child("release"))


def batch_cathist(data: Cells, pair: NeighbourPair, runs: int, rs: RandomSource, *,
                  active_only: bool = False) -> np.ndarray:
    """:func:`run_cathist` over many runs; bounding done once when its outcome is fixed."""
    if not data.cells.size or not _bound_is_fixed(EncodedBatch(data.cells[:, None], data.pids), K):
        return np.array([_cathist_stat(run_cathist(data, rs.child(i), active_only=active_only), pair)
                         for i in range(runs)])
    cells = data.cells[bound_rows(data.cells[:, None], data.pids, K, rs.child("bound"))]
    return np.array([_cathist_stat(_cathist_release(cells, rs.child(i), active_only=active_only), pair)
                     for i in range(runs)])


def _cathist_stat(release: Any, pair: NeighbourPair) -> float:
    hit = np.flatnonzero(release.cells == pair.context["cell"])
    return float(release.counts[hit[0]]) if hit.size else 0.0


_C0 = Cells(np.array([3, 3, 3, 3, 3, 7, 7, 11], np.int64), np.array([f"p{i}" for i in range(8)], dtype=object))
CATHIST_PAIRS = (
    NeighbourPair("heavy unit on a present value (c=5 → 7 after bounding)", _C0,
                  _C0.plus([3] * HEAVY, "heavy"), {"cell": 3}),
    NeighbourPair("one record of a value absent from the data", _C0, _C0.plus([15], "new"), {"cell": 15}),
    NeighbourPair("heavy unit of an absent value", _C0, _C0.plus([15] * HEAVY, "heavy"), {"cell": 15}),
    NeighbourPair("empty dataset + one record", Cells(np.zeros(0, np.int64), np.zeros(0, dtype=object)),
                  Cells(np.array([0], np.int64), np.array(["only"], dtype=object)), {"cell": 0}),
)
register(AuditCase(
    name="cathist", epsilon=EPSILON, delta=0.0, run=run_cathist, pairs=CATHIST_PAIRS,
    statistic=_cathist_stat, thresholds=tuple(range(1, 13)), runs=1500, slow_runs=30_000,
    public=lambda r: r.plan, batch=batch_cathist,
))
register_broken(AuditCase(
    name="cathist: active domain only", epsilon=EPSILON, delta=0.0,
    run=lambda d, rs: run_cathist(d, rs, active_only=True), pairs=CATHIST_PAIRS[2:3],
    statistic=_cathist_stat, thresholds=tuple(range(1, 13)), runs=1000, public=lambda r: r.plan,
    batch=lambda d, p, n, rs: batch_cathist(d, p, n, rs, active_only=True), broken="no simulated empty bins: a value is released only if present (Theorem 2.2)",
))


# -- SBHG (transforms/sbhg.py): SBA on hashed conditionals, (ε, δ)-DP ------------------------------
SBHG_DELTA = 1e-3
SBHG_PARENTS = ((1,), (0,), (0,))  # fixed hash parents (the EM selection is audited separately: not yet)


@functools.lru_cache(maxsize=1)
def _sbhg_params() -> tuple[float, int]:
    from beamsynth.transforms.budget import ApproxDP
    from beamsynth.transforms.sbhg import DPHashedConditionals

    t = DPHashedConditionals(shape=SCHEMA.shape, selection_budget=None, top_r=0, max_contributions=K,
                             conditional_budget=ApproxDP(epsilon=EPSILON, delta=SBHG_DELTA))
    return t.scale, t.threshold


def _sbhg_release(codes: np.ndarray, rs: RandomSource, *, threshold: int | None = None) -> Any:
    from beamsynth.transforms.budget import ApproxDP
    from beamsynth.transforms.sbhg import ReleasedConditionals, hashed_counts, sba_release

    scale, t = _sbhg_params()
    t = t if threshold is None else threshold
    counts = hashed_counts(codes, SBHG_PARENTS, SCHEMA.shape)
    cells = tuple(sba_release(k, c, scale=scale, threshold=t, rs=rs.child("sba", j))
                  for j, (k, c) in enumerate(counts))
    per_feature = ApproxDP(epsilon=EPSILON / 3, delta=SBHG_DELTA / 3)
    return ReleasedConditionals(SCHEMA.shape, SBHG_PARENTS, cells, scale, t, per_feature)


def run_sbhg(data: EncodedBatch, rs: RandomSource, *, threshold: int | None = None) -> Any:
    """SBHG's measurement core: bound, hashed counts per feature, SBA per feature (ε/p, δ/p).

    ``threshold=1`` is the broken variant: SBA without its stability threshold.
    """
    codes = data.codes
    if len(data):
        codes = codes[bound_rows(codes, data.pids, K, rs.child("bound"))]
    return _sbhg_release(codes, rs, threshold=threshold)


def _sbhg_target(row: tuple[int, int, int]) -> list[int]:
    from beamsynth.transforms.sbhg import hashed_counts

    keys = hashed_counts(np.array([row], np.int64), SBHG_PARENTS, SCHEMA.shape)
    return [int(k[0]) for k, _ in keys]


def _sbhg_stat(release: Any, pair: NeighbourPair) -> float:
    """min over features of (released value − exact count on ``smaller``) at the target cells;
    an unreleased cell counts as −1000."""
    out = []
    for (keys, values), key, base in zip(release.cells, _sbhg_target(pair.context["row"]), pair.context["base"]):
        hit = np.flatnonzero(keys == key)
        out.append(float(values[hit[0]] - base) if hit.size else -1000.0)
    return min(out)


def batch_sbhg(data: EncodedBatch, pair: NeighbourPair, runs: int, rs: RandomSource, *,
               threshold: int | None = None) -> np.ndarray:
    """:func:`run_sbhg` over many runs; bounding done once when its outcome is fixed."""
    if not len(data) or not _bound_is_fixed(data, K):
        return np.array([_sbhg_stat(run_sbhg(data, rs.child(i), threshold=threshold), pair)
                         for i in range(runs)])
    codes = data.codes[bound_rows(data.codes, data.pids, K, rs.child("bound"))]
    return np.array([_sbhg_stat(_sbhg_release(codes, rs.child(i), threshold=threshold), pair)
                     for i in range(runs)])


def _batch_of(rows: list[tuple[int, int, int]], pids: list[str]) -> EncodedBatch:
    return EncodedBatch(np.array(rows, np.int64).reshape(-1, 3), np.array(pids, dtype=object))


_S_ROWS = [(0, 1, 0)] * 120 + [(1, 2, 1)] * 90 + [(2, 3, 0)] * 5
_S0 = _batch_of(_S_ROWS, [f"p{i}" for i in range(len(_S_ROWS))])
SBHG_PAIRS = (
    NeighbourPair("heavy unit on a frequent cell (+2 after bounding)", _S0,
                  _batch_of(_S_ROWS + [(0, 1, 0)] * HEAVY, [f"p{i}" for i in range(len(_S_ROWS))] + ["h"] * HEAVY),
                  {"row": (0, 1, 0), "base": (120, 120, 120)}),
    NeighbourPair("heavy unit on an empty cell", _S0,
                  _batch_of(_S_ROWS + [(3, 4, 1)] * HEAVY, [f"p{i}" for i in range(len(_S_ROWS))] + ["h"] * HEAVY),
                  {"row": (3, 4, 1), "base": (0, 0, 0)}),
)
register(AuditCase(
    name="sbhg (SBA stage)", epsilon=EPSILON, delta=SBHG_DELTA, run=run_sbhg, pairs=SBHG_PAIRS,
    statistic=_sbhg_stat, thresholds=tuple(range(-3, 6)), runs=1500, slow_runs=40_000, batch=batch_sbhg,
    public=lambda r: (r.shape, r.parents, r.scale, r.threshold, r.budget_per_feature),
))
register_broken(AuditCase(
    name="sbhg: no stability threshold", epsilon=EPSILON, delta=SBHG_DELTA,
    run=lambda d, rs: run_sbhg(d, rs, threshold=1), pairs=SBHG_PAIRS[1:],
    statistic=_sbhg_stat, thresholds=tuple(range(-3, 6)), runs=1000,
    batch=lambda d, p, n, rs: batch_sbhg(d, p, n, rs, threshold=1),
    broken="SBA keeps z ≥ 1 instead of z ≥ t(ε, δ): new cells appear with probability ≫ δ",
))


# -- prefix trees (transforms/prefix.py): basic, improved, direct --------------------------------
@functools.lru_cache(maxsize=1)
def _prefix_codec() -> Any:
    from beamsynth.schemas.keys import TextKeyCodec

    return TextKeyCodec(column="q", alphabet="ab", max_length=2)


@functools.lru_cache(maxsize=8)
def _prefix_acct(method: str) -> Any:
    from beamsynth.transforms import prefix as P

    c = _prefix_codec()
    if method == "basic":
        return P.basic_accounting(epsilon=EPSILON, max_depth=c.depth, fanout=c.fanout)
    if method == "improved":
        return P.improved_accounting(epsilon=EPSILON, fanout=c.fanout)
    return P.direct_accounting(epsilon=EPSILON, max_depth=c.depth)


@dataclass(eq=False)
class Keys:
    """Text keys (one per record, k = 1), encoded once with the declared codec."""

    keys: tuple[str, ...]
    _codes: np.ndarray | None = field(default=None, repr=False)

    def codes(self) -> np.ndarray:
        """Symbol codes of the keys (deterministic encoding)."""
        if self._codes is None:
            self._codes = _prefix_codec().encode_strings(list(self.keys))
        return self._codes


def run_prefix(data: Keys, rs: RandomSource, *, method: str, noiseless_leaves: bool = False) -> list[Any]:
    """All levels of one prefix method, level by level as the Beam graph runs them.

    ``noiseless_leaves=True`` is a broken basic variant: the second pass re-measures the leaves
    with (practically) no noise, as if its budget had been forgotten.
    """
    import dataclasses

    from beamsynth.transforms import prefix as P

    codec, acct = _prefix_codec(), _prefix_acct(method)
    if noiseless_leaves:
        acct = dataclasses.replace(acct, final_scale=1e-9)
    codes = data.codes()
    state = P.root_state(codec.symbol_dtype)
    levels = codec.depth
    rels = []
    for d in range(levels):
        if len(state) == 0:
            break
        idx, cnt = P.child_cells(codes, d, state.keys, codec.fanout)
        r = rs.child(d)
        if method == "basic":
            state, rel = P.basic_step(state, idx, cnt, codec, acct=acct, rs=r, last=d == levels - 1)
        elif method == "improved":
            state, rel = P.improved_step(state, idx, cnt, codec, acct=acct, rule="proportional", rs=r)
        else:
            state, rel = P.direct_step(state, idx, cnt, codec, acct=acct, rs=r, last=d == levels - 1)
        rels.append(rel)
    return rels


def _prefix_stat(release: list[Any], pair: NeighbourPair) -> float:
    """Released count of the target key's leaf (0 when it is not released as a leaf)."""
    codec = _prefix_codec()
    for rel in release:
        for label, count, leaf in zip(codec.labels(rel.prefixes), rel.counts.tolist(), rel.leaf.tolist()):
            if leaf and label == pair.context["leaf"]:
                return float(count)
    return 0.0


_K0 = Keys(("a",) * 6 + ("ab",) * 3 + ("b",) * 2)
PREFIX_PAIRS = (
    NeighbourPair("one more record of a frequent key", _K0, Keys(_K0.keys + ("a",)), {"leaf": "a$"}),
    NeighbourPair("one record of an absent key", _K0, Keys(_K0.keys + ("bb",)), {"leaf": "bb$"}),
)
for _method in ("basic", "improved", "direct"):
    register(AuditCase(
        name=f"prefix {_method}", epsilon=EPSILON, delta=0.0,
        run=functools.partial(run_prefix, method=_method), pairs=PREFIX_PAIRS,
        statistic=_prefix_stat, thresholds=tuple(range(1, 10)), runs=600, slow_runs=10_000,
        public=lambda r, m=_method: (_prefix_acct(m).to_dict(), _prefix_codec().depth, _prefix_codec().fanout),
    ))


# -- PrivBayes (transforms/privbayes.py): EM structure + noisy family tables ---------------------
@functools.lru_cache(maxsize=1)
def _privbayes_setup() -> tuple[Any, list[tuple[int, ...]]]:
    from beamsynth.transforms.privbayes import candidate_families, plan_privbayes

    plan = plan_privbayes(SCHEMA.shape, PureDP(epsilon=EPSILON), degree=1, max_contributions=K)
    # the default refinement (all 3 pairs here) is audited too, with a small pool: the pool is
    # post-processing (sampled from released tables), its size does not touch the guarantee
    plan = dataclasses.replace(plan, refine=dataclasses.replace(plan.refine, pool_rows=2_000))
    return plan, [tuple(f) for f in candidate_families(len(SCHEMA.shape), plan.degree)]


def _privbayes_measure(codes: np.ndarray, rs: RandomSource) -> Any:
    from beamsynth.transforms.privbayes import measure_privbayes

    plan, families = _privbayes_setup()
    counts = _count_tables(codes, families)
    return measure_privbayes(counts, families, shape=SCHEMA.shape, names=SCHEMA.names, plan=plan, rs=rs)


def run_privbayes(data: Records, rs: RandomSource) -> Any:
    """PrivBayes' measurement core: bound, candidate counts (CombineFn), measure_privbayes."""
    batch = data.encoded()
    codes = batch.codes
    if len(batch):
        codes = codes[bound_rows(codes, batch.pids, K, rs.child("bound"))]
    return _privbayes_measure(codes, rs.child("privbayes"))


def _privbayes_stat(release: Any, pair: NeighbourPair) -> float:
    """min over the released tables of (noisy − exact on ``smaller``) at the added row's cell."""
    row = _row_codes(pair.context["row"], pair.context["city"])
    batch = pair.smaller.encoded()
    out = []
    for m in release.marginals:
        cell = tuple(row[c] for c in m.columns)
        base = int(np.sum(np.all(batch.codes[:, list(m.columns)] == np.array(cell), axis=1))) if len(batch) else 0
        out.append(int(m.values[cell]) - base)
    # refinement tables: coarse cells through the groupings released with each table
    for m in (release.refinement.tables if release.refinement is not None else ()):
        groups = [np.asarray(g) for g in m.meta["groups"]]
        cell = tuple(int(g[row[c]]) for g, c in zip(groups, m.columns))
        base = int(np.sum(np.all(np.stack([g[batch.codes[:, c]] for g, c in zip(groups, m.columns)], 1)
                                 == np.array(cell), axis=1))) if len(batch) else 0
        out.append(int(m.values[cell]) - base)
    return float(min(out))


def batch_privbayes(data: Records, pair: NeighbourPair, runs: int, rs: RandomSource) -> np.ndarray:
    """:func:`run_privbayes` over many runs; bounding done once when its outcome is fixed."""
    batch = data.encoded()
    if not len(batch) or not _bound_is_fixed(batch, K):
        return np.array([_privbayes_stat(run_privbayes(data, rs.child(i)), pair) for i in range(runs)])
    codes = batch.codes[bound_rows(batch.codes, batch.pids, K, rs.child("bound"))]
    return np.array([_privbayes_stat(_privbayes_measure(codes, rs.child(i).child("privbayes")), pair)
                     for i in range(runs)])


PRIVBAYES_PAIRS = (
    NeighbourPair(HEAVY_PAIRS[0].name, HEAVY_PAIRS[0].smaller, HEAVY_PAIRS[0].larger,
                  {"row": ("red", 30), "city": "x"}),
    NeighbourPair(PAIRS[2].name, PAIRS[2].smaller, PAIRS[2].larger, {"row": ("OTHER", 0), "city": "x"}))
register(AuditCase(
    name="privbayes", epsilon=EPSILON, delta=0.0, run=run_privbayes,
    pairs=PRIVBAYES_PAIRS, statistic=_privbayes_stat, thresholds=tuple(range(-2, 7)), runs=600,
    slow_runs=6000,
    batch=batch_privbayes,
    # the structure (exponential mechanism) and the table layout it implies are DP outputs; the
    # data-independent part: the plan, and the marginal budget always fully and exactly spent
    public=lambda r: (_privbayes_setup()[0].details(), round(sum(m.budget.epsilon for m in r.marginals), 9),
                      len(r.refinement.tables)),
))


# PrivBayes' small-input model (issue 18): 1-way tables + a private forest of affordable pairs, as
# chosen by the sizing for a public input size of 2,000 rows (2 steps over the pairs of ≤ 12 cells)
@functools.lru_cache(maxsize=1)
def _forest_setup() -> tuple[Any, list[tuple[int, ...]]]:
    from beamsynth.transforms.privbayes import candidate_families, plan_forest, plan_privbayes

    base = plan_privbayes(SCHEMA.shape, PureDP(epsilon=EPSILON), degree=1, max_contributions=K,
                          refine_pairs=0)
    forest = plan_forest(2_000, EPSILON, SCHEMA.shape, max_contributions=K)
    plan = dataclasses.replace(base, forest=forest, structure_budget=forest.structure_budget,
                               marginal_budget=forest.pair_budget)
    return plan, [tuple(f) for f in candidate_families(len(SCHEMA.shape), plan.degree)]


def run_privbayes_forest(data: Records, rs: RandomSource) -> Any:
    """The forest model's measurement core: bound, pair counts, measure_privbayes (plan.forest)."""
    from beamsynth.transforms.privbayes import measure_privbayes

    batch = data.encoded()
    codes = batch.codes
    if len(batch):
        codes = codes[bound_rows(codes, batch.pids, K, rs.child("bound"))]
    plan, families = _forest_setup()
    return measure_privbayes(_count_tables(codes, families), families, shape=SCHEMA.shape,
                             names=SCHEMA.names, plan=plan, rs=rs.child("privbayes"))


register(AuditCase(
    name="privbayes forest", epsilon=EPSILON, delta=0.0, run=run_privbayes_forest,
    pairs=PRIVBAYES_PAIRS, statistic=_privbayes_stat, thresholds=tuple(range(-2, 7)), runs=600,
    slow_runs=6000,
    # the forest and its table layout are DP outputs; public: the plan, and the tables' ε, always
    # ε_1 + ε_2 (the 1-way tables take ε_2 too when no edge is chosen)
    public=lambda r: (_forest_setup()[0].details(), round(sum(m.budget.epsilon for m in r.marginals), 9)),
))


# -- plausible deniability (transforms/plausible.py): Mechanism 1 with Privacy Test 2 -------------
PD_K, PD_GAMMA, PD_EPS0, PD_T = 10, 2.0, 1.0, 5


def _pd_claim() -> tuple[float, float]:
    from beamsynth.transforms.plausible import theorem1_guarantee

    return theorem1_guarantee(k=PD_K, gamma=PD_GAMMA, epsilon0=PD_EPS0, t=PD_T)


def _pd_release(seeds_data: np.ndarray, runs: int, rs: RandomSource, *, randomized: bool) -> np.ndarray:
    """``runs`` independent single-record releases: seed uniformly from the data, perturb with the
    public PerturbationModel, count plausible seeds, Privacy Test 2 (Test 1 if not randomized).
    Returns the released rows (−1 rows when the candidate was not released)."""
    from beamsynth.transforms.plausible import (
        PerturbationModel,
        count_plausible_generic,
        privacy_test,
    )

    model = PerturbationModel(shape=SCHEMA.shape, p=0.3)
    out = np.full((runs, len(SCHEMA.shape)), -1, dtype=np.int64)
    if len(seeds_data) == 0:
        return out
    pick = rs.child("seed").integers(len(seeds_data), runs)
    y, own = model.generate(seeds_data[pick], rs.child("generate"))
    kprime = count_plausible_generic(own, model.log_prob(y, seeds_data), PD_GAMMA)
    passed, _ = privacy_test(kprime, k=PD_K, epsilon0=PD_EPS0 if randomized else None,
                             rs=rs.child("test") if randomized else None)
    out[passed] = y[passed]
    return out


def run_plausible(data: EncodedBatch, rs: RandomSource, *, randomized: bool = True) -> np.ndarray:
    """One released candidate (a row, or −1s when the test fails)."""
    return _pd_release(np.asarray(data.codes, np.int64), 1, rs, randomized=randomized)[0]


def _pd_stat(release: np.ndarray, pair: NeighbourPair) -> float:
    return float(release[0] >= 0)


_PD_ROWS = [(0, 1, 0)] * (PD_K - 1)
PD_PAIRS = (
    NeighbourPair(f"{PD_K - 1} identical records + one more (k' crosses k)",
                  _batch_of(_PD_ROWS, [f"p{i}" for i in range(PD_K - 1)]),
                  _batch_of(_PD_ROWS + [(0, 1, 0)], [f"p{i}" for i in range(PD_K)]), {}),
    NeighbourPair("k-1 identical records + one outlier",
                  _batch_of(_PD_ROWS, [f"p{i}" for i in range(PD_K - 1)]),
                  _batch_of(_PD_ROWS + [(3, 4, 1)], [f"p{i}" for i in range(PD_K)]), {}),
)
register(AuditCase(
    name="plausible deniability (one record)", epsilon=_pd_claim()[0], delta=_pd_claim()[1],
    run=run_plausible, pairs=PD_PAIRS, statistic=_pd_stat, thresholds=(1,), runs=20_000,
    slow_runs=400_000,
    batch=lambda d, p, n, rs: _pd_release(np.asarray(d.codes, np.int64), n, rs, randomized=True)[:, 0] >= 0,
    public=lambda r: (r.shape, _pd_claim()),
))
register_broken(AuditCase(
    name="plausible: deterministic test claimed DP", epsilon=_pd_claim()[0], delta=_pd_claim()[1],
    run=lambda d, rs: run_plausible(d, rs, randomized=False), pairs=PD_PAIRS[:1], statistic=_pd_stat,
    thresholds=(1,), runs=2000,
    batch=lambda d, p, n, rs: _pd_release(np.asarray(d.codes, np.int64), n, rs, randomized=False)[:, 0] >= 0,
    broken="Privacy Test 1 (k' ≥ k, no noisy threshold) has no (ε, δ) guarantee",
))
register_broken(AuditCase(
    name="prefix basic: leaves re-measured without noise", epsilon=EPSILON, delta=0.0,
    run=functools.partial(run_prefix, method="basic", noiseless_leaves=True), pairs=PREFIX_PAIRS[:1],
    statistic=_prefix_stat, thresholds=tuple(range(1, 10)), runs=600,
    broken="the second pass (leaf re-measurement) adds no noise",
))


# == session 11 (H34): the mechanisms changed in sessions 10-11 ===================================
# -- PrivBayes zCDP mode (noise="gaussian", issue 18): discrete Gaussian network tables ---------
# An (ε, δ) of the zCDP curve where the audit can see a miscalibrated σ in a few thousand runs (δ
# large, so ρ is large against the claim); the code path is the one every (ε, δ) takes.
PB_GAUSS_BUDGET = ApproxDP(epsilon=2.0, delta=1e-2)


@functools.lru_cache(maxsize=4)
def _pb_gaussian_setup(rho_factor: float = 1.0) -> tuple[Any, list[tuple[int, ...]]]:
    """The zCDP plan of the audit schema (degree 1, no refinement, m = K); ``rho_factor`` ≠ 1 is
    the broken variant: the tables get ``rho_factor``·ρ_marginals (σ / √rho_factor) while the
    spend states ρ."""
    from beamsynth.transforms.privbayes import candidate_families, gaussian_plan, plan_privbayes

    plan = gaussian_plan(plan_privbayes(SCHEMA.shape, PB_GAUSS_BUDGET, degree=1, max_contributions=K,
                                        refine_pairs=0), PB_GAUSS_BUDGET)
    if rho_factor != 1.0:
        plan = dataclasses.replace(plan, zcdp=dataclasses.replace(
            plan.zcdp, marginal_rho=plan.zcdp.marginal_rho * rho_factor))
    return plan, [tuple(f) for f in candidate_families(len(SCHEMA.shape), plan.degree)]


def _bounded_codes(data: Any, rs: RandomSource) -> np.ndarray:
    batch = data.encoded() if isinstance(data, Records) else data
    if not len(batch):
        return batch.codes
    return batch.codes[bound_rows(batch.codes, batch.pids, K, rs)]


def run_privbayes_gaussian(data: Records, rs: RandomSource, *, rho_factor: float = 1.0) -> Any:
    """The zCDP measurement core: bound, candidate counts (CombineFn), measure_privbayes."""
    from beamsynth.transforms.privbayes import measure_privbayes

    plan, families = _pb_gaussian_setup(rho_factor)
    counts = _count_tables(_bounded_codes(data, rs.child("bound")), families)
    return measure_privbayes(counts, families, shape=SCHEMA.shape, names=SCHEMA.names, plan=plan,
                             rs=rs.child("privbayes"))


def gaussian_table_stat(release: Any, pair: NeighbourPair) -> float:
    """The likelihood-ratio statistic of Gaussian tables: ``Σ_t m·(noisy_t − exact_t)/σ_t²`` at the
    added row's cell of every released table (network and refinement; coarse tables through their
    released groupings), over ``√(Σ_t m²/σ_t²)``: about N(0, 1) on ``smaller``, N(μ, 1) on
    ``larger`` with ``μ² = Σ_t m²/σ_t²`` = 2·(the tables' ρ). Uses released values only (σ_t is
    public) and the auditor's knowledge (``context``: ``codes`` of ``smaller`` after bounding,
    the added row's ``target`` codes, ``m``)."""
    base, row, m = pair.context["codes"], pair.context["target"], float(pair.context["m"])
    tables = list(release.marginals)
    if release.refinement is not None:
        tables += list(release.refinement.tables)
    num = den = 0.0
    for t in tables:
        cols = list(t.columns)
        maps = ([np.asarray(g) for g in t.meta["groups"]] if t.meta.get("coarse")
                else [np.arange(s) for s in t.shape])
        cell = tuple(int(g[row[c]]) for g, c in zip(maps, cols))
        hit = np.ones(len(base), dtype=bool)
        for g, c, v in zip(maps, cols, cell):
            hit &= g[base[:, c]] == v
        num += m * (float(t.values[cell]) - float(hit.sum())) / t.scale ** 2
        den += m * m / t.scale ** 2
    return num / np.sqrt(den)


def _pb_gaussian_pair(pair: NeighbourPair) -> NeighbourPair:
    row = _row_codes(pair.context["row"], pair.context["city"])
    return NeighbourPair(pair.name, pair.smaller, pair.larger,
                         {**pair.context, "codes": pair.smaller.encoded().codes, "target": row, "m": K})


def batch_measure(data: Any, pair: NeighbourPair, runs: int, rs: RandomSource, *, run: Any,
                  measure: Any, statistic: Any) -> np.ndarray:
    """``runs`` executions of ``run``; bounding done once when its outcome is fixed (then
    ``measure(codes, rs)`` runs on the bounded codes: the same law, faster)."""
    batch = data.encoded() if isinstance(data, Records) else data
    if not len(batch) or not _bound_is_fixed(batch, K):
        return np.array([statistic(run(data, rs.child(i)), pair) for i in range(runs)])
    codes = batch.codes[bound_rows(batch.codes, batch.pids, K, rs.child("bound"))]
    return np.array([statistic(measure(codes, rs.child(i)), pair) for i in range(runs)])


def _pb_gaussian_measure(codes: np.ndarray, rs: RandomSource, *, rho_factor: float = 1.0) -> Any:
    from beamsynth.transforms.privbayes import measure_privbayes

    plan, families = _pb_gaussian_setup(rho_factor)
    return measure_privbayes(_count_tables(codes, families), families, shape=SCHEMA.shape,
                             names=SCHEMA.names, plan=plan, rs=rs.child("privbayes"))


def _pb_gaussian_case(name: str, rho_factor: float, **kw: Any) -> AuditCase:
    return AuditCase(
        name=name, epsilon=PB_GAUSS_BUDGET.epsilon, delta=PB_GAUSS_BUDGET.delta,
        run=functools.partial(run_privbayes_gaussian, rho_factor=rho_factor),
        pairs=PB_GAUSSIAN_PAIRS if not kw.get("broken") else PB_GAUSSIAN_PAIRS[:1],
        statistic=gaussian_table_stat, thresholds=tuple(x / 2 for x in range(-2, 11)),
        batch=lambda d, p, n, rs: batch_measure(
            d, p, n, rs, run=functools.partial(run_privbayes_gaussian, rho_factor=rho_factor),
            measure=functools.partial(_pb_gaussian_measure, rho_factor=rho_factor),
            statistic=gaussian_table_stat),
        # public: the plan, and the tables' ρ always summing to the planned ρ_marginals
        public=lambda r: (_pb_gaussian_setup(rho_factor)[0].details(),
                          round(sum(t.meta["rho"] for t in r.marginals), 9)), **kw)


PB_GAUSSIAN_PAIRS = tuple(_pb_gaussian_pair(p) for p in PRIVBAYES_PAIRS)
register(_pb_gaussian_case("privbayes gaussian", 1.0, runs=4000, slow_runs=20_000))
register_broken(_pb_gaussian_case(
    "privbayes gaussian: σ halved", 4.0, runs=4000,
    broken="the network tables get 4·ρ_marginals (σ/2) while the spend states ρ"))


# -- CatHist's empty bins (Binomial(n − a, p), noise.binomial's two-sided inversion, 25b90b1) -----
# A 2,000-bin declared domain with a low tolerance (τ = 4): the binomial draws ~170 surviving empty
# bins per run, and one empty bin survives with p = 0.084, enough to audit in a few thousand runs.
CATHIST_BIG_DOMAIN = 2_000
CATHIST_BIG_TOLERANCE = 1e-80


@functools.lru_cache(maxsize=1)
def _cathist_big_setup() -> tuple[Any, Any]:
    from beamsynth.schemas.domains import IntegerDomain
    from beamsynth.transforms.cathist import plan_cathist

    domain = IntegerDomain(low=0, high=CATHIST_BIG_DOMAIN - 1)
    return domain, plan_cathist(epsilon=EPSILON, tolerance=CATHIST_BIG_TOLERANCE,
                                domain_size=domain.size, max_contributions=K)


@dataclass(frozen=True)
class _ShiftedPlan:
    """A CatHist plan whose empty-bin survival probability is that of threshold ``τ + shift``
    (the broken variant: the binomial gets ``p`` of a wrong threshold)."""

    plan: Any
    shift: int

    def __getattr__(self, name: str) -> Any:
        return getattr(self.plan, name)

    @property
    def tail_probability(self) -> float:
        from beamsynth.transforms.cathist import log_tail

        return float(np.exp(log_tail(self.plan.tau + self.shift, self.plan.log_q)))


def _cathist_big_release(cells: np.ndarray, rs: RandomSource, *, p_shift: int) -> Any:
    from beamsynth.transforms.cathist import count_values, release_histogram

    domain, plan = _cathist_big_setup()
    present, counts = count_values(cells)
    return release_histogram(present, counts, plan=_ShiftedPlan(plan, p_shift) if p_shift else plan,
                             domain=domain, rs=rs.child("release"))


def run_cathist_big(data: Cells, rs: RandomSource, *, p_shift: int = 0) -> Any:
    """CatHist's core on the large domain: bound, exact value counts, release_histogram."""
    cells = data.cells
    if cells.size:
        cells = cells[bound_rows(cells[:, None], data.pids, K, rs.child("bound"))]
    return _cathist_big_release(cells, rs, p_shift=p_shift)


def batch_cathist_big(data: Cells, pair: NeighbourPair, runs: int, rs: RandomSource, *,
                      p_shift: int = 0) -> np.ndarray:
    """:func:`run_cathist_big` over many runs (:func:`batch_measure`: bounding once if fixed)."""
    return batch_measure(
        EncodedBatch(data.cells[:, None], data.pids), pair, runs, rs,
        run=lambda b, r: run_cathist_big(Cells(b.codes[:, 0], b.pids), r, p_shift=p_shift),
        measure=lambda codes, r: _cathist_big_release(codes[:, 0], r, p_shift=p_shift),
        statistic=_cathist_stat)


_CB0 = Cells(np.array([3, 3, 3, 7, 7, 11, 1500, 1999], np.int64), np.array([f"p{i}" for i in range(8)], dtype=object))
CATHIST_BIG_PAIRS = (
    NeighbourPair("heavy unit of an absent value (n − a empty bins → n − a − 1)", _CB0,
                  _CB0.plus([1234] * HEAVY, "heavy"), {"cell": 1234}),
    NeighbourPair("one record of an absent value", _CB0, _CB0.plus([1234], "new"), {"cell": 1234}),
    NeighbourPair("empty dataset + one record", Cells(np.zeros(0, np.int64), np.zeros(0, dtype=object)),
                  Cells(np.array([0], np.int64), np.array(["only"], dtype=object)), {"cell": 0}),
)


def _cathist_big_case(name: str, p_shift: int, **kw: Any) -> AuditCase:
    tau = _cathist_big_setup()[1].tau
    return AuditCase(
        name=name, epsilon=EPSILON, delta=0.0, run=functools.partial(run_cathist_big, p_shift=p_shift),
        pairs=CATHIST_BIG_PAIRS if not kw.get("broken") else CATHIST_BIG_PAIRS[:1],
        statistic=_cathist_stat, thresholds=(tau, tau + 2), public=lambda r: r.plan,
        batch=functools.partial(batch_cathist_big, p_shift=p_shift), **kw)


register(_cathist_big_case(f"cathist ({CATHIST_BIG_DOMAIN:,} bins: binomial empty bins)", 0,
                           runs=8000, slow_runs=40_000))
register_broken(_cathist_big_case(
    "cathist: empty bins at a wrong threshold", 1, runs=10_000,
    broken="Binomial(n − a, p) with p = P(Z ≥ τ + 1), the active bins thresholded at τ"))


# -- plausible deniability: Poisson(rows/|D_S|) candidates per seed (noise.poisson, e9b1e01) -----
# candidate_release_cost's proof needs the number of invocations N = Σ_seeds Poisson(rows/|D_S|)
# to be Poisson(rows) whatever D_S is (non-empty): its claim here is ε = 0, audited against a
# token ε (the harness needs ε > 0); a correct sampler yields a bound of exactly 0.
PD_ROWS = 20
PD_COUNT_CLAIM = 0.01


def _cut_poisson(rs: RandomSource, lam: float, n: int) -> np.ndarray:
    """The broken variant: each seed's count cut at its Poisson(λ) 0.99-quantile."""
    from scipy.stats import poisson as sp_poisson

    from beamsynth.transforms.plausible import poisson_counts

    return np.minimum(poisson_counts(rs, lam, n), int(sp_poisson.ppf(0.99, lam)))


def run_candidate_count(data: EncodedBatch, rs: RandomSource, *, counts: Any = None) -> int:
    """GenerateCandidates' multiplicities (_GenerateFn: λ = rows/|D_S|, poisson_counts over the
    seeds): the number N of Mechanism 1 invocations."""
    from beamsynth.transforms.plausible import poisson_counts

    n = len(data)
    lam = float(PD_ROWS) / max(n, 1)
    return int((counts or poisson_counts)(rs.child("poisson"), lam, n).sum())


def batch_candidate_count(data: EncodedBatch, pair: NeighbourPair, runs: int, rs: RandomSource, *,
                          counts: Any = None) -> np.ndarray:
    """:func:`run_candidate_count` over runs: one draw of runs·|D_S| i.i.d. counts (same law)."""
    from beamsynth.transforms.plausible import poisson_counts

    n = len(data)
    draws = (counts or poisson_counts)(rs.child("poisson"), float(PD_ROWS) / max(n, 1), runs * n)
    return draws.reshape(runs, n).sum(axis=1).astype(np.float64)


_PD_SEEDS = [(0, 1, 0), (1, 2, 1), (2, 3, 0), (0, 0, 1), (3, 4, 1)]
PD_COUNT_PAIRS = (
    NeighbourPair("one seed + one more", _batch_of(_PD_SEEDS[:1], ["s0"]), _batch_of(_PD_SEEDS[:2], ["s0", "s1"]), {}),
    NeighbourPair("4 seeds + one more", _batch_of(_PD_SEEDS[:4], ["s0", "s1", "s2", "s3"]),
                  _batch_of(_PD_SEEDS, ["s0", "s1", "s2", "s3", "s4"]), {}),
)


def _pd_count_case(name: str, counts: Any, **kw: Any) -> AuditCase:
    return AuditCase(
        name=name, epsilon=PD_COUNT_CLAIM, delta=0.0,
        run=functools.partial(run_candidate_count, counts=counts),
        pairs=PD_COUNT_PAIRS if not kw.get("broken") else PD_COUNT_PAIRS[:1],
        statistic=lambda r, _p: float(r), thresholds=tuple(range(8, 41, 2)),
        batch=functools.partial(batch_candidate_count, counts=counts), **kw)


register(_pd_count_case("plausible: Poisson candidate count", None, runs=20_000, slow_runs=200_000))
register_broken(_pd_count_case(
    "plausible: Poisson counts with a cut tail", _cut_poisson, runs=20_000,
    broken="each seed's Poisson(rows/|D_S|) cut at its 0.99-quantile: N's law depends on |D_S|"))
