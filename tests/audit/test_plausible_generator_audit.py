"""Audit of the PrivBayes-generator path of ``--method plausible``: the guarantee keeps its shape.

* Empirical: invocations of Mechanism 1 with a seed-resampling network (the generator the
  PrivBayes path builds, a fixed function of a model learned on disjoint data) through the
  privacy test's own fast-path DoFns (``_KeyCountsFn`` → ``_MergeKeyCountsFn`` →
  ``_KeyCandidatesFn`` → ``_FastTestFn``: hashed shards, grouped seed counts, lookup, noisy
  threshold), called directly without a runner, on hard neighbouring seed sets: the
  Clopper–Pearson lower bound on ε stays below Theorem 1's ε₁, and the same audit on Privacy
  Test 1 (no noisy threshold) certifies more than ε₁ (the audit is not vacuous). Each candidate
  of a batch is one independent invocation (its own uniform seed, its own threshold draw).
  False-failure rate ≤ AUDIT_ALPHA = 1e-4 per pair; seeded.
* Accounting: the plan (no data read) of ``--generator privbayes`` charges the PrivBayes spends
  under ``plausible.model.*`` plus ``plausible.candidates`` = (C·ε₁, C·δ₁ + δ_tail), and the
  manifest's ``side_by_side`` rows are exactly Theorem 1's (ε₁, δ₁), the charged C·ε₁, and C·ε₁
  plus the model's ε = the accountant's total.
"""

from __future__ import annotations

import numpy as np
import pytest
from apache_beam.transforms.window import GlobalWindow

from beamsynth.pipelines.methods.synthesize import SynthesisConfig, plan_synthesis
from beamsynth.schemas.schema import EncodedBatch, load_schema
from beamsynth.transforms import plausible as P
from beamsynth.transforms import plausible_filter
from beamsynth.transforms.audit import AuditCase, NeighbourPair, audit_pair
from beamsynth.transforms.noise import RandomSource

pytestmark = pytest.mark.audit

K, GAMMA, EPS0, T = 10, 2.0, 1.0, 5
SHAPE = (3, 5, 2)
EPS1, DELTA1 = P.theorem1_guarantee(k=K, gamma=GAMMA, epsilon0=EPS0, t=T)


def _generator() -> P.NetworkGenerator:
    """Copies column 0, resamples 2 then 1 (parents: 2 ← 0, 1 ← (0, 2))."""
    rs = RandomSource(seed=11)
    parents = ((), (0, 2), (0,))
    tables = []
    for i, ps in enumerate(parents):
        rows = int(np.prod([SHAPE[p] for p in ps])) if ps else 1
        t = 0.1 + rs.child(i).uniform(rows * SHAPE[i]).reshape(rows, SHAPE[i])
        tables.append(t / t.sum(axis=1, keepdims=True))
    return P.NetworkGenerator(structure=P.PlausibleStructure(parents=parents, order=(0, 2, 1)), shape=SHAPE,
                              conditionals=tables, omega=2)


GEN = _generator()


SHARDS = 4


def _released(seeds: np.ndarray, runs: int, rs: RandomSource, *, randomized: bool) -> int:
    """How many of ``runs`` independent invocations release their candidate: uniform seeds, the
    generator, then the pipeline's fast-path DoFns on hashed shards (no runner)."""
    if len(seeds) == 0:
        return 0
    y, logp = GEN.generate(seeds[rs.child("seed").integers(len(seeds), runs)], rs.child("generate"))
    counts: dict[int, list] = {}
    for shard, kc in plausible_filter._KeyCountsFn(SHARDS).process(EncodedBatch(seeds), GEN):
        counts.setdefault(shard, []).append(kc)
    merge = plausible_filter._MergeKeyCountsFn()
    keyed: dict[int, list] = {}
    for shard, ck in plausible_filter._KeyCandidatesFn(SHARDS).process(P.CandidateBatch(y, logp, "audit"), GEN):
        keyed.setdefault(shard, []).append(ck)
    test = plausible_filter._FastTestFn(k=K, epsilon0=EPS0 if randomized else None, max_plausible=None, max_check=None,
                         seed=int(rs.child("test-seed").integers(2**62, 1)[0]))
    released = 0
    for shard, cands in keyed.items():
        table = merge.extract_output(merge.add_input(merge.create_accumulator(), counts[shard][0])) \
            if shard in counts else None
        for out in test.process((shard, {"counts": [table], "candidates": cands}), len(seeds),
                                window=GlobalWindow()):
            if isinstance(out, EncodedBatch):
                released += len(out)
    return released


