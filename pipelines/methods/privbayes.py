"""``--method privbayes``: the PrivBayes network (:mod:`beamsynth.transforms.privbayes`) as a
synthesis method of the ``synthesize`` pipeline and releases.

Budget: :class:`~beamsynth.transforms.privbayes.DPPrivBayes` spends the method's ε on the
accountant in ``__init__``, before any data is read (structure, family tables and the
refinement; see that module's docstring for mechanisms, sensitivities and paper sections).
This module holds only the CLI options and the registry entry, so that ``transforms/`` never
imports ``pipelines/``.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import apache_beam as beam

from beamsynth.pipelines.io.metrics import run_counters
from beamsynth.pipelines.methods.options import Limit, whole_or
from beamsynth.pipelines.methods.registry import Method, register
from beamsynth.transforms.private import names_of
from beamsynth.transforms.privbayes import (
    AUTO_EXACT_MAX_COLUMNS,
    DEFAULT_DEGREE,
    DEFAULT_REFINED_DEGREE,
    DEFAULT_SAMPLING,
    DEFAULT_SHRINK,
    DEFAULT_STRUCTURE_FRACTION,
    GAUSSIAN_REFINE_GROUPS,
    GAUSSIAN_REFINE_PAIRS,
    NOISE_MODES,
    PARENT_MODES,
    SAMPLING_MODES,
    SIZING_MODES,
    DPPrivBayes,
)
from beamsynth.transforms.privbayes_measure import (
    REFINE_PICK_PREFIX,
    refine_pick_choices,
    sizing_choices,
)
from beamsynth.transforms.privbayes_plan import (
    TARGET_PARENT_OPTIONS,
    TARGET_PARENT_THETA,
    PrivBayesPlan,
    resolve_noise,
)
from beamsynth.transforms.refine import (
    DEFAULT_REFINE_FRACTION,
    DEFAULT_REFINE_GROUPS,
    DEFAULT_REFINE_PAIRS,
    DEFAULT_REFINE_ROUNDS,
    DEFAULT_REFINE_TARGET_PICKS,
    REFINE_MIN_PAIRS,
    TARGET_FLOOR,
)

_LOG = logging.getLogger(__name__)

__all__ = ["PrivBayesMethod", "PrivBayesRunTime", "add_input_rows_argument", "choice_counter_names",
           "run_time_choices", "with_run_time_choices"]


def add_input_rows_argument(parser: argparse.ArgumentParser) -> None:
    """``--input-rows N`` (once per parser): the public input size privbayes and sbhg size their
    models from (issue 18)."""
    if "--input-rows" not in getattr(parser, "_option_string_actions", {}):
        parser.add_argument("--input-rows", dest="input_rows", type=int, default=None,
                            help="privbayes/sbhg: a public number of input records, used only to "
                                 "size the model (issue 18); not --rows, which is the number of "
                                 "synthetic rows. Without it privbayes spends 2%% of its ε on a "
                                 "DP count")


@register
class PrivBayesMethod(Method):
    """``--method privbayes``: private Bayesian network (structure + noisy family tables)."""

    name = "privbayes"
    description = "PrivBayes: private k-parent Bayesian network from noisy (k+1)-way marginals"
    # the ranges plan_privbayes / plan_refinement / DPPrivBayes check, in the caller's words
    option_limits = {
        "degree": Limit(0, 8), "structure_fraction": Limit(0, 1, True, True),
        "shrink": Limit(0, 100), "refine_pairs": Limit(0), "refine_rounds": Limit(1),
        "refine_target_picks": Limit(0),
        "refine_groups": Limit(2, 64), "refine_fraction": Limit(0, 1, True, True),
        "input_rows": Limit(0)}

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        opts = self.options  # checked and normalised (Method.__init__, option_limits)

        def given(name: str, default: Any) -> Any:  # None only is the default: never `or` (H73)
            return default if opts.get(name) is None else opts[name]

        # auto (default since H53: gaussian when the method's δ > 0 and the schema is wide enough,
        # else laplace, byte for byte at δ = 0), laplace (pure ε), gaussian (zCDP)
        self._noise = given("pb_noise", "auto")
        gaussian = resolve_noise(self._noise, self.budget.delta, n_columns=len(self.schema.shape),
                                 epsilon=self.budget.epsilon)[0] == "gaussian"
        # zCDP: its own refinement defaults
        self._transform = DPPrivBayes(
            schema=self.schema, budget=self.budget, degree=given("degree", None),
            structure_fraction=given("structure_fraction", DEFAULT_STRUCTURE_FRACTION),
            shrink=float(given("shrink", DEFAULT_SHRINK)), sampling=given("sampling", DEFAULT_SAMPLING),
            parents=given("parents", "auto"),
            refine_pairs=given("refine_pairs", GAUSSIAN_REFINE_PAIRS if gaussian
                               else DEFAULT_REFINE_PAIRS),
            refine_rounds=given("refine_rounds", DEFAULT_REFINE_ROUNDS),
            refine_groups=given("refine_groups", GAUSSIAN_REFINE_GROUPS if gaussian
                                else DEFAULT_REFINE_GROUPS),
            refine_fraction=given("refine_fraction", DEFAULT_REFINE_FRACTION),
            sizing=given("pb_sizing", "auto"), rows=given("input_rows", None),
            noise=self._noise, target=self._target(), target_parent=self._target_parent(),
            refine_target_picks=given("refine_target_picks", DEFAULT_REFINE_TARGET_PICKS),
            max_contributions=self.max_contributions, seed=self.seed, accountant=self.accountant)
        self._note_rounds(given("refine_pairs", None), opts.get("refine_rounds"))
        self._note_target_picks(opts.get("refine_target_picks"))
        self._chosen: dict[str, int] = {}
        self._small: dict[str, int] = {}  # degree-0 windows per small-input model that ran
        self._refined: dict[str, dict[str, Any]] = {}
        self._parented: dict[str, int] = {}  # windows per run-time target-parent mode (auto)

    def _note_rounds(self, pairs: int | None, rounds: int | None) -> None:
        """Say, in the caller's words, what a refinement setting that builds as it always did
        runs (H76): 1 or 2 ``refine_pairs`` drop the refinement (fewer than
        ``REFINE_MIN_PAIRS``: no coarse pairs, no refinement spend), and ``refine_rounds`` above
        ``refine_pairs`` runs ``min(rounds, pairs)`` rounds (a round picks at least one pair),
        up to ``rounds`` only where the size rule raises the pairs (``refine_rounds_for_pairs``;
        wide refinements use that, so it is not refused)."""
        if pairs is None or pairs <= 0:
            return
        if pairs < REFINE_MIN_PAIRS:
            _LOG.warning("%s", f"{self.say.option('refine_pairs', pairs)} is below "
                         f"{REFINE_MIN_PAIRS}: the refinement is dropped (no coarse pairs, no "
                         "refinement spend)" + (f", so {self.say.option('refine_rounds', rounds)} "
                                                "changes nothing" if rounds is not None else "")
                         + f"; give {self.say.option('refine_pairs', 0)} to say so, or "
                         f"{REFINE_MIN_PAIRS} or more (method 'privbayes'; docs/options.md)")
        elif rounds is not None and rounds > pairs:
            _LOG.warning("%s", f"{self.say.option('refine_rounds', rounds)} is more than "
                         f"{self.say.option('refine_pairs', pairs)}: a round picks at least one "
                         f"pair, so the {pairs} requested pairs run in at most {pairs} rounds; up "
                         f"to {rounds} rounds only where the size rule raises the pairs from the "
                         "row count (method 'privbayes'; docs/options.md)")

    def _note_target_picks(self, picks: int | str | None) -> None:
        """Say, in the caller's words, that ``refine_target_picks`` changes nothing without a
        declared target (H86's open item): the plan then equals ``refine_target_picks=0`` and the
        manifest names no target picks, so a user who set it would otherwise never learn that it
        was ignored. Build time, from the configuration only."""
        if picks in (None, 0) or self._target() is not None:
            return
        _LOG.warning("%s", f"{self.say.option('refine_target_picks', picks)} changes nothing: "
                     "no target is declared (the schema's 'target' key or "
                     f"{self.say.option('target', 'COLUMN')}), so the refinement picks among "
                     "every pair as with 0 (method 'privbayes'; docs/privbayes.md)")

    def _target_parent(self) -> str:
        """``--target-parent`` / ``options={'target_parent': ...}`` (default ``auto``): its
        choices (``TARGET_PARENT_OPTIONS``) were checked once, in the caller's words, by
        ``Method.__init__`` (options.check_option_values, H73), before anything is planned or
        spent; not checked again here (H78)."""
        given = self.options.get("target_parent")
        return "auto" if given is None else str(given)

    def _target(self) -> str | None:
        """The declared target: the option (``--target`` / ``options={"target": ...}``, public
        configuration) over the schema's ``target`` key, ``""`` for none (a label-free model on a
        schema that declares one); a name that is not a declared column is refused here, echoing
        it in the caller's words with the nearest declared column."""
        given = self.options.get("target")
        if given is None:
            return getattr(self.schema, "target", None)
        if given == "":
            return None
        names_of(self.schema, [given], self.say.option("target", given))  # raises with the hint
        return given

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        taken = getattr(parser, "_option_string_actions", {})
        if "--degree" not in taken and "--k-parents" not in taken:
            parser.add_argument("--degree", "--k-parents", dest="degree", type=int, default=None,
                                help="privbayes: parents per attribute (default "
                                     f"{DEFAULT_REFINED_DEGREE} with the refinement, {DEFAULT_DEGREE} "
                                     "without; "
                                     "lowered if the declared domains make candidate counts too large)")
        if "--pb-structure-fraction" not in taken:
            parser.add_argument("--pb-structure-fraction", dest="structure_fraction", type=float,
                                default=None, help="privbayes: share of the method's ε for the "
                                f"structure (default {DEFAULT_STRUCTURE_FRACTION})")
        if "--pb-shrink" not in taken:
            parser.add_argument("--pb-shrink", dest="shrink", type=float, default=None,
                                help=f"privbayes: conditional fallback strength (default {DEFAULT_SHRINK})")
        if "--pb-parents" not in taken:
            parser.add_argument("--pb-parents", dest="parents", choices=PARENT_MODES,
                                default=None, help="privbayes: parent sets of any size up to k "
                                "chosen with the noise penalty (adaptive), exactly k (exact, "
                                "PrivBayes Alg. 4), or auto (default: exact for at most "
                                f"{AUTO_EXACT_MAX_COLUMNS} declared columns, else adaptive)")
        if "--pb-refine-pairs" not in taken:
            parser.add_argument("--pb-refine-pairs", dest="refine_pairs", type=int, default=None,
                                help="privbayes: coarse 2-way tables chosen privately and raked in "
                                     f"after the network (default {DEFAULT_REFINE_PAIRS}; 0 = off)")
            parser.add_argument("--pb-refine-rounds", dest="refine_rounds", type=int, default=None,
                                help=f"privbayes: selection rounds (default {DEFAULT_REFINE_ROUNDS})")
            parser.add_argument("--pb-refine-target-picks", dest="refine_target_picks",
                                type=whole_or("auto"), default=None,
                                help="privbayes: with a declared target, the refinement's first N "
                                "picks drawn among the target's pairs only, or auto: at least "
                                f"{TARGET_FLOOR} of them, the last picks only where needed (same "
                                f"spends; default {DEFAULT_REFINE_TARGET_PICKS}; docs/privbayes.md)")
            parser.add_argument("--pb-refine-groups", dest="refine_groups", type=int, default=None,
                                help="privbayes: groups per column in refinement tables "
                                     f"(default {DEFAULT_REFINE_GROUPS})")
            parser.add_argument("--pb-refine-fraction", dest="refine_fraction", type=float,
                                default=None, help="privbayes: share of the method's ε for the "
                                f"refinement (default {DEFAULT_REFINE_FRACTION})")
        if "--pb-sizing" not in taken:
            parser.add_argument("--pb-sizing", dest="pb_sizing", choices=SIZING_MODES, default=None,
                                help="privbayes: auto (default) chooses the degree from ε and the "
                                     "input size (--input-rows, else a DP count); when n·ε is "
                                     "small, every 1-way table plus a forest of the 2-way tables "
                                     "that size affords, or independent 1-way marginals "
                                     "(docs/privbayes.md); off keeps the planned degree")
        add_input_rows_argument(parser)
        if "--target" not in taken:
            parser.add_argument("--target", dest="target", default=None, metavar="COLUMN",
                                help="privbayes: the declared column models will be trained to "
                                     "predict (public; overrides the schema's target key, '' for "
                                     "none): on small inputs the model is a star around it "
                                     "(docs/privbayes.md)")
        if "--target-parent" not in taken:
            parser.add_argument("--target-parent", dest="target_parent",
                                choices=TARGET_PARENT_OPTIONS, default=None,
                                help="privbayes: with a declared target, how it enters a k >= 1 "
                                     "network: auto (default: a parent of every column where "
                                     "its tables are useful enough at n·ε, θ_T = "
                                     f"{TARGET_PARENT_THETA:g}, else off), off (the label-free "
                                     "network), optional (each column may take it), required "
                                     "(a parent of every column: tree-augmented naive Bayes); "
                                     "docs/privbayes.md")
        if "--pb-noise" not in taken:
            parser.add_argument("--pb-noise", dest="pb_noise", choices=NOISE_MODES, default=None,
                                help="privbayes: auto (default: gaussian when --delta > 0 and "
                                     "the schema is wide enough for zCDP to pay, else laplace), "
                                     "laplace (pure ε-DP; a --delta is not used) or gaussian "
                                     "(zCDP converted to (ε, δ): needs --delta > 0; discrete "
                                     f"Gaussian tables, {GAUSSIAN_REFINE_PAIRS} refinement pairs "
                                     f"of {GAUSSIAN_REFINE_GROUPS} groups by default); "
                                     "docs/privbayes.md")
        if "--pb-sampling" not in taken:
            parser.add_argument("--pb-sampling", dest="sampling", choices=SAMPLING_MODES, default=None,
                                help="privbayes: balanced (refined: rows whose 2-way tables match "
                                     "the raked pool's; plain network: systematic within parent "
                                     "cells) or iid draws (default "
                                     f"{DEFAULT_SAMPLING})")

    def expand_model(self, batches):
        models = batches | "PrivBayes" >> self._transform
        self.run_counts = self._transform.measured | "RunChoices" >> beam.FlatMap(_choice_items)
        # (counter name, 1) per window: the run-time choices for the API/YAML manifests
        # (pipelines/job.py, yaml_transforms.py); the CLI reads the same names as Beam counters
        return models

    @property
    def run_time_details(self) -> PrivBayesRunTime:
        """The API/YAML manifests' hook over :attr:`run_counts` (picklable: the plan only)."""
        return PrivBayesRunTime(self._transform.plan)

    def collect_metrics(self, result: Any) -> None:
        """The run-time size decision (from the DP count; public) and the refinement's picks (DP
        outputs) for :meth:`details`."""
        plan = self._transform.plan
        self._picks = refine_picks(run_counters(result, prefix=REFINE_PICK_PREFIX) or {})
        if plan.sizing is None or plan.sizing.rows is not None:
            return
        found = run_counters(result) or {}
        counts = {name: found.get(name, 0) for name in choice_counter_names(plan)}
        self._chosen, self._small, self._refined, self._parented = run_time_choices(plan, counts)

    def run_notes(self) -> list[str]:
        """Console lines after a run whose DP size count chose the small-input model (read by
        :func:`~beamsynth.pipelines.methods.synthesize.run_synthesis`): which model ran, since
        the plan and spend lines name the planned network (whose ε covers it)."""
        if not self._chosen.get("0"):
            return []
        ran = "; ".join(f"{model} in {n} window(s)" for model, n in self._small.items())
        return [f"privbayes: the DP size count chose the small-input model (k = 0) in "
                f"{self._chosen['0']} window(s): {ran or 'see the manifest'}; the spend lines "
                "name the planned network, whose ε covers it (manifest: "
                "sizing.chosen_small_model_windows)"]

    def details(self) -> dict[str, Any]:
        plan = self._transform.plan
        out = plan.details()
        why = self._transform.noise_reason
        if self._transform.noise == "gaussian" and plan.zcdp is None:  # small-input model
            small = "star around the target" if plan.star is not None else "forest"
            why += f"; the small-input model ({small}) is pure ε-DP, so δ is not used"
        if plan.zcdp is not None and plan.zcdp.count_epsilon:  # the DP size count: its own spend
            why += (f"; the DP size count is pure ε_c = {plan.zcdp.count_epsilon:g} (spend "
                    "privbayes.size_count), the model chosen from it (ε − ε_c = "
                    f"{plan.zcdp.budget.epsilon:g}, δ) (spend privbayes.zcdp): (ε, δ) by basic "
                    "composition")
        out["noise_mode"] = {"option": self._noise,
                             "chosen": "gaussian" if plan.zcdp is not None else "laplace",
                             "why": why}
        with_run_time_choices(out, plan, self._chosen, self._small, self._refined, self._parented)
        with_refine_picks(out, getattr(self, "_picks", []))
        return {"privbayes": out}


