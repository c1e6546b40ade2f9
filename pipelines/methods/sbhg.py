"""``--method sbhg``: the stability-based hashed Gibbs sampler as a synthesis method.

Budget (spent on the accountant in ``__init__``, before any data is read): of the method's
``(ε, δ)``, ``selection_fraction·ε`` (pure) chooses the hash features with the exponential
mechanism and the rest, with all of δ, releases the hashed conditionals with SBA. See
:mod:`beamsynth.transforms.sbhg` for the mechanisms and the proofs, ``docs/sbhg.md`` for usage.
"""

from __future__ import annotations

import argparse
from typing import Any

from beamsynth.pipelines.methods.options import Limit
from beamsynth.pipelines.methods.privbayes import add_input_rows_argument
from beamsynth.pipelines.methods.registry import Method, register
from beamsynth.transforms.budget import ApproxDP, PureDP
from beamsynth.transforms.sbhg import _MAX_PAIR_CELLS as MAX_PAIR_CELLS
from beamsynth.transforms.sbhg import (
    DEFAULT_MI_COUNT_CAP,
    DPHashedConditionals,
    choose_hash_size,
    sba_threshold,
)
from beamsynth.transforms.synthesis import DPIndependentMarginals

__all__ = ["SBHGMethod"]

_DEFAULTS: dict[str, Any] = {
    "top_r": 2, "burn_in": 50, "thin": 5, "sbhg_chain_length": 20, "sbhg_init_sweeps": 10,
    "sbhg_selection_fraction": 0.2, "sbhg_support_check": "cell",
    "sbhg_mi_count_cap": DEFAULT_MI_COUNT_CAP, "sbhg_sizing": "auto",
}


def _option(options: dict[str, Any], name: str) -> Any:
    value = options.get(name)
    return _DEFAULTS[name] if value is None else value


