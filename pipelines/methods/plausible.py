"""``--method plausible``: plausible-deniability synthesis (seed 001) as a ``synthesize`` method.

Wires :mod:`beamsynth.transforms.plausible`: split → DP Bayesian network → candidates from seeds →
privacy test → released records. Unlike model-sampling methods it needs the seed records, so it
implements the optional :meth:`Method.expand_tables` hook (``rows`` = number of candidates).
See ``docs/plausible.md``.
"""

from __future__ import annotations

import argparse
import copy
import math
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import pyarrow as pa

from beamsynth.pipelines.io.metrics import run_counters
from beamsynth.pipelines.methods.options import Limit
from beamsynth.pipelines.methods.privbayes import (
    PrivBayesRunTime,
    choice_counter_names,
    refine_picks,
    run_time_choices,
    with_refine_picks,
    with_run_time_choices,
)
from beamsynth.pipelines.methods.registry import Method, register
from beamsynth.schemas.schema import EncodedBatch, Schema
from beamsynth.transforms.budget import ApproxDP, BudgetExceededError, PureDP
from beamsynth.transforms.conventions import display_items, element_types
from beamsynth.transforms.measure import combine_globally
from beamsynth.transforms.noise import RandomSource, run_seed
from beamsynth.transforms.plausible_filter import (
    REJECT_BELOW_K,
    REJECT_NOISY_THRESHOLD,
    GenerateCandidates,
    PlausibleDeniabilityFilter,
    RejectedCandidates,
)
from beamsynth.transforms.plausible_learn import (
    DEFAULT_MAX_RECORDS,
    DPPlausibleBayesNet,
    DPPrivBayesGenerator,
)
from beamsynth.transforms.plausible_model import PlausibleModel
from beamsynth.transforms.plausible_privacy import (
    candidate_bound,
    candidate_release_cost,
    theorem1_guarantee,
)
from beamsynth.transforms.plausible_split import OrderReleased, SplitForPlausible
from beamsynth.transforms.privbayes_measure import (
    REFINE_PICK_PREFIX,
    refine_pick_choices,
    sizing_choices,
)
from beamsynth.transforms.synthesis import _CountRowsFn, codes_to_table

__all__ = ["GENERATORS", "PlausibleMethod", "PlausibleSynthesis"]

GENERATORS = ("privbayes", "cfs")
"""Seed-based generators: ``privbayes`` (default: the PrivBayes model with its refinement, fitted
into a seed-resampling network; Adult at model ε = 1, ω = 9: accuracy 0.80-0.83, AUC 0.84-0.87)
and ``cfs`` (the paper's CFS network, Sections 3.3-3.4; AUC 0.51 there). docs/plausible.md."""

_DEFAULTS: dict[str, Any] = {
    "k": 50, "gamma": 4.0, "epsilon0": 1.0, "omega": None, "plausible_test": "randomized",
    "plausible_t": None, "max_plausible": None, "max_check_plausible": None,
    "plausible_split": None, "pd_max_parents": 3, "pd_max_cost": 1000, "pd_alpha": 1.0,
    "pd_max_records": DEFAULT_MAX_RECORDS, "pd_generic": False, "pd_model_fraction": 0.1,
    "allow_non_dp": False, "generator": "privbayes",
}
DEFAULT_SPLITS = {"privbayes": "0.3,0.2,0.5", "cfs": "0.5,0.2,0.3"}
"""Default ``seeds,structure,params`` fractions per generator. ``cfs``: the paper's split (Section
3.5). ``privbayes`` fits one model on D_T ∪ D_P (the 0.2/0.5 ratio does not matter), whose quality
at ε = 1 limits the released rows' ML scores, while the pass rate has room: 70% of the records to
the model (Adult, seeds 1-6: accuracy mean 0.818, min 0.810, pass 68-71%; with 0.5 seeds 0.810,
min 0.796, pass 75-78%; docs/plausible.md)."""
TAIL_DELTA_FRACTION = 0.1
"""Share of the user's δ given to ``δ_tail = P(Poisson(rows) > C)`` (the bound on invocations)."""
COUNTS_NOTE = ("released is the output's own size (public); candidates, tested and pass_rate are 0 "
               "whenever the seed split D_S is empty and Poisson(rows) otherwise, so they would reveal "
               "an empty D_S: they are in the manifest's private operational part, with the "
               "per-reason rejection counts")
"""Why a manifest's public part carries ``released`` only (CLI and API)."""
NON_DP_WARNING = ("NOT DIFFERENTIALLY PRIVATE: the released records passed Privacy Test 1 "
                  "(deterministic, --allow-non-dp), which gives (k, γ)-plausible deniability only. "
                  "The budget covers the model alone; the records carry no DP guarantee.")


class _DecodeFn(beam.DoFn):
    """``(label, EncodedBatch)`` from :class:`OrderReleased` → a table carrying that label."""

    def __init__(self, schema: Schema, seed: int | None) -> None:
        self._schema, self._seed = schema, seed

    def process(self, element: tuple[str, EncodedBatch]):
        from beamsynth.schemas.tables import label_part

        label, batch = element  # the label holds the window and the shard
        rs = RandomSource(seed=self._seed).child("plausible.decode", label)
        yield label_part(codes_to_table(self._schema, batch.codes, rs), label)


@element_types(input=EncodedBatch, outputs={"tables": pa.Table, "released": EncodedBatch,
                                            "rejected": RejectedCandidates,
                                            "model": PlausibleModel})