# -- run-time choices (from the DP count): the CLI's Beam counters and the API/YAML's records --------
def choice_counter_names(plan: PrivBayesPlan) -> list[str]:
    """Every counter name :func:`~beamsynth.transforms.privbayes_measure.sizing_choices` can give
    for ``plan``, in the manifest's order."""
    d = plan.n_columns
    names = [f"privbayes_degree_{k}" for k in range(plan.degree + 1)]
    names += ["privbayes_k0_independent"] + [
        n for e in range(d) for n in (f"privbayes_k0_forest_edges_{e}", f"privbayes_k0_star_{e}")]
    names += [f"privbayes_target_parent_{mode}" for mode in ("required", "off")]
    if plan.sizing is not None and plan.sizing.refine_requested:
        names += [f"privbayes_refine_pairs_{p}" for p in range(1, plan.sizing.refine_countable + 1)]
    return names


def run_time_choices(plan: PrivBayesPlan, counts: Mapping[str, int]) -> tuple[
        dict[str, int], dict[str, int], dict[str, dict[str, Any]], dict[str, int]]:
    """``counter name → windows`` (Beam counters after a CLI run, or the API/YAML records) →
    the manifest's ``chosen_degree_windows``, ``chosen_small_model_windows``, ``chosen_refine``
    and ``chosen_target_parent_windows`` (windows per choice; only choices that ran)."""
    chosen: dict[str, int] = {}
    small: dict[str, int] = {}
    refined: dict[str, dict[str, Any]] = {}
    parented: dict[str, int] = {}
    for k in range(plan.degree + 1):
        if counts.get(f"privbayes_degree_{k}"):
            chosen[str(k)] = counts[f"privbayes_degree_{k}"]
    if chosen.get("0"):  # which small-input model those windows fitted
        if counts.get("privbayes_k0_independent"):
            small["independent 1-way tables (∝ √cells, whole ε)"] = counts["privbayes_k0_independent"]
        for e in range(plan.n_columns):
            if counts.get(f"privbayes_k0_forest_edges_{e}"):
                small[f"forest of {e} chosen edge(s) + 1-way tables"] = \
                    counts[f"privbayes_k0_forest_edges_{e}"]
            if counts.get(f"privbayes_k0_star_{e}"):  # the declared target's star (H41)
                small[f"star of {e} column(s) around the target {plan.target_name!r} + 1-way "
                      "tables"] = counts[f"privbayes_k0_star_{e}"]
    for mode in ("required", "off"):  # auto's gate on the same DP count (H65)
        if counts.get(f"privbayes_target_parent_{mode}"):
            parented[mode] = counts[f"privbayes_target_parent_{mode}"]
    if plan.sizing is not None and plan.sizing.refine_requested:
        for p in range(1, plan.sizing.refine_countable + 1):
            if counts.get(f"privbayes_refine_pairs_{p}"):  # the refinement's size (refine_size)
                refined[str(p)] = {"windows": counts[f"privbayes_refine_pairs_{p}"],
                                   **plan.sizing.refine_plan_for(plan.refine, p).details()}
    return chosen, small, refined, parented


