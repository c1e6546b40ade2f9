"""Session 10 audit (H27): the accounting of prefix trees (seed 003) and SBHG (seed 002), recomputed.

* Prefix trees: ``basic`` (Corollary 2 + second pass), ``improved`` (Theorem 3, the tight loss
  ``ε₀ + Σ_j h(jt)`` of :func:`improved_privacy_loss`) and ``direct`` (``k(maxdepth + 1)/ε`` per
  level, terminal cells the path's unused budget) recomputed from their definitions, the improved
  bound checked exactly (every released tree of small neighbours) with the ``uniform`` discount
  (``tests/unit/test_prefix.py`` enumerates ``skip``), and CLI neighbours on the bundled query log
  (D vs D + one unit of 3 records, seeded): the tree's shape is the same and its counts differ only
  on the unit's paths, by at most its records.
* SBHG: the SBA threshold against δ recomputed by enumerating every way ``k`` records of a new unit
  can fill new cells (brute-force survival sums), its pass rate measured through
  :func:`sba_release`, and the CLI manifest's (ε, δ) per table.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from beamsynth.pipelines.cli.main import main
from beamsynth.transforms import prefix as P
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.sbhg import mi_score_sensitivity, sba_release, sba_threshold

pytestmark = pytest.mark.audit

ROOT = Path(__file__).resolve().parents[2]
QUERY_LOG = ROOT / "examples" / "data" / "text" / "query_log_10k.csv"
ADULT = ROOT / "examples" / "data" / "adult" / "adult.csv"


# -- independent discrete Laplace arithmetic (P(Z = z) ∝ exp(-|z|/scale)) --------------------------
def _survival(m: int, eps0: float) -> float:
    """``P(Z ≥ m)`` by summing the pmf (no closed form)."""
    q = math.exp(-eps0)
    c = (1 - q) / (1 + q)
    if m <= 0:  # 1 - P(Z ≤ m - 1) = 1 - P(Z ≥ 1 - m)
        return 1.0 - _survival(1 - m, eps0)
    return math.fsum(c * q ** z for z in range(m, m + int(60 / eps0) + 60))


def _improved_loss(eps0: float, b: float, t: int) -> float:
    """Worst loss of one record: the leaf ``ε₀`` plus ``h(x) = log p(x+1)/p(x)`` at ``x = t, 2t, ...``
    with ``p(x) = P(x + Z ≥ ⌈b⌉)`` (the counts above the last differing node grow by ``t`` per level)."""
    bi = math.ceil(b)
    total, j = eps0, 1
    while j * t <= bi + 80 / eps0:
        x = j * t
        total += math.log(_survival(bi - x - 1, eps0)) - math.log(_survival(bi - x, eps0))
        j += 1
    return total


@pytest.mark.parametrize("epsilon, depth, k, final", [(1.0, 21, 1, 0.25), (1.0, 21, 3, 0.25), (0.5, 8, 2, 0.4)])
def test_basic_levels_and_second_pass_sum_to_epsilon_with_sensitivity_k(epsilon, depth, k, final):
    a = P.basic_accounting(epsilon=epsilon, max_depth=depth, max_contributions=k, final_fraction=final, fanout=39)
    eps_level = epsilon * (1 - final) / depth  # B levels of disjoint nodes: L1 sensitivity k each
    assert a.epsilon_level == pytest.approx(eps_level) and a.scale == pytest.approx(k / eps_level)
    assert a.final_scale == pytest.approx(k / (epsilon * final))  # the leaves partition the records
    assert depth * k / a.scale + k / a.final_scale == pytest.approx(epsilon) == a.epsilon
    assert a.threshold == math.ceil(2 * (k / eps_level) * math.log(39))  # public parameters only


_IMPROVED = [(1.0, 1, 39, "theorem3", None), (1.0, 3, 39, "theorem3", None), (0.1, 1, 39, "theorem3", None),
             (10.0, 1, 2, "theorem3", None), (1.0, 1, 39, "theorem3", 1.0), (1.0, 1, 39, "tight", None),
             (1.0, 3, 39, "tight", None), (0.1, 1, 39, "tight", None), (10.0, 1, 2, "tight", None),
             (1.0, 2, 39, "tight", 3.0)]


@pytest.mark.parametrize("epsilon, k, fanout, calibration, threshold", _IMPROVED)
def test_improved_loss_recomputed_and_within_theorem_3(epsilon, k, fanout, calibration, threshold):
    a = P.improved_accounting(epsilon=epsilon, max_contributions=k, fanout=fanout, depth=21,
                              calibration=calibration, threshold=threshold)
    eps0, b, t = a.epsilon_level, a.threshold, a.discount
    loss = _improved_loss(eps0, b, t)
    assert P.improved_privacy_loss(eps0, b, t) == pytest.approx(loss, rel=1e-9, abs=1e-12)
    assert a.scale == pytest.approx(1 / eps0)
    assert k * loss <= a.epsilon + 1e-9 and a.epsilon == pytest.approx(epsilon)  # group privacy over k
    if calibration == "theorem3":  # the paper's t ≥ b + ln 2/ε₀ gives at most 2ε₀ per record
        assert t >= b + math.log(2) / eps0 and loss <= 2 * eps0 and eps0 == pytest.approx(epsilon / (2 * k))
    else:
        assert a.loss == pytest.approx(k * loss)
        assert t == max(1, math.ceil(b)) or k * _improved_loss(eps0, b, t - 1) > epsilon  # the smallest t


def _log_survival(m: int, eps0: float) -> float:
    return math.log(_survival(m, eps0))


def _worst_log_ratio(first: dict, second: dict, eps0: float, b: int, t: int, rule: str, length: int = 3) -> float:
    """max over released trees of log P[tree | first]/P[tree | second] for the improved method (exact).

    Alphabet ``ab`` + EOS (``$``). A non-terminal node either splits (``P(e + Z ≥ b)``) or is a leaf
    with its released value ``y < b``; an EOS node is a leaf with any value. The tree's probability
    is a product over its nodes, so the maximum is a recursion choosing split or leaf per node; the
    discount is the product's own :func:`allocate_discount` with ``rule``.
    """
    def raw(data: dict, node: str) -> int:
        if node.endswith("$"):
            return data.get(node[:-1], 0)
        return sum(c for s, c in data.items() if s.startswith(node))

    def below(node: str, e1: int, o1: int, e2: int, o2: int) -> float:
        kids = [node + ch for ch in "ab"] * (len(node) < length) + [node + "$"]
        r1 = np.array([[raw(first, x) for x in kids]])
        r2 = np.array([[raw(second, x) for x in kids]])
        m1 = P.allocate_discount(r1, np.array([o1]), t, rule, None)[0]
        m2 = P.allocate_discount(r2, np.array([o2]), t, rule, None)[0]
        return sum(node_max(x, int(r1[0, i] - m1[i]), int(m1[i]), int(r2[0, i] - m2[i]), int(m2[i]))
                   for i, x in enumerate(kids))

    def node_max(node: str, e1: int, o1: int, e2: int, o2: int) -> float:
        if node.endswith("$"):
            return eps0 * abs(e1 - e2)
        leaf = max(eps0 * (abs(y - e2) - abs(y - e1)) for y in range(min(e1, e2, b) - 3, b))
        split = _log_survival(b - e1, eps0) - _log_survival(b - e2, eps0) + below(node, e1, o1, e2, o2)
        return max(leaf, split)

    return below("", 0, 0, 0, 0)  # the root always splits, with its discount


def _worst_over_neighbours(eps0: float, b: int, t: int, rule: str, trials: int = 40,
                           run_t: int | None = None) -> float:
    """Worst over random neighbour pairs (counts up to 4t); the trees discount ``run_t`` (default t)."""
    run_t = t if run_t is None else run_t
    rng = np.random.default_rng(11)
    strings = ["", "a", "b", "aa", "ab", "ba", "bb", "aaa", "aab", "aba", "abb", "bab", "bbb"]
    worst = 0.0
    for _ in range(trials):
        data = {str(s): int(rng.integers(0, 4 * t)) for s in rng.choice(strings, size=rng.integers(1, 6))}
        other = dict(data)
        extra = str(rng.choice(strings))
        other[extra] = other.get(extra, 0) + 1
        worst = max(worst, _worst_log_ratio(other, data, eps0, b, run_t, rule),
                    _worst_log_ratio(data, other, eps0, b, run_t, rule))
    return worst


@pytest.mark.parametrize("eps0, b, t", [(0.92, 5, 6), (0.5, 15, 17), (0.35, 3, 4)])
def test_improved_bound_holds_exactly_with_the_uniform_discount(eps0, b, t):
    """Every released tree of 40 random neighbour pairs (one record added or removed), exact; the
    tight parameters of ε = 1 (k = 1, 39 symbols), Theorem 3's, and a user threshold of 3."""
    claim = P.improved_privacy_loss(eps0, b, t)
    worst = _worst_over_neighbours(eps0, b, t, "uniform")
    assert worst <= claim + 1e-9
    assert worst >= claim - 0.01  # attained: the bound is what the discount allows, not loose