class PlausibleSynthesis(beam.PTransform):
    """Records → released synthetic tables (Mechanism 1 with Privacy Test 1 or 2), one composite.

    Input: ``PCollection[EncodedBatch]`` (bounded). Side: ``rows`` (``PCollection[int]``, the number
    of candidates). Output: ``{"tables": PCollection[pyarrow.Table], "released":
    PCollection[EncodedBatch], "rejected": PCollection[RejectedCandidates], "model": ...}``.
    The ``rejected`` candidates were generated from private seeds and failed the test: count them,
    **never write them**. The tables come out in :class:`OrderReleased` order (``order_shards``
    public shards by value, each sorted then permuted with the run's randomness), so the written
    file's row order does not depend on the input order. ``generator``: ``"cfs"`` (the paper's
    network, :class:`~beamsynth.transforms.plausible.DPPlausibleBayesNet`) or ``"privbayes"``
    (:class:`~beamsynth.transforms.plausible.DPPrivBayesGenerator` on the two model splits,
    ``model_rows`` its public size for the sizing); both are seed-resampling networks and take the
    fast path. Privacy: see :mod:`beamsynth.transforms.plausible`.
    """

    def __init__(self, *, schema: Schema, rows, budget: PureDP, k: int, gamma: float,
                 epsilon0: float | None, omega: int, fractions=(0.5, 0.2, 0.3),
                 max_plausible: int | None = None, max_check_plausible: int | None = None,
                 max_parents: int = 3, max_cost: int = 1000, alpha: float = 1.0,
                 max_records: int = DEFAULT_MAX_RECORDS, max_contributions: int = 1,
                 fast_path: bool = True, seed: int | None = None, order_shards: int = 16,
                 generator: str = "cfs", model_rows: int | None = None,
                 label: str | None = None) -> None:
        super().__init__(label)
        if generator not in GENERATORS:
            raise ValueError(f"generator ({generator!r}) must be one of {GENERATORS}")
        self._schema, self._rows, self._seed = schema, rows, run_seed(seed)
        self._order_shards = order_shards
        self._split = SplitForPlausible(fractions=fractions, seed=seed)
        if generator == "privbayes":  # PrivBayes on D_T ∪ D_P, fitted into a seed-resampling network
            self._model = DPPrivBayesGenerator(schema=schema, budget=budget, omega=omega, rows=model_rows,
                                               max_contributions=max_contributions, seed=seed)
        else:
            self._model = DPPlausibleBayesNet(
                shape=schema.shape, budget=budget, omega=omega, max_parents=max_parents, max_cost=max_cost,
                alpha=alpha, max_records=max_records, max_contributions=max_contributions, seed=seed,
                params_ratio=float(fractions[2]) / float(fractions[1]))
        self._test_args = dict(k=k, gamma=gamma, epsilon0=epsilon0, max_plausible=max_plausible,
                               max_check_plausible=max_check_plausible, fast_path=fast_path, seed=seed)

    def display_data(self) -> dict[str, Any]:
        """The model's and the privacy test's parameters (never data values)."""
        items = self._model.display_data()
        test = self._test_args
        items.update(display_items(
            mechanism="plausible deniability (Mechanism 1: DP Bayesian network + privacy test)",
            k=test["k"], gamma=test["gamma"], epsilon0=test["epsilon0"],
            order_shards=self._order_shards))
        return items

    @property
    def measured(self) -> Any:
        """The PrivBayes generator's measurements (after :meth:`expand`; None for cfs): its
        run-time choices for the manifest (H72)."""
        return getattr(self._model, "measured", None)

    def expand(self, batches):
        parts = batches | "Split" >> self._split
        # seeds / structure / params: EncodedBatch (disjoint)
        model = {"structure": parts["structure"], "params": parts["params"]} | "Model" >> self._model
        # PlausibleModel (singleton): PlausibleBayesNet (cfs) or NetworkGenerator (privbayes)
        n_seeds = combine_globally(parts["seeds"], _CountRowsFn(), "CountSeeds")
        # int |D_S|
        cands = parts["seeds"] | "Candidates" >> GenerateCandidates(
            model=model, rows=self._rows, n_seeds=n_seeds, seed=self._seed)
        # CandidateBatch
        tested = cands | "PrivacyTest" >> PlausibleDeniabilityFilter(
            records=parts["seeds"], model=model, **self._test_args)
        # released: EncodedBatch; rejected: RejectedCandidates (never written)
        ordered = tested["released"] | "Order" >> OrderReleased(
            shape=self._schema.shape, shards=self._order_shards, seed=self._seed)
        # (label, EncodedBatch): a function of the released multiset and the run's randomness,
        # never of the input order or its partitioning (candidates come out per seed)
        tables = ordered | "Decode" >> beam.ParDo(_DecodeFn(self._schema, self._seed))
        # pyarrow.Table labelled (window, shard): the parts' order in a single-file write
        released = ordered | "ReleasedBatches" >> beam.Map(lambda kv: kv[1])
        # EncodedBatch in release order (what the tables hold), never the per-seed emission
        return {"tables": tables, "released": released, "rejected": tested["rejected"],
                "model": model}


def _add(parser: argparse._ActionsContainer, flag: str, **kw: Any) -> None:
    """Add an option unless another method already defined the same flag (shared namespace)."""
    if flag in getattr(parser, "_option_string_actions", {}):
        return
    parser.add_argument(flag, **kw)


