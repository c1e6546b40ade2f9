"""PrivBayes budget plans, fixed when the pipeline is built: Laplace and zCDP plans, their spends.

* :class:`PrivBayesPlan`, :func:`plan_privbayes` — validation, the degree (lowered from the
  declared shape until the candidate counts fit :data:`MAX_CANDIDATE_CELLS`), parent sets
  (``"auto"``/``"adaptive"``/``"exact"``), sizing (:mod:`~beamsynth.transforms.privbayes_sizing`),
  the refinement's size (:mod:`~beamsynth.transforms.refine`) and the split of ε into structure,
  tables and refinement;
* :class:`ZCDPPlan`, :func:`gaussian_plan` — ``noise="gaussian"`` (issue 18, AIM's accounting):
  ``(ε, δ)`` → ``ρ`` and its split by :data:`GAUSSIAN_SHARES`;
* :func:`spend_privbayes`, :func:`spend_zcdp` — the spends on the accountant (mechanism, scale,
  sensitivity, paper), which reach the manifest.

Shapes: the declared shape and an ``ApproxDP``/``PureDP`` budget in, a frozen
:class:`PrivBayesPlan` out. Nothing here reads data: the budget is checked when the pipeline is
built.

Privacy (add/remove one privacy unit of at most ``m`` records): the Laplace plan is pure DP,
``ε = [ε_count] + ε_s + ε_m [+ ε_refine]`` by sequential composition (size count discrete
Laplace Δ = m; structure PrivBayes Alg. 4 with permute-and-flip on InDif, Δ = 4m; tables
PrivBayes §4.2 converted to add/remove counts, discrete Laplace Δ = m each). The zCDP plan turns
``(ε − ε_count, δ)`` into ``ρ`` (Canonne, Kamath & Steinke 2020 Cor. 13); pure parts cost ``ε²/2``
(Bun & Steinke 2016 Prop. 1.4), a discrete Gaussian table of L2 sensitivity ``m`` costs
``m²/(2σ²)`` (CKS 2020 Thm. 4); the parts add up and are spent as one ``(ε − ε_count, δ)``; the
DP size count (pure ``ε_count``, only without a public row count) is its own spend, composed with
it by adaptive basic composition (Dwork & Roth 2014 Thm. 3.16 and §3.5.2).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from beamsynth.transforms import privbayes_model, privbayes_sizing
from beamsynth.transforms import refine as refine_module
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant, PureDP, zcdp_rho
from beamsynth.transforms.noise import discrete_laplace_scale
from beamsynth.transforms.privbayes_sizing import (
    GAUSSIAN_ONE_WAY_SHARE,
    GAUSSIAN_REFINE_DOWN_RULE,
    GAUSSIAN_REFINE_MIN_TABLE_RHO,
    SIZE_COUNT_FRACTION,
    ForestPlan,
    NetworkSizing,
    gaussian_refine_pairs_down,
    gaussian_refine_pairs_for_rows,
    gaussian_refine_size,
    gaussian_refine_split,
    refine_pairs_for_rows,
    refine_size,
)
from beamsynth.transforms.privbayes_star import StarPlan, plan_star, star_wording
from beamsynth.transforms.privbayes_structure import (
    INDIF_SENSITIVITY,
    MAX_FAMILY_CELLS,
    candidate_families,
    family_cells,
)
from beamsynth.transforms.refine import (
    DEFAULT_REFINE_FRACTION,
    DEFAULT_REFINE_GROUPS,
    DEFAULT_REFINE_PAIRS,
    DEFAULT_REFINE_ROUNDS,
    DEFAULT_REFINE_TARGET_PICKS,
    REFINE_MIN_PAIRS,
    REFINE_MIN_TABLE_EPSILON,
    SELECTION_SHARE,
    RefinePlan,
    plan_refinement,
    spend_refinement,
)

__all__ = [
    "DEFAULT_DEGREE",
    "DEFAULT_REFINED_DEGREE",
    "DEFAULT_STRUCTURE_FRACTION",
    "SIZING_MODES",
    "MAX_CANDIDATE_CELLS",
    "PrivBayesPlan",
    "PARENT_MODES",
    "AUTO_EXACT_MAX_COLUMNS",
    "AUTO_EXACT_MIN_TABLE_EPSILON",
    "spend_privbayes",
    "GAUSSIAN_REFINE_GROUPS",
    "GAUSSIAN_REFINE_PAIRS",
    "GAUSSIAN_SHARES",
    "NOISE_MODES",
    "resolve_noise",
    "AUTO_MAX_SIGMA_RATIO",
    "auto_sigma_ratio",
    "ZCDPPlan",
    "gaussian_plan",
    "spend_zcdp",
    "plan_privbayes",
    "TARGET_PARENT",
    "TARGET_PARENT_MODES",
    "TARGET_PARENT_OPTIONS",
    "TARGET_PARENT_THETA",
    "resolve_target_parent",
    "target_parent_usefulness",
]

DEFAULT_DEGREE = 2  # parents per column without the refinement
DEFAULT_REFINED_DEGREE = 1  # ... and with it (the refinement adds the pairs a tree misses)
DEFAULT_STRUCTURE_FRACTION = 0.1
PARENT_MODES = ("auto", "adaptive", "exact")
AUTO_EXACT_MAX_COLUMNS = 16  # "auto": exact k-subsets only for schemas this narrow ...
AUTO_EXACT_MIN_TABLE_EPSILON = 0.05  # ... and at least this much ε per table and unit (docs/privbayes.md)
MAX_CANDIDATE_CELLS = 16_000_000  # exact candidate counts kept in one accumulator
SIZING_MODES = ("auto", "off")
NOISE_MODES = ("laplace", "gaussian", "auto")  # auto: gaussian when δ > 0, else laplace
# noise="gaussian" (zCDP, issue 18): shares of ρ and refinement size (docs/privbayes.md "zCDP")
GAUSSIAN_SHARES = {"structure": 0.03, "marginals": 0.45, "selection": 0.10, "measure": 0.42}
GAUSSIAN_REFINE_PAIRS = 40
GAUSSIAN_REFINE_GROUPS = 8
# GAUSSIAN_REFINE_MIN_TABLE_RHO (privbayes_sizing): σ ≤ 141, the std of the Laplace rule's b = 100


# How a declared target enters a k >= 1 network (H58, issue 18; docs/privbayes.md "Fourteenth
# session: the declared target at k ≥ 1"): "off" = the label-free network (the target unused at
# k >= 1, as before H58); "optional" = rooted at the target, which each column may take as a parent
# beside its k chosen ones (the score decides); "required" = the target a parent of every column
# (tree-augmented naive Bayes at k = 1); "useful" = "required" where the triples are useful enough
# (target_parent_usefulness ≥ θ_T, from public rows or the DP count), else "off".
# The user option (H65: --target-parent, options={'target_parent': ...}) is one of
# TARGET_PARENT_OPTIONS, "auto" = "useful" at TARGET_PARENT_THETA; it is resolved when the plan is
# built and carried in the plan (PrivBayesPlan.target_parent), so workers of a multi-process
# runner measure the mode the launcher planned and spent.
TARGET_PARENT_OPTIONS = ("auto", "off", "optional", "required")
TARGET_PARENT_MODES = ("off", "optional", "required", "useful")
# the option plan_privbayes uses when its caller passes none (read when the plan is built only)
TARGET_PARENT = "auto"
# "auto"/"useful": "required" where target_parent_usefulness ≥ this (public rows or the DP count);
# H58 fitted 10 in-sample (ACS / Adult / NLTCS), COMPAS ε = 4 (u 11.8) sat at its edge: 20 (H65)
TARGET_PARENT_THETA = 20.0
TARGET_PARENT_WORDING = {
    "optional": "k >= 1: the network is rooted at the target and each other column may take it "
                "as a parent beside its up to k chosen parents (candidates Π and {T} ∪ Π, same "
                "InDif − cells·b score; tree-augmented naive Bayes where every column takes it)",
    "required": "k >= 1: the network is rooted at the target and the target is a parent of every "
                "other column beside its up to k chosen parents (tree-augmented naive Bayes at "
                "k = 1; PrivBayes §4 with T a fixed parent)",
    "useful": "k >= 1: where n̂·ε_m/(m·Σ_X |X|·|T|·c̄) ≥ θ_T (public rows or the DP count; "
              "post-processing) the network is rooted at the target and the target is a parent of "
              "every other column beside its up to k chosen parents (tree-augmented naive Bayes at "
              "k = 1); else the label-free network",
}


def resolve_target_parent(option: str) -> str:
    """The network mode of a target-parent ``option`` (:data:`TARGET_PARENT_OPTIONS`, or a mode
    of :data:`TARGET_PARENT_MODES`): ``"auto"`` is ``"useful"``; anything else is refused with
    the bad value echoed."""
    if option == "auto":
        return "useful"
    if not isinstance(option, str) or option not in TARGET_PARENT_MODES:
        raise ValueError(f"target_parent ({option!r}) must be one of "
                         f"{', '.join(TARGET_PARENT_OPTIONS)}")
    return option


def target_parent_usefulness(rows: float, plan: PrivBayesPlan) -> float:
    """How useful the ``(X, T, P)`` tables of a target-parented network are at ``rows`` (public
    or the DP count: post-processing): ``rows·ε_m / (m·Σ_X |X|·|T|·c̄)``, ε_m the planned
    tables' ε (Laplace-equivalent under zCDP), c̄ the mean declared cells of the columns other
    than ``T`` (PrivBayes §4.4's usefulness of the family tables). Measured (H58): ACS 0.8–3.0
    and Adult 30k 2.1–8.4 lose TVD with ``"required"``, NLTCS 42–166 win."""
    shape = [int(c) for c in plan.sizing.shape]
    t = plan.target
    others = [c for c in range(len(shape)) if c != t]
    cbar = sum(shape[c] for c in others) / len(others)
    cells = sum(shape[x] * shape[t] * cbar for x in others)
    return max(float(rows), 0.0) * plan.marginal_budget.epsilon / (plan.max_contributions * cells)


AUTO_MAX_SIGMA_RATIO = 1.5  # auto: gaussian only where its network tables' σ ≤ 1.5 × Laplace's std


def auto_sigma_ratio(n_columns: int, epsilon: float, delta: float) -> float:
    """σ of a Gaussian network family table over the std of a Laplace network table, both the
    default plans at ``(ε, δ)`` with the tables' budget split equally over the ``d`` columns
    (H47, issue 18): ``σ = m·√(d/(2ρ_fam))`` with ``ρ_fam = 0.45·0.8·zcdp_rho(ε, δ)`` (the
    :data:`GAUSSIAN_SHARES` marginals less the 1-way share), the Laplace std ``√2·m·d/ε_m`` with
    ``ε_m = 0.75·0.9·ε`` (refinement and structure fractions); ``m`` cancels. It falls like
    ``1/√d``: 1.82–1.94 on PUMS' 6 columns at ε 0.5–2 (δ = 1e-9), 1.12–1.22 on Adult, COMPAS and
    NLTCS (15–16), 0.91–0.97 on ACS (24), 0.70–0.74 on census_kdd (41). Public values only."""
    d = max(1, int(n_columns))
    eps_m = epsilon * (1 - DEFAULT_REFINE_FRACTION) * (1 - DEFAULT_STRUCTURE_FRACTION)
    rho_fam = GAUSSIAN_SHARES["marginals"] * (1 - GAUSSIAN_ONE_WAY_SHARE) * zcdp_rho(epsilon, delta)
    return math.sqrt(d / (2 * rho_fam)) / (math.sqrt(2) * d / eps_m)


def resolve_noise(noise: str, delta: float, *, n_columns: int | None = None,
                  epsilon: float | None = None) -> tuple[str, str]:
    """``(noise, why)``: the tables' noise for a requested mode and the method's δ.

    ``"auto"`` is ``"laplace"`` (pure ε-DP) when ``δ = 0``; with ``δ > 0`` it is ``"gaussian"``
    (zCDP, discrete Gaussian tables, :func:`gaussian_plan`) unless the declared column count
    ``n_columns`` and ``epsilon`` are given and :func:`auto_sigma_ratio` exceeds
    :data:`AUTO_MAX_SIGMA_RATIO` (H47): with few columns zCDP's composition gain does not pay
    for the (ε, δ) → ρ conversion, and the Gaussian network loses TVD1 (PUMS 1,000 ε = 2, 6
    columns, ratio 1.94: +0.0166 ± 0.0027 against Laplace, worse than independent), so
    ``"laplace"``. The rule is fixed when the pipeline is built, from public values only (the
    declared shape, ε, δ), so each branch's spends are the plan's own. ``why`` is the manifest's
    wording; ``"laplace"`` with ``δ > 0`` says that δ is not used. Measured:
    docs/privbayes.md "Thirteenth session: `--pb-noise auto`"."""
    if noise not in NOISE_MODES:
        raise ValueError(f"noise ({noise!r}) must be one of {NOISE_MODES}")
    if noise == "auto":
        if delta > 0:
            if n_columns is not None and epsilon is not None and epsilon > 0:
                ratio = auto_sigma_ratio(n_columns, epsilon, delta)
                if ratio > AUTO_MAX_SIGMA_RATIO:
                    return "laplace", (
                        f"auto: δ = {delta:g} > 0, but with {n_columns} declared columns the "
                        f"Gaussian network tables' σ would be {ratio:.2f} × the Laplace tables' "
                        f"std (more than {AUTO_MAX_SIGMA_RATIO:g}): zCDP does not pay for so few "
                        "tables, so pure ε-DP with discrete Laplace tables (δ is not used)")
                return "gaussian", (
                    f"auto: δ = {delta:g} > 0 and the Gaussian network tables' σ is {ratio:.2f} "
                    f"× the Laplace tables' std (at most {AUTO_MAX_SIGMA_RATIO:g}), so zCDP with "
                    "discrete Gaussian tables converted to the method's (ε, δ)")
            return "gaussian", (f"auto: δ = {delta:g} > 0, so zCDP with discrete Gaussian tables "
                                "converted to the method's (ε, δ)")
        return "laplace", "auto: δ = 0, so pure ε-DP with discrete Laplace tables"
    if noise == "laplace" and delta > 0:
        return "laplace", (f"laplace: pure ε-DP; the method's δ = {delta:g} is not used (spent "
                           "δ = 0; pb_noise 'gaussian' or 'auto' would use it)")
    return noise, noise


# -- budget plan ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ZCDPPlan:
    """zCDP accounting of a ``noise="gaussian"`` run: ``budget`` (the method's (ε, δ), less the
    DP size count's pure ``count_epsilon`` when one is planned) converted to ρ
    (:func:`~beamsynth.transforms.budget.zcdp_rho`, Canonne-Kamath-Steinke 2020 Cor. 13) and its
    split. Pure-DP parts (each permute-and-flip step) cost ``ε²/2`` each (Bun & Steinke 2016,
    Prop. 1.4); a discrete Gaussian table of L2 sensitivity ``m`` costs ``m²/(2σ²)`` (CKS 2020
    Thm. 4); the parts add up (zCDP composition, adaptive). The size count is not a part: it is
    spent on its own as ``(count_epsilon, 0)`` and composes with ``budget`` by adaptive basic
    composition (Dwork & Roth 2014 Thm. 3.16), so the method's total is
    ``(count_epsilon + budget.epsilon, budget.delta)``."""

    budget: ApproxDP
    rho: float
    structure_rho: float
    marginal_rho: float
    selection_rho: float
    measure_rho: float
    count_epsilon: float = 0.0  # the DP size count's pure ε (its own spend), 0 with public rows
    # the network tables' ρ share on every column's own 1-way table, read from the A/B switch
    # privbayes_sizing.GAUSSIAN_ONE_WAY_SHARE when the plan is built (0: no 1-way tables, the
    # release before the twelfth session) and used by the measuring step's split (H78)
    one_way_share: float = 0.2

    @property
    def spent_rho(self) -> float:
        return self.structure_rho + self.marginal_rho + self.selection_rho + self.measure_rho

    def details(self) -> dict[str, Any]:
        """Manifest details."""
        out = {"accounting": "zCDP, converted to (ε, δ) by Canonne-Kamath-Steinke 2020 Cor. 13",
               "epsilon": self.budget.epsilon, "delta": self.budget.delta, "rho": self.rho,
               "rho_structure": self.structure_rho, "rho_marginals": self.marginal_rho,
               "rho_refine_selection": self.selection_rho,
               "rho_refine_marginals": self.measure_rho, "rho_spent": self.spent_rho}
        if self.count_epsilon:
            out["size_count"] = SIZE_COUNT_COMPOSITION.format(c=self.count_epsilon,
                                                             e=self.budget.epsilon)
        return out


SIZE_COUNT_COMPOSITION = (
    "the DP size count is pure ε_c = {c:g} (spend privbayes.size_count, δ = 0), outside this ρ; "
    "every model it selects (network, forest, 1-way tables) is (ε − ε_c = {e:g}, δ)-DP, so the "
    "method is (ε, δ)-DP by adaptive basic composition (Dwork & Roth 2014 Thm. 3.16)")


@dataclass(frozen=True)
class PrivBayesPlan:
    """Data-independent parameters of one PrivBayes run (fixed when the pipeline is built)."""

    degree: int
    structure_budget: PureDP | None
    marginal_budget: PureDP
    n_columns: int
    max_contributions: int
    penalty: float = 1.0
    max_family_cells: int = MAX_FAMILY_CELLS
    exact_degree: bool = False
    refine: RefinePlan | None = None
    sizing: NetworkSizing | None = None
    zcdp: ZCDPPlan | None = None  # noise="gaussian" (gaussian_plan): zCDP accounting
    forest: ForestPlan | None = None  # the small-input model (public rows, network not useful)
    target: int | None = None  # declared prediction target (k = 0: privbayes_star; k >= 1: H58)
    star: StarPlan | None = None  # the small-input star around it (public rows, H41)
    target_name: str | None = None  # the target's declared name (public; manifest wording)
    # the target at k >= 1 (H58), decided when the plan is built (H65): the mode (one of
    # TARGET_PARENT_MODES), the user's option, θ_T of "useful", and why the mode is "off"
    target_parent: str = "off"
    target_parent_option: str = "off"
    target_parent_theta: float = TARGET_PARENT_THETA
    target_parent_note: str = ""
    # the weight of split_network_budget (H59) for a pure-ε network's tables, read from the A/B
    # switch privbayes_sizing.NETWORK_SPLIT_TABLE_WEIGHT when the plan is built (None: the √cells
    # split), so that workers of a multi-process runner split as the launcher planned (H67)
    split_table_weight: float | None = 1.0
    # which released pure-ε refinement pairs also feed each column's 1-way estimate in the fit
    # (post-processing, H69; privbayes_model.REFINE_MARGINS_MODES), read from
    # privbayes_model.DEFAULT_REFINE_MARGINS when the plan is built, carried to the workers
    refine_margins: str = "alive"
    # how the fit estimates each column's 1-way margin (privbayes_model.ONE_WAY_ESTIMATES), read
    # from the A/B switch privbayes_model.ONE_WAY_ESTIMATE when the plan is built and used by the
    # measuring step's network and the Fit step on the workers (sixteenth session, H78)
    one_way_estimate: str = "mean"

    @property
    def parent_target(self) -> int | None:
        """The declared target as a parent of a k ≥ 1 network (:attr:`target_parent`, H58), or
        ``None`` (no target, the star or forest plan, or the mode ``"off"``). The same d − 1
        structure steps (permute-and-flip, Δ = 4m) and one table per column (Δ = m), so the same
        spends as the label-free network."""
        if (self.target_parent == "off" or self.target is None or self.star is not None
                or self.forest is not None or self.degree < 1 or self.n_columns < 3):
            return None
        return self.target

    @property
    def target_required(self) -> bool:
        """Whether :attr:`parent_target` is a parent of every column (``"required"``, and
        ``"useful"`` where the measurement keeps it)."""
        return self.parent_target is not None and self.target_parent in ("required", "useful")

    def target_parent_gate(self, rows: float) -> tuple[bool, float]:
        """``"useful"``: whether the target is a parent of every column at ``rows`` (public rows
        or the DP count: post-processing) and the usefulness it was judged by; other modes:
        ``(parent_target is not None, nan)``."""
        if self.parent_target is None or self.target_parent != "useful":
            return self.parent_target is not None, float("nan")
        u = target_parent_usefulness(rows, self)
        return u >= self.target_parent_theta, u

    def target_parent_at(self, rows_hat: float | None = None) -> tuple[int | None, float]:
        """The one decision whether the declared target is a parent of every column (H78:
        :class:`~beamsynth.transforms.privbayes_beam.DPPrivBayes`' counts, through
        :meth:`counted_families`, and the measuring step both call it; the gate lives nowhere
        else). Returns ``(the target or None, the usefulness u it was judged by or nan)``.
        ``"useful"`` is judged by :meth:`target_parent_gate` at the public rows where the plan has
        them (so already when the pipeline is built), else at ``rows_hat``, the measuring step's
        DP count (post-processing); with neither (building a DP-count plan) the target is kept:
        its families are counted and the gate is decided per window. Other modes:
        ``(parent_target, nan)``. A function of the plan and public or released values only."""
        target = self.parent_target
        if target is None or self.target_parent != "useful":
            return target, float("nan")
        public = None if self.sizing is None else self.sizing.rows
        rows = public if public is not None else rows_hat
        if rows is None:
            return target, float("nan")
        on, u = self.target_parent_gate(rows)
        return (target if on else None), u

    def fit_choices(self) -> dict[str, Any]:
        """The Fit step's choices as :func:`~beamsynth.transforms.privbayes_model.fit_privbayes`
        keywords, all read when the plan was built (H69, H78): ``refine_margins``,
        ``one_way_estimate`` and the refinement's ``rake_end_on_margins`` (the fitted
        ``RefinedModel`` carries it to the sampling workers)."""
        return {"refine_margins": self.refine_margins, "one_way_estimate": self.one_way_estimate,
                "rake_end_on_margins": self.refine is None or self.refine.rake_end_on_margins}

    def counted_families(self, shape: Sequence[int]) -> list[tuple[int, ...]]:
        """The candidate families whose exact counts the measuring step gets: with the
        target's ``(X, T, Π)`` where :meth:`target_parent_at` keeps the target when the pipeline
        is built (public rows that close ``"useful"``'s gate: the label-free ones). Declared
        values only."""
        return candidate_families(self.n_columns, self.degree, shape=shape,
                                  max_family_cells=self.max_family_cells,
                                  target=self.target_parent_at()[0])

    def target_parent_details(self) -> dict[str, Any]:
        """The manifest's word on the target at k ≥ 1: the option, the mode that runs and why."""
        out: dict[str, Any] = {"option": self.target_parent_option, "mode": self.target_parent}
        if self.parent_target is None:
            why = self.target_parent_note or (
                "the plan is the small-input model (star or forest)" if self.star is not None
                or self.forest is not None else "no k >= 1 network with at least 3 columns"
                if self.degree < 1 or self.n_columns < 3 else f"{self.target_parent_option}: "
                "the label-free network (the target not a parent)")
            return {**out, "ran": "off", "why": why}
        if self.target_parent != "useful":
            return {**out, "ran": self.target_parent,
                    "why": f"{self.target_parent_option}: {TARGET_PARENT_WORDING[self.target_parent]}"}
        out["theta"] = self.target_parent_theta
        rule = (f"'required' where u = n̂·ε_m/(m·Σ_X |X|·|T|·c̄) ≥ θ_T = {self.target_parent_theta:g}, "
                "else 'off'")
        rows = None if self.sizing is None else self.sizing.rows
        if rows is None:
            return {**out, "ran": "decided per window from the DP count (the manifest's "
                    "sizing.chosen_target_parent_windows: 'required' or 'off' per k >= 1 window; "
                    "a window where it picks k = 0 runs the small-input model, "
                    "sizing.chosen_degree_windows; per declared window in an API manifest: "
                    "sizing.chosen_per_window; CLI, API bs.WriteManifest and Beam YAML "
                    "manifest: alike (H72); also the Beam counters "
                    "beamsynth/privbayes_target_parent_required and _off, "
                    "beamsynth/privbayes_degree_<k>)", "why": f"{self.target_parent_option}: {rule}"}
        target, u = self.target_parent_at()
        return {**out, "usefulness": u, "ran": "required" if target is not None else "off",
                "why": f"{self.target_parent_option}: {rule}; u = {u:.3g} at the public "
                       f"{rows:,} rows"}

    @property
    def step_epsilon(self) -> float:
        """Exponential-mechanism budget of each of the ``d−1`` structure steps."""
        if self.structure_budget is None:
            return 0.0
        return self.structure_budget.epsilon / max(1, self.n_columns - 1)

    @property
    def score_sensitivity(self) -> float:
        """InDif sensitivity for ``max_contributions`` records per unit."""
        return INDIF_SENSITIVITY * self.max_contributions

    @property
    def max_tables(self) -> int:
        """Upper bound on the number of released tables (one per column)."""
        return self.n_columns

    def table_scale(self, tables: int) -> float:
        """Discrete Laplace scale per cell when the marginal budget is split over ``tables``."""
        return discrete_laplace_scale(sensitivity=self.max_contributions,
                                      epsilon=self.marginal_budget.epsilon / tables)

    def _refine_details(self) -> dict[str, Any]:
        """The refinement's planned details; where the run may choose more pairs from the DP
        count, also the largest such plan and the note (never the planned split alone)."""
        out = self.refine.details()  # type: ignore[union-attr]
        largest = None if self.sizing is None else self.sizing.refine_largest(self.refine)
        if largest is not None:
            out.update(largest=largest.details(), pairs_note=REFINE_RUN_TIME_NOTE)
        return out

    def details(self) -> dict[str, Any]:
        """Manifest details."""
        return {
            "degree": self.degree,
            "structure_epsilon": 0.0 if self.structure_budget is None else self.structure_budget.epsilon,
            "structure_steps": max(0, self.n_columns - 1),
            "epsilon_per_step": self.step_epsilon,
            "score": "InDif − cells·b (permute-and-flip)",
            "score_sensitivity": self.score_sensitivity,
            "marginal_epsilon": self.marginal_budget.epsilon,
            "max_tables": self.max_tables,
            "max_family_cells": self.max_family_cells,
            "parent_sets": "exact k" if self.exact_degree else "any size ≤ k",
            "refine": None if self.refine is None else self._refine_details(),
            "sizing": None if self.sizing is None
            else self.sizing.details(),
            **({} if self.zcdp is None else {"noise": "discrete Gaussian", "zcdp": self.zcdp.details()}),
            "forest": None if self.forest is None else self.forest.details(),
            **({} if self.target is None else {"target": {
                "column": self.target_name, "index": self.target,
                "use": "where n̂·ε picks k = 0 (public rows at build time, else the DP count in "
                       f"the measurement step): {star_wording(self.target_name or self.target)}; "
                       + (TARGET_PARENT_WORDING[self.target_parent] if self.parent_target is not None
                          else "k >= 1 does not use it"),
                "target_parent": self.target_parent_details()}}),
            **({} if self.star is None else {"star": self.star.details()}),
        }


def plan_switches() -> dict[str, Any]:
    """The PrivBayes plan's A/B switches, read from their modules once, when a plan is built
    (H67, H69, H78): ``split_table_weight`` (``privbayes_sizing.NETWORK_SPLIT_TABLE_WEIGHT``),
    ``refine_margins`` (``privbayes_model.DEFAULT_REFINE_MARGINS``) and ``one_way_estimate``
    (``privbayes_model.ONE_WAY_ESTIMATE``). The plan carries them to every worker, so a launcher
    that flips one gets the same bytes on every runner (a worker's fresh module is never read).
    A value outside its modes is refused here, before anything is spent."""
    out = {"split_table_weight": privbayes_sizing.NETWORK_SPLIT_TABLE_WEIGHT,
           "refine_margins": privbayes_model.DEFAULT_REFINE_MARGINS,
           "one_way_estimate": privbayes_model.ONE_WAY_ESTIMATE}
    for name, value, modes in (
            ("privbayes_model.DEFAULT_REFINE_MARGINS", out["refine_margins"],
             privbayes_model.REFINE_MARGINS_MODES),
            ("privbayes_model.ONE_WAY_ESTIMATE", out["one_way_estimate"],
             privbayes_model.ONE_WAY_ESTIMATES)):
        if value not in modes:
            raise ValueError(f"{name} ({value!r}) must be one of {modes}")
    return out


def plan_privbayes(
    shape: Sequence[int],
    budget: ApproxDP,
    *,
    degree: int | None = None,
    structure_fraction: float = DEFAULT_STRUCTURE_FRACTION,
    max_contributions: int = 1,
    max_candidate_cells: int = MAX_CANDIDATE_CELLS,
    max_family_cells: int = MAX_FAMILY_CELLS,
    parents: str = "auto",
    names: Sequence[str] | None = None,
    refine_pairs: int = DEFAULT_REFINE_PAIRS,
    refine_rounds: int = DEFAULT_REFINE_ROUNDS,
    refine_groups: int = DEFAULT_REFINE_GROUPS,
    refine_fraction: float = DEFAULT_REFINE_FRACTION,
    sizing: str = "off",
    rows: int | None = None,
    target: int | None = None,
    target_parent: str | None = None,
    refine_target_picks: int | str = DEFAULT_REFINE_TARGET_PICKS,
) -> PrivBayesPlan:
    """Validate parameters and split the budget; lowers ``degree`` (from the declared shape
    only) until the counts of all candidate families (each at most ``max_family_cells`` cells,
    :func:`candidate_families`) fit in ``max_candidate_cells``.

    ``parents``: ``"adaptive"`` offers parent sets of any size ≤ k (the noise penalty decides),
    ``"exact"`` only k-subsets (PrivBayes Alg. 4), ``"auto"`` (default) exact when the schema has
    at most :data:`AUTO_EXACT_MAX_COLUMNS` declared columns **and** the marginal budget per table
    and unit, ``ε_m/(d·m)``, is at least :data:`AUTO_EXACT_MIN_TABLE_EPSILON`, adaptive otherwise
    — a choice from declared quantities only. Measured (TVD2/TVD3): Adult (15 columns) at ε = 1,
    Beam-free harness, exact 0.0435/0.0869 vs adaptive 0.0444/0.0889 and GBM accuracy/AUC
    0.839/0.883 vs 0.827/0.863 (12–16 seeds), at ε = 2 0.0382/0.0789 vs 0.0408/0.0836; at ε = 0.5
    even (0.0540 vs 0.0537); at ε = 0.1 (benchmark, 3 seeds) exact worse, 0.1177 vs 0.1058. Two
    random 15-column subsets of ACS at ε = 1: even (±0.001 TVD2). ACS (24 columns) at ε = 1:
    exact 0.0727/0.1377 vs adaptive 0.0653/0.1264 (6 seeds), at ε = 2 0.0552 vs 0.0538.

    ``sizing="auto"`` (the default of ``--method privbayes``) lets the model size follow ``n̂·ε``
    (:func:`choose_network_degree`, :class:`NetworkSizing`): with a public input size ``rows``
    (``--input-rows``) the degree is chosen here, at build time (0 = the independent model: no
    structure, no refinement, the whole ε on 1-way marginals); without it
    :data:`SIZE_COUNT_FRACTION` of ε is set aside for a DP count released in the measurement
    step, the split below is the planned network's, and a smaller degree chosen there spends the
    same shares (in the fallback the structure and refinement shares go to the 1-way tables).

    With ``sizing="auto"`` the refinement may measure more than ``refine_pairs`` coarse pairs:
    ``min(d, ⌊√(κ·n̂·ε_meas/(m·groups²))⌋)``
    (:func:`~beamsynth.transforms.privbayes_sizing.refine_pairs_for_rows`, κ = 0.9: the tables'
    summed expected L1 noise ≤ 0.9·n̂) when that is larger than requested, in rounds of at most 5
    picks (:func:`~beamsynth.transforms.privbayes_sizing.refine_size`); census_kdd (199,523 rows,
    41 columns) at ε = 1: 37 pairs in 8 rounds instead of 15 in 3, Adult unchanged at every ε.
    With public ``rows`` that is decided here; without them the plan keeps the requested count
    and the measurement step applies the same rule to the DP count n̂
    (:meth:`~beamsynth.transforms.privbayes_sizing.NetworkSizing.refine_plan`). Privacy: the
    count is a function of public values (rows or the released DP count, declared shape, ε:
    post-processing); the refinement's ε_sel and ε_meas are fixed here, before any data, and
    are only split over the P picks (permute-and-flip, Δ = m each, ε_sel/P) and the P tables
    (discrete Laplace, L1 Δ = m each, ε_meas/P), so sequential (adaptive) composition gives
    P·ε_sel/P + P·ε_meas/P = ε_sel + ε_meas whatever P is: the spends recorded here are exact;
    their details list the planned P and the manifest's ``sizing`` the run-time one.

    ``target_parent`` (with a declared ``target`` and ``sizing="auto"``; H58, H65): how the target
    enters a k ≥ 1 network, one of :data:`TARGET_PARENT_OPTIONS` (``None``: :data:`TARGET_PARENT`,
    read here, at build time), carried in the plan (:attr:`PrivBayesPlan.target_parent`) so that
    every worker measures the mode spent here. ``"auto"`` (``"useful"`` at
    :data:`TARGET_PARENT_THETA`) counts the target's triples only where they fit
    ``max_candidate_cells`` at the planned degree: it never lowers the degree (else ``"off"``,
    with a note)."""
    if not isinstance(budget, ApproxDP):
        raise TypeError(f"budget must be an ApproxDP/PureDP, got {type(budget).__name__}")
    if degree is not None and (isinstance(degree, bool) or not isinstance(degree, int)
                               or not 0 <= degree <= 8):
        raise ValueError(f"degree ({degree!r}) must be an int in [0, 8]")
    if target is not None and (isinstance(target, bool) or not isinstance(target, int)
                               or not 0 <= target < len(shape) or len(shape) < 2):
        raise ValueError(f"target ({target!r}) must be a column index in [0, {len(shape) - 1}] "
                         "of at least two declared columns")
    if not isinstance(structure_fraction, (int, float)) or not 0 < structure_fraction < 1:
        raise ValueError(f"structure_fraction ({structure_fraction!r}) must be in (0, 1)")
    if isinstance(max_contributions, bool) or not isinstance(max_contributions, int) or max_contributions < 1:
        raise ValueError(f"max_contributions ({max_contributions!r}) must be an int >= 1")
    if not isinstance(max_candidate_cells, int) or max_candidate_cells < 1:
        raise ValueError(f"max_candidate_cells ({max_candidate_cells!r}) must be an int >= 1")
    if parents not in PARENT_MODES:
        raise ValueError(f"parents ({parents!r}) must be one of {PARENT_MODES}")
    if isinstance(max_family_cells, bool) or not isinstance(max_family_cells, int) or max_family_cells < 1:
        raise ValueError(f"max_family_cells ({max_family_cells!r}) must be an int >= 1")
    if isinstance(refine_pairs, bool) or not isinstance(refine_pairs, int) or refine_pairs < 0:
        raise ValueError(f"refine_pairs ({refine_pairs!r}) must be an int >= 0")
    if refine_target_picks != "auto" and (
            isinstance(refine_target_picks, bool) or not isinstance(refine_target_picks, int)
            or refine_target_picks < 0):
        raise ValueError(f"refine_target_picks ({refine_target_picks!r}) must be 'auto' or an "
                         "int >= 0")
    if not isinstance(refine_fraction, (int, float)) or not 0 < refine_fraction < 1:
        raise ValueError(f"refine_fraction ({refine_fraction!r}) must be in (0, 1)")
    if sizing not in SIZING_MODES:
        raise ValueError(f"sizing ({sizing!r}) must be one of {SIZING_MODES}")
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 0):
        raise ValueError(f"rows ({rows!r}) must be None or an int >= 0")
    switches = plan_switches()  # every A/B switch read once, here (H78)
    shape = [int(s) for s in shape]
    model_epsilon, count_budget = budget.epsilon, None
    sized = sizing == "auto" and len(shape) > 1
    if sized and rows is None:  # n̂ from a DP count in the measurement step
        count_budget = PureDP(epsilon=budget.epsilon * SIZE_COUNT_FRACTION)
        budget = PureDP(epsilon=budget.epsilon - count_budget.epsilon)
    if not shape:
        raise ValueError("shape must name at least one column")
    huge = [f"{names[i] if names is not None else i!r} ({c:,} cells)"
            for i, c in enumerate(shape) if c > max_family_cells]
    if huge:
        raise ValueError(
            f"privbayes: column(s) {', '.join(huge)} declare more than {max_family_cells:,} "
            "cells (max_family_cells); declare bins (integer/float `edges`) or a smaller domain, "
            "synthesize the other columns (API: records | job.private(schema.select([...])); CLI "
            "and Beam YAML: a schema without them), or use the independent method (CLI --method "
            "independent, API bs.IndependentSynthesis, Beam YAML method: independent; open "
            "columns go through CatHist)")
    # refinement size, from declared quantities only: pairs with exact counts (every pair within
    # max_family_cells is in a candidate family), and as many tables as get ≥ REFINE_MIN_TABLE_EPSILON
    countable = sum(1 for a, b in itertools.combinations(range(len(shape)), 2)
                    if shape[a] * shape[b] <= max_family_cells)
    refine_budget = PureDP(epsilon=budget.epsilon * float(refine_fraction))
    if refine_pairs > 0:
        # validate the refinement parameters whether or not the refinement ends up used
        plan_refinement(refine_budget, pairs=refine_pairs, rounds=min(refine_rounds, refine_pairs),
                        groups=refine_groups, max_contributions=max_contributions)
    afford = int(refine_budget.epsilon * (1 - SELECTION_SHARE)
                 / (max_contributions * REFINE_MIN_TABLE_EPSILON) + 1e-9)
    pairs = min(refine_pairs, countable, afford)
    rounds = min(refine_rounds, pairs)
    wide = 0
    if sized and rows is not None and refine_pairs > 0:
        # public rows: more pairs where n̂·ε supports more than requested (refine_size, up to d;
        # wide tables, issue 18), in rounds of at most REFINE_PICKS_PER_ROUND picks; without
        # them the same rule runs on the DP count in the measurement step
        measure_epsilon = refine_budget.epsilon * (1 - SELECTION_SHARE)
        wide = min(countable, refine_pairs_for_rows(rows, measure_epsilon, shape,
                                                    groups=refine_groups,
                                                    max_contributions=max_contributions))
        pairs, rounds = refine_size(rows, measure_epsilon, shape, requested=refine_pairs,
                                    planned=pairs, rounds=refine_rounds, countable=countable,
                                    groups=refine_groups, max_contributions=max_contributions)
    if pairs < REFINE_MIN_PAIRS or len(shape) < 2:
        pairs = 0
    if degree is None:
        degree = DEFAULT_REFINED_DEGREE if pairs else DEFAULT_DEGREE
    option = TARGET_PARENT if target_parent is None else target_parent
    mode, parent_theta, parent_note = resolve_target_parent(option), TARGET_PARENT_THETA, ""
    parent = target if mode != "off" and sizing == "auto" else None  # H58: its families

    def candidate_cells(k: int, with_target: int | None) -> int:
        return sum(family_cells(shape, f) for f in candidate_families(
            len(shape), k, shape=shape, max_family_cells=max_family_cells, target=with_target))

    if parent is not None and mode == "useful" and degree > 0 and (
            candidate_cells(degree, parent) > max_candidate_cells):
        # "useful" never lowers the degree for the triples: the label-free network (H65)
        parent, mode = None, "off"
        parent_note = (f"{option}: the target's (X, T, P) triples at k = {degree} exceed "
                       f"max_candidate_cells = {max_candidate_cells:,}: the label-free network")
    while degree > 0 and candidate_cells(degree, parent) > max_candidate_cells:
        degree -= 1
    spec = None
    if sized:
        spec = NetworkSizing(epsilon=model_epsilon, max_degree=degree, shape=tuple(shape),
                             max_contributions=max_contributions, rows=rows,
                             max_family_cells=max_family_cells,
                             count_budget=count_budget, refine_pairs_for_rows=wide,
                             refine_requested=refine_pairs if pairs and degree > 0 else 0,
                             refine_rounds=refine_rounds, refine_countable=countable,
                             band_for_zcdp=privbayes_sizing.BAND_FOR_ZCDP,
                             refine_down=privbayes_sizing.GAUSSIAN_REFINE_DOWN,
                             forest_score=privbayes_sizing.FOREST_SCORE)
        if rows is not None:  # public row count: the size is a build-time decision
            degree = spec.degree(rows)
    if sized and rows is not None and degree == 0 and target is not None:
        # a declared target: the star of its θ-useful X × T tables (privbayes_star, H41)
        star = plan_star(rows, budget.epsilon, shape, target, max_contributions=max_contributions,
                         names=names)
        if star.columns:
            spec = dataclasses.replace(spec, refine_pairs_for_rows=0, refine_requested=0)
            return PrivBayesPlan(
                degree=1, structure_budget=None, marginal_budget=star.budget,
                n_columns=len(shape), max_contributions=max_contributions,
                max_family_cells=max_family_cells, sizing=spec, target=target, star=star,
                target_name=None if names is None else names[target], **switches)
    if sized and rows is not None and degree == 0:
        # not θ-useful as a network: 1-way tables + a forest of affordable pairs (plan_forest),
        # or, if no pair is affordable, the independent model with the whole ε
        forest = spec.small_forest(rows, budget.epsilon)  # the band's forest or plan_forest (H49)
        if forest.steps > 0:
            spec = dataclasses.replace(spec, refine_pairs_for_rows=0,
                                       refine_requested=0)  # no refinement here
            return PrivBayesPlan(
                degree=1, structure_budget=forest.structure_budget,
                marginal_budget=forest.pair_budget, n_columns=len(shape),
                max_contributions=max_contributions, max_family_cells=max_family_cells,
                sizing=spec, forest=forest, **switches)
    refine = None
    network = budget.epsilon
    if pairs and degree > 0:
        refine = plan_refinement(refine_budget, pairs=pairs, rounds=rounds,
                                 groups=refine_groups, max_contributions=max_contributions,
                                 target=target, target_picks=refine_target_picks)
        network = budget.epsilon - refine.selection_budget.epsilon - refine.measure_budget.epsilon
    if spec is not None and refine is None and spec.refine_requested:
        spec = dataclasses.replace(spec, refine_requested=0)  # no refinement to size at run time
    keep_target = target is not None and spec is not None and (
        spec.count_budget is not None or (parent is not None and degree > 0))
    if len(shape) == 1 or degree == 0:  # nothing to choose: all of it on the 1-way tables
        structure, rest = 0.0, network
    else:
        structure = network * float(structure_fraction)
        rest = network - structure
    return PrivBayesPlan(
        degree=degree,
        structure_budget=PureDP(epsilon=structure) if structure > 0 else None,
        marginal_budget=PureDP(epsilon=rest),
        n_columns=len(shape),
        max_contributions=max_contributions,
        max_family_cells=max_family_cells,
        exact_degree=parents == "exact" or (
            parents == "auto" and len(shape) <= AUTO_EXACT_MAX_COLUMNS
            and rest / (len(shape) * max_contributions) >= AUTO_EXACT_MIN_TABLE_EPSILON),
        refine=refine,
        sizing=spec,
        # the DP count may choose k = 0 in the measurement step: the star there (H41); at k >= 1
        # the target may be a parent of every column (H58, TARGET_PARENT)
        target=target if keep_target else None,
        target_name=None if not keep_target or names is None else names[target],
        target_parent=mode if keep_target else "off", target_parent_option=str(option),
        target_parent_theta=float(parent_theta), target_parent_note=parent_note, **switches,
    )


def gaussian_plan(plan: PrivBayesPlan, budget: ApproxDP, *, pairs: int = GAUSSIAN_REFINE_PAIRS,
                  rounds: int = DEFAULT_REFINE_ROUNDS,
                  groups: int = GAUSSIAN_REFINE_GROUPS) -> PrivBayesPlan:
    """The zCDP variant of a network ``plan`` (``noise="gaussian"``, issue 18: AIM's accounting).

    ``budget`` (δ > 0), less the DP size count's pure ``ε_c`` if one is planned (below), becomes
    ``ρ = zcdp_rho(ε − ε_c, δ)``, split by :data:`GAUSSIAN_SHARES`: the structure's
    ``d−1`` permute-and-flip steps (``ε_step = √(2ρ_s/(d−1))``, same scores and Δ = 4m), the
    network's tables (discrete Gaussian, ρ split ∝ cells^⅔, :func:`_release_tables`), the
    refinement's picks (``ε_pick = √(2ρ_sel/pairs)``, Δ = m) and its ``pairs`` coarse tables
    (discrete Gaussian, ``σ = m/√(2ρ_meas/pairs)``). Under add/remove of one unit of ≤ m records
    a table's L2 sensitivity is ≤ its L1 sensitivity m. The degree, sizing and structure rules
    are the Laplace plan's; ``marginal_budget`` and the refinement's ``measure_budget`` become the
    Laplace-equivalent ε (same noise std), used only for data-independent penalties. Plans of
    the small-input models (``forest``/``one_way``, if present) stay pure DP (returned as is).

    The DP size count (planned by :func:`plan_privbayes` without public ``rows``) is **not** in
    ρ: it stays a pure ``ε_c``-DP spend of its own, and ``ρ = zcdp_rho(ε − ε_c, δ)``. Whatever the
    count selects at run time — this network, the forest with pure ``ε − ε_c`` (the Laplace
    plan's forest budget) or discrete Gaussian 1-way tables at ``ρ`` — is ``(ε − ε_c, δ)``-DP
    given the count, so the method is ``(ε, δ)``-DP by adaptive basic composition (Dwork & Roth
    2014 Thm. 3.16 with §3.5.2's adaptive form; issue 18, docs/privbayes.md "zCDP"). Composing
    the count inside zCDP instead (``ε_c²/2`` of ``zcdp_rho(ε, δ)``) left the pure-ε forest only
    the ε whose ``ε²/2``-costs fit the rest: 0.63 instead of 0.98 at ε = 1, δ = 1e-9 on Adult.

    Refinement size (wide tables, docs/privbayes.md "Twelfth session"): ``pairs`` (capped by the
    ρ floor per table, :data:`GAUSSIAN_REFINE_MIN_TABLE_RHO`) in ``rounds``, unless the plan is
    sized (``sizing="auto"``) and ``n̂·√ρ_meas`` supports more:
    :func:`~beamsynth.transforms.privbayes_sizing.gaussian_refine_size` (up to ``⌊1.5·d⌋`` pairs, at
    most 5 picks a round), decided here with a public row count, else in the measurement step
    from the DP count (:meth:`NetworkSizing.refine_plan`: the same ρ_sel and ρ_meas re-split over
    the chosen ``P``, so the spend is exact for every ``P``).
    """
    if budget.delta <= 0:
        raise ValueError("noise='gaussian' (CLI --pb-noise gaussian; API and Beam YAML options "
                         "pb_noise: gaussian) needs delta > 0 (zCDP converted to (ε, δ)); got δ = 0")
    one_way_share = privbayes_sizing.GAUSSIAN_ONE_WAY_SHARE  # the A/B switch, read here (H78)
    if not 0 <= one_way_share < 1:
        raise ValueError(f"privbayes_sizing.GAUSSIAN_ONE_WAY_SHARE ({one_way_share!r}) must be "
                         "in [0, 1)")
    if (getattr(plan, "forest", None) is not None or getattr(plan, "star", None) is not None
            or getattr(plan, "one_way_budget", None) is not None):
        return plan
    d, m = plan.n_columns, plan.max_contributions
    count_epsilon = 0.0
    if plan.sizing is not None and plan.sizing.count_budget is not None:
        count_epsilon = plan.sizing.count_budget.epsilon  # pure ε_c, its own spend
        if not count_epsilon < budget.epsilon:
            raise ValueError(f"noise='gaussian': the size count's ε = {count_epsilon:g} leaves "
                             f"nothing of ε = {budget.epsilon:g}")
        budget = ApproxDP(epsilon=budget.epsilon - count_epsilon, delta=budget.delta)
    rho = zcdp_rho(budget.epsilon, budget.delta)
    rest = rho
    sh = GAUSSIAN_SHARES
    refine = None
    n_pairs = min(pairs, d * (d - 1) // 2, int(sh["measure"] * rest / GAUSSIAN_REFINE_MIN_TABLE_RHO + 1e-9))
    if plan.refine is None or n_pairs < REFINE_MIN_PAIRS or plan.degree == 0 or d < 2:
        n_pairs = 0
    shares = dict(sh)
    if not n_pairs:  # no refinement: its shares go to the network's tables
        shares["marginals"] += shares.pop("selection") + shares.pop("measure")
        shares["selection"] = shares["measure"] = 0.0
    if plan.structure_budget is None:
        shares["marginals"] += shares["structure"]
        shares["structure"] = 0.0
    structure_rho, marginal_rho = shares["structure"] * rest, shares["marginals"] * rest
    selection_rho, measure_rho = shares["selection"] * rest, shares["measure"] * rest
    structure_budget = None
    if structure_rho > 0:
        structure_budget = PureDP(epsilon=math.sqrt(2 * structure_rho / (d - 1)) * (d - 1))
    n_rounds = min(rounds, n_pairs)
    sizing = plan.sizing
    if sizing is not None:
        # the refinement's size follows n̂·√ρ_meas (wide tables), public rows here, else the DP
        # count at run time (NetworkSizing.refine_plan with refine_noise="gaussian")
        wide = 0
        if n_pairs and sizing.rows is not None:
            wide = gaussian_refine_pairs_for_rows(sizing.rows, measure_rho, plan_shape(plan),
                                                  groups=groups, max_contributions=m)
            planned = n_pairs
            n_pairs, n_rounds = gaussian_refine_size(
                sizing.rows, measure_rho, plan_shape(plan), requested=pairs, planned=n_pairs,
                rounds=rounds, countable=sizing.refine_countable, groups=groups,
                max_contributions=m)
            small = gaussian_refine_pairs_down(sizing.rows, measure_rho, plan_shape(plan),
                                               planned=n_pairs, groups=groups, max_contributions=m,
                                               enabled=sizing.refine_down)
            if n_pairs == planned and small < n_pairs:
                # small n̂·√ρ (H47): fewer pairs at the planned ε per pick and σ per table; the
                # dropped pairs' ρ goes to the network's tables (the parts still add up to ρ)
                kept = small / n_pairs
                marginal_rho += (selection_rho + measure_rho) * (1 - kept)
                selection_rho, measure_rho = selection_rho * kept, measure_rho * kept
                n_pairs, n_rounds = small, min(n_rounds, small)
        sizing = dataclasses.replace(sizing, refine_noise="gaussian", refine_pairs_for_rows=wide,
                                     refine_requested=pairs if n_pairs else 0,
                                     refine_rounds=rounds if n_pairs else 0)
    # Laplace-equivalent ε of the tables (same std: σ = √2·m/ε_t) for the penalties only
    sigma_eq = m / math.sqrt(2 * marginal_rho / plan.max_tables)
    marginal_budget = PureDP(epsilon=plan.max_tables * math.sqrt(2) * m / sigma_eq)
    if n_pairs:
        refine = RefinePlan(pairs=n_pairs, rounds=n_rounds, groups=groups, max_contributions=m,
                            delta=budget.delta, pair_cells=refine_module.PAIR_CELLS,
                            rake_end_on_margins=refine_module.RAKE_END_ON_MARGINS,
                            **plan.refine.target_fields(n_pairs),
                            **gaussian_refine_split(selection_rho, measure_rho, n_pairs, m))
    zcdp = ZCDPPlan(budget=budget, rho=rho, structure_rho=structure_rho,
                    marginal_rho=marginal_rho, selection_rho=selection_rho, measure_rho=measure_rho,
                    count_epsilon=count_epsilon, one_way_share=float(one_way_share))
    return dataclasses.replace(plan, structure_budget=structure_budget,
                               marginal_budget=marginal_budget, refine=refine, zcdp=zcdp,
                               sizing=sizing)


def plan_shape(plan: PrivBayesPlan) -> tuple[int, ...]:
    """The declared shape a sized plan was made for (``plan.sizing.shape``)."""
    return tuple(plan.sizing.shape)


def _target_parent_details(plan: PrivBayesPlan) -> dict[str, Any]:
    """Spend details of a network with the declared target as a parent (H58), else nothing."""
    if plan.parent_target is None:
        return {}
    return {"target_parent": {
        "column": plan.target_name, "index": plan.parent_target, "mode": plan.target_parent,
        "option": plan.target_parent_option, "rule": TARGET_PARENT_WORDING[plan.target_parent],
        "tables": "one per column as without a target: (k+1)-way, or (k+2)-way where the target "
                  "is among the parents (L1/L2 sensitivity m each); the same d − 1 structure "
                  "steps (InDif, Δ = 4m); the candidates are declared facts and earlier picks",
        "paper": "PrivBayes §4 (Zhang et al. 2014) with the target a parent; tree-augmented "
                 "naive Bayes (Friedman, Geiger & Goldszmidt 1997)"}}


def spend_zcdp(accountant: PrivacyAccountant, plan: PrivBayesPlan, prefix: str = "privbayes") -> None:
    """The spends of a ``noise="gaussian"`` plan: the DP size count (if planned) as its own pure
    ``(ε_c, 0)`` spend (:func:`_spend_size_count`, as in the Laplace plan), then one
    ``(ε − ε_c, δ)`` spend ``privbayes.zcdp``: its parts compose in zCDP, not by adding ε's, so
    the manifest lists them (mechanism, ρ, σ or ε per step) in the spend's details. The two
    compose by adaptive basic composition (:func:`gaussian_plan`)."""
    z = plan.zcdp
    _spend_size_count(accountant, plan, prefix)
    parts: dict[str, Any] = {}
    small: dict[str, Any] = {}
    if z.count_epsilon:  # the model chosen from n̂ may be the small-input one instead of parts
        small = {"small_input_model": {
            "when": "the DP size count finds no θ-useful network at n̂ (instead of the parts)",
            "model": "every 1-way table + a forest of affordable pairs, pure-DP discrete Laplace "
                     f"and permute-and-flip with ε − ε_c = {z.budget.epsilon:g} in all (the "
                     "Laplace plan's forest budget); or, with no forest, discrete Gaussian 1-way "
                     "tables with the whole ρ: (ε − ε_c, δ)-DP either way"}}
        if plan.target is not None:  # a declared target: the star first (privbayes_star, H41)
            small["small_input_model"]["model"] = (
                f"{star_wording(plan.target_name or plan.target)}, pure-DP discrete Laplace with "
                f"ε − ε_c = {z.budget.epsilon:g} in all; if no X × T table is θ-useful, "
                + small["small_input_model"]["model"])
    if plan.structure_budget is not None:
        parts["structure"] = {"mechanism": "permute-and-flip on InDif − cells·b, greedy network",
                              "steps": plan.n_columns - 1, "epsilon_per_step": plan.step_epsilon,
                              "rho": z.structure_rho, "sensitivity": plan.score_sensitivity,
                              **_target_parent_details(plan)}
    parts["marginals"] = {"mechanism": "discrete Gaussian on the chosen (k+1)-way marginals",
                          "rho": z.marginal_rho, "split": "ρ_i ∝ min(cells_i, 10⁴)^⅔",
                          "l2_sensitivity_per_table": plan.max_contributions}
    if plan.degree > 0 and plan.n_columns > 1:  # the network measures every column's 1-way table
        parts["marginals"].update(
            mechanism="discrete Gaussian on the chosen (k+1)-way marginals and on every column's "
                      "1-way marginal (each declared cell)",
            split=f"{z.one_way_share:g} of ρ on the 1-way tables of the columns not "
                  "released as parentless families, the rest on the families; within each part "
                  "ρ_i ∝ min(cells_i, 10⁴)^⅔ (zCDP: the ρ_i add up)")
    if plan.refine is not None:
        parts["refine.selection"] = {
            "mechanism": "permute-and-flip on ‖T − M‖₁ − cells·b of coarse 2-way tables",
            "picks": plan.refine.pairs, "epsilon_per_pick": plan.refine.pick_epsilon,
            "rho": z.selection_rho, "sensitivity": plan.max_contributions}
        parts["refine.marginals"] = {
            "mechanism": "discrete Gaussian on the selected coarse 2-way marginals",
            "tables": plan.refine.pairs, "sigma": plan.refine.sigma, "rho": z.measure_rho,
            "groups_per_column": plan.refine.groups, "rounds": plan.refine.rounds,
            "l2_sensitivity_per_table": plan.max_contributions}
        largest = None if plan.sizing is None else plan.sizing.refine_largest(plan.refine)
        if largest is not None:  # the run may choose more pairs from the DP count: same ρ
            parts["refine.marginals"]["largest"] = {
                "picks": largest.pairs, "tables": largest.pairs, "rounds": largest.rounds,
                "epsilon_per_pick": largest.pick_epsilon, "sigma": largest.sigma,
                "note": REFINE_RUN_TIME_NOTE_ZCDP}
        if (plan.sizing is not None and plan.sizing.count_budget is not None
                and plan.sizing.refine_requested):
            # the run may keep fewer pairs from the DP count (H47): their ρ goes to the tables
            parts["refine.marginals"]["fewer_pairs"] = GAUSSIAN_REFINE_DOWN_RULE
            parts["marginals"]["rho_note"] = (
                "planned; where the DP count keeps fewer refinement pairs (refine.marginals."
                "fewer_pairs) the tables get the dropped pairs' ρ too, the total is unchanged")
    accountant.spend(
        f"{prefix}.zcdp", z.budget,
        mechanism="PrivBayes network + refinement under zCDP (discrete Gaussian tables)",
        details={**z.details(), "parts": parts, **small,
                 "neighbours": "add/remove one privacy unit",
                 "paper": "AIM (McKenna et al. 2022) accounting; discrete Gaussian (Canonne, "
                          "Kamath & Steinke 2020); PrivBayes (Zhang et al. 2014)"})


def _spend_size_count(accountant: PrivacyAccountant, plan: PrivBayesPlan, prefix: str) -> None:
    """The DP size count's pure ``(ε_c, 0)`` spend (only without a public row count), first."""
    if plan.sizing is None or plan.sizing.count_budget is None:
        return
    small = "forest or independent 1-way marginals"
    if plan.target is not None:  # a declared target: the star first (privbayes_star, H41)
        small = (f"{star_wording(plan.target_name or plan.target)}; if no X × T table is "
                 f"θ-useful, {small}")
    use = ("post-processing: the network degree (choose_network_degree); 0 = the small-input "
           f"model ({small}) with the rest of ε")
    if plan.zcdp is not None:
        use += ("; the zCDP spend privbayes.zcdp covers every model chosen from n̂ at (ε − ε_c, "
                "δ): adaptive basic composition (Dwork & Roth 2014 Thm. 3.16)")
    accountant.spend(
        f"{prefix}.size_count", plan.sizing.count_budget,
        mechanism="discrete Laplace on the record count (n̂ for the model size)",
        details={"sensitivity": plan.max_contributions,
                 "scale": discrete_laplace_scale(sensitivity=plan.max_contributions,
                                                 epsilon=plan.sizing.count_budget.epsilon),
                 "use": use,
                 "paper": "AIM budget-aware sizing (McKenna et al. 2022 §4); PrivBayes §4.4"})


REFINE_RUN_TIME_NOTE = (
    "the number of pairs P (picks = tables) is chosen in the measurement step from the DP count "
    "n̂ (refine_size; post-processing, public) between the two values listed; picks/tables, "
    "rounds, ε per pick/table and scale are [min, max] over that range; every P splits this same "
    "ε evenly (ε/P per pick or table), so the spend is exact. The run's P per window: the "
    "manifest's privbayes sizing.chosen_refine (CLI, API bs.WriteManifest, Beam YAML manifest:); "
    "also the Beam counter beamsynth/privbayes_refine_pairs_<P> (windows that chose P)")


REFINE_RUN_TIME_NOTE_ZCDP = (
    "the number of pairs P (picks = tables) is chosen in the measurement step from the DP count "
    "n̂ (gaussian_refine_size; post-processing, public) between the planned P and this one; "
    "every P splits the same ρ_sel and ρ_meas evenly (ε_pick = √(2ρ_sel/P), σ = m/√(2ρ_meas/P)), "
    "so the spend is exact. The run's P per window: the manifest's privbayes "
    "sizing.chosen_refine (CLI, API bs.WriteManifest, Beam YAML manifest:); also the Beam "
    "counter beamsynth/privbayes_refine_pairs_<P>")


def spend_privbayes(accountant: PrivacyAccountant, plan: PrivBayesPlan, prefix: str = "privbayes") -> None:
    """Record the spends (size count, structure, marginals, refinement) on ``accountant`` (raises
    if overspent)."""
    if plan.zcdp is not None:
        spend_zcdp(accountant, plan, prefix)
        return
    _spend_size_count(accountant, plan, prefix)
    if plan.star is not None:  # the declared target's star (public rows, H41): one spend
        accountant.spend(
            f"{prefix}.marginals", plan.star.budget,
            mechanism="discrete Laplace on the star's X × T tables and the other 1-way tables",
            details={**plan.star.details(), "neighbours": "add/remove one privacy unit",
                     "paper": "PrivBayes §4.2 (noisy conditionals) and §4.4 (θ-usefulness), "
                              "add/remove counts; sequential composition over the tables"})
        return
    if plan.forest is not None:
        forest = plan.forest
        margins = forest.score == "margins"  # H102: the 1-way tables first, the score against them
        one_way = (".one_way", forest.one_way_budget, {
            "mechanism": "discrete Laplace on every column's 1-way marginal"
                         + (", released before the forest's edges are chosen" if margins else ""),
            "details": {"tables": plan.n_columns, "sensitivity_per_table": plan.max_contributions,
                        "split": "ε_i ∝ √cells_i (split_marginal_budget)",
                        "paper": "consistency with the forest's tables (PriView §4.2) is "
                                 "post-processing"}})
        structure = (".structure", forest.structure_budget, {
            "mechanism": ("permute-and-flip on S − cells·b over affordable pairs, forest edges; "
                          "S = Σ|n(x,y) − n̂·q_a(x)·q_b(y)| against the released 1-way tables"
                          if margins else
                          "permute-and-flip on InDif − cells·b over affordable pairs, forest edges"),
            "details": {"steps": forest.steps, "epsilon_per_step": forest.step_epsilon,
                        "max_pair_cells": forest.max_pair_cells, "no_edge_score": 0.0,
                        "sensitivity": forest.score_sensitivity, "score": forest.score,
                        "neighbours": "add/remove one privacy unit",
                        "paper": "PrivBayes §4.4 θ-usefulness (affordable pairs); "
                                 + ("S: one record moves one cell against a reference of released "
                                    "values (docs/privbayes.md, H102)" if margins
                                    else "InDif score (PrivSyn §4)")
                                 + "; permute-and-flip (McKenna & Sheldon 2020)"}})
        for step, budget, spend in ((one_way, structure) if margins else (structure, one_way)):
            accountant.spend(prefix + step, budget, **spend)
        accountant.spend(
            f"{prefix}.marginals", forest.pair_budget,
            mechanism="discrete Laplace on the forest's chosen 2-way marginals",
            details={"max_tables": forest.steps, "sensitivity_per_table": plan.max_contributions,
                     "penalty_scale": forest.pair_scale,
                     "split": "ε_i ∝ √cells_i over the chosen edges' tables; with no edge "
                              "chosen, the 1-way tables get this share too",
                     "paper": "PrivBayes §4.2 (noisy conditionals), converted to add/remove counts"})
        return
    if plan.structure_budget is not None:
        accountant.spend(
            f"{prefix}.structure", plan.structure_budget,
            mechanism="permute-and-flip on InDif − cells·b, greedy network",
            details={"steps": plan.n_columns - 1, "epsilon_per_step": plan.step_epsilon,
                     "parent_sets": "exact k" if plan.exact_degree else "any size ≤ k",
                     "sensitivity": plan.score_sensitivity, "degree": plan.degree,
                     "neighbours": "add/remove one privacy unit",
                     "paper": "PrivBayes Alg. 4 (Zhang et al. 2014); InDif score (PrivSyn §4); "
                              "permute-and-flip (McKenna & Sheldon 2020)",
                     **_target_parent_details(plan)},
        )
    accountant.spend(
        f"{prefix}.marginals", plan.marginal_budget,
        mechanism="discrete Laplace on the chosen (k+1)-way marginals",
        details={"max_tables": plan.max_tables, "sensitivity_per_table": plan.max_contributions,
                 "penalty_scale": plan.table_scale(plan.max_tables),
                 "penalty_scale_note": "the scale the structure penalty assumes (ε split equally "
                                       "over max_tables; data-independent)",
                 "split": "ε_i by split_network_budget over the released tables: the √cells "
                          "split moved toward the tables that carry the columns' 1-way margins "
                          "(H59; ε_i ∝ √cells_i where split_table_weight is None), "
                          "adding up to this ε; the tables are chosen privately, so each table's "
                          "ε and scale are released with the model's noisy marginals",
                 "split_table_weight": plan.split_table_weight,
                 "fit_refine_margins": plan.refine_margins,
                 # named where a launcher flipped the switch (the default's manifest unchanged)
                 **({} if plan.one_way_estimate == "mean"
                    else {"fit_one_way_estimate": plan.one_way_estimate}),
                 "paper": "PrivBayes §4.2 (noisy conditionals), converted to add/remove counts"},
    )
    if plan.refine is not None:
        largest = None if plan.sizing is None else plan.sizing.refine_largest(plan.refine)
        spend_refinement(accountant, plan.refine, f"{prefix}.refine", largest,
                         None if largest is None else REFINE_RUN_TIME_NOTE)