def test_the_exact_check_catches_a_discount_below_the_accounted_one():
    claim = P.improved_privacy_loss(0.92, 5, 6)  # accounted t = 6, trees discounting t = 2
    assert _worst_over_neighbours(0.92, 5, 6, "uniform", trials=10, run_t=2) > claim + 0.5


@pytest.mark.parametrize("epsilon, max_depth, k, fanout", [(1.0, 20, 1, 39), (1.0, 20, 3, 39), (2.0, 16, 2, 4)])
def test_direct_every_records_path_spends_epsilon(epsilon, max_depth, k, fanout):
    a = P.direct_accounting(epsilon=epsilon, max_depth=max_depth, max_contributions=k, fanout=fanout)
    assert a.scale == pytest.approx(k * (max_depth + 1) / epsilon)  # root + maxdepth levels, Δ = k
    for end in range(1, max_depth + 1):  # a key ending (EOS / full depth) at level `end`
        scale, terminal, _thr, _tthr = P.direct_scales(a, end, fanout)
        path = k / a.scale + (end - 1) * k / scale + k / terminal  # root, non-terminal cells, terminal
        assert path == pytest.approx(epsilon)
    assert (max_depth + 1) * k / a.scale == pytest.approx(epsilon)  # a key longer than maxdepth


# -- CLI neighbours on the bundled query log -------------------------------------------------------
_UNIT = [("999999", "abc news"), ("999999", "abc news"), ("999999", "zzqx")]