def _release_bits(seeds: np.ndarray, runs: int, rs: RandomSource, *, randomized: bool) -> np.ndarray:
    """One 0/1 per invocation (the invocations are i.i.d., so only the count matters)."""
    r = _released(seeds, runs, rs, randomized=randomized)
    return np.r_[np.ones(r), np.zeros(runs - r)]


def _case(randomized: bool) -> AuditCase:
    rows = [(1, 2, 0)] * (K - 1)
    pairs = (
        NeighbourPair("k-1 seeds sharing the copied value + one more (k' crosses k)",
                      np.array(rows, np.int64), np.array(rows + [(1, 4, 1)], np.int64)),
        NeighbourPair("k-1 seeds + one outlier", np.array(rows, np.int64), np.array(rows + [(2, 0, 0)], np.int64)),
    )
    return AuditCase(
        name="plausible, seed-resampling network generator" + ("" if randomized else " (Test 1)"),
        epsilon=EPS1, delta=DELTA1, run=lambda d, rs: _release_bits(d, 1, rs, randomized=randomized)[0],
        pairs=pairs, statistic=lambda r, p: float(r), thresholds=(1,),
        batch=lambda d, p, n, rs: _release_bits(d, n, rs, randomized=randomized))


@pytest.mark.parametrize("i", [0, 1])
def test_network_generator_release_stays_below_theorem1(i):
    case = _case(True)
    r = audit_pair(case, case.pairs[i], runs=40_000, rs=RandomSource(seed=2026).child(i))
    assert r.passed, f"{r.row()} exceeds ε₁ = {EPS1}"


def test_audit_catches_test1_with_the_network_generator():
    case = _case(False)
    r = audit_pair(case, case.pairs[0], runs=2000, rs=RandomSource(seed=99))
    assert not r.passed and r.epsilon_lower_bound > EPS1


def test_privbayes_generator_plan_states_per_record_and_dataset_guarantees():
    cfg = SynthesisConfig(input="unused.csv", schema=load_schema("adult"), output="/tmp/unused.csv",
                          epsilon=4000.0, delta=1e-6, method="plausible", rows=3000,
                          options={"generator": "privbayes", "k": 50, "gamma": 4.0, "epsilon0": 1.0, "omega": 9,
                                   "pd_model_fraction": 0.00025})
    plan = plan_synthesis(cfg)  # builds no pipeline and reads nothing
    spends = {s.step: s for s in plan.accountant.spends}
    model = sum(s.budget.epsilon for k, s in spends.items() if k.startswith("plausible.model."))
    assert model == pytest.approx(1.0)  # the PrivBayes model at ε = 1 (its own split of it)
    cand = spends["plausible.candidates"]
    eps1, delta1 = P.theorem1_guarantee(k=50, gamma=4.0, epsilon0=1.0, t=25)
    c = cand.details["C"]
    assert cand.budget.epsilon == pytest.approx(c * eps1) and c > 3000
    rows = plan.method.details()["release_guarantee"]["side_by_side"]
    assert [r["epsilon"] for r in rows] == pytest.approx([eps1, c * eps1, c * eps1 + 1.0])
    assert [r["delta"] for r in rows] == pytest.approx([delta1, cand.budget.delta, cand.budget.delta])
    assert rows[-1]["epsilon"] == pytest.approx(plan.accountant.spent_epsilon)