@register
class SBHGMethod(Method):
    """Hashed full conditionals (top-R by DP mutual information) released by SBA, Gibbs-sampled."""

    name = "sbhg"
    description = "stability-based hashed Gibbs sampler (needs delta > 0)"
    # DPHashedConditionals' ranges, in the caller's words (input_rows: was taken at -1, H73);
    # sbhg_selection_fraction is checked below, in the caller's words too
    option_limits = {"top_r": Limit(0), "burn_in": Limit(0), "thin": Limit(1),
                     "sbhg_chain_length": Limit(1), "input_rows": Limit(0)}

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        if self.budget.delta <= 0:
            who = (self.say.option("method", "sbhg") if self.say.caller != "api"
                   else "the sbhg method (bs.SBHG, bs.Synthesize(method='sbhg'))")
            raise ValueError(
                f"{who} "
                "needs delta > 0 (the stability-based algorithm is "
                f"(ε, δ)-DP), got delta={self.budget.delta!r}; pass e.g. "
                f"{self.say.option('delta', 1e-6)}" + (" on a bs.PrivacyJob(epsilon=..., delta=...) "
                                                       "that has δ" if self.say.caller == "api" else ""))
        o = self.options
        frac = float(_option(o, "sbhg_selection_fraction"))
        if not (0.0 < frac < 1.0):
            raise ValueError(f"{self.say.option('sbhg_selection_fraction', frac)}: the selection "
                             "fraction must be in (0, 1)")
        p = len(self.schema.columns)
        top_r = _option(o, "top_r")
        r_eff = min(int(top_r), p - 1) if isinstance(top_r, int) and top_r >= 0 else top_r
        self.sizing: dict[str, Any] | None = None
        rows = o.get("input_rows")  # public input size (not --rows, the synthetic row count)
        if (_option(o, "sbhg_sizing") == "auto" and rows is not None and isinstance(r_eff, int)
                and r_eff > 0 and not any(c.is_open for c in self.schema.columns)):
            # public row count: hash size from n·ε at build time (issue 18, docs/sbhg.md)
            # the SBA threshold the hashed tables would get (per feature: (1-frac)·ε/p, δ/p)
            _, threshold = sba_threshold(epsilon=self.budget.epsilon * (1 - frac) / p,
                                         delta=self.budget.delta / p,
                                         max_contributions=self.max_contributions)
            fit = choose_hash_size(int(rows), self.budget.epsilon, self.schema.shape, top_r=r_eff,
                                   max_contributions=self.max_contributions,
                                   min_cell_count=threshold)
            self.sizing = {"rule": "largest r <= top_r with n·ε/(d·m·g^(r+1)) >= theta and "
                                   "n/g^(r+1) >= the SBA threshold (transforms.sbhg."
                                   "choose_hash_size), else independent 1-way marginals with the "
                                   "whole ε", "rows": int(rows), "sba_threshold": threshold,
                           "top_r_requested": r_eff, "top_r_chosen": fit}
            if fit == 0:
                self._fallback()
                return
            top_r = r_eff = fit
        if isinstance(r_eff, int) and r_eff > 0:
            selection = PureDP(epsilon=self.budget.epsilon * frac)
            conditional = ApproxDP(epsilon=self.budget.epsilon - selection.epsilon, delta=self.budget.delta)
        else:
            selection, conditional = None, ApproxDP(epsilon=self.budget.epsilon, delta=self.budget.delta)
        self._check_pair_cells(r_eff)
        self.transform = DPHashedConditionals(
            shape=self.schema.shape, selection_budget=selection, conditional_budget=conditional,
            top_r=top_r, max_contributions=self.max_contributions,
            mi_count_cap=_option(o, "sbhg_mi_count_cap"), burn_in=_option(o, "burn_in"),
            thin=_option(o, "thin"), chain_length=_option(o, "sbhg_chain_length"),
            init_sweeps=_option(o, "sbhg_init_sweeps"),
            support_check=_option(o, "sbhg_support_check"), seed=self.seed)
        d = self.transform.details()
        paper = "Li, Karwa, Slavković, Steorts: SBHG (seed 002)"
        if selection is not None:
            self.accountant.spend(
                "sbhg.hash_selection", selection,
                mechanism="exponential mechanism on capped count-weighted mutual information",
                details={"draws": d["em_draws"], "epsilon_per_draw": d["em_epsilon_each"],
                         "sensitivity": d["mi_score_sensitivity"], "mi_count_cap": d["mi_count_cap"],
                         "top_r": d["top_r"], "paper": paper + " §3.2 Remark 3.2 (SBHG+EM)"})
        self.accountant.spend(
            "sbhg.conditionals", conditional,
            mechanism="stability-based algorithm: discrete Laplace on non-empty hashed cells, threshold",
            details={"tables": p, "per_table": d["sba_per_feature"], "scale": d["sba_scale"],
                     "threshold": d["sba_threshold"], "sensitivity": self.max_contributions,
                     "paper": paper + " §2.3 Algorithm 1, §3.3 Theorem 3.1 (converted to add/remove)"})

    def _check_pair_cells(self, r_eff: Any) -> None:
        """The parent selection measures every 2-way table densely: refuse one too large when
        built, naming the columns and the caller's options (the transform's own check said
        ``2-way tables [(0, 7), ...] exceed 2000000 cells; ... use top_r=0``; H81)."""
        if not (isinstance(r_eff, int) and r_eff > 0):
            return
        shape, names = self.schema.shape, self.schema.names
        big = [(names[a], names[b]) for a in range(len(shape)) for b in range(a + 1, len(shape))
               if shape[a] * shape[b] > MAX_PAIR_CELLS]
        if not big:
            return
        wide = sorted(set.intersection(*map(set, big)) or {n for pair in big for n in pair})
        leave_out = ("records | job.private(schema.select([...]))" if self.say.caller == "api"
                     else "a schema without them")
        raise ValueError(
            f"sbhg: its parent selection measures every 2-way table, and {len(big)} of them have more "
            f"than {MAX_PAIR_CELLS:,} cells (e.g. {', '.join(f'({a}, {b})' for a, b in big[:3])}): "
            f"declare bins (integer/float `edges`) or a smaller domain for {', '.join(map(repr, wide))}, "
            f"synthesize the other columns ({leave_out}), or pass {self.say.option('top_r', 0)} (no parent "
            "selection)")

    def _fallback(self) -> None:
        """Independent 1-way marginals with the method's whole ε (pure; δ unspent)."""
        budget = PureDP(epsilon=self.budget.epsilon)
        self.transform = DPIndependentMarginals(schema=self.schema, budget=budget,
                                                max_contributions=self.max_contributions,
                                                seed=self.seed)
        self.accountant.spend(
            "sbhg.fallback_independent", budget,
            mechanism="discrete Laplace on 1-way marginals (SBHG's hash size is 0 at this n·ε)",
            details={"tables": len(self.schema.columns), "sensitivity": self.max_contributions,
                     "scale_per_table": self.max_contributions * len(self.schema.columns)
                     / budget.epsilon,
                     "paper": "Laplace mechanism; DataSynthesizer independent mode (seed 004)"})

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--top-r", dest="top_r", type=int, default=None,
                            help="sbhg: hash features per column, chosen privately (default 2)")
        parser.add_argument("--burn-in", dest="burn_in", type=int, default=None,
                            help="sbhg: Gibbs sweeps before the first record of a chain (default 50)")
        parser.add_argument("--thin", dest="thin", type=int, default=None,
                            help="sbhg: sweeps between records of a chain (default 5)")
        parser.add_argument("--chain-length", dest="sbhg_chain_length", type=int, default=None,
                            help="sbhg: records per Gibbs chain (default 20)")
        parser.add_argument("--selection-fraction", dest="sbhg_selection_fraction", type=float,
                            default=None, help="sbhg: share of ε for choosing hashes (default 0.2)")
        parser.add_argument("--support-check", dest="sbhg_support_check", choices=["cell", "hash"],
                            default=None, help="sbhg: rejection rule: 'hash' = Remark 3.3, "
                            "'cell' (default) also needs positive mass for the other feature's value")
        add_input_rows_argument(parser)
        parser.add_argument("--sbhg-sizing", dest="sbhg_sizing", choices=["auto", "off"],
                            default=None, help="sbhg: with --input-rows, auto (default) lowers --top-r "
                            "to what n·ε supports, down to independent 1-way marginals (docs/sbhg.md)")

    def expand_model(self, batches):
        return batches | "SBHG" >> self.transform

    def details(self) -> dict[str, Any]:
        if not isinstance(self.transform, DPHashedConditionals):
            # the fallback's fit and sampling (64d02bb: Norm-Sub, balanced), as independent's
            return {"sbhg": {"model": "independent 1-way marginals (fallback)",
                             **self.transform.modes, "sizing": self.sizing}}
        return {"sbhg": {**self.transform.details(), "sizing": self.sizing}}