def with_run_time_choices(out: dict[str, Any], plan: PrivBayesPlan, chosen: Mapping[str, int],
                          small: Mapping[str, int], refined: Mapping[str, Any],
                          parented: Mapping[str, int]) -> dict[str, Any]:
    """``plan.details()`` (+ ``noise_mode``) with the run-time choices, in place: the CLI's
    :meth:`PrivBayesMethod.details` and the API/YAML manifests (:class:`PrivBayesRunTime`)."""
    if plan.zcdp is not None and chosen.get("0"):  # run-time fallback from the DP count
        out["noise_mode"]["why"] += (
            f"; in {chosen['0']} window(s) the DP count chose the small-input model: its "
            f"{'star or ' if plan.target is not None else ''}forest tables are pure-ε discrete "
            f"Laplace with ε − ε_c = {plan.zcdp.budget.epsilon:g} in all, the Laplace plan's "
            "forest budget (or discrete Gaussian 1-way tables with the whole ρ), within the "
            "privbayes.zcdp spend")
    if chosen:  # windows per chosen degree ("0" = the small-input model, below)
        out["sizing"] = {**out["sizing"], "chosen_degree_windows": dict(chosen)}
    if small:  # degree 0: √cells 1-way tables or the forest (plan_forest, forest_resolves)
        out["sizing"] = {**out["sizing"], "chosen_small_model_windows": dict(small)}
    if refined:  # refinement per chosen pair count: windows, rounds, ε per pick/table
        out["sizing"] = {**out["sizing"], "chosen_refine": dict(refined)}
    if parented:  # auto: where the DP count passed the target-parent gate
        out["sizing"] = {**out["sizing"], "chosen_target_parent_windows": dict(parented)}
    return out


