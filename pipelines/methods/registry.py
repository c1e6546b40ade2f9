"""Synthesis methods: a registry so that adding a mechanism to the CLI and releases is one line.

A method is a class with a ``name``, CLI options, and a constructor that **spends its budget on
the accountant** (so overspending fails while the pipeline is built), plus ``expand_model``
turning bounded ``EncodedBatch`` records into one ``SynthesisModel`` per window.
"""

from __future__ import annotations

import argparse
import difflib
from abc import ABC, abstractmethod
from typing import Any

import apache_beam as beam

from beamsynth.pipelines.methods.options import Limit, check_option_values
from beamsynth.pipelines.methods.wording import Vocabulary
from beamsynth.schemas.schema import Schema
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant, PureDP, as_budget
from beamsynth.transforms.cathist import plan_cathist
from beamsynth.transforms.synthesis import SAMPLING_MODES, DPIndependentMarginals

__all__ = ["MAX_DENSE_CELLS", "METHODS", "Method", "IndependentMethod", "register", "get_method",
           "method_option_names", "options_for_other_methods"]

MAX_DENSE_CELLS = 50_000_000  # cells of one dense 1-way table of the independent method


class Method(ABC):
    """A synthesis mechanism as seen by the ``synthesize`` pipeline."""

    name: str = ""
    description: str = ""
    #: ranges of numeric options (destination → :class:`Limit`), checked with their kinds in
    #: :meth:`__init__` and by the API's and Beam YAML's ``check_options``, in the caller's words
    option_limits: dict[str, Limit] = {}

    def __init__(self, *, schema: Schema, accountant: PrivacyAccountant, budget: ApproxDP,
                 max_contributions: int, seed: int | None, options: dict[str, Any],
                 vocabulary: Vocabulary | None = None) -> None:
        self.say = vocabulary or Vocabulary.cli(type(self))  # messages spell options as the caller
        self.schema = schema
        self.accountant = accountant
        self.budget = budget
        self.max_contributions = max_contributions
        self.seed = seed
        # the method's own options checked once, for every caller (kinds, ranges; options.py)
        self.options = check_option_values(type(self), options, self.say)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Method-specific CLI options (none by default)."""

    @abstractmethod
    def expand_model(self, batches: beam.PCollection) -> beam.PCollection:
        """Bounded ``EncodedBatch`` records → one ``SynthesisModel`` per window."""

    def details(self) -> dict[str, Any]:
        """Method parameters for the manifest."""
        return {}

    @classmethod
    def releases_records(cls) -> bool:
        """Whether the method releases records itself (overrides :meth:`expand_tables`, as
        plausible deniability does) instead of a model that ``SampleSynthetic`` samples."""
        return cls.expand_tables is not Method.expand_tables

    def expand_tables(self, batches: beam.PCollection, rows: beam.PCollection) -> beam.PCollection:
        """Optional hook for methods that release records directly instead of sampling a model.

        Overriding it makes ``synthesize`` call it instead of :meth:`expand_model` +
        ``SampleSynthetic``: bounded ``EncodedBatch`` records and ``rows`` (``PCollection[int]``,
        one per window) → ``PCollection[pyarrow.Table]``.
        """
        raise NotImplementedError

    def collect_metrics(self, result: Any) -> None:
        """Optional hook: read the finished run's Beam metrics (for :meth:`details`)."""

    def operational(self) -> dict[str, Any]:
        """Exact, non-DP diagnostics for the manifest's private ``operational`` part (never the
        public ``release`` part, which holds only DP outputs and public parameters)."""
        return {}