@register
class PlausibleMethod(Method):
    """Plausible deniability (Bindschaedler, Shokri, Gunter, VLDB 2017).

    Budget (spent here, before any data is read): the model gets ``pd_model_fraction`` of ε, pure
    (``--generator privbayes``, the default: PrivBayes's own spends as ``plausible.model.*``,
    sized from ``--input-rows`` scaled to the model split or a DP count; ``--generator cfs``: one
    ``plausible.model`` spend); the candidates released through Privacy Test 2 are charged
    ``(C·ε₁, C·δ₁ + δ_tail)`` (``plausible.candidates``, :func:`candidate_release_cost`) with
    ``δ_tail = TAIL_DELTA_FRACTION·δ``, which needs a public ``rows``. Privacy Test 1 is refused
    unless ``allow_non_dp``; then only the model is charged and the manifest says the records are
    NOT differentially private.
    """

    name = "plausible"
    non_dp_warning: str | None = None
    # ranges in the caller's words (Method.__init__); those depending on the schema or on other
    # options (omega <= columns, plausible_t < k, max_plausible >= k) are checked below
    option_limits = {
        "k": Limit(1), "gamma": Limit(1, None, True), "epsilon0": Limit(0, None, True),
        "omega": Limit(1), "plausible_t": Limit(1), "max_plausible": Limit(1),
        "max_check_plausible": Limit(1), "pd_max_parents": Limit(0), "pd_max_cost": Limit(1),
        "pd_alpha": Limit(0, None, True), "pd_max_records": Limit(2),
        "pd_model_fraction": Limit(0, 1, True, True), "input_rows": Limit(0)}
    description = "seed-based synthesis released through the plausible-deniability privacy test"

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        o = {key: (self.options.get(key) if self.options.get(key) is not None else d)
             for key, d in _DEFAULTS.items()}
        m = len(self.schema.columns)
        # kinds, ranges (option_limits) and choices were checked once, for every caller, in the
        # caller's words by Method.__init__ (options.check_option_values, H73); only what needs
        # the schema or another option is checked here (H78: no second check of the same range)
        self.k = int(o["k"])
        self.gamma = float(o["gamma"])
        self.test = str(o["plausible_test"])
        self.epsilon0 = float(o["epsilon0"])
        self.omega = m if o["omega"] is None else int(o["omega"])
        if self.omega > m:
            raise ValueError(f"{self.say.option('omega', self.omega)} must be in [1, {m}] (the "
                             f"schema has {m} columns)")
        self.t = max(1, self.k // 2) if o["plausible_t"] is None else int(o["plausible_t"])
        if self.test == "randomized" and not (self.k >= 2 and self.t < self.k):
            raise ValueError(f"{self.say.option('plausible_t', self.t)} must be in [1, k-1] with "
                             f"{self.say.option('k', self.k)} >= 2")
        self.max_plausible = None if o["max_plausible"] is None else int(o["max_plausible"])
        if self.max_plausible is not None and self.max_plausible < self.k:
            raise ValueError(f"{self.say.option('max_plausible', self.max_plausible)} must be an "
                             f"int >= {self.k} ({self.say.option('k', self.k)})")
        self.max_check = None if o["max_check_plausible"] is None else int(o["max_check_plausible"])
        self.generator = str(o["generator"])
        split = o["plausible_split"] if o["plausible_split"] is not None else DEFAULT_SPLITS[self.generator]
        try:
            self.fractions = tuple(float(x) for x in str(split).split(","))
        except ValueError:
            raise ValueError(f"{self.say.option('plausible_split', split)} must be three numbers "
                             "'seeds,structure,params'") from None
        if len(self.fractions) != 3 or min(self.fractions) <= 0:
            raise ValueError(f"{self.say.option('plausible_split', split)} must be three numbers > 0")
        self.max_parents = int(o["pd_max_parents"])
        self.max_cost = int(o["pd_max_cost"])
        self.alpha = float(o["pd_alpha"])
        self.max_records = int(o["pd_max_records"])
        self.fast_path = not bool(o["pd_generic"])
        if not self.fast_path and self.max_check is None:
            self.max_check = 10_000
        self.model_fraction = float(o["pd_model_fraction"])
        self.allow_non_dp = bool(o["allow_non_dp"])
        input_rows = self.options.get("input_rows")
        # public input size → the model split's expected size, only to size the PrivBayes network
        self.model_rows = None if input_rows is None else int(
            round(input_rows * sum(self.fractions[1:]) / sum(self.fractions)))
        self.rows = self.options.get("rows")
        if self.test == "deterministic":
            if not self.allow_non_dp:
                raise ValueError(
                    f"{self.say.option('plausible_test', 'deterministic')} (Privacy Test 1) gives (k, γ)-plausible deniability "
                    "but no differential privacy; use the randomized test (default) or pass "
                    f"{self.say.option('allow_non_dp', True)} to release records that are NOT DP")
            self.model_budget = PureDP(epsilon=self.budget.epsilon)
            self.candidate_cost = None
            self.non_dp_warning = NON_DP_WARNING  # run_synthesis puts it at the top of the release part
        else:
            if self.rows is None or isinstance(self.rows, bool) or not isinstance(self.rows, int) or self.rows < 0:
                raise ValueError(
                    f"method 'plausible' needs a public {self.say.option('rows')} (got {self.rows!r}): the cost of the privacy "
                    "test is composed over a bound on the Poisson(rows) candidates, which must not "
                    "depend on the data (a DP row count would make it adaptive)")
            self.model_budget = PureDP(epsilon=self.model_fraction * self.budget.epsilon)
            self.candidate_cost = self._plan_candidates()
        if self.generator == "privbayes":
            self._spend_privbayes_model()
        else:
            self._spend_cfs_model()
        self._spend_candidates()
        self._metrics: dict[str, int] = {}

    def _spend_privbayes_model(self) -> None:
        """The PrivBayes generator's spends (``plausible.model.*``: its own accounting, on the
        model splits D_T ∪ D_P only)."""
        probe = DPPrivBayesGenerator(
            schema=self.schema, budget=self.model_budget, omega=self.omega, rows=self.model_rows,
            max_contributions=self.max_contributions, seed=self.seed, accountant=self.accountant,
            spend_prefix="plausible.model")
        self.model_plan = probe.plan.details()
        self._model_plan = probe.plan  # its run-time choices (H72): run_time_details, details

    def _spend_cfs_model(self) -> None:
        """The paper's CFS network (``plausible.model``: entropies on D_T, tables on D_P)."""
        self._transform_probe = DPPlausibleBayesNet(
            shape=self.schema.shape, budget=self.model_budget, omega=self.omega,
            max_parents=self.max_parents, max_cost=self.max_cost, alpha=self.alpha,
            max_records=self.max_records, max_contributions=self.max_contributions, seed=self.seed,
            params_ratio=self.fractions[2] / self.fractions[1])
        self.model_plan = self._model_plan = None
        mechanism = ("Laplace on n·H (structure) + discrete Laplace on conditional counts (parameters), "
                     "disjoint random splits")
        if self.candidate_cost is None:
            mechanism += " [model only; " + NON_DP_WARNING + "]"
        self.accountant.spend(
            "plausible.model", self.model_budget,
            mechanism=mechanism,
            details={
                "composition": "parallel over disjoint splits D_T (structure) and D_P (parameters); "
                               "sequential within each",
                "model_fraction": self.model_fraction if self.candidate_cost is not None else 1.0,
                "structure_entropy_scale": self._transform_probe.entropy_scale,
                "structure_count_epsilon": 0.1 * self.model_budget.epsilon,
                "entropy_sum_sensitivity": "log2 N + (N-1)·log2(N/(N-1)), N = max_records",
                "max_records": self.max_records,
                "parameter_scale": self._transform_probe.param_scale,
                "parameter_sensitivity_per_table": self.max_contributions,
                "split_fractions": {"seeds": self.fractions[0], "structure": self.fractions[1],
                                    "params": self.fractions[2]},
                "paper": "Bindschaedler, Shokri, Gunter, VLDB 2017, Sections 3.3-3.5",
            },
        )

    def _spend_candidates(self) -> None:
        """Privacy Test 2 over the candidates (``plausible.candidates``), whatever the generator."""
        if self.candidate_cost is not None and self.candidate_cost["C"] > 0:
            cc = self.candidate_cost
            self.accountant.spend(
                "plausible.candidates", ApproxDP(epsilon=cc["epsilon"], delta=cc["delta"]),
                mechanism="Privacy Test 2 (randomized threshold k + Lap(1/ε0)) per candidate, Theorem 1, "
                          "basic composition over C ≥ Poisson(rows) invocations except with prob. δ_tail",
                details={key: cc[key] for key in ("theorem", "per_invocation", "per_unit_invocation",
                                                  "rows", "C", "tail_delta")}
                | {"formula": "(C·ε₁, C·δ₁ + δ_tail), ε₁ = ε0 + ln(1 + γ/t), δ₁ = exp(-ε0(k - t)), "
                              "C = min{c : P(Poisson(rows) > c) ≤ δ_tail}",
                   "composition_with_model": "sequential (conservative; D_S is disjoint from the "
                                             "model's splits)"},
            )

    def _cost(self, rows: int, tail: float, **params: Any) -> dict[str, Any]:
        args = {"k": self.k, "gamma": self.gamma, "epsilon0": self.epsilon0, "t": self.t} | params
        return candidate_release_cost(rows=rows, tail_delta=tail, max_contributions=self.max_contributions,
                                      **args)

    def _plan_candidates(self) -> dict[str, Any]:
        """The candidate release's (ε, δ) (:func:`candidate_release_cost`) checked against the
        user's budget minus the model's share; raises :class:`BudgetExceededError` before any data
        is read, saying what the requested rows need and what would fit."""
        rows = self.rows
        eps_avail = self.budget.epsilon - self.model_budget.epsilon
        delta_avail = self.budget.delta
        if delta_avail > 0:
            cost = self._cost(rows, TAIL_DELTA_FRACTION * delta_avail)
            if cost["epsilon"] <= eps_avail * (1 + 1e-12) and cost["delta"] <= delta_avail * (1 + 1e-12):
                return cost
        # what the requested rows need: δ solves C(δ_tail = f·δ)·δ_u + f·δ = δ (fixed point, increasing)
        delta_u = self._cost(0, 0.5)["per_unit_invocation"]["delta"]
        need_d = max(delta_u * max(rows, 1) / (1 - TAIL_DELTA_FRACTION), 1e-300)
        for _ in range(30):
            need_d = max(candidate_bound(rows, min(0.5, TAIL_DELTA_FRACTION * need_d)) * delta_u
                         / (1 - TAIL_DELTA_FRACTION), 1e-300)
        need = self._cost(rows, min(0.5, TAIL_DELTA_FRACTION * (delta_avail if delta_avail > 0 else need_d)))
        need_e_total = need["epsilon"] / (1 - self.model_fraction)
        msg = (f"method 'plausible': releasing the Poisson({rows}) candidates through Privacy Test 2 costs "
               f"(C·ε₁, C·δ₁ + δ_tail) = ({need['epsilon']:.6g}, {need['delta']:.3g}) with C = {need['C']} "
               f"invocations of Mechanism 1 (Theorem 1: ε₁ = {need['per_unit_invocation']['epsilon']:.4g}, "
               f"δ₁ = {need['per_unit_invocation']['delta']:.3g} per candidate, k={self.k}, γ={self.gamma:g}, "
               f"ε0={self.epsilon0:g}, t={self.t}), but after the model's share "
               f"({self.say.option('pd_model_fraction', self.model_fraction)}) only ε={eps_avail:.6g}, δ={delta_avail:.3g} "
               f"remain. The requested rows need a total ε ≥ {need_e_total:.6g} and δ ≥ {need_d * 1.01:.3g}")
        if delta_avail > 0:
            tail = TAIL_DELTA_FRACTION * delta_avail

            def fits(r: int) -> bool:
                c = self._cost(r, tail)
                return c["epsilon"] <= eps_avail and c["delta"] <= delta_avail

            lo, hi = 0, rows
            while lo < hi:  # the largest rows that fit (the cost is monotone in rows)
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
            msg += f"; with these parameters at most {self.say.option('rows', lo)} fits"
            bound = max(need["C"], 1)
            target = eps_avail / (bound * self.max_contributions)  # per-record ε₁ that would fit
            if target > 0:
                e0 = target / 2
                t = max(1, math.ceil(self.gamma / math.expm1(target / 2)))
                while math.log1p(self.gamma / t) > target - e0:
                    t += 1
                e0 = target - math.log1p(self.gamma / t)
                slack = (1 - TAIL_DELTA_FRACTION) * delta_avail / (bound * self.max_contributions
                                                                   * math.exp((self.max_contributions - 1) * target))
                k = t + max(1, math.ceil(-math.log(slack) / e0)) if slack < 1 else t + 1
                alt = self._cost(rows, tail, k=k, epsilon0=e0 * (1 - 1e-9), t=t)
                k_max = self._feasible_k(rows)
                if k > k_max:  # no data set of about `rows` records has k plausible seeds
                    msg += self._cheapest_feasible(rows, tail, k_max, slack)
                elif alt["epsilon"] <= eps_avail and alt["delta"] <= delta_avail:
                    msg += (f"; the requested rows would fit with k={k}, t={t}, γ={self.gamma:g}, "
                            f"ε0={e0 * (1 - 1e-9):.4g} (per-candidate ε₁ ≤ {target:.3g})")
        else:
            msg += f"; Privacy Test 2 has δ₁ > 0, so pass {self.say.option('delta')}"
        raise BudgetExceededError(msg)

    def _feasible_k(self, rows: int) -> int:
        """The largest k a data set of about ``rows`` records can meet: its seed split holds
        about ``rows · seeds share`` records (public: the requested rows, not from the data)."""
        return max(2, int(rows * self.fractions[0] / sum(self.fractions)))

    def _cheapest_feasible(self, rows: int, tail: float, k_max: int, slack: float) -> str:
        """The smallest total ε releasing ``rows`` candidates with a feasible k ≤ ``k_max``
        (t and ε0 chosen for it), as the end of the refusal message."""
        best = None
        for t in sorted({max(1, min(k_max - 1, round(k_max * f))) for f in
                         [i / 200 for i in range(1, 200)]} | {1, k_max - 1}):
            e0 = -math.log(min(slack, 0.5)) / (k_max - t)  # δ₁ = exp(-ε0 (k - t)) ≤ slack
            eps1 = e0 + math.log1p(self.gamma / t)
            if best is None or eps1 < best[0]:
                best = (eps1, t, e0)
        _, t, e0 = best  # type: ignore[misc]
        cost = self._cost(rows, tail, k=k_max, epsilon0=e0, t=t)
        total = cost["epsilon"] / (1 - self.model_fraction)
        say = self.say
        return (f"; no feasible k gets there: k can be at most about {k_max} (the seed share of a "
                f"data set of about {rows} records, as {say.option('rows', rows)} requests), and "
                f"with k={k_max}, t={t}, γ={self.gamma:g}, ε0={e0:.4g} the requested rows need a "
                f"total ε ≥ {total:.4g}; release fewer rows ({say.option('rows')}), or use "
                f"{say.method('independent')} or {say.method('privbayes')}, whose cost does not "
                "grow with the rows released")

    @classmethod
    def add_arguments(cls, parser: argparse._ActionsContainer) -> None:
        _add(parser, "--k", type=int, default=None, help="plausible: k, plausible seeds needed (default 50)")
        _add(parser, "--gamma", type=float, default=None, help="plausible: γ > 1 (default 4)")
        _add(parser, "--epsilon0", type=float, default=None,
             help="plausible: ε0 of the randomized threshold k + Lap(1/ε0) (default 1)")
        _add(parser, "--omega", type=int, default=None,
             help="plausible: attributes resampled from a seed (default: all)")
        _add(parser, "--plausible-test", choices=["randomized", "deterministic"], default=None,
             help="plausible: Privacy Test 2 (randomized, DP; default) or Test 1 (deterministic, no DP)")
        _add(parser, "--plausible-t", type=int, default=None,
             help="plausible: t of Theorem 1 for the reported (ε, δ) (default k//2)")
        _add(parser, "--max-plausible", type=int, default=None, help="plausible: stop counting at this k'")
        _add(parser, "--max-check-plausible", type=int, default=None,
             help="plausible: examine at most this many seed records per candidate")
        _add(parser, "--plausible-split", default=None,
             help="plausible: fractions seeds,structure,params (default 0.3,0.2,0.5 with --generator "
                  "privbayes, 0.5,0.2,0.3 with cfs)")
        _add(parser, "--pd-max-parents", type=int, default=None, help="plausible: max parents (default 3)")
        _add(parser, "--pd-max-cost", type=int, default=None,
             help="plausible: max parent configurations per attribute (default 1000)")
        _add(parser, "--pd-alpha", type=float, default=None, help="plausible: Dirichlet prior α (default 1)")
        _add(parser, "--pd-max-records", type=int, default=None,
             help="plausible: declared bound on records (entropy sensitivity; default 1e9); a larger "
                  "structure split is measured as if scaled to it, never an error")
        _add(parser, "--pd-model-fraction", type=float, default=None,
             help="plausible: share of ε for the model (default 0.1); the rest must cover the privacy "
                  "test's Theorem 1 cost composed over the candidates")
        _add(parser, "--allow-non-dp", action="store_true", default=None,
             help="plausible: allow --plausible-test deterministic, whose released records are NOT "
                  "differentially private (the manifest says so)")
        _add(parser, "--generator", choices=GENERATORS, default=None,
             help="plausible: seed-based generator: privbayes (default; the PrivBayes model with its "
                  "refinement, fitted into a seed-resampling network) or cfs (the paper's CFS network)")
        _add(parser, "--input-rows", dest="input_rows", type=int, default=None,
             help="plausible (privbayes generator): a public number of input records, used only to "
                  "size the PrivBayes model on its split; without it PrivBayes spends 2%% of the "
                  "model's ε on a DP count")
        _add(parser, "--pd-generic", action="store_true", default=None,
             help="plausible: use the generic privacy-test path (sampled seeds) instead of the fast path")

    def expand_model(self, batches):
        """The plausible method releases records directly; see :meth:`expand_tables`."""
        raise NotImplementedError("plausible releases records through expand_tables, not a model")

    def expand_tables(self, batches, rows):
        from beamsynth.runners.presets import is_beam_dask

        if is_beam_dask(batches.pipeline.options):  # beamsynth's DaskRunner (--runner dask) runs it
            raise ValueError("method 'plausible' needs multi-output ParDos (released/rejected), which "
                             "Beam's own DaskRunner gets wrong; use --runner dask (beamsynth's "
                             "DaskRunner), direct, Flink, Spark or Dataflow")
        synth = PlausibleSynthesis(
            schema=self.schema, rows=rows, budget=self.model_budget, k=self.k, gamma=self.gamma,
            epsilon0=self.epsilon0 if self.test == "randomized" else None, omega=self.omega,
            fractions=self.fractions, max_plausible=self.max_plausible,
            max_check_plausible=self.max_check, max_parents=self.max_parents, max_cost=self.max_cost,
            alpha=self.alpha, max_records=self.max_records, max_contributions=self.max_contributions,
            fast_path=self.fast_path, seed=self.seed, generator=self.generator,
            model_rows=self.model_rows)
        out = batches | "Plausible" >> synth
        choices = () if synth.measured is None else (
            synth.measured | "ModelChoices" >> beam.FlatMap(_model_choice_items),)
        self.run_counts = ((out["released"] | "CountReleased" >> beam.Map(_released_items),
                            out["rejected"] | "CountRejected" >> beam.FlatMap(_rejected_items),
                            *choices)
                           | "RunCounts" >> beam.Flatten())
        # (field, n) per window: released / tested totals, per-reason rejections (for the API
        # manifest, pipelines/job.py; the CLI reads the same totals from Beam metrics)
        return out["tables"]

    @property
    def run_time_details(self) -> PlausibleRunTime:
        """The API/YAML manifests' hook over :attr:`run_counts` (picklable: the model's plan)."""
        return PlausibleRunTime(self._model_plan)

    @staticmethod
    def released_details(details: dict[str, Any], totals: dict[str, int],
                         per_window: dict[str, dict[str, int]] | None = None, *,
                         every_window: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
        """The API manifest's run-time figures from :attr:`run_counts` (``field → n``, summed
        over the job and per declared window start): ``(public details, private part)``.

        Public: ``released`` (the output's own size, also per window). Private: ``tested`` (=
        ``candidates``: every candidate is tested once), ``pass_rate`` and the per-reason
        rejections. ``tested`` is Poisson(rows) whatever the data only while the seed split D_S
        is non-empty; an empty D_S gives 0 candidates (measured: 2 records → 0 tested, the same
        plus one record → 113 tested at rows=100, 0 released in both), so it would reveal that
        D_S (or a window's D_S) is empty and stays private here. ``every_window=False`` (an
        open-ended declared range: only windows with counts are known) lists publicly only the
        windows that released rows, as a window with seeds but no released row must look like
        an empty one."""
        def figures(c: dict[str, int]) -> dict[str, Any]:
            released = int(c.get("released", 0))
            tested = released + int(c.get("rejected", 0))
            return {"candidates": tested, "tested": tested, "released": released,
                    "pass_rate": released / tested if tested else None,
                    "rejection_reasons": {r: int(c.get(f"rejected_{r}", 0))
                                          for r in (REJECT_BELOW_K, REJECT_NOISY_THRESHOLD)}}

        private = figures(totals)
        # the CLI's composition over the tested count (a diagnostic on private data: H76)
        unit = (details.get("release_guarantee") or {})
        unit = unit.get("per_unit") or unit.get("per_record")
        if unit is not None:
            private["composed_over_tested"] = {
                "epsilon": private["tested"] * unit["epsilon"],
                "delta": min(1.0, private["tested"] * unit["delta"])}
        public = dict(details)  # details() states no tested count (COUNTS_NOTE)
        public["released"] = private["released"]
        public["counts_note"] = COUNTS_NOTE
        if per_window is not None:
            windows = {start: figures(c) for start, c in per_window.items()}
            public["released_per_window"] = [{"window_start": start, "released": w["released"]}
                                             for start, w in windows.items()
                                             if every_window or w["released"]]
            private["per_window"] = [{"window_start": start, **w} for start, w in windows.items()]
        private["note"] = "exact counts on private data, not covered by the DP guarantee"
        return public, private

    def collect_metrics(self, result: Any) -> None:
        names = ["plausible_candidates", "plausible_tested", "plausible_released",
                 f"plausible_rejected_{REJECT_BELOW_K}", f"plausible_rejected_{REJECT_NOISY_THRESHOLD}"]
        found = run_counters(result)
        if found is not None:  # runners without metrics leave the entries out
            self._metrics.update({n: found.get(n, 0) for n in names})
        found = found or {}
        plan = self._model_plan  # the PrivBayes generator sized from its own DP count (H72)
        if plan is not None and plan.sizing is not None and plan.sizing.rows is None:
            self._model_choices = run_time_choices(plan, {
                name: found.get(name, 0) for name in choice_counter_names(plan)})
        # the generator's refinement picks (DP outputs, as PrivBayes' own: refine.picks)
        self._model_picks = refine_picks({n: v for n, v in found.items()
                                          if n.startswith(REFINE_PICK_PREFIX)})

    def release_guarantee(self, candidates: int | None = None) -> dict[str, Any]:
        """The release's guarantee: Theorem 1 per invocation of Mechanism 1 (one candidate, released
        or dropped) and the **charged** composition over the public bound ``C`` on the Poisson(rows)
        invocations (spent on the accountant at build time, ``plausible.candidates``). With
        ``candidates`` (the count actually tested, a diagnostic) the basic composition over that many
        invocations is reported too; it is at most the charged one except with probability δ_tail."""
        if self.test == "deterministic":
            return {"test": "Privacy Test 1 (deterministic)", "differential_privacy": False,
                    "WARNING": NON_DP_WARNING,
                    "note": "(k, γ)-plausible deniability only; no DP guarantee for the released records; "
                            "the accountant holds the model's spend only"}
        eps, delta = theorem1_guarantee(k=self.k, gamma=self.gamma, epsilon0=self.epsilon0, t=self.t)
        out: dict[str, Any] = {
            "test": "Privacy Test 2 (randomized threshold k + Lap(1/ε0))",
            "differential_privacy": True,
            "per_record": {"epsilon": eps, "delta": delta, "t": self.t},
            "neighbouring": "add/remove one record of the seed split D_S",
            "paper": "Theorem 1, Section 2.3 (Appendix C); checked by brute force in tests",
            "composition": "every candidate is one invocation of Mechanism 1 (released or dropped: the "
                           "number released is visible); invocations compose sequentially over the "
                           "public bound C ≥ Poisson(rows) (except with probability δ_tail), and the "
                           "result composes sequentially with the model's ε",
        }
        cc = self.candidate_cost
        out["charged"] = None if cc is None else {
            "epsilon": cc["epsilon"], "delta": cc["delta"], "C": cc["C"], "rows": cc["rows"],
            "tail_delta": cc["tail_delta"], "formula": "(C·ε₁, C·δ₁ + δ_tail)"}
        c = self.max_contributions
        if c > 1:  # a unit has up to c records in D_S (all in D_S, the split is per unit): group privacy
            eps, delta = c * eps, c * math.exp((c - 1) * eps) * delta  # δ uses the per-record ε
            out["per_unit"] = {"epsilon": eps, "delta": min(1.0, delta), "max_contributions": c,
                               "note": "group privacy over the unit's records"}
        if candidates is not None:
            out["candidates_tested"] = candidates
            out["composed"] = {"epsilon": candidates * eps, "delta": min(1.0, candidates * delta)}
        out["side_by_side"] = self._side_by_side(eps, delta)
        return out

    def _side_by_side(self, eps: float, delta: float) -> list[dict[str, Any]]:
        """Per-record (Theorem 1) and dataset-level guarantees as rows of one table (manifest and
        report): what one released candidate costs, what the whole release is charged, and that
        charge composed with the model's ε."""
        unit = "one privacy unit" if self.max_contributions > 1 else "one record"
        rows = [{"level": "per released record (Theorem 1: one invocation of Mechanism 1)",
                 "epsilon": eps, "delta": delta, "neighbours": f"add/remove {unit} of the seed split D_S"}]
        cc = self.candidate_cost
        if cc is not None:
            rows.append({"level": "dataset: every candidate (C·ε₁, C·δ₁ + δ_tail), charged",
                         "epsilon": cc["epsilon"], "delta": cc["delta"], "C": cc["C"],
                         "neighbours": f"add/remove {unit} of D_S"})
            rows.append({"level": "dataset: model + candidates (sequential composition), charged",
                         "epsilon": cc["epsilon"] + self.model_budget.epsilon, "delta": cc["delta"],
                         "neighbours": f"add/remove {unit} of the input (D_S, D_T, D_P disjoint; "
                                       "the accountant adds them)"})
        return rows

    def details(self) -> dict[str, Any]:
        warning = {"WARNING": NON_DP_WARNING, "differential_privacy": False} if self.test == "deterministic" else {}
        return warning | {
            "k": self.k, "gamma": self.gamma, "epsilon0": self.epsilon0, "omega": self.omega,
            "test": self.test, "max_plausible": self.max_plausible,
            "max_check_plausible": self.max_check, "path": "fast" if self.fast_path else "generic",
            "rows": self.rows, "model_fraction": self.model_fraction,
            "generator": self.generator,
            "model": ({"epsilon": self.model_budget.epsilon, "delta": 0.0, "generator": "privbayes",
                       "privbayes": self._model_details()} if self.generator == "privbayes" else
                      {"epsilon": self.model_budget.epsilon, "delta": 0.0, "generator": "cfs",
                       "max_parents": self.max_parents, "max_cost": self.max_cost, "alpha": self.alpha}),
            "release_guarantee": self.release_guarantee(),
            "released": self._metrics.get("plausible_released"),
            "counts_note": COUNTS_NOTE,
        }

    def _model_details(self) -> dict[str, Any] | None:
        """The PrivBayes generator's plan details, with its run-time choices after a CLI run."""
        choices = getattr(self, "_model_choices", None)
        picks = getattr(self, "_model_picks", [])
        if (choices is None and not picks) or self.model_plan is None:
            return self.model_plan
        out = copy.deepcopy(self.model_plan)
        if choices is not None:
            with_run_time_choices(out, self._model_plan, *choices)
        return with_refine_picks(out, picks)

    def operational(self) -> dict[str, Any]:
        """Exact diagnostics on private data (not DP): the candidates tested (0 exactly when the
        seed split is empty, see :data:`COUNTS_NOTE`), the pass rate, the composition over the
        tested count, and the per-reason rejection counts."""
        tested = self._metrics.get("plausible_tested")
        released = self._metrics.get("plausible_released")
        guarantee = self.release_guarantee(tested) if tested is not None else {}
        return {
            "candidates": self._metrics.get("plausible_candidates"), "tested": tested,
            "pass_rate": (released / tested) if tested and released is not None else None,
            "composed_over_tested": guarantee.get("composed"),
            "rejection_reasons": {
                REJECT_BELOW_K: self._metrics.get(f"plausible_rejected_{REJECT_BELOW_K}"),
                REJECT_NOISY_THRESHOLD: self._metrics.get(f"plausible_rejected_{REJECT_NOISY_THRESHOLD}"),
            },
            "note": "computed on private data without noise; not covered by the DP guarantee",
        }


_MODEL = "model:"
"""Prefix of the PrivBayes generator's run-time choice records among :attr:`run_counts`."""


@dataclass(frozen=True)
class PlausibleRunTime:
    """The API/YAML manifests' run-time figures: :meth:`PlausibleMethod.released_details` (the
    released rows, public; tested and rejections, private) and, for the PrivBayes generator sized
    from its own DP count, its choices in ``model.privbayes.sizing`` (the CLI's fields, public)."""

    model_plan: Any = None  # PrivBayesPlan of the generator, None for cfs

    def __call__(self, details: dict[str, Any], totals: dict[str, int],
                 per_window: dict[str, dict[str, int]] | None = None, *,
                 every_window: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
        def split(c: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
            return ({k: v for k, v in c.items() if not k.startswith(_MODEL)},
                    {k[len(_MODEL):]: v for k, v in c.items() if k.startswith(_MODEL)})
        mine, model = split(totals)
        windows = None if per_window is None else {s: split(c) for s, c in per_window.items()}
        public, private = PlausibleMethod.released_details(
            details, mine, None if windows is None else {s: w[0] for s, w in windows.items()},
            every_window=every_window)
        if self.model_plan is not None and isinstance(public.get("model"), dict):
            public["model"] = PrivBayesRunTime(self.model_plan)(
                public["model"], model, None if windows is None else
                {s: w[1] for s, w in windows.items()}, every_window=every_window)[0]
        return public, private


def _model_choice_items(measurement: Any) -> list[tuple[str, int]]:
    """One window's PrivBayes generator measurement → ``(model:<counter name>, 1)`` per choice."""
    return [(_MODEL + name, 1) for name in (*sizing_choices(measurement.sizing),
                                            *refine_pick_choices(measurement))]


def _released_items(batch: EncodedBatch) -> tuple[str, int]:
    return "released", len(batch)


def _rejected_items(rej: RejectedCandidates):
    yield "rejected", len(rej)
    for reason, n in rej.reason_counts().items():
        yield f"rejected_{reason}", n