@dataclass(frozen=True)
class PrivBayesRunTime:
    """The run-time choices in a manifest built inside the pipeline (API ``bs.WriteManifest``,
    Beam YAML ``manifest:``) from the ``(counter name, 1)`` records of each window's measurement:
    the CLI's fields (:func:`with_run_time_choices`) and, per declared window,
    ``sizing.chosen_per_window``. Public: functions of the DP count and the declared plan."""

    plan: PrivBayesPlan

    def __call__(self, details: Mapping[str, Any], totals: Mapping[str, int],
                 per_window: Mapping[str, Mapping[str, int]] | None = None, *,
                 every_window: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
        out = copy.deepcopy(dict(details["privbayes"]))
        with_run_time_choices(out, self.plan, *run_time_choices(self.plan, totals))
        with_refine_picks(out, refine_picks(totals))
        if per_window is not None and self.plan.sizing is not None and \
                self.plan.sizing.rows is None:  # the DP count sized every window
            out["sizing"] = {**out["sizing"], "chosen_per_window": [
                {"window_start": start, **self.window_choice(counts)}
                for start, counts in per_window.items() if every_window or counts]}
        return {**details, "privbayes": out}, {}

    def window_choice(self, counts: Mapping[str, int]) -> dict[str, Any]:
        """One window's choices in the CLI's words: degree, model, target parent, refinement."""
        chosen, small, refined, parented = run_time_choices(self.plan, counts)
        if not chosen:  # no record of this window (a runner that lost it): say so
            return {"degree": None, "model": "not recorded"}
        k = int(next(iter(chosen)))
        out: dict[str, Any] = {"degree": k, "model": next(iter(small)) if small else
                               f"network with {k} parent(s) per column"}
        if parented:
            out["target_parent"] = next(iter(parented))
        if refined:
            out["refine_pairs"] = int(next(iter(refined)))
        return out


def _choice_items(measurement: Any) -> list[tuple[str, int]]:
    """One window's :class:`~beamsynth.transforms.privbayes_measure.PrivBayesMeasurement` →
    ``(counter name, 1)`` per run-time choice (public: from the DP count) and per refinement
    pick (a DP output)."""
    return [(name, 1) for name in (*sizing_choices(measurement.sizing),
                                   *refine_pick_choices(measurement))]


def refine_picks(counts: Mapping[str, int]) -> list[dict[str, Any]]:
    """Records ``privbayes_refine_pick_<j>:["a", "b"]`` → windows (CLI counters or API/YAML
    records) → ``[{"pick": j, "pair": [a, b], "windows": n}, ...]`` by pick, then pair."""
    picks = []
    for name, n in counts.items():
        if name.startswith(REFINE_PICK_PREFIX) and n:
            j, pair = name[len(REFINE_PICK_PREFIX):].split(":", 1)
            picks.append({"pick": int(j), "pair": json.loads(pair), "windows": int(n)})
    return sorted(picks, key=lambda p: (p["pick"], p["pair"]))


def with_refine_picks(out: dict[str, Any], picks: list[dict[str, Any]]) -> dict[str, Any]:
    """``out["refine"]["picks"]``: which pairs the refinement's DP selection picked (public: a DP
    output), each pick's spends being the refinement's ``epsilon_per_pick`` (selection) and
    ``epsilon_per_table`` (its noisy table), or those of ``sizing.chosen_refine`` where the DP
    count resized it. In place; nothing where no pick was recorded."""
    if picks and isinstance(out.get("refine"), dict):
        out["refine"] = {**out["refine"], "picks": picks,
                         "picks_note": "pairs the DP selection picked, in pick order (per pick: "
                                       "windows where it was picked); each spent epsilon_per_pick "
                                       "to select and epsilon_per_table for its table"}
    return out