class IndependentMethod(Method):
    """Noisy 1-way marginals of every column (discrete Laplace), columns sampled independently."""

    name = "independent"
    description = "independent noisy 1-way marginals"

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        # pure ε-DP: a δ the user allowed is simply not spent (the manifest shows δ spent = 0)
        self.budget = PureDP(epsilon=self.budget.epsilon)
        columns = self.schema.columns
        per_column = self.budget.epsilon / len(columns)
        closed = [c for c in columns if not c.is_open]
        for c in closed:  # dense tables are allocated and noised cell by cell after the data is read
            if c.cells > MAX_DENSE_CELLS:
                raise ValueError(
                    f"column {c.name!r} has {c.cells} cells, more than a dense noisy table can hold "
                    f"({MAX_DENSE_CELLS}); declare it open (open: {{tolerance: ρ}}, released with "
                    "CatHist) or bin it coarser")
        details = {
            "tables": len(closed),
            "epsilon_per_table": per_column,
            "scale_per_table": self.max_contributions / per_column,
            "sensitivity_per_table": self.max_contributions,
            "paper": "Laplace mechanism (Dwork et al. 2006); DataSynthesizer independent mode (seed 004)",
        }
        if len(closed) == len(columns):
            self.accountant.spend("independent.marginals", self.budget,
                                  mechanism="discrete Laplace on 1-way marginals", details=details)
            return
        if closed:  # equal split: the closed columns' share
            share = as_budget(per_column * len(closed))
            self.accountant.spend("independent.marginals", share,
                                  mechanism="discrete Laplace on 1-way marginals", details=details)
        parts = self.budget.split({c.name: 1.0 for c in columns})  # as DPIndependentMarginals
        for c in columns:
            if c.is_open:  # huge declared domain: CatHist, never a dense table
                eps = parts[c.name].epsilon
                plan = plan_cathist(epsilon=eps, tolerance=c.tolerance, domain_size=c.cells,
                                    max_contributions=self.max_contributions)
                self.accountant.spend(
                    f"independent.cathist.{c.name}", PureDP(epsilon=eps),
                    mechanism="CatHist: discrete Laplace on every declared bin, keep ≥ τ",
                    details={"column": c.name, **plan.details()})

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--independent-sampling", dest="independent_sampling",
                            choices=SAMPLING_MODES, default=None,
                            help="independent: balanced (default: every column's synthetic "
                                 "margin is its Norm-Sub fitted table's, to one row per cell) or "
                                 "iid draws from the same tables; docs/methods.md")

    def _sampling(self) -> str:
        return self.options.get("independent_sampling") or SAMPLING_MODES[0]

    def details(self) -> dict[str, Any]:
        """The fit and sampling of the released tables (post-processing; no spend)."""
        return {"fit": "norm_sub", "sampling": self._sampling()}

    def expand_model(self, batches):
        return batches | "IndependentMarginals" >> DPIndependentMarginals(
            schema=self.schema, budget=self.budget, max_contributions=self.max_contributions,
            seed=self.seed, sampling=self._sampling())


METHODS: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    """Add a method class to the registry (usable as a decorator)."""
    if not cls.name:
        raise ValueError(f"method class {cls.__name__} has no name")
    METHODS[cls.name] = cls
    return cls


def get_method(name: str) -> type[Method]:
    """The method class called ``name``."""
    _load_optional_methods()
    try:
        return METHODS[name]
    except KeyError:  # bs.Synthesize(method="privbays"): the nearest name too (H87)
        close = ([m for m in sorted(METHODS) if m == str(name).lower()]
                 or difflib.get_close_matches(str(name), sorted(METHODS), n=1, cutoff=0.6))
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown method {name!r}{hint}; available: {sorted(METHODS)}") from None


def method_option_names(method: str) -> set[str]:
    """Option names a synthesis method reads (its CLI destinations): what the API, Beam YAML and
    release configs accept in ``options``."""
    parser = argparse.ArgumentParser(add_help=False)
    get_method(method).add_arguments(parser)
    return {a.dest for a in parser._actions if a.dest != "help"}


def options_for_other_methods(method: str, values: dict[str, Any]) -> dict[str, list[str]]:
    """Flags given a non-default value in ``values`` (CLI destinations) that ``method`` does not
    read but another method does: ``{"--target": ["privbayes"]}``. The CLI accepts every
    method's flags, so ``--target income`` with ``--method independent`` ran without a word."""
    _load_optional_methods()
    own = method_option_names(method)
    found: dict[str, list[str]] = {}
    for name, cls in sorted(METHODS.items()):
        if name == method:
            continue
        parser = argparse.ArgumentParser(add_help=False)
        cls.add_arguments(parser)
        for action in parser._actions:
            if (action.dest == "help" or action.dest in own or action.dest not in values
                    or values[action.dest] == action.default):
                continue
            flag = action.option_strings[0]
            found.setdefault(flag, []).append(name)
    return found


# Methods living in their own modules register themselves on import. Adding one: append its
# module here.
_METHOD_MODULES: list[str] = ["beamsynth.pipelines.methods.sbhg", "beamsynth.pipelines.methods.plausible", "beamsynth.pipelines.methods.privbayes"]


def _load_optional_methods() -> None:
    import importlib

    for mod in _METHOD_MODULES:
        importlib.import_module(mod)


register(IndependentMethod)