def _tree(path: Path) -> dict[tuple[int, str, str], str]:
    with open(path, newline="", encoding="utf-8") as fh:
        return {(int(r["depth"]), r["prefix"], r["leaf"]): r["count"] for r in csv.DictReader(fh)}


@pytest.mark.slow
def test_cli_prefix_neighbours_differ_only_on_the_units_paths(tmp_path: Path) -> None:
    """D (query log, 10,000 rows) vs D + one unit of 3 records, k = 3, seed 7: basic and improved
    (``skip``: a deterministic discount) release the same nodes, and only nodes on the unit's paths
    change count, by at most its records there; direct keeps the tree and writes 3 more keys (the
    root count). Seed-specific: a node of the unit's paths could cross a threshold under other
    draws (the shape is DP, not fixed). Measured: basic a +2, ab +2, z +1; improved z +1 only."""
    lines = QUERY_LOG.read_text("utf-8").splitlines()
    assert not any(line.startswith("999999,") for line in lines)
    sources = {"D": tmp_path / "D.csv", "D1": tmp_path / "D1.csv"}
    sources["D"].write_text("\n".join(lines) + "\n", "utf-8")
    sources["D1"].write_text("\n".join(lines + [f"{u},{q}" for u, q in _UNIT]) + "\n", "utf-8")
    runs = {}
    for method, extra in {"basic": [], "improved": ["--discount", "skip"], "direct": []}.items():
        for name, src in sources.items():
            out = tmp_path / f"{method}_{name}.csv"
            assert main(["prefixes", str(src), "--column", "query", "--privacy-id", "user_id",
                         "--max-contributions", "3", "--method", method, *extra, "--epsilon", "1",
                         "--seed", "7", "--output", str(out), "--quiet"]) == 0
            manifest = json.loads(Path(f"{out}.manifest.json").read_text("utf-8"))
            runs[method, name] = (_tree(Path(f"{out}.tree.csv")), manifest,
                                  len(out.read_text("utf-8").splitlines()) - 1)
    paths = {q[:i] for _u, q in _UNIT for i in range(1, len(q) + 1)} | {q + "$" for _u, q in _UNIT}
    for method in ("basic", "improved", "direct"):
        (t0, m0, rows0), (t1, m1, rows1) = runs[method, "D"], runs[method, "D1"]
        for m in (m0, m1):
            (spend,) = m["release"]["budget"]["spends"]
            assert spend["step"] == f"prefixes/{method}" and spend["epsilon"] == pytest.approx(1.0)
        assert m0["release"]["budget"]["spends"] == m1["release"]["budget"]["spends"]  # public only
        assert set(t0) == set(t1), method  # same nodes, same leaves
        if method == "direct":  # allocations are Center'd (post-processing): only the total is local
            assert rows1 - rows0 == 3
            continue
        changed = {node: (t0[node], t1[node]) for node in t0 if t0[node] != t1[node]}
        assert changed, method
        for (_depth, prefix, _leaf), (c0, c1) in changed.items():
            assert prefix in paths, (method, prefix)
            under = sum(1 for _u, q in _UNIT if (q + "$").startswith(prefix))
            assert 0 < int(c1) - int(c0) <= under, (method, prefix, c0, c1)


# -- SBHG: the stability-based release -------------------------------------------------------------
def _partitions(n: int, largest: int | None = None):
    largest = n if largest is None else largest
    if n == 0:
        yield []
        return
    for part in range(min(n, largest), 0, -1):
        for rest in _partitions(n - part, part):
            yield [part, *rest]


def _sba_delta(t: int, scale: float, k: int) -> float:
    """P(a new cell passes) maximised over every way ≤ k records fill new cells (union bound)."""
    eps = 1.0 / scale
    return max(math.fsum(_survival(t - c, eps) for c in part)
               for n in range(1, k + 1) for part in _partitions(n))


_SBHG = [(1.0, 1e-6, 15, 1, 0.2), (1.0, 1e-6, 15, 3, 0.2), (4.0, 1e-9, 15, 2, 0.2), (0.5, 1e-4, 6, 5, 0.3)]


@pytest.mark.parametrize("epsilon, delta, p, k, fraction", _SBHG)
def test_sba_threshold_is_the_smallest_meeting_delta_per_table(epsilon, delta, p, k, fraction):
    """(ε_c/p, δ/p) per table; scale k·p/ε_c; the smallest t whose new-cell pass probability
    (every split of the unit's k records into new cells) is ≤ δ/p. Measured: Adult p = 15, ε = 1,
    δ = 1e-6: t = 299 (k = 1), 954 (k = 3), scale 18.75 / 56.25 (the paper's replace-one t: 647)."""
    eps_c = epsilon * (1 - fraction)
    scale, t = sba_threshold(epsilon=eps_c / p, delta=delta / p, max_contributions=k)
    assert scale == pytest.approx(k * p / eps_c)
    assert _sba_delta(t, scale, k) <= delta / p < _sba_delta(t - 1, scale, k)
    assert mi_score_sensitivity(max_contributions=k) == pytest.approx(k * (math.log(10**7) + 1))


def test_sba_release_pass_rate_is_the_tail_the_delta_counts():
    """Through sba_release itself: a cell of count c passes with probability P(Z ≥ t - c); a new
    unit's cells (one of count 2, or two of count 1) pass at most δ of the time."""
    scale, t = sba_threshold(epsilon=0.5, delta=0.05, max_contributions=2)
    n = 400_000
    for c in (1, 2):
        keys, _ = sba_release(np.arange(n), np.full(n, c), scale=scale, threshold=t,
                              rs=RandomSource(seed=c).child("sba"))
        expected = _survival(t - c, 1.0 / scale)
        assert abs(keys.size / n - expected) <= 5 * math.sqrt(expected / n)
        assert expected <= 0.05
    assert _sba_delta(t, scale, 2) <= 0.05 < _sba_delta(t - 1, scale, 2)


def test_cli_sbhg_manifest_states_the_recomputed_tables(tmp_path: Path) -> None:
    out = tmp_path / "sbhg.csv"
    assert main(["synthesize", str(ADULT), "--schema", "adult", "--method", "sbhg", "--epsilon", "1",
                 "--delta", "1e-6", "--rows", "200", "--seed", "3", "--output", str(out), "--quiet"]) == 0
    budget = json.loads(Path(f"{out}.manifest.json").read_text("utf-8"))["release"]["budget"]
    sel, cond = budget["spends"]
    assert (sel["step"], sel["epsilon"], sel["delta"]) == ("sbhg.hash_selection", pytest.approx(0.2), 0.0)
    assert sel["details"]["draws"] == 30 and sel["details"]["epsilon_per_draw"] == pytest.approx(0.2 / 30)
    assert (cond["step"], cond["epsilon"], cond["delta"]) == ("sbhg.conditionals", pytest.approx(0.8), 1e-6)
    d = cond["details"]
    assert d["tables"] == 15 and d["scale"] == pytest.approx(15 / 0.8) and d["threshold"] == 299
    assert _sba_delta(d["threshold"], d["scale"], 1) <= d["per_table"]["delta"] == pytest.approx(1e-6 / 15)
    assert budget["spent"] == {"epsilon": pytest.approx(1.0), "delta": pytest.approx(1e-6)}
